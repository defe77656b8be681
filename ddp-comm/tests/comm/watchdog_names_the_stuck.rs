//! The collective watchdog (the supervision NCCL groups run under), with CPU work items: a
//! collective that never finishes fails within the timeout plus about a second, the abort
//! callback runs once, and the error names the stuck collective and the ranks behind it.
//! Ranks are threads sharing one store; every wait is bounded by the harness, so a broken
//! watchdog fails the test instead of hanging it.
use ddp_comm::watchdog::{
    AbortFn, AsyncErrorProbe, CollectiveLabel, CompletionProbe, Watchdog, WatchdogCause,
    WatchdogConfig,
};
use ddp_comm::{CommError, Store, StoreConfig, StoreServer};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

/// Longest any single test step may take before the test fails instead of hanging.
const HARNESS_LIMIT: Duration = Duration::from_secs(15);

fn server() -> StoreServer {
    StoreServer::bind(
        "127.0.0.1:0",
        StoreConfig::new().with_timeout(Duration::from_secs(10)),
    )
    .expect("bind a store")
}

fn connect(server: &StoreServer) -> Store {
    Store::connect(
        &server.local_addr().to_string(),
        StoreConfig::new().with_timeout(Duration::from_secs(10)),
    )
    .expect("connect to the store")
}

/// An abort callback that counts its calls.
fn counting_abort() -> (AbortFn, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    (
        Box::new(move || {
            c.fetch_add(1, Ordering::SeqCst);
        }),
        count,
    )
}

fn start(
    store: &Store,
    rank: usize,
    world: usize,
    timeout: Duration,
    abort: AbortFn,
    async_error: Option<AsyncErrorProbe>,
) -> Watchdog {
    let config = WatchdogConfig::new("test", rank, world, timeout)
        .with_publish_interval(Duration::from_millis(20));
    Watchdog::start(store, config, abort, async_error).expect("start the watchdog")
}

fn done() -> Arc<dyn CompletionProbe> {
    Arc::new(|| Ok(true))
}

fn never() -> Arc<dyn CompletionProbe> {
    Arc::new(|| Ok(false))
}

/// Runs `f` on a thread and returns its result, failing the test if it takes longer than
/// [`HARNESS_LIMIT`] (the thread is left behind; the test has failed anyway).
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(HARNESS_LIMIT)
        .unwrap_or_else(|_| panic!("{what} did not return within {HARNESS_LIMIT:?}"))
}

fn watchdog_failure(e: &CommError) -> &ddp_comm::watchdog::WatchdogFailure {
    match e {
        CommError::Watchdog(f) => f,
        other => panic!("expected a watchdog failure, got {other:?}"),
    }
}

/// Rank 1 issues two collectives and stops; rank 0 issues a third that never completes. Rank 0
/// names rank 1 as behind, and rank 1 (alive, "stuck in compute") learns of rank 0's failure
/// through the store and aborts too, naming rank 0's error.
#[test]
fn should_name_the_rank_that_never_issued_the_stuck_collective() {
    let server = server();
    let timeout = Duration::from_millis(500);
    let (store0, store1) = (connect(&server), connect(&server));
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let rank1 = std::thread::spawn(move || {
        let (abort, aborts) = counting_abort();
        let wd = start(&store1, 1, 2, timeout, abort, None);
        for _ in 0..2 {
            wd.issue(CollectiveLabel::new("all_reduce"), 64, done())
                .expect("issue")
                .wait()
                .expect("a completing item");
        }
        ready_tx.send(()).expect("tell rank 0");
        // Rank 1 is "stuck in compute": alive, but it issues nothing more.
        let deadline = Instant::now() + HARNESS_LIMIT * 2;
        while wd.check().is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        (
            aborts.load(Ordering::SeqCst),
            wd.check().map_err(|e| e.to_string()),
        )
    });
    ready_rx.recv_timeout(HARNESS_LIMIT).expect("rank 1 ready");

    let (abort, aborts) = counting_abort();
    let wd = Arc::new(start(&store0, 0, 2, timeout, abort, None));
    for _ in 0..2 {
        wd.issue(CollectiveLabel::new("all_reduce"), 64, done())
            .expect("issue")
            .wait()
            .expect("a completing item");
    }
    let stuck = wd
        .issue(
            CollectiveLabel::new("all_reduce").with_bucket(3),
            4096,
            never(),
        )
        .expect("issue the stuck collective");
    assert_eq!(stuck.seq(), 3);
    let issued_at = Instant::now();
    let result = bounded("waiting for the stuck collective", move || stuck.wait());
    let waited = issued_at.elapsed();
    let e = result.expect_err("a collective that never completes must fail");
    // Detection, then up to a second reading the peers' reports: a wide margin on a busy
    // machine, still far below any wait the group would otherwise do.
    assert!(
        waited < timeout + Duration::from_secs(5),
        "the error came {waited:?} after the collective, more than the timeout + 5 s"
    );
    assert_eq!(aborts.load(Ordering::SeqCst), 1, "abort runs exactly once");
    let f = watchdog_failure(&e);
    assert_eq!(f.ranks_behind(), vec![1], "{e}");
    assert_eq!(f.cause, WatchdogCause::Timeout(timeout));
    // The old name still compiles, deprecated, for one release.
    #[allow(deprecated)]
    let old: &ddp_comm::watchdog::FailureCause = &f.cause;
    assert_eq!(old, &WatchdogCause::Timeout(timeout));
    let s = f.stuck.as_ref().expect("the stuck collective");
    assert_eq!(
        (s.seq, s.label.op, s.label.bucket, s.bytes),
        (3, "all_reduce", Some(3), 4096)
    );
    let msg = e.to_string();
    for part in [
        "all_reduce #3 (bucket 3, 4096 bytes)",
        "rank 1 (issued up to #2)",
        "never issued #3",
    ] {
        assert!(msg.contains(part), "missing '{part}' in: {msg}");
    }
    // Every later call gets the same error, and abort is not called again.
    let later = wd
        .issue(CollectiveLabel::new("broadcast"), 8, done())
        .expect_err("a failed group refuses new work");
    assert_eq!(later.to_string(), msg);
    assert!(wd.check().is_err());
    assert_eq!(aborts.load(Ordering::SeqCst), 1, "abort runs exactly once");
    let (rank1_aborts, rank1_error) = rank1.join().expect("rank 1");
    let rank1_error = rank1_error.expect_err("rank 1 learns that rank 0 failed the group");
    assert_eq!(rank1_aborts, 1, "rank 1 aborts its communicator too");
    assert!(
        rank1_error.contains("another rank failed the group [group 'test' rank 0: all_reduce #3"),
        "{rank1_error}"
    );
}

/// Both ranks issue the collective and neither finishes: not a straggler, a transport failure.
#[test]
fn should_blame_the_network_when_every_rank_issued_and_none_finished() {
    let server = server();
    let timeout = Duration::from_millis(300);
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let store = connect(&server);
            std::thread::spawn(move || {
                let (abort, aborts) = counting_abort();
                let wd = start(&store, rank, 2, timeout, abort, None);
                let work = wd
                    .issue(
                        CollectiveLabel::new("all_reduce").with_bucket(0),
                        128,
                        never(),
                    )
                    .expect("issue");
                let r = bounded("waiting", move || work.wait());
                (r.map_err(|e| e.to_string()), aborts.load(Ordering::SeqCst))
            })
        })
        .collect();
    for h in handles {
        let (r, aborts) = h.join().expect("rank thread");
        let msg = r.expect_err("nothing completes");
        assert!(
            msg.contains("Every rank issued #1 and none finished it"),
            "{msg}"
        );
        assert_eq!(aborts, 1);
    }
}

/// A probe that reports an error fails the group at once, long before the timeout.
#[test]
fn should_fail_promptly_when_an_item_reports_an_error() {
    let server = server();
    let store = connect(&server);
    let (abort, aborts) = counting_abort();
    let wd = start(&store, 0, 1, Duration::from_secs(60), abort, None);
    let probe: Arc<dyn CompletionProbe> = Arc::new(|| Err("event query: illegal address".into()));
    let work = wd
        .issue(CollectiveLabel::new("all_gather"), 32, probe)
        .expect("issue");
    let e = bounded("waiting for the failed item", move || work.wait()).expect_err("it failed");
    let msg = e.to_string();
    assert!(msg.contains("all_gather #1 (32 bytes) failed"), "{msg}");
    assert!(msg.contains("illegal address"), "{msg}");
    assert_eq!(aborts.load(Ordering::SeqCst), 1);
}

/// Items that complete give no error, and the published sequence numbers follow them.
#[test]
fn should_publish_advancing_progress_while_items_complete() {
    let server = server();
    let store = connect(&server);
    let (abort, aborts) = counting_abort();
    let wd = start(&store, 0, 1, Duration::from_secs(60), abort, None);
    let key = "watchdog/test/0";
    for n in 1..=3u64 {
        let finished = Arc::new(AtomicBool::new(false));
        let f = finished.clone();
        let probe: Arc<dyn CompletionProbe> = Arc::new(move || Ok(f.load(Ordering::SeqCst)));
        let work = wd
            .issue(
                CollectiveLabel::new("all_reduce").with_bucket(n as usize),
                8,
                probe,
            )
            .expect("issue");
        wait_for_value(&store, key, format!("{n} {}", n - 1));
        assert!(!work.is_completed());
        finished.store(true, Ordering::SeqCst);
        bounded("waiting", move || work.wait()).expect("a completing item");
        wait_for_value(&store, key, format!("{n} {n}"));
    }
    assert_eq!((wd.last_issued(), wd.last_completed()), (3, 3));
    assert!(wd.check().is_ok());
    assert_eq!(aborts.load(Ordering::SeqCst), 0);
}

/// Polls the store until `key` holds `want`.
fn wait_for_value(store: &Store, key: &str, want: String) {
    let deadline = Instant::now() + HARNESS_LIMIT;
    let mut last = None;
    while Instant::now() < deadline {
        if store.check(&[key]).expect("check") {
            let got = String::from_utf8(store.get(key).expect("get")).expect("text");
            if got == want {
                return;
            }
            last = Some(got);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("store key {key} holds {last:?}, expected '{want}'");
}

/// The communicator-wide async-error probe fails the group and aborts, with items in flight.
#[test]
fn should_abort_and_fail_when_the_async_error_probe_fires() {
    let server = server();
    let store = connect(&server);
    let (abort, aborts) = counting_abort();
    let broken = Arc::new(AtomicBool::new(false));
    let b = broken.clone();
    let probe: AsyncErrorProbe = Box::new(move || {
        if b.load(Ordering::SeqCst) {
            Err("ncclRemoteError: a peer failed".into())
        } else {
            Ok(())
        }
    });
    let wd = start(&store, 0, 1, Duration::from_secs(60), abort, Some(probe));
    let work = wd
        .issue(
            CollectiveLabel::new("all_reduce").with_bucket(2),
            16,
            never(),
        )
        .expect("issue");
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        aborts.load(Ordering::SeqCst),
        0,
        "no abort before the error"
    );
    broken.store(true, Ordering::SeqCst);
    let e = bounded("waiting", move || work.wait()).expect_err("the communicator failed");
    let msg = e.to_string();
    assert!(msg.contains("ncclRemoteError: a peer failed"), "{msg}");
    assert!(msg.contains("all_reduce #1 (bucket 2, 16 bytes)"), "{msg}");
    assert_eq!(aborts.load(Ordering::SeqCst), 1);
    assert!(matches!(
        watchdog_failure(&e).cause,
        WatchdogCause::AsyncError(_)
    ));
}

/// A failing item is the one the error names, even while an older one is still running.
#[test]
fn should_name_the_failed_item_rather_than_the_oldest_in_flight() {
    let server = server();
    let store = connect(&server);
    let (abort, aborts) = counting_abort();
    let wd = start(&store, 0, 1, Duration::from_secs(60), abort, None);
    let older = wd
        .issue(
            CollectiveLabel::new("all_reduce").with_bucket(0),
            8,
            never(),
        )
        .expect("issue");
    let failing: Arc<dyn CompletionProbe> = Arc::new(|| Err("event query failed".into()));
    let newer = wd
        .issue(
            CollectiveLabel::new("all_reduce").with_bucket(1),
            16,
            failing,
        )
        .expect("issue");
    let e = bounded("waiting", move || older.wait()).expect_err("the group failed");
    let s = watchdog_failure(&e).stuck.clone().expect("the failed item");
    assert_eq!((s.seq, s.label.bucket, s.bytes), (2, Some(1), 16), "{e}");
    assert_eq!(newer.wait().expect_err("failed").to_string(), e.to_string());
    assert_eq!(aborts.load(Ordering::SeqCst), 1);
}

/// What `synchronize` and dropping an NCCL group rely on: waiting for everything in flight
/// ends at the latest with the watchdog's error, never a hang.
#[test]
fn should_end_a_wait_for_idle_with_the_timeout_error() {
    let server = server();
    let store = connect(&server);
    let (abort, aborts) = counting_abort();
    let wd = Arc::new(start(&store, 0, 1, Duration::from_millis(200), abort, None));
    wd.issue(CollectiveLabel::new("all_reduce"), 8, done())
        .expect("issue")
        .wait()
        .expect("done");
    let stuck = wd
        .issue(CollectiveLabel::new("broadcast"), 8, never())
        .expect("issue");
    let w = wd.clone();
    let e = bounded("wait_idle", move || w.wait_idle()).expect_err("the stuck item times out");
    assert!(
        e.to_string()
            .contains("broadcast #2 (8 bytes) did not finish"),
        "{e}"
    );
    assert_eq!(aborts.load(Ordering::SeqCst), 1);
    assert!(
        stuck.is_completed(),
        "a failed group has nothing left to wait for"
    );
}

/// Waiters of a dropped watchdog get an error instead of waiting forever.
#[test]
fn should_release_waiters_when_the_watchdog_is_dropped() {
    let server = server();
    let store = connect(&server);
    let (abort, aborts) = counting_abort();
    let wd = start(&store, 0, 1, Duration::from_secs(60), abort, None);
    let work = wd
        .issue(CollectiveLabel::new("all_reduce"), 8, never())
        .expect("issue");
    drop(wd);
    let r = bounded("waiting after the drop", move || work.wait());
    assert!(matches!(r, Err(CommError::Destroyed)), "{r:?}");
    assert_eq!(
        aborts.load(Ordering::SeqCst),
        0,
        "dropping is not a failure"
    );
}

/// An abort callback that raises `flag`, as `ncclCommAbort` makes the kernels of unfinished
/// collectives exit (their end events then complete, with garbage in the buffers).
fn flagging_abort() -> (AbortFn, Arc<AtomicBool>) {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    (Box::new(move || f.store(true, Ordering::SeqCst)), flag)
}

/// Waits (bounded) until `flag` is raised.
fn until_raised(flag: &AtomicBool) {
    let deadline = Instant::now() + HARNESS_LIMIT;
    while !flag.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The group fails (another thread's error) while the polling thread is inside a probe; the
/// abort makes the item look finished. That completion is the abort's, not the collective's:
/// the waiter must get the failure, never `Ok` over garbage.
#[test]
fn should_not_trust_a_completion_polled_after_the_abort() {
    let server = server();
    let store = connect(&server);
    let (raise, aborted) = flagging_abort();
    // ncclCommAbort takes a while to return: the kernels have exited (the event completes)
    // well before the failure is recorded.
    let abort: AbortFn = Box::new(move || {
        raise();
        std::thread::sleep(Duration::from_millis(200));
    });
    let wd = Arc::new(start(&store, 0, 1, Duration::from_secs(60), abort, None));
    let (fail_now, fail_requested) = mpsc::channel::<()>();
    let failer_wd = wd.clone();
    let failer = std::thread::spawn(move || {
        fail_requested
            .recv_timeout(HARNESS_LIMIT)
            .expect("the probe was polled");
        failer_wd.fail("CUDA_ERROR_LAUNCH_FAILED in another job")
    });
    let probe_aborted = aborted.clone();
    let probe: Arc<dyn CompletionProbe> = Arc::new(move || {
        // First poll: have the group fail now, and "finish" once the abort has run.
        let _ = fail_now.send(());
        until_raised(&probe_aborted);
        Ok(probe_aborted.load(Ordering::SeqCst))
    });
    let work = wd
        .issue(CollectiveLabel::new("all_reduce").with_bucket(4), 64, probe)
        .expect("issue");
    let r = bounded("waiting", move || work.wait());
    let e = r.expect_err("a completion seen only after the abort is not a result");
    assert!(aborted.load(Ordering::SeqCst), "the abort ran");
    let msg = e.to_string();
    assert!(msg.contains("CUDA_ERROR_LAUNCH_FAILED"), "{msg}");
    assert_eq!(failer.join().expect("failer").to_string(), msg);
    assert_eq!(wd.last_completed(), 0, "nothing completed: {msg}");
}

/// `finish_observed` (a waiter that saw the end event itself, as `NcclWork::wait` does):
/// trusted before any failure, refused after the group started failing.
#[test]
fn should_trust_a_completion_the_waiter_saw_only_before_a_failure() {
    let server = server();
    let store = connect(&server);
    let (abort, aborted) = flagging_abort();
    let wd = start(&store, 0, 1, Duration::from_secs(60), abort, None);
    let first = wd
        .issue(CollectiveLabel::new("all_reduce"), 8, never())
        .expect("issue");
    first
        .finish_observed()
        .expect("a healthy group trusts the waiter");
    assert_eq!(wd.last_completed(), 1);
    let wd = Arc::new(wd);
    let w = wd.clone();
    let (r, e) = bounded("failing the group", move || {
        w.wait_idle().expect("nothing in flight");
        let second = w
            .issue(
                CollectiveLabel::new("all_reduce").with_bucket(1),
                8,
                never(),
            )
            .expect("issue");
        let e = w.fail("CUDA_ERROR_ILLEGAL_ADDRESS");
        // The abort ended the collective; its event now reads complete.
        (
            second.finish_observed().map_err(|e| e.to_string()),
            e.to_string(),
        )
    });
    assert_eq!(r.expect_err("seen after the failure began"), e);
    assert_eq!(
        wd.last_completed(),
        1,
        "the aborted collective is not counted as completed"
    );
    assert!(aborted.load(Ordering::SeqCst));
}

/// An error on this rank (the caller's, e.g. out of memory staging a buffer) names no peer as
/// behind, even when a peer has published less progress: the peers are waiting for this rank.
#[test]
fn should_blame_no_peer_for_this_ranks_own_error() {
    let server = server();
    let (store0, store1) = (connect(&server), connect(&server));
    let (abort1, _) = counting_abort();
    // Rank 1 publishes that it issued and completed nothing yet.
    let rank1 = start(&store1, 1, 2, Duration::from_secs(60), abort1, None);
    wait_for_value(&store1, "watchdog/test/1", "0 0".into());
    let (abort, aborts) = counting_abort();
    let wd = start(&store0, 0, 2, Duration::from_secs(60), abort, None);
    let _in_flight = wd
        .issue(
            CollectiveLabel::new("all_reduce").with_bucket(0),
            8,
            never(),
        )
        .expect("issue");
    let e = wd.fail("CUDA_ERROR_OUT_OF_MEMORY staging a buffer");
    let f = watchdog_failure(&e);
    assert!(f.ranks_behind().is_empty(), "{e}");
    assert_eq!(f.stuck, None, "{e}");
    let msg = f.to_string();
    assert!(
        msg.starts_with("group 'test' rank 0: failed: CUDA_ERROR_OUT_OF_MEMORY staging a buffer;"),
        "{msg}"
    );
    assert!(msg.contains("The error arose on this rank"), "{msg}");
    assert!(!msg.contains("Behind"), "{msg}");
    assert_eq!(aborts.load(Ordering::SeqCst), 1);
    drop(rank1);
}

/// A rank's own error reaches its peers through the store: their collectives in flight fail
/// within the peer check interval (not their timeout), quoting the failing rank's error.
#[test]
fn should_fail_the_peers_promptly_quoting_the_failing_rank() {
    let server = server();
    let (store0, store1) = (connect(&server), connect(&server));
    let config = |rank| {
        WatchdogConfig::new("peers", rank, 2, Duration::from_secs(60))
            .with_peer_check_interval(Duration::from_millis(50))
    };
    let (abort0, _) = counting_abort();
    let wd0 = Watchdog::start(&store0, config(0), abort0, None).expect("rank 0");
    let (abort1, aborts1) = counting_abort();
    let wd1 = Watchdog::start(&store1, config(1), abort1, None).expect("rank 1");
    let in_flight = wd1
        .issue(
            CollectiveLabel::new("all_reduce").with_bucket(2),
            32,
            never(),
        )
        .expect("issue");
    let origin = wd0.fail("CUDA_ERROR_OUT_OF_MEMORY staging a buffer");
    let e = bounded("rank 1's collective", move || in_flight.wait())
        .expect_err("rank 0 failed the group");
    let f = watchdog_failure(&e);
    assert!(matches!(&f.cause, WatchdogCause::PeerFailed(_)), "{e}");
    assert!(f.ranks_behind().is_empty(), "{e}");
    let msg = f.to_string();
    let quoted = format!(
        "when another rank failed the group [{}]",
        watchdog_failure(&origin).headline()
    );
    for part in [
        "group 'peers' rank 1: all_reduce #1 (bucket 2, 32 bytes) was in flight",
        quoted.as_str(),
        "[group 'peers' rank 0: failed: CUDA_ERROR_OUT_OF_MEMORY staging a buffer]",
    ] {
        assert!(msg.contains(part), "missing '{part}' in: {msg}");
    }
    assert_eq!(aborts1.load(Ordering::SeqCst), 1);
}

/// When two ranks fail on their own, the first one's reason is the one the store keeps (and
/// every other rank quotes).
#[test]
fn should_keep_the_first_failing_ranks_reason() {
    let server = server();
    let (store0, store1) = (connect(&server), connect(&server));
    // Rank 1 does not look for peers' failures here: it fails on its own, after rank 0.
    let config = |rank| {
        WatchdogConfig::new("first", rank, 2, Duration::from_secs(60))
            .with_peer_check_interval(Duration::from_secs(60))
    };
    let (abort0, _) = counting_abort();
    let wd0 = Watchdog::start(&store0, config(0), abort0, None).expect("rank 0");
    let (abort1, _) = counting_abort();
    let wd1 = Watchdog::start(&store1, config(1), abort1, None).expect("rank 1");
    let first = wd0.fail("the first error");
    let key = "watchdog/first/failed";
    let want = watchdog_failure(&first).headline();
    wait_for_value(&store0, key, want.clone());
    let second = wd1.fail("the second error");
    assert!(second.to_string().contains("the second error"), "{second}");
    // (Rank 1's store thread handled its publication before the report `fail` waited for.)
    let stored = String::from_utf8(store0.get(key).expect("get")).expect("text");
    assert_eq!(stored, want, "the first failing rank's reason stays");
}

/// The failure report reads every rank's progress in chunks of 1,024 ranks (one `multi_get`
/// each): in a world of 2,051 ranks, ranks on both sides of every chunk boundary are read, and
/// the ranks that never published are named as behind along with those that published less.
#[test]
fn should_name_every_rank_behind_across_chunks_including_those_that_never_published() {
    const WORLD: usize = 2 * 1024 + 3;
    let server = server();
    let store = connect(&server);
    // Published: rank 2 and ranks on either side of the chunk boundaries issued #1; rank 7
    // issued nothing yet. Every other rank never published.
    let ahead = [2, 1024, 2047, 2048, 2050];
    for r in ahead {
        store
            .set(&format!("watchdog/wide/{r}"), b"1 0")
            .expect("set");
    }
    store.set("watchdog/wide/7", b"0 0").expect("set");
    let timeout = Duration::from_millis(300);
    let (abort, aborts) = counting_abort();
    let config = WatchdogConfig::new("wide", 0, WORLD, timeout)
        .with_publish_interval(Duration::from_millis(20));
    let wd = Watchdog::start(&store, config, abort, None).expect("start the watchdog");
    let stuck = wd
        .issue(CollectiveLabel::new("all_reduce"), 8, never())
        .expect("issue");
    let e = bounded("waiting for the stuck collective", move || stuck.wait())
        .expect_err("a collective that never completes must fail");
    let f = watchdog_failure(&e);
    assert_eq!(f.cause, WatchdogCause::Timeout(timeout));
    let want: Vec<usize> = (1..WORLD).filter(|r| !ahead.contains(r)).collect();
    let behind = f.ranks_behind();
    assert_eq!(behind.len(), want.len(), "{}", f.headline());
    assert_eq!(behind, want);
    let msg = e.to_string();
    for part in [
        "Behind: rank 1 (never issued a collective), rank 3 (never issued a collective)",
        "rank 7 (issued up to #0)",
        "rank 1023 (never issued a collective), rank 1025 (never issued a collective)",
        "rank 2046 (never issued a collective), rank 2049 (never issued a collective) never issued #1",
    ] {
        assert!(msg.contains(part), "missing '{part}' in the report");
    }
    assert_eq!(aborts.load(Ordering::SeqCst), 1);
}

/// A probe that never returns (a CUDA event query in a hung driver) holds the polling thread,
/// which checks every timeout: without the stall checker the wait below never ends (the timeout
/// is an hour). The checker fails the group instead, naming the collective whose probe hangs
/// and blaming no peer, the abort runs once, and dropping the watchdog leaves the stuck thread
/// behind rather than waiting for it.
#[test]
fn should_fail_the_group_when_a_probe_never_returns() {
    let server = server();
    let store = connect(&server);
    let (abort, aborts) = counting_abort();
    let config = WatchdogConfig::new("test", 0, 1, Duration::from_secs(3600))
        .with_publish_interval(Duration::from_millis(20))
        .with_stall_limit(Duration::from_millis(300));
    let watchdog = Watchdog::start(&store, config, abort, None).expect("start the watchdog");
    let (release, held) = mpsc::channel::<()>();
    let held = std::sync::Mutex::new(held);
    let hangs: Arc<dyn CompletionProbe> = Arc::new(move || {
        // Returns only when the test ends (`release` dropped).
        let _ = held.lock().map(|rx| rx.recv());
        Ok(true)
    });
    let work = watchdog
        .issue(
            CollectiveLabel::new("all_reduce").with_bucket(2),
            256,
            hangs,
        )
        .expect("issue");
    let e = bounded("waiting on a collective whose probe hangs", move || {
        work.wait()
    })
    .expect_err("a probe that never returns must fail the group");
    let failure = watchdog_failure(&e);
    assert!(
        matches!(failure.cause, WatchdogCause::Stalled { .. }),
        "{failure:?}"
    );
    assert_eq!(failure.stuck.as_ref().map(|s| s.seq), Some(1));
    assert!(failure.ranks_behind().is_empty(), "{failure:?}");
    let text = e.to_string();
    assert!(
        text.contains("completion probe of collective #1") && text.contains("arose on this rank"),
        "{text}"
    );
    assert_eq!(aborts.load(Ordering::SeqCst), 1, "abort runs exactly once");
    bounded(
        "dropping a watchdog whose polling thread is stuck",
        move || drop(watchdog),
    );
    drop(release);
}

/// Settings with a quick heartbeat: a peer silent for half a second is dead, and `timeout`
/// applies to collectives.
fn heartbeat_config(rank: usize, timeout: Duration) -> WatchdogConfig {
    WatchdogConfig::new("test", rank, 2, timeout)
        .with_publish_interval(Duration::from_millis(20))
        .with_heartbeat_interval(Duration::from_millis(50))
        .with_silence_limit(Duration::from_millis(500))
}

/// Rank 1's process "dies" after one collective (its watchdog and store thread stop, and with
/// them its heartbeat); rank 0 then waits on a collective that can never finish. With an hour's
/// timeout, only the heartbeat can end that wait: rank 0 names rank 1 as silent.
#[test]
fn should_name_a_peer_whose_heartbeat_stopped_long_before_the_timeout() {
    let server = server();
    let (store0, store1) = (connect(&server), connect(&server));
    let hour = Duration::from_secs(3600);
    let (abort1, _) = counting_abort();
    let rank1 = Watchdog::start(&store1, heartbeat_config(1, hour), abort1, None)
        .expect("start rank 1's watchdog");
    let (abort0, aborts0) = counting_abort();
    let rank0 = Watchdog::start(&store0, heartbeat_config(0, hour), abort0, None)
        .expect("start rank 0's watchdog");
    for wd in [&rank0, &rank1] {
        wd.issue(CollectiveLabel::new("all_reduce"), 64, done())
            .expect("issue")
            .wait()
            .expect("a completing item");
    }
    drop(rank1);
    let stuck = rank0
        .issue(
            CollectiveLabel::new("all_reduce").with_bucket(1),
            4096,
            never(),
        )
        .expect("issue the stuck collective");
    let e = bounded("waiting on a collective whose peer died", move || {
        stuck.wait()
    })
    .expect_err("a collective whose peer died must fail");
    let failure = watchdog_failure(&e);
    match &failure.cause {
        WatchdogCause::PeerSilent { ranks, silent_for } => {
            assert_eq!(ranks, &[1], "{failure:?}");
            assert!(*silent_for >= Duration::from_millis(500), "{failure:?}");
        }
        other => panic!("expected a silent peer, got {other:?}"),
    }
    assert_eq!(failure.stuck.as_ref().map(|s| s.seq), Some(2));
    let text = e.to_string();
    assert!(
        text.contains("rank(s) [1] had published no heartbeat")
            && text.contains("died, froze or left the group"),
        "{text}"
    );
    assert_eq!(aborts0.load(Ordering::SeqCst), 1, "abort runs exactly once");
}

/// Rank 1 is alive but issues nothing more (stuck in compute): its store thread keeps beating,
/// so rank 0 is not misled by a silence limit shorter than its timeout and fails on the
/// timeout, naming rank 1 as behind.
#[test]
fn should_not_take_a_live_peer_that_issues_nothing_for_a_dead_one() {
    let server = server();
    let (store0, store1) = (connect(&server), connect(&server));
    // A silence limit of 40 beats, shorter than the timeout: a busy machine may hold rank 1's
    // store thread off for a while, but not for two seconds on end.
    let timeout = Duration::from_secs(4);
    let config = |rank| heartbeat_config(rank, timeout).with_silence_limit(Duration::from_secs(2));
    let (abort1, _) = counting_abort();
    let rank1 = Watchdog::start(&store1, config(1), abort1, None).expect("start rank 1's watchdog");
    let (abort0, _) = counting_abort();
    let rank0 = Watchdog::start(&store0, config(0), abort0, None).expect("start rank 0's watchdog");
    let stuck = rank0
        .issue(CollectiveLabel::new("all_reduce"), 64, never())
        .expect("issue");
    let e = bounded(
        "waiting on a collective a live peer never issues",
        move || stuck.wait(),
    )
    .expect_err("the collective must time out");
    let failure = watchdog_failure(&e);
    assert!(
        matches!(failure.cause, WatchdogCause::Timeout(_)),
        "{failure:?}"
    );
    assert_eq!(failure.ranks_behind(), vec![1], "{failure:?}");
    drop(rank1);
}
