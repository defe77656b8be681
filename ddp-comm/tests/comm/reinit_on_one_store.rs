//! Creating groups again over one long-lived store (PyTorch's `destroy_process_group` then
//! `init_process_group` over one `TCPStore`): each init meets afresh instead of reading the
//! keys of the one before (dead listeners' addresses, segment names, failure reports), and a
//! watchdog started again under the same name does not quote the old run's failure.
use crate::common::Setup;
use ddp_comm::watchdog::{CompletionProbe, Watchdog, WatchdogConfig};
use ddp_comm::{CommError, ProcessGroup, ReduceOp, Store, StoreConfig, StoreServer};
use std::sync::Arc;
use std::time::Duration;

/// Each group's timeout: long enough for a busy machine, short enough that a rendezvous that
/// went to the wrong keys fails as an error rather than a hang.
const TIMEOUT: Duration = Duration::from_secs(10);

fn server() -> StoreServer {
    StoreServer::bind("127.0.0.1:0", StoreConfig::new().with_timeout(TIMEOUT)).expect("bind store")
}

fn connect(addr: &str) -> Result<Store, CommError> {
    Store::connect(addr, StoreConfig::new().with_timeout(TIMEOUT))
}

/// Init number `round` of a world of `n` on the store at `addr`: each rank joins, all-reduces in
/// the world and in the subgroup of ranks 0 and 1, and drops its groups. Returns each rank's
/// sums.
fn one_init(addr: &str, setup: Setup, n: usize, round: usize) -> Vec<(i64, i64)> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                s.spawn(move || -> Result<(i64, i64), CommError> {
                    let pg =
                        ProcessGroup::with_store(connect(addr)?, setup.config(rank, n, TIMEOUT))?;
                    assert_eq!(pg.generation(), round as u64, "rank {rank}");
                    let mut v = vec![(rank + round) as i64; 4];
                    pg.all_reduce(&mut v, ReduceOp::Sum)?;
                    let pair = pg.new_group(&[0, 1])?;
                    let mut w = vec![(rank + 1) as i64; 2];
                    if let Some(pair) = &pair {
                        assert_eq!(pair.generation(), round as u64, "rank {rank}");
                        pair.all_reduce(&mut w, ReduceOp::Sum)?;
                    }
                    pg.barrier()?;
                    Ok((v[0], w[0]))
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| {
                h.join().expect("rank thread panicked").unwrap_or_else(|e| {
                    panic!("{setup:?}, world {n}, init #{round}: rank {rank} failed: {e}")
                })
            })
            .collect()
    })
}

#[test]
fn groups_created_again_on_the_same_store_meet_afresh() {
    for setup in [Setup::Tcp, Setup::Shm] {
        for n in [2, 3] {
            let server = server();
            let addr = server.local_addr().to_string();
            for round in 1..=3 {
                let sums = one_init(&addr, setup, n, round);
                let world: i64 = (0..n).map(|r| (r + round) as i64).sum();
                for (rank, &(v, w)) in sums.iter().enumerate() {
                    assert_eq!(v, world, "{setup:?}, world {n}, init #{round}, rank {rank}");
                    let pair = if rank < 2 { 3 } else { (rank + 1) as i64 };
                    assert_eq!(w, pair, "{setup:?}, world {n}, init #{round}, rank {rank}");
                }
            }
        }
    }
}

/// Rank 1 tries alone and fails (rank 0 never came); then both ranks init together and meet,
/// although rank 1 has tried once more than rank 0 on this store.
#[test]
fn a_rank_whose_init_failed_alone_meets_the_others_next_time() {
    let server = server();
    let addr = server.local_addr().to_string();
    let short = Duration::from_millis(300);
    let config = |rank, timeout| Setup::Tcp.config(rank, 2, timeout);
    let e = ProcessGroup::with_store(connect(&addr).expect("connect"), config(1, short))
        .expect_err("rank 0 never comes");
    assert_eq!(e.peer(), Some(0), "{e}");
    let sums = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let addr = &addr;
                s.spawn(move || -> Result<i32, CommError> {
                    let pg = ProcessGroup::with_store(connect(addr)?, config(rank, TIMEOUT))?;
                    assert_eq!(pg.generation(), 1, "rank {rank}: rank 0's first init");
                    let mut v = vec![rank as i32 + 1];
                    pg.all_reduce(&mut v, ReduceOp::Sum)?;
                    Ok(v[0])
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect::<Vec<_>>()
    });
    for (rank, sum) in sums.into_iter().enumerate() {
        assert_eq!(sum.unwrap_or_else(|e| panic!("rank {rank}: {e}")), 3);
    }
}

/// Rank 0 tries alone and fails (rank 1 never came), then tries again; rank 1, which never
/// tried, joins rank 0's second init (the newest), not the abandoned first: whether it comes
/// after rank 0 has begun its second init or before.
#[test]
fn a_rank_that_missed_an_abandoned_init_joins_the_newest() {
    let server = server();
    let addr = server.local_addr().to_string();
    let config = |rank, timeout| Setup::Tcp.config(rank, 2, timeout);
    let short = Duration::from_millis(300);
    let e = ProcessGroup::with_store(connect(&addr).expect("connect"), config(0, short))
        .expect_err("rank 1 never comes");
    assert_eq!(e.peer(), Some(1), "{e}");
    let sums = std::thread::scope(|s| {
        let addr = &addr;
        let join = |rank| -> Result<i32, CommError> {
            let pg = ProcessGroup::with_store(connect(addr)?, config(rank, TIMEOUT))?;
            assert_eq!(pg.generation(), 2, "rank {rank}: rank 0's second init");
            let mut v = vec![rank as i32 + 1];
            pg.all_reduce(&mut v, ReduceOp::Sum)?;
            Ok(v[0])
        };
        let rank0 = s.spawn(move || join(0));
        // Rank 1 starts once rank 0 has begun its second init (the key rank 0 sets for that).
        connect(addr)
            .and_then(|probe| probe.wait(&["pg/init/begun/2"], TIMEOUT))
            .expect("rank 0 begins its second init");
        let rank1 = s.spawn(move || join(1));
        [rank0, rank1].map(|h| h.join().expect("rank thread panicked"))
    });
    for (rank, sum) in sums.into_iter().enumerate() {
        assert_eq!(sum.unwrap_or_else(|e| panic!("rank {rank}: {e}")), 3);
    }
}

/// As above, with rank 1 arriving first: it finds rank 0's first init begun, but abandoned,
/// and waits for the next instead of joining it (where nobody would ever meet it).
#[test]
fn a_rank_arriving_before_rank_0_retries_does_not_join_the_abandoned_init() {
    let server = server();
    let addr = server.local_addr().to_string();
    let config = |rank, timeout| Setup::Tcp.config(rank, 2, timeout);
    let e = ProcessGroup::with_store(
        connect(&addr).expect("connect"),
        config(0, Duration::from_millis(300)),
    )
    .expect_err("rank 1 never comes");
    assert_eq!(e.peer(), Some(1), "{e}");
    let sums = std::thread::scope(|s| {
        let addr = &addr;
        let join = |rank| -> Result<(u64, i32), CommError> {
            let pg = ProcessGroup::with_store(connect(addr)?, config(rank, TIMEOUT))?;
            let mut v = vec![rank as i32 + 1];
            pg.all_reduce(&mut v, ReduceOp::Sum)?;
            Ok((pg.generation(), v[0]))
        };
        let rank1 = s.spawn(move || join(1));
        // Give rank 1 the head start that makes it read the store before rank 0's retry (the
        // outcome must be the same without it).
        std::thread::sleep(Duration::from_millis(300));
        let rank0 = s.spawn(move || join(0));
        [rank0, rank1].map(|h| h.join().expect("rank thread panicked"))
    });
    for (rank, outcome) in sums.into_iter().enumerate() {
        let outcome = outcome.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(outcome, (2, 3), "rank {rank}: (generation, sum)");
    }
}

/// The world grows from 2 to 3 between two inits on one store, and rank 2, new, arrives before
/// rank 0 begins the larger init: it waits for that one instead of joining the earlier world's,
/// which has no place for it.
#[test]
fn a_rank_the_world_grew_by_waits_for_the_larger_init() {
    let server = server();
    let addr = server.local_addr().to_string();
    for (rank, &(v, _)) in one_init(&addr, Setup::Tcp, 2, 1).iter().enumerate() {
        assert_eq!(v, 3, "world 2, rank {rank}");
    }
    let outcomes = std::thread::scope(|s| {
        let addr = &addr;
        let join = |rank| -> Result<(u64, i32), CommError> {
            let pg = ProcessGroup::with_store(connect(addr)?, Setup::Tcp.config(rank, 3, TIMEOUT))?;
            let mut v = vec![rank as i32 + 1];
            pg.all_reduce(&mut v, ReduceOp::Sum)?;
            Ok((pg.generation(), v[0]))
        };
        let rank2 = s.spawn(move || join(2));
        // Rank 2 reads the store before rank 0 begins the second init (the outcome must be the
        // same without this head start).
        std::thread::sleep(Duration::from_millis(300));
        let rank0 = s.spawn(move || join(0));
        let rank1 = s.spawn(move || join(1));
        [rank0, rank1, rank2].map(|h| h.join().expect("rank thread panicked"))
    });
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let outcome = outcome.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(outcome, (2, 6), "rank {rank}: (generation, sum)");
    }
}

fn never() -> Arc<dyn CompletionProbe> {
    Arc::new(|| Ok(false))
}

/// Two runs of a two-rank watchdog group under one name on one store: rank 0 fails each run
/// with its own reason; rank 1's watchdog in the second run quotes the second reason, not the
/// first run's (which its store still holds).
#[test]
fn a_watchdog_started_again_under_the_same_name_quotes_only_its_own_runs_failure() {
    let server = server();
    let addr = server.local_addr().to_string();
    let store = |_| connect(&addr).expect("connect");
    let config = |rank| {
        WatchdogConfig::new("again", rank, 2, Duration::from_secs(60))
            .with_peer_check_interval(Duration::from_millis(20))
            .with_publish_interval(Duration::from_millis(20))
    };
    for (run, why) in [(1, "the first run's error"), (2, "the second run's error")] {
        let wd0 = Watchdog::start(&store(0), config(0), Box::new(|| {}), None).expect("rank 0");
        let wd1 = Watchdog::start(&store(1), config(1), Box::new(|| {}), None).expect("rank 1");
        assert_eq!((wd0.generation(), wd1.generation()), (run, run));
        let stuck = wd1
            .issue(
                ddp_comm::watchdog::CollectiveLabel::new("all_reduce"),
                8,
                never(),
            )
            .expect("issue");
        let _ = wd0.fail(why);
        let e = stuck.wait().expect_err("rank 0 failed the group");
        let msg = e.to_string();
        assert!(
            msg.contains(why),
            "run {run}: rank 1 quotes another failure: {msg}"
        );
    }
}
