//! Failures end in errors that name the rank at fault, within the timeout, never a hang: over
//! TCP, over shared memory, and (where the world is large enough) across two pretend hosts.
use crate::common::{Setup, run_world, run_world_with};
use ddp_comm::{CommError, ProcessGroup, ReduceOp, Store, StoreConfig};
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

const BOTH: [Setup; 2] = [Setup::Tcp, Setup::Shm];

/// The collective timeout of the tests that must fail without waiting for it.
const PATIENCE: Duration = Duration::from_secs(120);
/// Their bound: far from the timeout, and far above the second or so these failures take, so
/// that a busy machine cannot fail them.
const PROMPTLY: Duration = Duration::from_secs(60);

#[test]
fn mismatched_collectives_name_both_ranks_and_both_calls() {
    for setup in BOTH {
        let results = run_world_with(setup, 2, Duration::from_secs(20), |pg| {
            let mut v = vec![1.0f32; 4];
            if pg.rank() == 0 {
                pg.all_reduce(&mut v, ReduceOp::Sum)
            } else {
                pg.broadcast(&mut v, 0)
            }
        });
        for (rank, r) in results.iter().enumerate() {
            let e = r.as_ref().expect_err("a mismatch must fail").to_string();
            assert!(
                e.contains("all_reduce(f32 x 4, sum)"),
                "{setup:?} rank {rank}: {e}"
            );
            assert!(
                e.contains("broadcast(f32 x 4, root 0)"),
                "{setup:?} rank {rank}: {e}"
            );
            assert!(e.contains("mismatch"), "{setup:?} rank {rank}: {e}");
        }
    }
}

/// Two hosts that disagree: the leaders see each other's frames (or fingerprint checks), and
/// the mismatch, naming both calls, is reported well before the timeout. (A rank that only
/// sends, like a broadcast root, may finish first, as over TCP.)
#[test]
fn mismatch_across_hosts_fails_every_rank_quickly() {
    let calls: [(&str, Call); 5] = [
        ("all_reduce(f32 x 4, sum)", |pg, v| {
            pg.all_reduce(v, ReduceOp::Sum)
        }),
        ("all_to_all(f32 x 4)", |pg, v| {
            let mut out = vec![0.0; v.len()];
            pg.all_to_all(v, &mut out)
        }),
        ("broadcast(f32 x 4, root 0)", |pg, v| pg.broadcast(v, 0)),
        ("all_gather(f32 x 4)", |pg, v| {
            let mut out = vec![0.0; 4 * pg.world_size()];
            pg.all_gather(v, &mut out)
        }),
        ("barrier(u8 x 1)", |pg, _| pg.barrier()),
    ];
    let pairs: Vec<_> = calls
        .into_iter()
        .flat_map(|a| {
            calls
                .into_iter()
                .filter(move |b| b.0 != a.0)
                .map(move |b| (a, b))
        })
        .collect();
    // The 20 pairs are 20 independent worlds that mostly wait (for the peer's report, the
    // 500 ms below): a few at a time, so the test takes seconds, not most of a minute.
    std::thread::scope(|s| {
        for lane in 0..MISMATCH_LANES {
            let pairs = &pairs;
            s.spawn(move || {
                for &((a, call_a), (b, call_b)) in pairs.iter().skip(lane).step_by(MISMATCH_LANES) {
                    mismatch_across_hosts(a, call_a, b, call_b);
                }
            });
        }
    });
}

/// A collective one host calls in a mismatch.
type Call = fn(&ProcessGroup, &mut Vec<f32>) -> ddp_comm::Result<()>;

/// How many of the mismatch pairs run at once.
const MISMATCH_LANES: usize = 4;

/// One pair: host 0 (ranks 0 and 2) calls `a`, host 1 (ranks 1 and 3) calls `b`.
fn mismatch_across_hosts(a: &str, call_a: Call, b: &str, call_b: Call) {
    let start = Instant::now();
    let results = run_world_with(Setup::TwoHosts, 4, PATIENCE, |pg| {
        let mut v = vec![1.0f32; 4];
        let r = if pg.rank() % 2 == 0 {
            call_a(&pg, &mut v)
        } else {
            call_b(&pg, &mut v)
        };
        // A rank that finished (a broadcast root) keeps its connections open a moment:
        // closing a socket with unread data resets it, and the peer could lose the frame that
        // shows the mismatch.
        std::thread::sleep(Duration::from_millis(500));
        r
    });
    assert!(
        results.iter().any(|r| r.is_err()),
        "{a} vs {b}: a mismatch must fail"
    );
    let all: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
        .collect();
    let all = all.join("\n");
    assert!(
        all.contains("mismatch") && all.contains(a) && all.contains(b),
        "{a} vs {b}:\n{all}"
    );
    assert!(
        start.elapsed() < PROMPTLY,
        "{a} vs {b}: no rank waits for the timeout"
    );
}

#[test]
fn different_lengths_are_a_mismatch() {
    for setup in crate::common::SETUPS {
        let results = run_world_with(setup, 3, Duration::from_secs(20), |pg| {
            let mut v = vec![1i64; if pg.rank() == 2 { 5 } else { 4 }];
            pg.all_reduce(&mut v, ReduceOp::Max)
        });
        assert!(results.iter().all(|r| r.is_err()), "{setup:?}");
        let all: String = results
            .iter()
            .map(|r| r.as_ref().unwrap_err().to_string())
            .collect();
        assert!(
            all.contains("i64 x 5") && all.contains("i64 x 4"),
            "{setup:?}: {all}"
        );
    }
}

/// All-to-all lengths that differ between ranks (each a valid multiple of the world size) are a
/// mismatch naming both lengths, reported well before the timeout, never a hang or garbage.
#[test]
fn all_to_all_lengths_that_differ_between_ranks_are_a_mismatch() {
    for setup in crate::common::SETUPS {
        let start = Instant::now();
        let results = run_world_with(setup, 3, PATIENCE, |pg| {
            let len = if pg.rank() == 2 { 15 } else { 12 };
            let mut out = vec![0i64; len];
            pg.all_to_all(&vec![1i64; len], &mut out)
        });
        assert!(results.iter().all(|r| r.is_err()), "{setup:?}");
        let all: String = results
            .iter()
            .map(|r| r.as_ref().unwrap_err().to_string())
            .collect();
        assert!(
            all.contains("all_to_all(i64 x 15)") && all.contains("all_to_all(i64 x 12)"),
            "{setup:?}: {all}"
        );
        assert!(
            start.elapsed() < PROMPTLY,
            "{setup:?}: no rank waits for the timeout"
        );
    }
}

/// A length that is not a multiple of the world size (async here), or an output that is not as
/// long as the input, fails that rank with a clear message, and its peers with that message.
#[test]
fn all_to_all_bad_length_on_one_rank_fails_its_peers_with_its_message() {
    type Bad = fn(&ProcessGroup) -> ddp_comm::Result<()>;
    let cases: [(&str, Bad); 2] = [
        (
            "all_to_all: input has 7 elements, not a multiple of the world size 2",
            |pg| pg.all_to_all_async(vec![1u8; 7]).wait().map(drop),
        ),
        ("all_to_all: output has 6 elements, expected 8", |pg| {
            pg.all_to_all(&[1u8; 8], &mut [0u8; 6])
        }),
    ];
    for (setup, (message, bad)) in BOTH.into_iter().flat_map(|s| cases.map(|c| (s, c))) {
        let start = Instant::now();
        let results = run_world_with(setup, 2, PATIENCE, |pg| {
            if pg.rank() == 0 {
                bad(&pg)
            } else {
                pg.all_to_all(&[1u8; 8], &mut [0u8; 8])
            }
        });
        let e0 = results[0].as_ref().unwrap_err().to_string();
        assert!(e0.contains(message), "{setup:?}: {e0}");
        let e1 = results[1].as_ref().unwrap_err().to_string();
        let reason = message.trim_start_matches("all_to_all: ");
        assert!(
            e1.contains("rank 0") && e1.contains(reason),
            "{setup:?}: {e1}"
        );
        assert!(start.elapsed() < PROMPTLY);
    }
}

/// A collective every rank runs, on `len` elements per rank, for the tests of dead and stalled
/// peers: all-reduce (ring neighbours) and all-to-all (every pair of ranks).
type PeerCall = fn(&ProcessGroup, usize) -> ddp_comm::Result<()>;
const PEER_CALLS: [(&str, PeerCall); 2] = [
    ("all_reduce", |pg, len| {
        let mut v = vec![1.0f32; len];
        pg.all_reduce(&mut v, ReduceOp::Sum)
    }),
    ("all_to_all", |pg, len| {
        let len = len.next_multiple_of(pg.world_size());
        let mut out = vec![0.0f32; len];
        pg.all_to_all(&vec![1.0f32; len], &mut out)
    }),
];

#[test]
fn stalled_peer_is_named_after_the_timeout() {
    for (setup, (what, call)) in BOTH.into_iter().flat_map(|s| PEER_CALLS.map(|c| (s, c))) {
        let start = Instant::now();
        let results = run_world_with(setup, 2, Duration::from_secs(1), |pg| {
            if pg.rank() == 1 {
                std::thread::sleep(Duration::from_secs(4));
            }
            call(&pg, 8)
        });
        let e = results[0].as_ref().expect_err("rank 0 must time out");
        assert!(
            matches!(e, CommError::Timeout { peer: 1, .. }),
            "{setup:?} {what}: {e}"
        );
        assert!(
            e.to_string().contains("waiting for rank 1"),
            "{setup:?} {what}: {e}"
        );
        // The late rank of an all-reduce needs data its peer never sent; that of an all-to-all
        // of two may find its peer's whole chunk handed over before the timeout, and finish.
        if what == "all_reduce" {
            assert!(results[1].is_err(), "the late rank finds the group aborted");
        }
        assert!(start.elapsed() < Duration::from_secs(15));
    }
}

/// The rank that timed out records whom it blames (`failure/<rank>/blame` in the group's
/// store namespace), so a rank failing because of it follows the chain to the stalled rank.
#[test]
fn a_rank_that_times_out_records_whom_it_blames_in_the_store() {
    for setup in BOTH {
        let results = run_world_with(setup, 2, Duration::from_secs(1), |pg| {
            if pg.rank() == 1 {
                std::thread::sleep(Duration::from_secs(4));
            }
            let mut v = vec![0u8; 8];
            let failed = pg.all_reduce(&mut v, ReduceOp::Sum).is_err();
            let blame = pg
                .store()
                .get_timeout("failure/0/blame", Duration::from_secs(2))
                .ok();
            Ok((failed, blame))
        });
        let (failed, blame) = results[0].as_ref().expect("rank 0's check");
        assert!(failed, "{setup:?}: rank 0 must time out");
        assert_eq!(
            blame.as_deref(),
            Some(&b"1"[..]),
            "{setup:?}: rank 0 blames rank 1"
        );
    }
}

#[test]
fn departed_peer_is_named_by_every_rank_without_waiting_for_the_timeout() {
    let cases = crate::common::SETUPS
        .into_iter()
        .flat_map(|s| PEER_CALLS.map(|c| (s, c)));
    for (setup, (what, call)) in cases {
        let start = Instant::now();
        let results = run_world_with(setup, 3, PATIENCE, |pg| {
            if pg.rank() == 2 {
                return Ok(()); // leaves: dropping the group closes its connections
            }
            call(&pg, 1 << 16)
        });
        for (rank, result) in results.iter().enumerate().take(2) {
            let e = result
                .as_ref()
                .expect_err("the collective cannot complete")
                .to_string();
            assert!(
                e.contains("rank 2"),
                "{setup:?} {what}: rank {rank} should name rank 2: {e}"
            );
        }
        assert!(
            start.elapsed() < PROMPTLY,
            "{setup:?} {what}: detected by the closed connection or slot, not the 60 s timeout"
        );
    }
}

#[test]
fn bad_argument_on_one_rank_fails_its_peers_with_its_message() {
    for setup in BOTH {
        let start = Instant::now();
        let results = run_world_with(setup, 2, PATIENCE, |pg| {
            let input = [1.0f32; 3];
            let mut out = vec![0.0f32; if pg.rank() == 0 { 5 } else { 6 }];
            pg.all_gather(&input, &mut out)
        });
        let e0 = results[0].as_ref().unwrap_err().to_string();
        assert!(
            e0.contains("all_gather: output has 5 elements, expected 6"),
            "{setup:?}: {e0}"
        );
        let e1 = results[1].as_ref().unwrap_err().to_string();
        assert!(
            e1.contains("rank 0") && e1.contains("output has 5 elements"),
            "{setup:?}: {e1}"
        );
        assert!(start.elapsed() < PROMPTLY);
    }
}

/// Each rank publishes its own error only: a peer following the chain of blame appends every
/// link's report itself, so a report that held the links behind it too would double the text
/// at every hop (megabytes, past the store's frame limit, along a long chain).
#[test]
fn a_rank_publishes_its_own_error_not_the_chain_behind_it() {
    for setup in BOTH {
        let results = run_world_with(setup, 3, PATIENCE, |pg| {
            let input = [1.0f32; 3];
            let mut out = vec![0.0f32; if pg.rank() == 0 { 5 } else { 9 }];
            let e = pg
                .all_gather(&input, &mut out)
                .expect_err("rank 0's bad output");
            let published = pg
                .store()
                .get_timeout(&format!("failure/{}", pg.rank()), Duration::from_secs(10))?;
            Ok((
                e.to_string(),
                String::from_utf8_lossy(&published).into_owned(),
            ))
        });
        for (rank, result) in results.iter().enumerate().skip(1) {
            let (error, published) = result.as_ref().expect("the ranks' reads");
            assert!(
                error.contains("rank 0 reported: ") && error.contains("output has 5 elements"),
                "{setup:?}: rank {rank}'s error carries rank 0's report: {error}"
            );
            assert!(
                !published.contains("reported: "),
                "{setup:?}: rank {rank} published the chain behind it: {published}"
            );
        }
    }
}

#[test]
fn group_is_unusable_after_a_failure() {
    for setup in BOTH {
        let results = run_world_with(setup, 2, Duration::from_secs(20), |pg| {
            let mut v = vec![0.0f32; if pg.rank() == 0 { 1 } else { 2 }];
            let first = pg.all_reduce(&mut v, ReduceOp::Sum);
            assert!(first.is_err());
            pg.barrier()
        });
        for r in results {
            assert!(matches!(r, Err(CommError::Aborted(_))), "{setup:?}: {r:?}");
        }
    }
}

#[test]
fn out_of_range_root_is_an_error_not_a_panic() {
    for setup in BOTH {
        let results = run_world_with(setup, 2, Duration::from_secs(20), |pg| {
            let mut v = [0u8; 4];
            pg.broadcast(&mut v, 2)
        });
        for r in results {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("root 2 is outside 0..2"), "{setup:?}: {e}");
        }
    }
}

/// Gather's output and scatter's input are passed by the root only, `world_size()` blocks long;
/// a rank that gets this wrong is told which way.
#[test]
fn root_only_buffers_are_checked() {
    type Misuse = dyn Fn(&ProcessGroup) -> Result<(), CommError> + Sync;
    let cases: [(usize, &str, &Misuse); 5] = [
        (0, "gather: the root must pass an output buffer", &|pg| {
            pg.gather(&[1i32], None, 0)
        }),
        (
            1,
            "gather: only the root (0) passes an output buffer",
            &|pg| pg.gather(&[1i32], Some(&mut [0i32; 2]), 0),
        ),
        (0, "gather: output has 3 elements, expected 2", &|pg| {
            let mut out = [0i32; 3];
            pg.gather(&[1i32], (pg.rank() == 0).then_some(&mut out[..]), 0)
        }),
        (0, "scatter: the root must pass an input buffer", &|pg| {
            pg.scatter::<i32>(None, &mut [0], 0)
        }),
        (
            1,
            "scatter: only the root (0) passes an input buffer",
            &|pg| pg.scatter(Some(&[1i32, 2][..]), &mut [0], 0),
        ),
    ];
    for (rank, expected, misuse) in cases {
        let results = run_world(2, Duration::from_secs(20), |pg| misuse(&pg));
        let e = results[rank]
            .as_ref()
            .expect_err("a misused root-only buffer must fail")
            .to_string();
        assert!(e.contains(expected), "rank {rank}: {e}");
    }
}

/// Strangers on a rank's rendezvous port (garbage, an oversized hello, a wrong proof) are
/// rejected and the job goes on.
#[test]
fn garbage_on_a_rank_port_is_rejected_and_the_job_continues() {
    let results = run_world(2, Duration::from_secs(30), |pg| {
        let mut v = vec![pg.rank() as f32 + 1.0; 100];
        pg.all_reduce(&mut v, ReduceOp::Sum)?;
        Ok(v)
    });
    // The harness connects rank 0 and 1 directly; to attack the port during rendezvous we run
    // a job whose rank 1 arrives late, and send junk to rank 0 in the meantime.
    assert!(
        results
            .iter()
            .all(|r| r.as_ref().is_ok_and(|v| v[0] == 3.0))
    );

    let server = ddp_comm::StoreServer::bind("127.0.0.1:0", StoreConfig::new()).unwrap();
    let addr = server.local_addr().to_string();
    std::thread::scope(|s| {
        let rank0 = s.spawn(|| {
            let store = Store::connect(&addr, StoreConfig::new()).unwrap();
            let pg =
                ddp_comm::ProcessGroup::with_store(store, ddp_comm::ProcessGroupConfig::new(0, 2))
                    .unwrap();
            let mut v = vec![1u8; 10];
            pg.all_reduce(&mut v, ReduceOp::Sum).map(|_| v)
        });
        let probe = Store::connect(&addr, StoreConfig::new()).unwrap();
        let rank0_addr = String::from_utf8(probe.get("pg/world/addr/0").unwrap()).unwrap();
        // Garbage.
        let mut c = TcpStream::connect(&rank0_addr).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nmore junk to fill the hello")
            .unwrap();
        // A well-formed hello announcing 65535 bytes of claims (over the limit).
        let mut c2 = TcpStream::connect(&rank0_addr).unwrap();
        let mut hello = b"DDPA\x01\x02".to_vec();
        hello.extend_from_slice(&u16::MAX.to_le_bytes());
        hello.extend_from_slice(&[0; 32]);
        c2.write_all(&hello).unwrap();
        // A hello claiming to be rank 1, then a made-up proof (it does not know the token).
        let mut c3 = TcpStream::connect(&rank0_addr).unwrap();
        let mut bad = hello[..6].to_vec();
        bad.extend_from_slice(&16u16.to_le_bytes());
        bad.extend_from_slice(&[0; 32]);
        bad.extend_from_slice(&1u32.to_le_bytes());
        bad.extend_from_slice(&2u32.to_le_bytes());
        bad.extend_from_slice(&[0; 8]);
        bad.extend_from_slice(&[0x55; 32]);
        c3.write_all(&bad).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let rank1 = s.spawn(|| {
            let store = Store::connect(&addr, StoreConfig::new()).unwrap();
            let pg =
                ddp_comm::ProcessGroup::with_store(store, ddp_comm::ProcessGroupConfig::new(1, 2))
                    .unwrap();
            let mut v = vec![2u8; 10];
            pg.all_reduce(&mut v, ReduceOp::Sum).map(|_| v)
        });
        assert_eq!(rank0.join().unwrap().unwrap(), vec![3u8; 10]);
        assert_eq!(rank1.join().unwrap().unwrap(), vec![3u8; 10]);
        drop((c, c2, c3));
    });
}
