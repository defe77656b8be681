//! The workers' environment, and that workers form a process group: through `ddp-run`, through
//! the `launch()` API, and when started by Slurm, Open MPI or torchrun-style variables.
use crate::launch_common::*;
use std::collections::HashMap;
use std::process::Command;

/// The `ENV key=value ...` line of each rank, keyed by rank, from the launcher's stdout.
fn env_lines(stdout: &str) -> HashMap<usize, HashMap<String, String>> {
    let mut ranks = HashMap::new();
    for line in stdout.lines() {
        let Some(pos) = line.find("ENV ") else {
            continue;
        };
        let fields: HashMap<String, String> = line[pos + 4..]
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let rank: usize = fields["ctx_rank"].parse().expect("rank");
        let prefix = &line[..pos];
        if !prefix.is_empty() {
            assert_eq!(
                prefix,
                format!("[rank {rank}]: "),
                "lines carry their rank's prefix"
            );
        }
        assert!(
            ranks.insert(rank, fields).is_none(),
            "rank {rank} printed twice"
        );
    }
    ranks
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Checks the environment of a 2-rank single-node job and that its all_reduce worked.
fn check_two_rank_job(out: &Finished) {
    assert!(out.status.success(), "{}", out.all());
    let ranks = env_lines(&out.stdout);
    assert_eq!(ranks.len(), 2, "{}", out.all());
    let port = &ranks[&0]["master_port"];
    assert!(port.parse::<u16>().is_ok_and(|p| p > 0), "{port}");
    let threads = (cores() / 2).max(1).to_string();
    for (rank, env) in &ranks {
        let r = rank.to_string();
        let expected = [
            ("rank", r.as_str()),
            ("local_rank", r.as_str()),
            ("world_size", "2"),
            ("local_world_size", "2"),
            ("group_rank", "0"),
            ("master_addr", "127.0.0.1"),
            ("master_port", port.as_str()),
            ("restart", "0"),
            ("torchelastic_restart", "0"),
            ("token_len", "32"),
            ("omp", threads.as_str()),
            ("rayon", threads.as_str()),
            ("worker", "1"),
            ("ctx_local_rank", r.as_str()),
            ("ctx_world_size", "2"),
            ("ctx_device", r.as_str()),
            ("ctx_restart", "0"),
            ("launcher", "DdpRun"),
        ];
        for (key, value) in expected {
            assert_eq!(env[key], value, "rank {rank} {key}\n{}", out.all());
        }
        assert!(
            out.stdout
                .contains(&format!("[rank {rank}]: ALLREDUCE rank={rank} sum=3\n")),
            "{}",
            out.all()
        );
    }
}

#[test]
fn ddp_run_workers_get_the_torchrun_environment_and_form_a_group() {
    let mut cmd = ddp_run();
    cmd.args(["--nproc-per-node", "2", "--"])
        .arg(worker_path())
        .args(["--mode", "env"]);
    check_two_rank_job(&run(cmd));
}

#[test]
fn launch_api_starts_itself_per_rank_and_workers_form_a_group() {
    let mut cmd = worker();
    cmd.args(["--nproc-per-node", "2", "--mode", "env"]);
    check_two_rank_job(&run(cmd));
}

#[test]
fn existing_job_token_thread_counts_and_fixed_port_are_honoured() {
    let port = free_port();
    let mut cmd = ddp_run();
    cmd.env("DDP_JOB_TOKEN", "sharedsecret")
        .env("OMP_NUM_THREADS", "3")
        .args([
            "--nproc-per-node",
            "2",
            "--master-port",
            &port.to_string(),
            "--",
        ])
        .arg(worker_path())
        .args(["--mode", "env"]);
    let out = run(cmd);
    assert!(out.status.success(), "{}", out.all());
    let ranks = env_lines(&out.stdout);
    for env in ranks.values() {
        assert_eq!(env["token_len"], "12");
        assert_eq!(env["omp"], "3");
        assert_eq!(env["rayon"], (cores() / 2).max(1).to_string());
        assert_eq!(env["master_port"], port.to_string());
    }
    assert_eq!(ranks.len(), 2);
}

/// Starts `n` copies of the example directly (no launcher) with `vars(rank)`, and checks that
/// each ran as a worker of `launcher` and all-reduced with the others.
fn run_external(n: usize, launcher: &str, vars: impl Fn(usize) -> Vec<(String, String)>) {
    let running: Vec<_> = (0..n)
        .map(|rank| {
            let mut cmd = worker();
            cmd.args(["--mode", "env"]);
            for (k, v) in vars(rank) {
                cmd.env(k, v);
            }
            start(cmd)
        })
        .collect();
    let sum = (n * (n + 1) / 2).to_string();
    for (rank, r) in running.into_iter().enumerate() {
        let out = r.finish();
        assert!(out.status.success(), "rank {rank}: {}", out.all());
        let ranks = env_lines(&out.stdout);
        assert_eq!(
            ranks.len(),
            1,
            "ran in this process, spawned nothing: {}",
            out.all()
        );
        let env = &ranks[&rank];
        assert_eq!(env["launcher"], launcher);
        assert_eq!(env["ctx_world_size"], n.to_string());
        // No launcher of ours ran: none of its variables is set.
        assert_eq!(env["worker"], "<unset>");
        assert!(
            out.stdout
                .contains(&format!("ALLREDUCE rank={rank} sum={sum}\n")),
            "{}",
            out.all()
        );
    }
}

fn pairs(v: &[(&str, String)]) -> Vec<(String, String)> {
    v.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

#[test]
fn slurm_tasks_run_as_workers_without_spawning() {
    let port = free_port().to_string();
    run_external(2, "Slurm", |rank| {
        pairs(&[
            ("SLURM_PROCID", rank.to_string()),
            ("SLURM_LOCALID", rank.to_string()),
            ("SLURM_STEP_ID", "0".into()),
            ("SLURM_NTASKS", "2".into()),
            ("SLURM_STEP_TASKS_PER_NODE", "2".into()),
            ("SLURM_NODEID", "0".into()),
            ("SLURM_JOB_ID", "4242".into()),
            ("SLURM_JOB_NODELIST", "localhost".into()),
            ("MASTER_PORT", port.clone()),
        ])
    });
}

#[test]
fn open_mpi_ranks_run_as_workers_without_spawning() {
    let port = free_port().to_string();
    run_external(2, "OpenMpi", |rank| {
        pairs(&[
            ("OMPI_COMM_WORLD_RANK", rank.to_string()),
            ("OMPI_COMM_WORLD_LOCAL_RANK", rank.to_string()),
            ("OMPI_COMM_WORLD_SIZE", "2".into()),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2".into()),
            ("MASTER_PORT", port.clone()),
        ])
    });
}

#[test]
fn torchrun_environment_makes_a_worker_even_with_launch_flags() {
    let port = free_port().to_string();
    let mut cmd: Command = worker();
    cmd.args(["--nproc-per-node", "4", "--mode", "env"])
        .env("RANK", "0")
        .env("WORLD_SIZE", "1")
        .env("MASTER_PORT", &port);
    let out = run(cmd);
    assert!(out.status.success(), "{}", out.all());
    let ranks = env_lines(&out.stdout);
    assert_eq!(ranks.len(), 1, "{}", out.all());
    assert_eq!(ranks[&0]["launcher"], "Torchrun");
    assert_eq!(ranks[&0]["ctx_world_size"], "1");
    assert!(
        out.stdout.contains("ALLREDUCE rank=0 sum=1\n"),
        "{}",
        out.all()
    );
}

#[test]
fn launch_id_set_in_the_launchers_environment_reaches_the_workers() {
    let mut cmd = ddp_run();
    cmd.env("DDP_LAUNCH_ID", "from-env")
        .args(["--nproc-per-node", "1", "--", "sh", "-c"])
        .arg("echo ID=$DDP_LAUNCH_ID");
    let out = run(cmd);
    assert!(out.status.success(), "{}", out.all());
    assert!(out.stdout.contains("ID=from-env\n"), "{}", out.all());
}

#[test]
fn a_launch_inside_another_launchs_worker_draws_its_own_launch_id() {
    let mut cmd = ddp_run();
    // What a worker of another launch has: its launcher's id, and the worker mark.
    cmd.env("DDP_LAUNCH_ID", "outer-launch")
        .env("DDP_LAUNCH_WORKER", "1")
        .args(["--nproc-per-node", "1", "--", "sh", "-c"])
        .arg("echo ID=$DDP_LAUNCH_ID");
    let out = run(cmd);
    assert!(out.status.success(), "{}", out.all());
    let id = out
        .stdout
        .lines()
        .find_map(|l| l.split_once("ID=").map(|(_, id)| id.to_string()))
        .unwrap_or_else(|| panic!("no ID line: {}", out.all()));
    assert!(
        id != "outer-launch" && id.len() >= 16,
        "{id}: {}",
        out.all()
    );
}
