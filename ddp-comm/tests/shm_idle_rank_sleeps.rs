//! An idle rank sleeps on the futex instead of spinning. Its own test binary, so that no
//! other test's threads add to the process's CPU time.

#[path = "comm/common/mod.rs"]
mod common;

use common::{Setup, run_ok_with};
use std::time::Duration;

/// User + system CPU time of this process, in clock ticks (10 ms).
fn process_cpu_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = s[s.rfind(')').unwrap() + 1..].split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the man page; `fields` starts at field 3.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// An idle rank sleeps on the futex instead of spinning: while one rank waits two seconds for
/// a late peer, the whole process uses far less than two seconds of CPU.
#[test]
fn a_waiting_rank_sleeps_instead_of_spinning() {
    run_ok_with(Setup::Shm, 2, |pg| {
        if pg.rank() == 1 {
            std::thread::sleep(Duration::from_secs(2));
            return pg.barrier();
        }
        let before = process_cpu_ticks();
        let start = std::time::Instant::now();
        pg.barrier()?;
        let waited = start.elapsed();
        let ticks = process_cpu_ticks() - before;
        assert!(waited >= Duration::from_millis(1500), "{waited:?}");
        // A spinning waiter would burn ~200 ticks in 2 s.
        assert!(
            ticks < 50,
            "the process used {ticks} ticks of CPU while rank 0 waited {waited:?}"
        );
        Ok(())
    });
}
