//! [`StandInComm`], the NCCL backend's CPU stand-in: collectives queued in issue order on a
//! communication thread of its own, supervised by the watchdog, failed from any thread.
use crate::common::{Setup, run_world_with};
use ddp_comm::ReduceOp;
use ddp_comm::stand_in::{StandInBuffer, StandInComm};
use ddp_comm::watchdog::CollectiveLabel;
use std::time::{Duration, Instant};

/// Long enough that only the behaviour under test can end a wait, on a busy machine too.
const TIMEOUT: Duration = Duration::from_secs(120);
/// A failure that is not the timeout arrives well within this.
const WELL_BEFORE_THE_TIMEOUT: Duration = Duration::from_secs(60);

fn label(bucket: usize) -> CollectiveLabel {
    CollectiveLabel::new("all_reduce").with_bucket(bucket)
}

#[test]
fn stand_in_averages_queued_buckets_in_issue_order() {
    for setup in [Setup::Shm, Setup::Tcp] {
        let results = run_world_with(setup, 3, TIMEOUT, |pg| {
            let comm = StandInComm::new(&pg)?;
            let rank = pg.rank() as f32;
            // Buckets of different sizes: issued out of order on any rank, they would meet
            // another rank's bucket of another size, which the subgroup names as a mismatch.
            let buffers: Vec<StandInBuffer<f32>> = (0..4)
                .map(|i| StandInBuffer::new(vec![rank * 10.0 + i as f32; 100 + i]))
                .collect();
            let mut works = Vec::new();
            for (i, b) in buffers.iter().enumerate() {
                works.push(comm.all_reduce_async(b, ReduceOp::Avg, label(i))?);
            }
            let seqs: Vec<u64> = works.iter().map(|w| w.seq()).collect();
            for w in works {
                let t = w.wait()?;
                assert!(t.queued <= t.started && t.started <= t.finished);
            }
            let values: Vec<Vec<f32>> = buffers.into_iter().map(StandInBuffer::take).collect();
            Ok((seqs, values))
        });
        for (rank, r) in results.into_iter().enumerate() {
            let (seqs, values) = r.unwrap_or_else(|e| panic!("{setup:?} rank {rank}: {e}"));
            assert_eq!(
                seqs,
                vec![1, 2, 3, 4],
                "{setup:?}: one sequence, in issue order"
            );
            for (i, v) in values.iter().enumerate() {
                // (0 + 10 + 20) / 3 + i on every rank.
                assert_eq!(v, &vec![10.0 + i as f32; 100 + i], "{setup:?} bucket {i}");
            }
        }
    }
}

/// Rank 0 queues a bucket that rank 1 never issues; another thread of rank 0 aborts the
/// communicator. The blocked bucket fails with the reason, and rank 1's communicator learns of
/// the failure, both long before the timeout.
#[test]
fn stand_in_abort_from_another_thread_fails_the_blocked_bucket_and_the_peer() {
    let results = run_world_with(Setup::Shm, 2, TIMEOUT, |pg| {
        let comm = StandInComm::new(&pg)?;
        let started = Instant::now();
        if pg.rank() == 0 {
            let buf = StandInBuffer::new(vec![1.0f32; 64]);
            let work = comm.all_reduce_async(&buf, ReduceOp::Avg, label(0))?;
            let other = comm.clone();
            let aborter = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                other.abort("backward failed: boom");
            });
            let outcome = work.wait().err().map(|e| e.to_string());
            aborter.join().expect("the aborting thread");
            let later = comm
                .all_reduce_async(&buf, ReduceOp::Avg, label(1))
                .err()
                .map(|e| e.to_string());
            return Ok((outcome, later, started.elapsed()));
        }
        while comm.check().is_ok() && started.elapsed() < TIMEOUT {
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok((
            comm.check().err().map(|e| e.to_string()),
            None,
            started.elapsed(),
        ))
    });
    let mut results = results
        .into_iter()
        .map(|r| r.expect("no rank fails outright"));
    let (blocked, later, took) = results.next().expect("rank 0");
    let blocked = blocked.expect("the blocked bucket fails");
    assert!(blocked.contains("boom"), "rank 0's bucket: {blocked}");
    let later = later.expect("a bucket after the abort is refused");
    assert!(later.contains("boom"), "rank 0's later bucket: {later}");
    assert!(took < WELL_BEFORE_THE_TIMEOUT, "rank 0 took {took:?}");
    let (peer, _, took) = results.next().expect("rank 1");
    let peer = peer.expect("rank 1's communicator fails too");
    assert!(peer.contains("rank 0"), "rank 1 names rank 0: {peer}");
    assert!(took < WELL_BEFORE_THE_TIMEOUT, "rank 1 took {took:?}");
}

/// A bucket whose peer never issues it fails at the timeout, naming the rank behind, on the
/// watchdog's word (the ranks agree on nothing else).
#[test]
fn stand_in_bucket_a_peer_never_issues_names_that_peer() {
    let timeout = Duration::from_secs(10);
    let results = run_world_with(Setup::Tcp, 2, timeout, |pg| {
        let comm = StandInComm::new(&pg)?;
        if pg.rank() == 1 {
            // Stays alive, and issues nothing, until rank 0's communicator failed.
            while comm.check().is_ok() {
                std::thread::sleep(Duration::from_millis(20));
            }
            return Ok(None);
        }
        let buf = StandInBuffer::new(vec![1.0f32; 64]);
        let work = comm.all_reduce_async(&buf, ReduceOp::Avg, label(7))?;
        Ok(work.wait().err().map(|e| e.to_string()))
    });
    let err = results
        .into_iter()
        .next()
        .expect("rank 0")
        .expect("rank 0 runs")
        .expect("rank 0's bucket fails");
    assert!(err.contains("bucket 7"), "names the bucket: {err}");
    assert!(
        err.contains("rank 1") || err.contains("[1]"),
        "names rank 1: {err}"
    );
}

/// NCCL cannot tell two ranks' buckets apart; the stand-in's communicator can: buckets issued
/// in another order on one rank (other sizes meet) fail on both ranks, naming the mismatch,
/// instead of reducing unrelated values.
#[test]
fn stand_in_buckets_issued_in_another_order_are_a_named_mismatch() {
    let results = run_world_with(Setup::Shm, 2, TIMEOUT, |pg| {
        let comm = StandInComm::new(&pg)?;
        let mut sizes = [100usize, 200];
        if pg.rank() == 1 {
            sizes.reverse();
        }
        let buffers: Vec<StandInBuffer<f32>> = sizes
            .iter()
            .map(|&n| StandInBuffer::new(vec![1.0; n]))
            .collect();
        let mut works = Vec::new();
        for (i, b) in buffers.iter().enumerate() {
            works.push(comm.all_reduce_async(b, ReduceOp::Avg, label(i))?);
        }
        let first = works.remove(0).wait().err().map(|e| e.to_string());
        Ok(first)
    });
    for (rank, r) in results.into_iter().enumerate() {
        let e = r
            .expect("the ranks start")
            .unwrap_or_else(|| panic!("rank {rank}'s first bucket must fail"));
        assert!(e.contains("bucket 0"), "rank {rank} names the bucket: {e}");
        assert!(
            e.contains("100") && e.contains("200"),
            "rank {rank} names both sizes: {e}"
        );
    }
}
