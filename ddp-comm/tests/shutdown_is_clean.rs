//! Dropping a group leaves no thread and no socket behind. Its own test binary, so no other
//! test's threads or sockets disturb the count.

#[path = "comm/common/mod.rs"]
mod common;

use common::run_ok;
use ddp_comm::ReduceOp;

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn dropping_groups_joins_threads_and_closes_sockets() {
    let (threads, fds) = (count("/proc/self/task"), count("/proc/self/fd"));
    for _ in 0..3 {
        run_ok(3, |pg| {
            let sub = pg.new_group(&[0, 1])?;
            let mut v = vec![1.0f32; 1000];
            pg.all_reduce(&mut v, ReduceOp::Sum)?;
            if let Some(s) = sub {
                s.all_reduce(&mut v, ReduceOp::Sum)?;
            }
            Ok(())
        });
    }
    // The accept thread of each store server polls every 50 ms; give it time to exit.
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(count("/proc/self/task"), threads, "threads left behind");
    assert_eq!(count("/proc/self/fd"), fds, "sockets left open");
}
