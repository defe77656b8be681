//! Issue 45 item 7: a stranger on rank 0's store port leaves a warning in rank 0's log (the
//! store always logged one, but a worker had no subscriber, so it went nowhere).
use crate::launch_common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// What the store logs for it (at warn).
const WARNING: &str = "WARN store: rejected a connection";

#[test]
fn garbage_on_rank_0s_store_port_is_logged_by_rank_0() {
    let dir = tempfile::tempdir().expect("tempdir");
    let logs = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let mut cmd = ddp_run();
    cmd.env("DDP_LAUNCH_ID", "strangers")
        .args(["--nproc-per-node", "1", "--master-port", &port.to_string()])
        .arg("--log-dir")
        .arg(logs.path())
        .arg("--")
        .arg(worker_path())
        .args(["--mode", "sleep", "--pid-dir"])
        .arg(dir.path());
    let mut launcher = start(cmd);
    let pids = wait_for_pids(dir.path(), 1, &mut launcher);

    // Not a hello, and no more bytes: the store refuses it and closes the connection.
    let mut stranger = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stranger
        .set_read_timeout(Some(DEADLINE))
        .expect("read timeout");
    stranger
        .write_all(b"GET / HTTP/1.0\r\n\r\n")
        .expect("send garbage");
    stranger
        .shutdown(std::net::Shutdown::Write)
        .expect("shutdown");
    let _ = stranger.read_to_end(&mut Vec::new());

    let log = logs.path().join("strangers/attempt_0/rank_0.log");
    let deadline = Instant::now() + DEADLINE;
    let logged = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains(WARNING) || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // SAFETY: signalling the launcher this test started.
    unsafe { libc::kill(launcher.child.id() as i32, libc::SIGTERM) };
    let out = launcher.finish();
    assert!(
        logged.contains(WARNING),
        "rank 0's log:\n{logged}\n{}",
        out.all()
    );
    assert_all_gone(&pids);
}
