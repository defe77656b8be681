//! ddp-comm with ranks as separate processes: collectives, a killed peer, and configuration
//! errors, each a clear message within the timeout.

use ddp_tests::{assert_survivors_name_the_dead, free_port, spawn_world};
use std::time::Duration;

const WORKER: &str = env!("CARGO_BIN_EXE_comm_worker");

fn no_extra(_: usize) -> Vec<(String, String)> {
    Vec::new()
}

#[test]
fn collectives_are_correct_across_processes() {
    for world in 1..=4 {
        let out = spawn_world(
            WORKER,
            &["collectives"],
            world,
            Duration::from_secs(120),
            no_extra,
        );
        for o in &out {
            assert_eq!(
                o.code,
                Some(0),
                "world {world} rank {}: {}",
                o.rank,
                o.stderr
            );
            assert!(o.stdout.contains("ok"));
        }
    }
}

#[test]
fn killed_peer_is_named_by_the_survivors_within_the_timeout() {
    let out = spawn_world(WORKER, &["die"], 4, Duration::from_secs(90), |_| {
        vec![
            ("DIE_RANK".into(), "2".into()),
            ("DIE_AT".into(), "5".into()),
            // Far beyond the harness's 90 s: only noticing the dead peer ends the survivors in
            // time (a rank still waiting then is killed and fails the exit-code check).
            ("DDP_TIMEOUT_SECS".into(), "600".into()),
        ]
    });
    assert_survivors_name_the_dead(&out, 2);
}

fn single_rank_error(env: Vec<(&str, String)>) -> String {
    let env: Vec<(String, String)> = env.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let out = spawn_world(WORKER, &["init"], 1, Duration::from_secs(30), move |_| {
        env.clone()
    });
    assert_eq!(out[0].code, Some(2), "must fail: {}", out[0].stderr);
    out[0].stderr.clone()
}

#[test]
fn unparsable_rank_is_a_clear_error() {
    let e = single_rank_error(vec![("RANK", "abc".into())]);
    assert!(
        e.contains("RANK: 'abc' is not a non-negative integer"),
        "{e}"
    );
}

#[test]
fn rank_outside_world_is_a_clear_error() {
    let e = single_rank_error(vec![("RANK", "3".into())]);
    assert!(e.contains("rank 3 is outside 0..1"), "{e}");
}

#[test]
fn world_size_zero_is_a_clear_error() {
    let e = single_rank_error(vec![("WORLD_SIZE", "0".into())]);
    assert!(e.contains("WORLD_SIZE: must be at least 1"), "{e}");
}

#[test]
fn missing_master_port_is_a_clear_error() {
    let e = single_rank_error(vec![("MASTER_PORT", "".into())]);
    assert!(e.contains("MASTER_PORT"), "{e}");
}

#[test]
fn port_in_use_on_rank_zero_is_a_clear_error() {
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let e = single_rank_error(vec![("MASTER_PORT", port.to_string())]);
    assert!(
        e.contains("already in use") || e.contains("MASTER_PORT"),
        "{e}"
    );
    assert!(e.contains(&port.to_string()), "{e}");
}

#[test]
fn unreachable_master_fails_within_the_timeout() {
    let port = free_port();
    // Rank 1 of 2 with no rank 0 anywhere.
    let env: Vec<(String, String)> = vec![
        ("RANK".into(), "1".into()),
        ("WORLD_SIZE".into(), "2".into()),
        ("LOCAL_RANK".into(), "1".into()),
        ("LOCAL_WORLD_SIZE".into(), "2".into()),
        ("MASTER_PORT".into(), port.to_string()),
        ("DDP_TIMEOUT_SECS".into(), "2".into()),
    ];
    let out = spawn_world(WORKER, &["init"], 1, Duration::from_secs(30), move |_| {
        env.clone()
    });
    assert_eq!(out[0].code, Some(2), "{}", out[0].stderr);
    assert!(
        out[0].stderr.contains("could not reach the store"),
        "{}",
        out[0].stderr
    );
}

#[test]
fn wrong_token_is_rejected_by_name() {
    let out = spawn_world(WORKER, &["init"], 2, Duration::from_secs(60), |rank| {
        let mut env = vec![("DDP_TIMEOUT_SECS".to_string(), "5".to_string())];
        if rank == 1 {
            env.push(("DDP_JOB_TOKEN".into(), "not-the-job-token".into()));
        }
        env
    });
    assert_eq!(out[1].code, Some(2), "{}", out[1].stderr);
    assert!(out[1].stderr.contains("token"), "{}", out[1].stderr);
    assert_ne!(
        out[0].code,
        Some(0),
        "rank 0 cannot complete a group without rank 1"
    );
}
