//! Two nodes, simulated by two network namespaces joined by a veth pair (10.77.0.1/24 and
//! 10.77.0.2/24, only inside the namespaces this test creates). Each runs
//! `ddp-run --nnodes 2 --node-rank k --master-addr 10.77.0.1 --master-port P` with two ranks.
//! Ignored by default (they need root and iproute2); `.ci/run` runs them with `--ignored`, and
//! where namespaces cannot be created they fail saying why.
use crate::launch_common::*;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

const NODE0: &str = "10.77.0.1";
const NODE1: &str = "10.77.0.2";
const RDZV_PORT: &str = "29400";

/// Two namespaces and a veth pair between them; removed on drop, whatever happened.
struct TwoNodes {
    ns: [String; 2],
    veth: [String; 2],
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `ip`: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl TwoNodes {
    /// `Err(reason)` when namespaces are unavailable here.
    fn create() -> Result<TwoNodes, String> {
        // SAFETY: plain syscall.
        if unsafe { libc::geteuid() } != 0 {
            return Err("network namespaces need root".into());
        }
        ip(&["-V"]).map_err(|e| format!("no usable `ip` binary: {e}"))?;
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        // Unique per test run and per test: pid plus a counter (interface names <= 15 bytes).
        let id = format!(
            "{}{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let nodes = TwoNodes {
            ns: [format!("ddpl{id}a"), format!("ddpl{id}b")],
            veth: [format!("vd{id}a"), format!("vd{id}b")],
        };
        let [ns0, ns1] = &nodes.ns;
        let [v0, v1] = &nodes.veth;
        // `nodes` is dropped (cleaning up) on every early return below.
        ip(&["netns", "add", ns0])?;
        ip(&["netns", "add", ns1])?;
        ip(&["link", "add", v0, "type", "veth", "peer", "name", v1])?;
        ip(&["link", "set", v0, "netns", ns0])?;
        ip(&["link", "set", v1, "netns", ns1])?;
        ip(&["-n", ns0, "addr", "add", &format!("{NODE0}/24"), "dev", v0])?;
        ip(&["-n", ns1, "addr", "add", &format!("{NODE1}/24"), "dev", v1])?;
        for (ns, v) in [(ns0, v0), (ns1, v1)] {
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", v, "up"])?;
        }
        Ok(nodes)
    }

    /// `ddp-run` on node `k` inside its namespace.
    fn ddp_run(
        &self,
        node_rank: usize,
        token: &str,
        launcher_args: &[&str],
        worker_args: &[&str],
    ) -> Command {
        let cmd = ddp_run();
        let program = cmd.get_program().to_owned();
        let mut wrapped = Command::new("ip");
        wrapped
            .args(["netns", "exec", &self.ns[node_rank]])
            .arg(program);
        wrapped.args([
            "--nnodes",
            "2",
            "--node-rank",
            &node_rank.to_string(),
            "--nproc-per-node",
            "2",
            "--master-addr",
            NODE0,
            "--master-port",
            RDZV_PORT,
            "--grace-period",
            "2",
            "--join-timeout",
            "50",
        ]);
        wrapped
            .args(launcher_args)
            .arg("--")
            .arg(worker_path())
            .args(worker_args);
        // The same environment cleaning as `ddp_run()`, plus the shared token.
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => wrapped.env(k, v),
                None => wrapped.env_remove(k),
            };
        }
        wrapped.env("DDP_JOB_TOKEN", token);
        wrapped
    }

    /// The worker program started directly on node `k` with torchrun's variables (one rank per
    /// node, rank = k), as a user or another launcher would, with `DDP_JOB_TOKEN` only if given.
    /// `local_world` passes `LOCAL_WORLD_SIZE=1`; without it the worker cannot tell the job
    /// spans nodes, so only the process group's own check stands between it and the network.
    fn torchrun_worker(&self, node_rank: usize, token: Option<&str>, local_world: bool) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns[node_rank]])
            .arg(worker_path())
            .args(["--mode", "env"]);
        for (k, v) in worker().get_envs() {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        cmd.env("RANK", node_rank.to_string())
            .env("WORLD_SIZE", "2")
            .env("LOCAL_RANK", "0")
            .env("MASTER_ADDR", NODE0)
            .env("MASTER_PORT", RDZV_PORT)
            .env("DDP_TIMEOUT_SECS", "50")
            .env_remove("DDP_JOB_TOKEN");
        if local_world {
            cmd.env("LOCAL_WORLD_SIZE", "1");
        }
        if let Some(token) = token {
            cmd.env("DDP_JOB_TOKEN", token);
        }
        cmd
    }
}

impl Drop for TwoNodes {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end inside it (and so its peer).
        for ns in &self.ns {
            let _ = ip(&["netns", "del", ns]);
        }
        // In case the pair was created but not yet moved.
        let _ = ip(&["link", "del", &self.veth[0]]);
    }
}

/// Two nodes, or a failure saying why they cannot be made here.
fn two_nodes() -> TwoNodes {
    TwoNodes::create().unwrap_or_else(|reason| {
        panic!("cannot create network namespaces: {reason} (these tests need root and iproute2)")
    })
}

#[test]
#[ignore = "needs root and iproute2 (network namespaces); .ci/run runs it"]
fn two_nodes_in_namespaces_rendezvous_and_all_reduce() {
    let nodes = two_nodes();
    let node0 = start(nodes.ddp_run(0, "two-node-secret", &[], &["--mode", "env"]));
    let node1 = start(nodes.ddp_run(1, "two-node-secret", &[], &["--mode", "env"]));
    let (out0, out1) = (node0.finish(), node1.finish());
    assert!(
        out0.status.success(),
        "node 0:\n{}\nnode 1:\n{}",
        out0.all(),
        out1.all()
    );
    assert!(
        out1.status.success(),
        "node 1:\n{}\nnode 0:\n{}",
        out1.all(),
        out0.all()
    );
    let mut ports = Vec::new();
    for (node, out, ranks) in [(0, &out0, [0, 1]), (1, &out1, [2, 3])] {
        for (local, rank) in ranks.into_iter().enumerate() {
            let line = out
                .stdout
                .lines()
                .find(|l| l.starts_with(&format!("[rank {rank}]: ENV ")))
                .unwrap_or_else(|| panic!("no ENV line for rank {rank}:\n{}", out.all()));
            for field in [
                format!(" rank={rank} "),
                format!(" local_rank={local} "),
                " world_size=4 ".to_string(),
                " local_world_size=2 ".to_string(),
                format!(" group_rank={node} "),
                format!(" master_addr={NODE0} "),
                " token_len=15 ".to_string(),
            ] {
                assert!(line.contains(&field), "{field:?} missing in {line}");
            }
            let port = line
                .split(" master_port=")
                .nth(1)
                .and_then(|r| r.split(' ').next())
                .expect("port");
            ports.push(port.to_string());
            // 1 + 2 + 3 + 4 over both nodes.
            assert!(
                out.stdout
                    .contains(&format!("[rank {rank}]: ALLREDUCE rank={rank} sum=10\n")),
                "{}",
                out.all()
            );
        }
    }
    ports.dedup();
    assert_eq!(
        ports.len(),
        1,
        "every rank uses node 0's worker port: {ports:?}"
    );
    assert_ne!(
        ports[0], RDZV_PORT,
        "the rendezvous port is the launchers'; workers get a fresh one"
    );
}

#[test]
#[ignore = "needs root and iproute2 (network namespaces); .ci/run runs it"]
fn failure_on_one_node_stops_the_other_node() {
    let nodes = two_nodes();
    let dirs = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    // Rank 1 (node 0) fails; every other rank sleeps until stopped.
    let start_node = |k: usize| {
        let dir = dirs[k].path().to_str().expect("utf-8 path");
        start(nodes.ddp_run(
            k,
            "secret-2",
            &[],
            &["--mode", "fail-message", "--pid-dir", dir],
        ))
    };
    let (node0, node1) = (start_node(0), start_node(1));
    let (out0, out1) = (node0.finish(), node1.finish());
    assert_eq!(out0.status.code(), Some(1), "node 0:\n{}", out0.all());
    assert_eq!(out1.status.code(), Some(1), "node 1:\n{}", out1.all());
    out0.assert_stderr_has("first failure: rank 1 (local rank 1 on node 0");
    out1.assert_stderr_has(
        "first failure: another node failed: rank 1 (local rank 1 on node 0) exited with code 1",
    );
    for dir in &dirs {
        let pids = pids_in(dir.path());
        assert_eq!(pids.len(), 2);
        assert_all_gone(&pids);
    }
}

#[test]
#[ignore = "needs root and iproute2 (network namespaces); .ci/run runs it"]
fn both_nodes_restart_together_after_a_failure() {
    let nodes = two_nodes();
    // fail-once records ports per attempt in --pid-dir: one directory per node.
    let dirs = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    let start_node = |k: usize| {
        let dir = dirs[k].path().to_str().expect("utf-8 path");
        start(nodes.ddp_run(
            k,
            "secret-3",
            &["--max-restarts", "1"],
            &["--mode", "fail-once", "--pid-dir", dir],
        ))
    };
    let (node0, node1) = (start_node(0), start_node(1));
    let (out0, out1) = (node0.finish(), node1.finish());
    assert!(
        out0.status.success(),
        "node 0:\n{}\nnode 1:\n{}",
        out0.all(),
        out1.all()
    );
    assert!(
        out1.status.success(),
        "node 1:\n{}\nnode 0:\n{}",
        out1.all(),
        out0.all()
    );
    for (out, ranks) in [(&out0, [0, 1]), (&out1, [2, 3])] {
        out.assert_stderr_has("restarting every worker (restart 1 of 1)");
        for rank in ranks {
            assert!(
                out.stdout
                    .contains(&format!("[rank {rank}]: RESTARTED_OK attempt=1 sum=10\n")),
                "{}",
                out.all()
            );
        }
    }
    let port = |node: usize, attempt: u32, rank: u32| {
        std::fs::read_to_string(
            dirs[node]
                .path()
                .join(format!("attempt{attempt}-rank{rank}.port")),
        )
        .expect("port")
    };
    assert_eq!(
        port(0, 1, 0),
        port(1, 1, 3),
        "one worker port per attempt across nodes"
    );
    assert_ne!(
        port(0, 0, 0),
        port(0, 1, 0),
        "a fresh worker port on restart"
    );
}

#[test]
#[ignore = "needs root and iproute2 (network namespaces); .ci/run runs it"]
fn a_two_node_job_without_a_token_refuses_to_start_and_with_one_trains() {
    let nodes = two_nodes();
    // Refused by the worker environment (it knows the job spans nodes), then by the process
    // group itself (it does not): each rank stops at once, naming the variable and the address.
    for (local_world, says) in [
        (
            true,
            "DDP_JOB_TOKEN: is not set, and this job runs on several nodes",
        ),
        (false, "DDP_JOB_TOKEN: is not set, but rank"),
    ] {
        let node0 = start(nodes.torchrun_worker(0, None, local_world));
        let node1 = start(nodes.torchrun_worker(1, None, local_world));
        for (k, out) in [node0.finish(), node1.finish()].into_iter().enumerate() {
            assert!(
                !out.status.success(),
                "node {k} ran without a token:\n{}",
                out.all()
            );
            assert!(out.stderr.contains(says), "node {k}:\n{}", out.all());
            assert!(
                out.stderr.contains("openssl rand"),
                "node {k}:\n{}",
                out.all()
            );
        }
    }
    let node0 = start(nodes.torchrun_worker(0, Some("a-secret"), false));
    let node1 = start(nodes.torchrun_worker(1, Some("a-secret"), false));
    for (rank, out) in [node0.finish(), node1.finish()].into_iter().enumerate() {
        assert!(out.status.success(), "rank {rank}:\n{}", out.all());
        // 1 + 2: the two ranks reduced over the veth link.
        assert!(
            out.stdout.contains(&format!("ALLREDUCE rank={rank} sum=3")),
            "rank {rank}:\n{}",
            out.all()
        );
    }
}
