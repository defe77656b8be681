//! `ProcessGroup::abort`: a rank that gives up tells its peers why, and they fail within about
//! a second instead of waiting for the (here 60 s) timeout; the aborting rank's own calls fail
//! with the reason, including the one its communication thread is blocked in.
use crate::common::{Setup, run_world_with};
use ddp_comm::{CommError, ReduceOp};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(60);
const REASON: &str = "backward failed: boom";
/// How soon after the abort the peers' errors must arrive.
const PROMPT: Duration = Duration::from_secs(2);

fn assert_aborted_with_reason(r: ddp_comm::Result<impl std::fmt::Debug>, what: &str) {
    match r {
        Err(CommError::Aborted(msg)) => assert!(msg.contains("boom"), "{what}: {msg}"),
        other => panic!("{what}: expected Aborted with the reason, got {other:?}"),
    }
}

/// Rank 1 aborts while rank 0 is blocked in an all-reduce waiting for it.
#[test]
fn abort_fails_a_blocked_peer_promptly_with_the_reason() {
    for setup in [Setup::Shm, Setup::Tcp] {
        let aborted_at = OnceLock::new();
        let results = run_world_with(setup, 2, TIMEOUT, |pg| {
            let mut v = vec![1.0f32; 1000];
            if pg.rank() == 0 {
                let r = pg.all_reduce(&mut v, ReduceOp::Sum);
                return Ok((r.err().map(|e| e.to_string()), Instant::now()));
            }
            std::thread::sleep(Duration::from_millis(300));
            aborted_at.get_or_init(Instant::now);
            pg.abort(REASON);
            pg.abort("a second abort changes nothing");
            assert_aborted_with_reason(pg.all_reduce(&mut v, ReduceOp::Sum), "all_reduce");
            assert_aborted_with_reason(pg.barrier(), "barrier");
            assert_aborted_with_reason(pg.broadcast_async(v.clone(), 0).wait(), "async");
            assert_aborted_with_reason(pg.new_group(&[0, 1]), "new_group");
            Ok((None, Instant::now()))
        });
        let (err, failed_at) = results.into_iter().next().expect("rank 0").expect("rank 0");
        let err = err.unwrap_or_else(|| panic!("{setup:?}: rank 0's all_reduce must fail"));
        assert!(
            err.contains("rank 1") && err.contains("boom"),
            "{setup:?}: {err}"
        );
        let aborted_at = *aborted_at.get().expect("rank 1 aborted");
        let delay = failed_at.saturating_duration_since(aborted_at);
        assert!(
            delay < PROMPT,
            "{setup:?}: rank 0 failed {delay:?} after the abort"
        );
    }
}

/// Rank 1's communication thread is blocked in an all-reduce that waits for late ranks; another
/// thread of rank 1 aborts. The blocked call and one queued behind it fail with the reason at
/// once, long before the late ranks show up; they fail naming rank 1 and the reason.
///
/// Cases: over TCP, rank 1 waits (through the ring) for rank 0, which waits for late rank 2.
/// In shared memory with ranks 0 and 2 late, nothing but rank 1's own aborted slot can wake
/// its thread; with only rank 2 late, rank 0 (waiting for rank 2, not for rank 1) must notice
/// rank 1's aborted slot at once too.
#[test]
fn abort_from_another_thread_ends_this_ranks_blocked_collective() {
    const LATE: Duration = Duration::from_secs(4);
    for (setup, late) in [
        (Setup::Tcp, &[2][..]),
        (Setup::Shm, &[0, 2][..]),
        (Setup::Shm, &[2][..]),
    ] {
        let case = format!("{setup:?} with rank(s) {late:?} late");
        let aborted_at = OnceLock::new();
        let start = Instant::now();
        let results = run_world_with(setup, 3, TIMEOUT, |pg| {
            let mut v = vec![1.0f32; 1000];
            if late.contains(&pg.rank()) {
                std::thread::sleep(LATE);
            }
            if pg.rank() != 1 {
                let r = pg.all_reduce(&mut v, ReduceOp::Sum);
                return Ok((r.err().map(|e| e.to_string()), Instant::now()));
            }
            std::thread::scope(|s| {
                s.spawn(|| {
                    std::thread::sleep(Duration::from_millis(500));
                    aborted_at.get_or_init(Instant::now);
                    pg.abort(REASON);
                });
                // The first runs (and blocks) on the communication thread; the second queues.
                let running = pg.all_reduce_async(v.clone(), ReduceOp::Sum);
                assert_aborted_with_reason(pg.all_reduce(&mut v, ReduceOp::Sum), "queued");
                let ended = Instant::now();
                assert_aborted_with_reason(running.wait(), "running");
                Ok((None, ended))
            })
        });
        let aborted_at = *aborted_at.get().expect("rank 1 aborted");
        let results: Vec<_> = results
            .into_iter()
            .map(|r| r.expect("every rank returns"))
            .collect();
        let own = results[1].1.saturating_duration_since(aborted_at);
        assert!(own < PROMPT, "{case}: rank 1's blocked call took {own:?}");
        for rank in [0, 2] {
            let err = results[rank].0.as_deref().unwrap_or_else(|| {
                panic!("{case}: rank {rank}'s all_reduce must fail");
            });
            assert!(
                err.contains("rank 1") && err.contains("boom"),
                "{case} rank {rank}: {err}"
            );
        }
        if setup == Setup::Shm && !late.contains(&0) {
            let delay = results[0].1.saturating_duration_since(aborted_at);
            assert!(
                delay < PROMPT,
                "{case}: rank 0 failed {delay:?} after the abort"
            );
        }
        assert!(
            start.elapsed() < LATE + Duration::from_secs(10),
            "{case}: nobody waits for the timeout"
        );
    }
}

/// How a stand-in for rank 0's mesh port fails the rank that connects to it.
#[derive(Debug, Clone, Copy)]
enum Frozen {
    /// Its kernel accepts the connection, and nothing ever answers the hello.
    Hello,
    /// Its accept queue is full, so the kernel drops the SYNs: the connect itself hangs.
    Connect,
}

/// A listener that fails connections as `frozen` says, and the connections that fill its
/// accept queue (kept open for as long as it must stay full).
fn frozen_listener(frozen: Frozen) -> (std::net::TcpListener, Vec<std::net::TcpStream>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    let mut queued = Vec::new();
    if let Frozen::Connect = frozen {
        // Never accepted: once the queue is full a connect times out, and so will the rank's.
        while let Ok(s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
            queued.push(s);
            assert!(queued.len() < 10_000, "the accept queue never filled");
        }
    }
    (listener, queued)
}

/// Rank 2's send to rank 0 (not a ring neighbour, so connected on demand) is blocked inside the
/// connection: rank 0's address in the store names a stand-in that accepts and never answers
/// the hello, or whose SYNs are dropped. Another thread of rank 2 aborts: the send fails with
/// the reason at once, not when the group's timeout runs out. (The socket used to be
/// registered for abort only after the hello, and one connect attempt took the whole timeout.)
#[test]
fn abort_ends_a_collective_blocked_connecting_on_demand() {
    const SHORT_TIMEOUT: Duration = Duration::from_secs(30);
    for frozen in [Frozen::Hello, Frozen::Connect] {
        let (listener, _queued) = frozen_listener(frozen);
        let fake = listener.local_addr().expect("address").to_string();
        let aborted_at = OnceLock::new();
        let results = run_world_with(Setup::Tcp, 4, SHORT_TIMEOUT, |pg| {
            let store = pg.store();
            match pg.rank() {
                0 => {
                    // Where the other ranks look rank 0 up: rank 2 finds the stand-in there.
                    store.set("addr/0", fake.as_bytes())?;
                    store.set("faked", b"1")?;
                }
                2 => {
                    store.get("faked")?;
                    let sent = std::thread::scope(|s| {
                        s.spawn(|| {
                            std::thread::sleep(Duration::from_millis(500));
                            aborted_at.get_or_init(Instant::now);
                            pg.abort(REASON);
                        });
                        let r = pg.send(&[1.0f32; 4], 0, 7);
                        (r, Instant::now())
                    });
                    store.set("done", b"1")?;
                    return Ok(Some(sent));
                }
                _ => {}
            }
            // Longer than the timeout, so that a send that waits it out fails below, by name.
            store.get_timeout("done", SHORT_TIMEOUT * 2)?;
            Ok(None)
        });
        let mut results: Vec<_> = results
            .into_iter()
            .map(|r| r.expect("every rank returns"))
            .collect();
        let (sent, ended) = results.remove(2).expect("rank 2's send");
        assert_aborted_with_reason(sent, &format!("{frozen:?}: the blocked send"));
        let took = ended.saturating_duration_since(*aborted_at.get().expect("rank 2 aborted"));
        assert!(
            took < SHORT_TIMEOUT / 3,
            "{frozen:?}: the send ended {took:?} after the abort (timeout {SHORT_TIMEOUT:?})"
        );
    }
}
