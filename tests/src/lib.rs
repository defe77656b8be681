//! Multi-process integration tests for ddp-burn.
//!
//! The test programs in `src/bin/` are real ranks: the tests in `tests/` start them as separate
//! processes with the environment a launcher would give them, and check what they print and how
//! they exit. [`spawn_world`] is the shared harness.
#![warn(missing_docs)]

pub mod fixtures;

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// One rank's outcome.
#[derive(Debug)]
pub struct RankOutput {
    /// The rank.
    pub rank: usize,
    /// Exit code, `None` when killed by a signal (or by the harness at the deadline).
    pub code: Option<i32>,
    /// Everything the rank printed to stdout.
    pub stdout: String,
    /// Everything the rank printed to stderr.
    pub stderr: String,
}

/// Asserts that rank `dead` was killed by a signal and that every other rank failed cleanly
/// (exit code 3) with an error naming it.
#[track_caller]
pub fn assert_survivors_name_the_dead(out: &[RankOutput], dead: usize) {
    assert_eq!(out[dead].code, None, "rank {dead} was killed by SIGKILL");
    for o in out.iter().filter(|o| o.rank != dead) {
        assert_eq!(
            o.code,
            Some(3),
            "rank {} should fail cleanly: {}",
            o.rank,
            o.stderr
        );
        assert!(
            o.stderr.contains(&format!("rank {dead}")),
            "rank {} must name rank {dead}: {}",
            o.rank,
            o.stderr
        );
    }
}

/// A process group of one rank over a store of its own (the server is returned to keep it up).
pub fn one_rank_group()
-> Result<(ddp_comm::StoreServer, ddp_comm::ProcessGroup), ddp_comm::CommError> {
    use ddp_comm::{ProcessGroup, ProcessGroupConfig, Store, StoreConfig, StoreServer};
    let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new())?;
    let store = Store::connect(&server.local_addr().to_string(), StoreConfig::new())?;
    let pg = ProcessGroup::with_store(store, ProcessGroupConfig::new(0, 1))?;
    Ok((server, pg))
}

/// A free TCP port on loopback (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port on loopback")
}

/// Starts `world` copies of `exe` with the worker environment (`RANK`, `WORLD_SIZE`,
/// `MASTER_ADDR`, `MASTER_PORT`, ...) plus `extra(rank)`, waits for all of them up to
/// `deadline`, killing any that are still running then, and returns their outputs.
pub fn spawn_world(
    exe: &str,
    args: &[&str],
    world: usize,
    deadline: Duration,
    extra: impl Fn(usize) -> Vec<(String, String)>,
) -> Vec<RankOutput> {
    let port = free_port();
    let children: Vec<Child> = (0..world)
        .map(|rank| {
            let mut cmd = Command::new(exe);
            cmd.args(args)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("LOCAL_WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("DDP_JOB_TOKEN", "test-token")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in extra(rank) {
                cmd.env(k, v);
            }
            cmd.spawn()
                .unwrap_or_else(|e| panic!("cannot start {exe}: {e}"))
        })
        .collect();
    let end = Instant::now() + deadline;
    let outputs: Vec<Output> = children
        .into_iter()
        .map(|mut child| {
            while Instant::now() < end {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            child
                .wait_with_output()
                .expect("collecting a rank's output")
        })
        .collect();
    outputs
        .into_iter()
        .enumerate()
        .map(|(rank, o)| RankOutput {
            rank,
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        })
        .collect()
}
