//! TCP connects ranks lazily: at world 4 and more, a gather, scatter, all-to-all or
//! point-to-point message may be the first time two ranks talk. A peer that is gone before that
//! connection is made must fail the collective within about a second, naming it, and not at the
//! (here 40 s) timeout:
//! - one that failed and reported it (a rank waiting for it to connect reads the report);
//! - one whose group was aborted (its listener refuses the connection with that reason);
//! - one whose group was dropped (its listener is closed: the connection is refused).
use crate::common::{Setup, run_world_with};
use ddp_comm::{ProcessGroup, Result, Store, StoreConfig, StoreServer};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(40);
/// Far below the timeout, far above the quarter second these take, for a busy machine.
const PROMPTLY: Duration = Duration::from_secs(20);
const REASON: &str = "backward failed: boom";

/// How the rank that goes away does it.
#[derive(Debug, Clone, Copy)]
enum Leave {
    /// `ProcessGroup::abort`, keeping its group (and so its listener) alive.
    Abort,
    /// Drops its group, as a process that ends does.
    Drop,
}

type Call = fn(&ProcessGroup) -> Result<()>;

fn scatter_from_0(pg: &ProcessGroup) -> Result<()> {
    let input = (pg.rank() == 0).then(|| vec![1.0f32; 4 * pg.world_size()]);
    let mut out = vec![0.0f32; 4];
    pg.scatter(input.as_deref(), &mut out, 0)
}

fn all_to_all(pg: &ProcessGroup) -> Result<()> {
    let mut out = vec![0i64; 4 * pg.world_size()];
    pg.all_to_all(&vec![1i64; 4 * pg.world_size()], &mut out)
}

/// Runs `call` on every rank but `gone`, which leaves first as `leave` says, and checks that
/// rank `witness` fails naming `gone` and saying `says`, promptly.
fn check(leave: Leave, gone: usize, call: Call, witness: usize, says: &str) {
    const N: usize = 4;
    let case = format!("rank {gone} leaves by {leave:?}; rank {witness} must say {says:?}");
    let (left, done) = (Barrier::new(N), Barrier::new(N));
    let start = Instant::now();
    let results = run_world_with(Setup::Tcp, N, TIMEOUT, |pg| {
        if pg.rank() == gone {
            match leave {
                Leave::Abort => {
                    pg.abort(REASON);
                    left.wait();
                    done.wait();
                }
                Leave::Drop => {
                    drop(pg);
                    left.wait();
                    done.wait();
                }
            }
            return Ok(None);
        }
        left.wait();
        let r = call(&pg).err().map(|e| e.to_string());
        done.wait();
        Ok(r)
    });
    let elapsed = start.elapsed();
    let err = results[witness]
        .as_ref()
        .unwrap_or_else(|e| panic!("{case}: the harness failed: {e}"))
        .clone()
        .unwrap_or_else(|| panic!("{case}: the collective succeeded"));
    assert!(
        err.contains(&format!("rank {gone}")) && err.contains(says),
        "{case}: {err}"
    );
    assert!(
        elapsed < PROMPTLY,
        "{case}: took {elapsed:?}, as if waiting for the {TIMEOUT:?} timeout ({err})"
    );
}

/// Rank 0, the root, waits for rank 2 (not its ring neighbour) to connect; rank 2 aborted and
/// reported why.
#[test]
fn a_root_waiting_for_a_rank_that_reported_a_failure_fails_with_its_report() {
    check(Leave::Abort, 2, scatter_from_0, 0, "boom");
}

/// Rank 3 connects to rank 1 (not its ring neighbour), whose group was aborted.
#[test]
fn a_rank_connecting_to_an_aborted_rank_is_refused_with_the_reason() {
    check(
        Leave::Abort,
        1,
        all_to_all,
        3,
        "refused us: its process group was aborted",
    );
}

/// Rank 3 connects to rank 1, whose group is gone.
#[test]
fn a_rank_connecting_to_a_rank_whose_group_is_gone_fails_at_once() {
    check(Leave::Drop, 1, all_to_all, 3, "no longer listening");
}

/// The store goes away (as when rank 0's process, which hosts it, freezes or dies) while rank
/// 0, the root of a scatter, waits for rank 2 to connect. Reading the peers' failure reports
/// must not hold that wait in a store call: an abort from another thread still ends it at
/// once, not after the store's (here 40 s) timeout.
#[test]
fn an_abort_ends_a_wait_for_a_connection_while_the_store_is_gone() {
    const N: usize = 4;
    let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new()).expect("bind the store");
    let addr = server.local_addr().to_string();
    let server = Mutex::new(Some(server));
    let (formed, store_gone, done) = (Barrier::new(N), Barrier::new(N), Barrier::new(N));
    let outcome = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..N)
            .map(|rank| {
                let (addr, server) = (addr.clone(), &server);
                let (formed, store_gone, done) = (&formed, &store_gone, &done);
                s.spawn(move || -> Result<Option<(String, Duration)>> {
                    let store = Store::connect(&addr, StoreConfig::new().with_timeout(TIMEOUT))?;
                    let config = Setup::Tcp.config(rank, N, TIMEOUT);
                    let pg = ProcessGroup::with_store(store, config)?;
                    formed.wait();
                    if rank == 0 {
                        drop(server.lock().unwrap_or_else(|e| e.into_inner()).take());
                    }
                    store_gone.wait();
                    let mut outcome = None;
                    if rank == 0 {
                        let aborter = pg.clone();
                        let start = Instant::now();
                        let abort = std::thread::spawn(move || {
                            std::thread::sleep(Duration::from_secs(1));
                            aborter.abort("stopped by the test");
                        });
                        let err = scatter_from_0(&pg).err().map(|e| e.to_string());
                        outcome = Some((err.unwrap_or_default(), start.elapsed()));
                        abort.join().expect("the aborting thread");
                    }
                    done.wait();
                    Ok(outcome)
                })
            })
            .collect();
        let mut outcomes: Vec<_> = ranks
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect();
        outcomes.swap_remove(0)
    });
    let (err, elapsed) = outcome
        .unwrap_or_else(|e| panic!("rank 0 failed outside the scatter: {e}"))
        .expect("rank 0's outcome");
    assert!(
        err.contains("abort"),
        "the scatter must fail aborted: {err:?}"
    );
    assert!(
        elapsed < PROMPTLY,
        "the abort took {elapsed:?}, as if a store call held the wait ({err})"
    );
}
