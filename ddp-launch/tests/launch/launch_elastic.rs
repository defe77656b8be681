//! Elastic jobs: several `ddp-run --nnodes 2:3 --rdzv-backend c10d` launchers on this host,
//! each a "node" with two workers of `launch_worker --mode elastic` (they record the world size
//! of every round, and stop together once the test creates the file `stop`). Nodes are killed,
//! frozen and added while the job runs; the job must re-form at the new size each time.
use crate::launch_common::*;
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Generous: rounds wait for last calls, heartbeats and grace periods on a loaded machine.
pub(crate) const ROUND_DEADLINE: Duration = Duration::from_secs(90);
pub(crate) const NPROC: usize = 2;
/// The job's `--rdzv-id`.
pub(crate) const JOB_ID: &str = "elastic-test";
/// `--rdzv-last-call`: once MIN nodes joined, a round waits this long for the others. The
/// launchers of a 3-node round start one after another, and on a busy machine the last may
/// join a few seconds after the second; a round closed without it would add a round the tests
/// do not expect.
pub(crate) const LAST_CALL_SECS: u64 = 5;
/// `--rdzv-heartbeat-timeout`: long enough that a live launcher starved of the CPU on a busy
/// machine is never taken for dead.
pub(crate) const HEARTBEAT_TIMEOUT_SECS: u64 = 6;

/// What one worker wrote when its round started.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Record {
    pub(crate) world: usize,
    pub(crate) node_rank: usize,
    pub(crate) pid: i32,
    pub(crate) launcher: i32,
}

/// A job of launchers on this host sharing one rendezvous endpoint and one record directory.
pub(crate) struct ElasticJob {
    dir: tempfile::TempDir,
    backend: &'static str,
    port: u16,
    /// `--nnodes`.
    nnodes: &'static str,
    /// `--rdzv-last-call`, in seconds.
    last_call_secs: u64,
    pub(crate) agents: Vec<Running>,
}

/// A port nobody listens on now.
impl ElasticJob {
    /// A `c10d` job: the first launcher hosts the rendezvous on a free port.
    fn new() -> ElasticJob {
        ElasticJob::with_backend("c10d", free_port())
    }

    /// A job with `--rdzv-backend backend` at `127.0.0.1:port`.
    pub(crate) fn with_backend(backend: &'static str, port: u16) -> ElasticJob {
        ElasticJob {
            dir: tempfile::tempdir().expect("tempdir"),
            backend,
            port,
            nnodes: "2:3",
            last_call_secs: LAST_CALL_SECS,
            agents: Vec::new(),
        }
    }

    pub(crate) fn command(&self, extra: &[&str]) -> Command {
        let mut cmd = ddp_run();
        cmd.args([
            "--nnodes",
            self.nnodes,
            "--nproc-per-node",
            &NPROC.to_string(),
            "--rdzv-backend",
            self.backend,
            "--rdzv-endpoint",
            &format!("127.0.0.1:{}", self.port),
            "--rdzv-id",
            JOB_ID,
            "--rdzv-last-call",
            &self.last_call_secs.to_string(),
            "--rdzv-heartbeat-timeout",
            &HEARTBEAT_TIMEOUT_SECS.to_string(),
            "--grace-period",
            "1",
            "--join-timeout",
            "80",
        ])
        .args(extra)
        .arg("--")
        .arg(worker_path())
        .args(["--mode", "elastic", "--pid-dir"])
        .arg(self.dir.path())
        .env("DDP_JOB_TOKEN", "elastic-test-token");
        cmd
    }

    /// Starts a node's launcher; returns its index in `agents`.
    pub(crate) fn start_agent(&mut self, extra: &[&str]) -> usize {
        self.agents.push(start(self.command(extra)));
        self.agents.len() - 1
    }

    /// Starts the launcher that hosts the store (the first to bind the endpoint) and waits
    /// until it listens, so the test knows which node hosts it.
    fn start_host(&mut self, extra: &[&str]) -> usize {
        let i = self.start_agent(extra);
        let deadline = Instant::now() + ROUND_DEADLINE;
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                self.agents[i].child.try_wait().expect("try_wait").is_none(),
                "the first launcher exited before listening"
            );
            assert!(
                Instant::now() < deadline,
                "the first launcher never listened"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        i
    }

    pub(crate) fn pid(&self, agent: usize) -> i32 {
        self.agents[agent].child.id() as i32
    }

    /// Every worker record written so far, by file name.
    pub(crate) fn records(&self) -> Vec<(String, Record)> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(self.dir.path()).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "world") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read record");
            let f: Vec<i64> = text
                .split_whitespace()
                .map(|x| x.parse().expect("number"))
                .collect();
            let name = path
                .file_stem()
                .expect("stem")
                .to_string_lossy()
                .into_owned();
            out.push((
                name,
                Record {
                    world: f[0] as usize,
                    node_rank: f[1] as usize,
                    pid: f[2] as i32,
                    launcher: f[3] as i32,
                },
            ));
        }
        out
    }

    /// The `DDP_LAUNCH_ID` of every worker that ever ran (a `.launch` file per `.world`
    /// record), by file name.
    pub(crate) fn launch_ids(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(self.dir.path()).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "launch") {
                let id = std::fs::read_to_string(&path).expect("read launch id");
                let name = path
                    .file_name()
                    .expect("name")
                    .to_string_lossy()
                    .into_owned();
                out.push((name, id));
            }
        }
        out.sort();
        out
    }

    /// Waits until every rank of `round` started with world size `world`; returns their
    /// records by rank. A round of another size fails the test.
    pub(crate) fn wait_round(&mut self, round: u32, world: usize) -> Vec<Record> {
        let deadline = Instant::now() + ROUND_DEADLINE;
        loop {
            let records = self.records();
            let mine: Vec<Record> = (0..world)
                .filter_map(|rank| {
                    let name = format!("round{round}-rank{rank}");
                    records.iter().find(|(n, _)| *n == name).map(|(_, r)| *r)
                })
                .collect();
            for (name, r) in &records {
                if name.starts_with(&format!("round{round}-")) {
                    assert_eq!(r.world, world, "{name}: {r:?}\n{}", self.describe());
                }
            }
            if mine.len() == world {
                return mine;
            }
            assert!(
                Instant::now() < deadline,
                "round {round} with world {world} did not start within {ROUND_DEADLINE:?}\n{}",
                self.describe()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn describe(&self) -> String {
        let mut names: Vec<String> = self
            .records()
            .into_iter()
            .map(|(n, r)| format!("{n}: {r:?}"))
            .collect();
        names.sort();
        names.join("\n")
    }

    /// SIGKILLs launcher `agent` and its workers of `records` (a dead machine).
    pub(crate) fn kill_node(&self, agent: usize, records: &[Record]) {
        let launcher = self.pid(agent);
        // SAFETY: signals to processes this test started (the launcher and its workers).
        unsafe { libc::kill(launcher, libc::SIGKILL) };
        for r in records.iter().filter(|r| r.launcher == launcher) {
            // SAFETY: as above.
            unsafe { libc::kill(r.pid, libc::SIGKILL) };
        }
    }

    /// Lets the workers finish, and waits for launchers `agents` to exit; returns their output.
    pub(crate) fn finish(&mut self, agents: &[usize]) -> Vec<Finished> {
        std::fs::write(self.dir.path().join("stop"), b"").expect("write stop file");
        let mut done = Vec::new();
        for &i in agents {
            let placeholder = start(Command::new("true"));
            let running = std::mem::replace(&mut self.agents[i], placeholder);
            done.push(running.finish());
        }
        done
    }

    /// Every worker that ever ran, for the orphan check.
    pub(crate) fn all_workers(&self) -> Vec<(String, i32)> {
        self.records()
            .into_iter()
            .map(|(n, r)| (n, r.pid))
            .collect()
    }
}

impl Drop for ElasticJob {
    fn drop(&mut self) {
        // After a failed assertion: nothing this test started may survive it.
        for a in &mut self.agents {
            let _ = a.child.kill();
            let _ = a.child.wait();
        }
        kill_all(&self.all_workers());
    }
}

pub(crate) fn node_of(records: &[Record], launcher: i32) -> Vec<Record> {
    records
        .iter()
        .copied()
        .filter(|r| r.launcher == launcher)
        .collect()
}

pub(crate) fn assert_succeeded(out: &Finished) {
    assert_eq!(out.status.code(), Some(0), "{}", out.all());
    assert!(!out.stderr.contains("panicked"), "{}", out.all());
}

/// The rounds block a launcher printed at exit: its lines, trimmed.
pub(crate) fn rounds_printed(out: &Finished) -> Vec<String> {
    out.stderr
        .lines()
        .skip_while(|l| !l.starts_with("ddp launcher: elastic job rounds"))
        .skip(1)
        .take_while(|l| l.starts_with("    round "))
        .map(|l| l.trim().to_string())
        .collect()
}

#[test]
fn a_killed_node_shrinks_the_job_and_a_new_node_grows_it_back() {
    let mut job = ElasticJob::new();
    let host = job.start_host(&["--max-restarts", "3"]);
    let second = job.start_agent(&["--max-restarts", "3"]);
    let third = job.start_agent(&["--max-restarts", "3"]);

    let round0 = job.wait_round(0, 3 * NPROC);
    for agent in [host, second, third] {
        assert_eq!(node_of(&round0, job.pid(agent)).len(), NPROC);
    }

    kill_a_node_then_grow_back(&mut job, [host, second, third], third, &round0, "c10d");
}

/// The shared scenario of both backends: `victim` (one of the three `agents` of round 0) dies
/// with its workers; the other two re-form a 2-node round; a fourth node grows the job back to
/// three; every launcher ends successfully and prints the same three rounds, naming the dead
/// node. `backend` only labels the printed timings.
pub(crate) fn kill_a_node_then_grow_back(
    job: &mut ElasticJob,
    agents: [usize; 3],
    victim: usize,
    round0: &[Record],
    backend: &str,
) {
    // A node dies: its launcher and workers at once, as with a lost machine.
    let killed_pid = job.pid(victim);
    let killed_at = Instant::now();
    job.kill_node(victim, round0);
    let round1 = job.wait_round(1, 2 * NPROC);
    println!(
        "elastic ({backend}): from a node's death to 2-node training again: {:.2} s (grace period 1 s, last call {LAST_CALL_SECS} s)",
        killed_at.elapsed().as_secs_f64()
    );
    assert!(node_of(&round1, killed_pid).is_empty());
    let mut node_ranks: Vec<usize> = round1.iter().map(|r| r.node_rank).collect();
    node_ranks.sort();
    assert_eq!(node_ranks, [0, 0, 1, 1]);

    // A new node arrives: the job grows back to three nodes.
    let arrived_at = Instant::now();
    let fourth = job.start_agent(&["--max-restarts", "3"]);
    let round2 = job.wait_round(2, 3 * NPROC);
    println!(
        "elastic ({backend}): from a new node's start to 3-node training: {:.2} s",
        arrived_at.elapsed().as_secs_f64()
    );
    assert_eq!(node_of(&round2, job.pid(fourth)).len(), NPROC);

    let workers = job.all_workers();
    let survivors: Vec<usize> = agents.into_iter().filter(|&a| a != victim).collect();
    let outs = job.finish(&[survivors[0], survivors[1], fourth]);
    for out in &outs {
        assert_succeeded(out);
    }
    // Every launcher, the late one too, gave its workers the first launcher's launch id.
    let ids = job.launch_ids();
    assert_eq!(ids.len(), workers.len(), "{ids:?}");
    assert!(
        ids.iter().all(|(_, id)| !id.is_empty() && *id == ids[0].1),
        "{ids:?}"
    );
    let rounds = rounds_printed(&outs[0]);
    println!("rounds from the summary:\n{}", rounds.join("\n"));
    assert_eq!(rounds.len(), 3, "{}", outs[0].all());
    // Whichever rank noticed first, the summary names the node that is gone.
    assert!(
        rounds[0].starts_with("round 0: 3 node(s)")
            && rounds[0].contains("failure: ")
            && rounds[0].contains("; not in the next round: ")
            && rounds[0].ends_with(&format!(":{killed_pid}")),
        "{rounds:?}"
    );
    assert!(
        rounds[1].starts_with("round 1: 2 node(s)") && rounds[1].contains("node joined: "),
        "{rounds:?}"
    );
    assert!(
        rounds[2].starts_with("round 2: 3 node(s)") && rounds[2].contains("completed"),
        "{rounds:?}"
    );
    // Every node printed the same history.
    for out in &outs[1..] {
        assert_eq!(rounds_printed(out), rounds, "{}", out.all());
    }
    assert_all_gone(&workers);
}

#[test]
fn a_frozen_node_is_dropped_when_its_heartbeats_stop() {
    let mut job = ElasticJob::new();
    let host = job.start_host(&["--max-restarts", "1"]);
    let second = job.start_agent(&["--max-restarts", "1"]);
    let frozen = job.start_agent(&["--max-restarts", "1"]);
    let round0 = job.wait_round(0, 3 * NPROC);

    // A hung machine: its launcher and workers stop, their connections stay open, so only the
    // missing heartbeats tell the other nodes.
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
        "elastic (c10d): from a node freezing to 2-node training again: {:.2} s (heartbeat timeout {HEARTBEAT_TIMEOUT_SECS} s)",
        frozen_at.elapsed().as_secs_f64()
    );
    job.kill_node(frozen, &round0);

    let workers = job.all_workers();
    let outs = job.finish(&[host, second]);
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

/// Preemption: SIGTERM to a node's launcher stops its workers and takes the node out of the
/// job; the others go on without it.
#[test]
fn an_interrupted_node_leaves_and_the_others_go_on() {
    let mut job = ElasticJob::new();
    let host = job.start_host(&["--max-restarts", "1"]);
    let second = job.start_agent(&["--max-restarts", "1"]);
    let leaving = job.start_agent(&["--max-restarts", "1"]);
    job.wait_round(0, 3 * NPROC);
    let launcher = job.pid(leaving);
    // SAFETY: a process this test started.
    unsafe { libc::kill(launcher, libc::SIGTERM) };
    let placeholder = start(Command::new("true"));
    let left = std::mem::replace(&mut job.agents[leaving], placeholder).finish();
    assert_eq!(
        left.status.code(),
        Some(128 + libc::SIGTERM),
        "{}",
        left.all()
    );
    job.wait_round(1, 2 * NPROC);

    let workers = job.all_workers();
    let outs = job.finish(&[host, second]);
    for out in &outs {
        assert_succeeded(out);
    }
    let rounds = rounds_printed(&outs[0]);
    assert!(
        rounds[0].contains(&format!(":{launcher}: node "))
            && rounds[0].contains("was interrupted by SIGTERM")
            && rounds[0].contains("; not in the next round: ")
            && rounds[0].ends_with(&format!(":{launcher}")),
        "{rounds:?}"
    );
    assert_all_gone(&workers);
}

/// A launcher started apart from the job's others, its log in a file that the test reads while
/// it runs (to tell when it joined a round); killed if the test fails first.
struct Logged {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl Logged {
    fn start(mut cmd: Command, log: std::path::PathBuf) -> Logged {
        let file = std::fs::File::create(&log).expect("create log");
        let child = cmd
            .env("RUST_LOG", "ddp_launch=info,warn")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawn");
        Logged { child, log }
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the launcher logged `line`.
    fn wait_for(&mut self, line: &str) {
        let deadline = Instant::now() + ROUND_DEADLINE;
        while !self.text().contains(line) {
            assert!(
                self.child.try_wait().expect("try_wait").is_none(),
                "the launcher exited before {line:?}:\n{}",
                self.text()
            );
            assert!(
                Instant::now() < deadline,
                "no {line:?} within {ROUND_DEADLINE:?}:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` and waits for the launcher to exit; its exit status.
    fn stop(&mut self, signal: i32) -> std::process::ExitStatus {
        // SAFETY: a process this test started.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        let deadline = Instant::now() + ROUND_DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the launcher outlived its signal:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two of four launchers leave while their first round waits out its last call, after they
/// joined it: one is interrupted (SIGTERM: it withdraws), one dies (SIGKILL: its heartbeats
/// stop). The round closes with the other two, ranked 0 and 1, and the job succeeds with no
/// restart to spend (`--max-restarts 0`).
#[test]
fn nodes_that_leave_during_the_last_call_are_not_in_the_round() {
    let mut job = ElasticJob::new();
    // Room for all four, so that only the last call closes the round; long enough for the
    // heartbeats of the killed node to stop counting (HEARTBEAT_TIMEOUT_SECS) before it ends.
    job.nnodes = "2:5";
    job.last_call_secs = 4 * HEARTBEAT_TIMEOUT_SECS;
    let host = job.start_host(&["--max-restarts", "0"]);
    let second = job.start_agent(&["--max-restarts", "0"]);
    let logs = job.dir.path().join("logs");
    std::fs::create_dir_all(&logs).expect("log dir");
    let mut interrupted = Logged::start(
        job.command(&["--max-restarts", "0"]),
        logs.join("interrupted.log"),
    );
    let mut killed = Logged::start(
        job.command(&["--max-restarts", "0"]),
        logs.join("killed.log"),
    );
    interrupted.wait_for("joined a rendezvous round");
    killed.wait_for("joined a rendezvous round");
    let killed_pid = killed.child.id() as i32;
    let interrupted_pid = interrupted.child.id() as i32;
    killed.stop(libc::SIGKILL);
    let status = interrupted.stop(libc::SIGTERM);
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGTERM),
        "{}",
        interrupted.text()
    );
    assert!(
        interrupted
            .text()
            .contains("withdrew from the round before it closed"),
        "{}",
        interrupted.text()
    );

    let round0 = job.wait_round(0, 2 * NPROC);
    let mut node_ranks: Vec<usize> = round0.iter().map(|r| r.node_rank).collect();
    node_ranks.sort();
    assert_eq!(node_ranks, [0, 0, 1, 1]);
    for agent in [host, second] {
        assert_eq!(node_of(&round0, job.pid(agent)).len(), NPROC);
    }

    let workers = job.all_workers();
    let outs = job.finish(&[host, second]);
    for out in &outs {
        assert_succeeded(out);
    }
    let rounds = rounds_printed(&outs[0]);
    assert_eq!(rounds.len(), 1, "{}", outs[0].all());
    assert!(
        rounds[0].starts_with("round 0: 2 node(s)")
            && rounds[0].contains("completed")
            && !rounds[0].contains(&format!(":{killed_pid}"))
            && !rounds[0].contains(&format!(":{interrupted_pid}")),
        "{rounds:?}"
    );
    assert_eq!(rounds_printed(&outs[1]), rounds, "{}", outs[1].all());
    assert_all_gone(&workers);
}

#[test]
fn a_failure_with_no_restarts_left_stops_every_node_with_the_rounds() {
    let mut job = ElasticJob::new();
    let host = job.start_host(&[]);
    let second = job.start_agent(&[]);
    let third = job.start_agent(&[]);
    let round0 = job.wait_round(0, 3 * NPROC);
    job.kill_node(third, &round0);
    let workers = job.all_workers();
    for i in [host, second] {
        let placeholder = start(Command::new("true"));
        let out = std::mem::replace(&mut job.agents[i], placeholder).finish();
        assert_eq!(out.status.code(), Some(1), "{}", out.all());
        out.assert_stderr_has("ended in a failure with no restarts left (--max-restarts 0)");
        let summary_rounds = out
            .stderr
            .lines()
            .skip_while(|l| !l.starts_with("  rounds:"))
            .nth(1)
            .unwrap_or_default();
        assert!(
            summary_rounds.starts_with("    round 0: 3 node(s)")
                && summary_rounds.contains("failure: "),
            "{}",
            out.all()
        );
    }
    assert!(
        !job.dir.path().join("round1-rank0.world").exists(),
        "no second round may start"
    );
    assert_all_gone(&workers);
}

/// A round re-formed because a node joined spends no restart, so a failure in the next round
/// is still attempt 1: every failure summary counts the restarts spent, not the rounds.
#[test]
fn a_failure_after_a_node_joined_is_reported_as_the_first_attempt() {
    let mut job = ElasticJob::new();
    job.nnodes = "1:2";
    job.last_call_secs = 1;
    let host = job.start_host(&[]);
    job.wait_round(0, NPROC);
    // The second node's arrival ends round 0 (no restart spent) and forms round 1.
    let second = job.start_agent(&[]);
    let round1 = job.wait_round(1, 2 * NPROC);
    let victim = node_of(&round1, job.pid(second))[0];
    // SAFETY: killing a worker this test's launcher started (its pid from its record).
    unsafe { libc::kill(victim.pid, libc::SIGKILL) };
    let workers = job.all_workers();
    for i in [host, second] {
        let placeholder = start(Command::new("true"));
        let out = std::mem::replace(&mut job.agents[i], placeholder).finish();
        assert_eq!(out.status.code(), Some(1), "{}", out.all());
        out.assert_stderr_has("ended in a failure with no restarts left (--max-restarts 0)");
        let attempts: Vec<&str> = out
            .stderr
            .lines()
            .filter(|l| l.trim_start().starts_with("attempt:"))
            .collect();
        assert!(
            !attempts.is_empty()
                && attempts
                    .iter()
                    .all(|l| l.trim() == "attempt:       1 of 1 (--max-restarts 0)"),
            "{attempts:?}\n{}",
            out.all()
        );
    }
    assert_all_gone(&workers);
}

fn assert_flags_refused(args: &[&str], expected: &str) {
    let mut cmd = ddp_run();
    cmd.args(args)
        .args(["--", "true"])
        .env("DDP_JOB_TOKEN", "t");
    crate::launch_common::assert_usage_error(&run(cmd), expected);
}

#[test]
fn bad_elastic_flags_are_rejected_with_what_to_do() {
    let ep = ["--rdzv-endpoint", "127.0.0.1:29400"];
    let with_ep =
        |args: &[&'static str]| -> Vec<&'static str> { args.iter().copied().chain(ep).collect() };
    assert_flags_refused(
        &with_ep(&["--nnodes", "3:2"]),
        "--nnodes 3:2 is reversed: MIN must not exceed MAX",
    );
    assert_flags_refused(
        &with_ep(&["--nnodes", "0:2"]),
        "--nnodes must be at least 1, got 0",
    );
    assert_flags_refused(
        &["--nnodes", "2:x"],
        "expected a number of nodes N or a range MIN:MAX (e.g. 2:4), got '2:x'",
    );
    assert_flags_refused(
        &["--nnodes", "2:3"],
        "--rdzv-backend c10d needs --rdzv-endpoint HOST:PORT",
    );
    assert_flags_refused(
        &with_ep(&["--nnodes", "2:3", "--node-rank", "1"]),
        "--node-rank 1 cannot be used with --rdzv-backend c10d: the rendezvous assigns node ranks",
    );
    assert_flags_refused(
        &with_ep(&["--nnodes", "2:3", "--master-port", "29500"]),
        "--master-port 29500 cannot be used with --rdzv-backend c10d",
    );
    assert_flags_refused(
        &with_ep(&["--nnodes", "2:3", "--rdzv-backend", "static"]),
        "--nnodes 2:3 lets the job change size, which --rdzv-backend static cannot",
    );
    assert_flags_refused(
        &["--nnodes", "2:3", "--rdzv-endpoint", "node0"],
        "--rdzv-endpoint node0: expected HOST:PORT",
    );
    assert_flags_refused(
        &with_ep(&["--nnodes", "2:3", "--rdzv-heartbeat-timeout", "0.1"]),
        "--rdzv-heartbeat-timeout 100ms: must be at least 500ms",
    );
    assert_flags_refused(
        &["--nnodes", "2", "--rdzv-endpoint", "h:1"],
        "--rdzv-endpoint h:1 cannot be used with --rdzv-backend static",
    );
    // Without the shared secret.
    let mut cmd = ddp_run();
    cmd.args(["--nnodes", "2:3"]).args(ep).args(["--", "true"]);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(2), "{}", out.all());
    out.assert_stderr_has("needs a shared job token");
}

/// Nodes must agree on the settings that shape the job: the host's are the job's (its store
/// holds them before it serves anyone, so a node with others never races it for them).
#[test]
fn a_node_with_other_settings_is_refused() {
    let mut job = ElasticJob::new();
    let host = job.start_host(&[]);
    let mut cmd = job.command(&["--max-restarts", "2"]);
    cmd.env("RUST_LOG", "warn");
    let refused = run(cmd);
    assert_eq!(refused.status.code(), Some(1), "{}", refused.all());
    refused.assert_stderr_has("the first node runs with --nnodes 2:3 --nproc-per-node 2 --max-restarts 0 but this node with --nnodes 2:3 --nproc-per-node 2 --max-restarts 2");
    // The first node still waits for a second one; the test's drop stops it.
    assert!(
        job.agents[host]
            .child
            .try_wait()
            .expect("try_wait")
            .is_none(),
        "the host stopped: a node with other settings must not stop it"
    );
    assert!(!Path::new(&job.dir.path().join("round0-rank0.world")).exists());
}

/// A c10d endpoint that resolves to a loopback address of the host (as the machine's own name
/// does on Debian and Ubuntu: 127.0.1.1) is hosted on every interface, so the other hosts reach
/// it; and since other hosts cannot reach it through that address, the launcher says so.
#[test]
fn the_c10d_host_listens_on_every_interface_and_warns_of_a_loopback_endpoint() {
    let port = free_port();
    let mut cmd = ddp_run();
    cmd.args(["--nnodes", "2:3", "--rdzv-endpoint"])
        .arg(format!("127.0.1.1:{port}"))
        .args(["--join-timeout", "120", "--", "true"])
        .env("DDP_JOB_TOKEN", "t")
        .env("RUST_LOG", "warn");
    let mut launcher = start(cmd);
    // Reached on another address of the host than the endpoint's: it listens on all of them.
    let deadline = Instant::now() + ROUND_DEADLINE;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            launcher.child.try_wait().expect("try_wait").is_none(),
            "the launcher exited before listening"
        );
        assert!(
            Instant::now() < deadline,
            "the launcher never listened on 127.0.0.1:{port} (endpoint 127.0.1.1:{port})"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: the launcher this test started; it still runs (waiting for a second node).
    unsafe { libc::kill(launcher.child.id() as i32, libc::SIGTERM) };
    let out = launcher.finish();
    assert_eq!(
        out.status.code(),
        Some(128 + libc::SIGTERM),
        "{}",
        out.all()
    );
    out.assert_stderr_has(&format!(
        "--rdzv-endpoint 127.0.1.1:{port} is a loopback address (127.0.1.1): nodes on other hosts cannot reach the rendezvous through it"
    ));
}

#[cfg(not(feature = "etcd"))]
#[test]
fn etcd_without_its_feature_says_how_to_build_it() {
    assert_flags_refused(
        &[
            "--nnodes",
            "2:3",
            "--rdzv-backend",
            "etcd",
            "--rdzv-endpoint",
            "127.0.0.1:2379",
        ],
        "--rdzv-backend etcd is not built into this launcher: build ddp-launch with `--features etcd`",
    );
}
