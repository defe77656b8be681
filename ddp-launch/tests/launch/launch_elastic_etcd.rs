//! Elastic jobs with `--rdzv-backend etcd`: the c10d scenario of `launch_elastic` against a
//! real etcd, where the node that started the job may die too (the job's state is in etcd, not
//! in a launcher). Ignored by `cargo test --workspace`: they need the `etcd` feature (protoc)
//! and Debian's etcd-server; `.ci/run` installs both and runs them by name.
use crate::launch_common::etcd_server::EtcdServer;
use crate::launch_common::*;
use crate::launch_elastic::*;
use std::time::{Duration, Instant};

/// Starts `n` launchers: the first alone, until it joined round 0 (so it is node 0), then the
/// others at once, so they all join within the round's last call however busy the machine is;
/// returns their indices, the first one first.
fn start_first_then_rest(job: &mut ElasticJob, etcd: &EtcdServer, n: usize) -> Vec<usize> {
    let first = job.start_agent(&["--max-restarts", "3"]);
    wait_joined(job, etcd, &[first], 1);
    let rest: Vec<usize> = (1..n)
        .map(|_| job.start_agent(&["--max-restarts", "3"]))
        .collect();
    wait_joined(job, etcd, &rest, n);
    std::iter::once(first).chain(rest).collect()
}

/// Waits until `joins` launchers joined round 0 in etcd, failing with the output of any of
/// `agents` that exits first.
fn wait_joined(job: &mut ElasticJob, etcd: &EtcdServer, agents: &[usize], joins: usize) {
    let key = format!("/ddp/{JOB_ID}/r/0/node/{joins}");
    let deadline = Instant::now() + ROUND_DEADLINE;
    while !etcd.has_key(&key) {
        for &agent in agents {
            if job.agents[agent]
                .child
                .try_wait()
                .expect("try_wait")
                .is_some()
            {
                let placeholder = start(std::process::Command::new("true"));
                let out = std::mem::replace(&mut job.agents[agent], placeholder).finish();
                panic!(
                    "launcher {agent} exited before round 0 had {joins} node(s)\n{}",
                    out.all()
                );
            }
        }
        assert!(
            Instant::now() < deadline,
            "round 0 never had {joins} node(s) (no {key} in etcd)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "needs etcd (etcd-server) and protoc: run by .ci/run"]
fn etcd_the_job_outlives_the_node_that_started_it_and_grows_back() {
    let etcd = EtcdServer::start();
    let mut job = ElasticJob::with_backend("etcd", etcd.port);
    let agents = start_first_then_rest(&mut job, &etcd, 3);
    let (first, second, third) = (agents[0], agents[1], agents[2]);

    let round0 = job.wait_round(0, 3 * NPROC);
    // The first launcher is node 0: its host holds the workers' store of round 0 too.
    let first_pid = job.pid(first);
    let firsts = node_of(&round0, first_pid);
    assert_eq!(firsts.len(), NPROC);
    assert!(firsts.iter().all(|r| r.node_rank == 0), "{round0:?}");

    // The node that started the job dies with its workers, as with a lost machine.
    kill_a_node_then_grow_back(&mut job, [first, second, third], first, &round0, "etcd");
}

/// A frozen node's lease expires in etcd: the others drop it by its missing heartbeat key.
#[test]
#[ignore = "needs etcd (etcd-server) and protoc: run by .ci/run"]
fn etcd_a_frozen_node_is_dropped_when_its_lease_expires() {
    let etcd = EtcdServer::start();
    let mut job = ElasticJob::with_backend("etcd", etcd.port);
    let agents = start_first_then_rest(&mut job, &etcd, 3);
    let round0 = job.wait_round(0, 3 * NPROC);

    let frozen = agents[2];
    let launcher = job.pid(frozen);
    let stopped: Vec<i32> = std::iter::once(launcher)
        .chain(node_of(&round0, launcher).iter().map(|r| r.pid))
        .collect();
    for pid in &stopped {
        // SAFETY: processes this test started.
        unsafe { libc::kill(*pid, libc::SIGSTOP) };
    }
    let frozen_at = Instant::now();
    job.wait_round(1, 2 * NPROC);
    println!(
        "elastic (etcd): from a node freezing to 2-node training again: {:.2} s (heartbeat timeout {HEARTBEAT_TIMEOUT_SECS} s)",
        frozen_at.elapsed().as_secs_f64()
    );
    job.kill_node(frozen, &round0);

    let workers = job.all_workers();
    let outs = job.finish(&[agents[0], agents[1]]);
    for out in &outs {
        assert_succeeded(out);
    }
    let rounds = rounds_printed(&outs[0]);
    assert!(
        rounds[0].contains(&format!(
            ":{launcher} sent no heartbeat for {HEARTBEAT_TIMEOUT_SECS}s"
        )),
        "{rounds:?}\n{}",
        outs[0].all()
    );
    assert_all_gone(&workers);
}

/// A finished job's state stays in etcd: a launcher that comes later with the same job id (as
/// when the same command runs again) fails, saying the job is over and how to start a new one,
/// rather than succeeding with nothing run.
#[test]
#[ignore = "needs etcd (etcd-server) and protoc: run by .ci/run"]
fn etcd_a_finished_job_id_is_reported_to_a_later_launcher() {
    let etcd = EtcdServer::start();
    let mut job = ElasticJob::with_backend("etcd", etcd.port);
    let agents = start_first_then_rest(&mut job, &etcd, 2);
    job.wait_round(0, 2 * NPROC);
    let workers = job.all_workers();
    for out in job.finish(&agents) {
        assert_succeeded(&out);
    }
    let records = job.records().len();
    let out = run(job.command(&["--max-restarts", "3"]));
    assert_eq!(out.status.code(), Some(1), "{}", out.all());
    out.assert_stderr_has(&format!(
        "job id '{JOB_ID}' already completed before this node joined (a job's state stays in etcd after it ends), so this node ran nothing: to run a job again, pass a new --rdzv-id"
    ));
    assert!(
        !out.stderr.contains("completed while this node waited"),
        "{}",
        out.all()
    );
    assert_eq!(job.records().len(), records, "no worker may start");
    assert_all_gone(&workers);
}

/// etcd is the job's one shared service: when it is lost, every launcher stops its workers and
/// exits with an error naming it (no launcher keeps training blind).
#[test]
#[ignore = "needs etcd (etcd-server) and protoc: run by .ci/run"]
fn etcd_lost_while_the_job_runs_stops_every_node_with_the_endpoint() {
    let mut etcd = EtcdServer::start();
    let mut job = ElasticJob::with_backend("etcd", etcd.port);
    let agents = start_first_then_rest(&mut job, &etcd, 2);
    job.wait_round(0, 2 * NPROC);
    let workers = job.all_workers();
    etcd.kill();
    for i in agents {
        let placeholder = start(std::process::Command::new("true"));
        let out = std::mem::replace(&mut job.agents[i], placeholder).finish();
        assert_eq!(out.status.code(), Some(1), "{}", out.all());
        assert!(
            out.stderr.contains(&format!(
                "at 127.0.0.1:{} failed: lost the rendezvous (etcd at 127.0.0.1:{}",
                etcd.port, etcd.port
            )) && out.stderr.contains(
                "with --rdzv-backend etcd every node must reach the etcd server at --rdzv-endpoint"
            ),
            "{}",
            out.all()
        );
    }
    assert_all_gone(&workers);
}

#[test]
#[ignore = "needs etcd (etcd-server) and protoc: run by .ci/run"]
fn etcd_unreachable_is_an_error_naming_the_endpoint() {
    let port = free_port();
    let mut cmd = ddp_run();
    cmd.args([
        "--nnodes",
        "2:3",
        "--rdzv-backend",
        "etcd",
        "--rdzv-endpoint",
    ])
    .arg(format!("127.0.0.1:{port}"))
    .args(["--join-timeout", "2", "--", "true"])
    .env("DDP_JOB_TOKEN", "t");
    cmd.env("RUST_LOG", "warn");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(1), "{}", out.all());
    out.assert_stderr_has(&format!(
        "at 127.0.0.1:{port} failed: cannot reach the etcd server within 2s"
    ));
    assert!(!out.stderr.contains("panicked"), "{}", out.all());
}
