//! Static multi-node jobs on one host: two `ddp-run --nnodes 2` launchers, node 0 and node 1,
//! meeting over loopback (no namespaces, no root). Node 1 may run another program than node 0:
//! the nodes only check `--nnodes`, `--nproc-per-node`, `--max-restarts` (and the rendezvous
//! protocol version).
use crate::launch_common::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `--join-timeout`: both launchers start at once, so node 1 joins well within it even on a
/// loaded machine; it is also how long a node whose workers succeeded waits for the others.
const JOIN_TIMEOUT: &str = "15";
/// `DDP_NODE_TAKEOVER_SECS`: how long a launcher started for a held `--node-rank` watches the
/// holder's heartbeat (beating every second) before taking its place; the default 15 s would
/// have each takeover test wait it out. Still five beats: a live holder on a busy machine is
/// seen beating well within it (the tests with a live holder expect a refusal).
const TAKEOVER_SECS: &str = "5";
/// How long to wait for a launcher to print something or exit (generous: a loaded machine).
const WAIT: Duration = Duration::from_secs(180);

/// `ddp-run` as node `node_rank` of a 2-node job at `127.0.0.1:port`, with `nproc` workers
/// running `program`, logging at info.
fn node(node_rank: usize, port: u16, nproc: usize, program: &[&str]) -> Command {
    node_of(2, node_rank, port, nproc, program)
}

/// [`node`] of an `nnodes`-node job.
fn node_of(nnodes: usize, node_rank: usize, port: u16, nproc: usize, program: &[&str]) -> Command {
    node_with(nnodes, node_rank, port, nproc, &[], program)
}

/// [`node_of`] with more launcher flags (a `--join-timeout` among them replaces
/// [`JOIN_TIMEOUT`]).
fn node_with(
    nnodes: usize,
    node_rank: usize,
    port: u16,
    nproc: usize,
    flags: &[&str],
    program: &[&str],
) -> Command {
    node_at("127.0.0.1", nnodes, node_rank, port, nproc, flags, program)
}

/// [`node_with`] of a job at `master_addr:port`.
fn node_at(
    master_addr: &str,
    nnodes: usize,
    node_rank: usize,
    port: u16,
    nproc: usize,
    flags: &[&str],
    program: &[&str],
) -> Command {
    let mut cmd = ddp_run();
    cmd.env("DDP_JOB_TOKEN", "loopback-secret")
        .env("DDP_NODE_TAKEOVER_SECS", TAKEOVER_SECS)
        .env("RUST_LOG", "ddp_launch=info,warn")
        .args([
            "--nnodes",
            &nnodes.to_string(),
            "--node-rank",
            &node_rank.to_string(),
            "--nproc-per-node",
            &nproc.to_string(),
            "--master-addr",
            master_addr,
            "--master-port",
            &port.to_string(),
            "--grace-period",
            "2",
        ])
        .args(flags);
    if !flags.contains(&"--join-timeout") {
        cmd.args(["--join-timeout", JOIN_TIMEOUT]);
    }
    cmd.arg("--").args(program);
    cmd
}

/// The `launch_id=` of every `ENV` line a launcher printed, by rank.
fn launch_ids(out: &Finished) -> HashMap<String, String> {
    out.stdout
        .lines()
        .filter_map(|l| l.split_once("]: ENV "))
        .map(|(prefix, fields)| {
            let id = fields
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix("launch_id="))
                .unwrap_or_else(|| panic!("no launch_id in {fields}"));
            (prefix.to_string(), id.to_string())
        })
        .collect()
}

#[test]
fn every_node_of_a_static_job_gives_its_workers_node_0s_launch_id() {
    let port = free_port();
    let worker = worker_path();
    let worker = worker.to_str().expect("utf-8 path");
    let program = [worker, "--mode", "env"];
    // Each launcher draws an id of its own; node 1 must adopt node 0's.
    let node0 = start(node(0, port, 2, &program));
    let node1 = start(node(1, port, 2, &program));
    let (out0, out1) = (node0.finish(), node1.finish());
    assert!(out0.status.success(), "node 0:\n{}", out0.all());
    assert!(out1.status.success(), "node 1:\n{}", out1.all());
    let mut ids = launch_ids(&out0);
    ids.extend(launch_ids(&out1));
    assert_eq!(
        ids.len(),
        4,
        "an ENV line per rank\nnode 0:\n{}\nnode 1:\n{}",
        out0.all(),
        out1.all()
    );
    let node0_id = &ids["[rank 0"];
    assert!(node0_id.len() >= 16 && node0_id != "<unset>", "{ids:?}");
    assert!(ids.values().all(|id| id == node0_id), "{ids:?}");
}

/// `--master-addr "[::1]"`, an IPv6 address given in brackets, is the same job as `::1`: the
/// launchers meet at `[::1]:PORT` (not `[[::1]]:PORT`) and the workers get the address as given.
#[test]
fn a_bracketed_ipv6_master_address_forms_the_job() {
    let port = free_port();
    let worker = worker_path();
    let program = [worker.to_str().expect("utf-8 path"), "--mode", "env"];
    let node0 = start(node_at("[::1]", 2, 0, port, 1, &[], &program));
    let node1 = start(node_at("[::1]", 2, 1, port, 1, &[], &program));
    let (out0, out1) = (node0.finish(), node1.finish());
    assert!(out0.status.success(), "node 0:\n{}", out0.all());
    assert!(out1.status.success(), "node 1:\n{}", out1.all());
    for out in [&out0, &out1] {
        assert!(!out.all().contains("[[::1]]"), "{}", out.all());
        assert!(out.stdout.contains(" master_addr=[::1] "), "{}", out.all());
    }
}

#[test]
fn two_launchers_with_the_same_node_rank_are_refused_and_every_node_stops() {
    let port = free_port();
    // Were the duplicate let in, the three launchers would make up the three nodes and start
    // workers with duplicate ranks, which would run until killed.
    let program = ["sleep", "600"];
    let ranks = [0, 1, 1];
    let launchers: Vec<Running> = ranks
        .into_iter()
        .map(|rank| start(node_of(3, rank, port, 1, &program)))
        .collect();
    let pids: Vec<u32> = launchers.iter().map(|l| l.child.id()).collect();
    let outs: Vec<Finished> = launchers.into_iter().map(Running::finish).collect();
    for (out, rank) in outs.iter().zip(ranks) {
        assert_eq!(out.status.code(), Some(1), "node {rank}:\n{}", out.all());
        out.assert_stderr_has("node 1 cannot join: --node-rank 1 is already held by launcher ");
        assert!(!out.stderr.contains("starting workers"), "{}", out.all());
    }
    // Both claimants are named (host:pid:nonce): the one that came first and the one refused.
    let refusal = outs[0]
        .stderr
        .lines()
        .find(|l| l.contains("is already held by launcher"))
        .expect("refusal line");
    for pid in &pids[1..] {
        assert!(refusal.contains(&format!(":{pid}:")), "{pid}: {refusal}");
    }
}

/// A launcher whose stderr goes to a file the test can read while it runs.
struct Logged {
    child: Child,
    log: PathBuf,
}

impl Logged {
    fn start(mut cmd: Command, log: PathBuf) -> Logged {
        let file = std::fs::File::create(&log).expect("log file");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(file));
        Logged {
            child: cmd.spawn().expect("spawn"),
            log,
        }
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the launcher printed `text`, failing if it exits first.
    #[track_caller]
    fn wait_for(&mut self, text: &str) {
        let deadline = Instant::now() + WAIT;
        while !self.text().contains(text) {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                panic!(
                    "exited ({status}) before printing {text:?}:\n{}",
                    self.text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{text:?} not printed within {WAIT:?}:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the launcher to exit; its exit code.
    #[track_caller]
    fn exit_code(&mut self) -> Option<i32> {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "still running after {WAIT:?}:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        // After a failed assertion; its workers die with it (PR_SET_PDEATHSIG).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Node 0's workers succeed at once (`true`); node 1's run until the file `stop` exists. Node 0
/// waits `--join-timeout` for node 1, warns naming it, and keeps serving the rendezvous until
/// node 1 finishes; returns (node 0, node 1, the stop file) once node 0 says so.
fn node_0_waits_for_a_running_node_1(dir: &Path) -> (Logged, Logged, PathBuf) {
    let port = free_port();
    let stop = dir.join("stop");
    let stop_arg = stop.to_str().expect("utf-8 path");
    let mut node0 = Logged::start(node(0, port, 1, &["true"]), dir.join("node0.log"));
    let node1 = Logged::start(
        node(
            1,
            port,
            1,
            &[
                "sh",
                "-c",
                "until [ -e \"$0\" ]; do sleep 0.1; done",
                stop_arg,
            ],
        ),
        dir.join("node1.log"),
    );
    node0.wait_for(&format!(
        "this node's workers all succeeded, but it did not hear from node 1 that attempt 0 finished within {JOIN_TIMEOUT}s"
    ));
    node0.wait_for("node 1 is still running attempt 0: serving it until they finish or fail");
    (node0, node1, stop)
}

#[test]
fn a_node_whose_workers_succeeded_keeps_serving_a_running_node_and_both_succeed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut node0, mut node1, stop) = node_0_waits_for_a_running_node_1(dir.path());
    std::fs::write(&stop, b"").expect("stop file");
    assert_eq!(node1.exit_code(), Some(0), "node 1:\n{}", node1.text());
    assert_eq!(node0.exit_code(), Some(0), "node 0:\n{}", node0.text());
    let log1 = node1.text();
    assert!(!log1.contains("unreachable"), "node 1:\n{log1}");
}

#[test]
fn a_signal_ends_node_0s_wait_for_a_running_node() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut node0, mut node1, stop) = node_0_waits_for_a_running_node_1(dir.path());
    let pid = libc::pid_t::try_from(node0.child.id()).expect("pid");
    // SAFETY: signalling the launcher this test started.
    unsafe { libc::kill(pid, libc::SIGINT) };
    // Its workers had succeeded: the signal only cut the wait short.
    assert_eq!(node0.exit_code(), Some(0), "node 0:\n{}", node0.text());
    let log0 = node0.text();
    assert!(
        log0.contains("interrupted by SIGINT while the other nodes' launchers were connected"),
        "node 0:\n{log0}"
    );
    // Node 1 lost its rendezvous and stops; then nothing is left running.
    std::fs::write(&stop, b"").expect("stop file");
    let _ = node1.exit_code();
}

#[test]
fn a_launcher_refused_once_the_job_runs_stops_alone_and_the_job_restarts_and_succeeds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let go = dir.path().join("go");
    let go_arg = go.to_str().expect("utf-8 path");
    // Attempt 0's workers wait for `go`, then fail; attempt 1's succeed. The restart is a new
    // join, where a refusal left by the stray launcher used to stop both nodes.
    let script = "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then \
                  until [ -e \"$0\" ]; do sleep 0.1; done; exit 3; fi";
    let program = ["sh", "-c", script, go_arg];
    let restarts = ["--max-restarts", "1"];
    let launcher = |rank, name: &str| {
        Logged::start(
            node_with(2, rank, port, 1, &restarts, &program),
            dir.path().join(name),
        )
    };
    let mut node0 = launcher(0, "node0.log");
    let mut node1 = launcher(1, "node1.log");
    node0.wait_for("starting workers");
    node1.wait_for("starting workers");
    let mut stray = launcher(1, "stray.log");
    assert_eq!(stray.exit_code(), Some(1), "stray:\n{}", stray.text());
    let said = stray.text();
    assert!(
        said.contains("--node-rank 1 is already held by launcher"),
        "{said}"
    );
    assert!(
        said.contains("the job formed before this launcher came, so this refusal does not stop it"),
        "{said}"
    );
    assert!(!said.contains("starting workers"), "{said}");
    std::fs::write(&go, b"").expect("go file");
    assert_eq!(node0.exit_code(), Some(0), "node 0:\n{}", node0.text());
    assert_eq!(node1.exit_code(), Some(0), "node 1:\n{}", node1.text());
    for node in [&node0, &node1] {
        let log = node.text();
        assert!(log.contains("attempt=1"), "no restart:\n{log}");
        assert!(!log.contains("already held"), "{log}");
    }
}

#[test]
fn a_node_waiting_for_a_dead_node_quotes_the_launcher_refused_in_its_place() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let worker = worker_path();
    let program = [worker.to_str().expect("utf-8 path"), "--mode", "loop"];
    let launcher = |rank, restarts: &'static str, name: &str| {
        let mut cmd = node_with(2, rank, port, 1, &["--max-restarts", restarts], &program);
        // Node 1 may die before the workers meet: then rank 0's wait for rank 1 ends in
        // this, not the default 300 s.
        cmd.env("DDP_TIMEOUT_SECS", "20");
        Logged::start(cmd, dir.path().join(name))
    };
    let mut node0 = launcher(0, "1", "node0.log");
    let mut node1 = launcher(1, "1", "node1.log");
    node0.wait_for("starting workers");
    node1.wait_for("starting workers");
    // Node 1's launcher dies (its workers with it): node 0's workers fail, and node 0 restarts
    // and waits for node 1. The launcher started again in its place runs with other settings,
    // so it is refused, and node 0 gives up waiting.
    node1.child.kill().expect("kill node 1");
    node0.wait_for("restarting every worker (restart 1 of 1)");
    let mut again = launcher(1, "2", "again.log");
    assert_eq!(
        again.exit_code(),
        Some(1),
        "node 1 again:\n{}",
        again.text()
    );
    assert!(
        again
            .text()
            .contains("every node must use the same settings"),
        "{}",
        again.text()
    );
    assert_eq!(node0.exit_code(), Some(1), "node 0:\n{}", node0.text());
    let log = node0.text();
    assert!(
        log.contains("only 1 of 2 nodes joined attempt 1")
            && log.contains("meanwhile a launcher was refused: node 1 cannot join"),
        "node 0 names the refused launcher:\n{log}"
    );
}

/// Node 0 and node 1 (one worker each) run `program` with `--max-restarts restarts`; node 1's
/// launcher is SIGKILLed (its workers die with it) once both started their workers, and a
/// launcher started again for node 1 once node 0 printed `wait` (if any). Returns node 0 and
/// the new node 1.
fn node_1_started_again(
    dir: &Path,
    restarts: &str,
    program: &[&str],
    wait: Option<&str>,
) -> (Logged, Logged) {
    let port = free_port();
    // Node 0 may wait for node 1 while the new launcher starts and watches the dead one's
    // heartbeat: a loaded machine may take a while.
    let flags = ["--max-restarts", restarts, "--join-timeout", "120"];
    let launcher = |rank, name: &str| {
        let mut cmd = node_with(2, rank, port, 1, &flags, program);
        // A worker waiting on a dead peer gives up in this, not the default 300 s.
        cmd.env("DDP_TIMEOUT_SECS", "20");
        Logged::start(cmd, dir.join(name))
    };
    let mut node0 = launcher(0, "node0.log");
    let mut node1 = launcher(1, "node1.log");
    node0.wait_for("starting workers");
    node1.wait_for("starting workers");
    node1.child.kill().expect("kill node 1");
    let _ = node1.child.wait();
    if let Some(text) = wait {
        node0.wait_for(text);
    }
    let again = launcher(1, "again.log");
    (node0, again)
}

/// Attempt 0's workers do not talk (they sleep), so node 0 does not notice node 1's death:
/// the new launcher's arrival ends attempt 0, and both nodes' workers meet in attempt 1.
#[test]
fn a_launcher_started_again_for_a_dead_node_takes_its_place_and_the_job_restarts_and_succeeds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let worker = worker_path();
    let script = "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then exec sleep 600; fi; \
                  exec \"$0\" --mode env";
    let program = ["sh", "-c", script, worker.to_str().expect("utf-8 path")];
    let (mut node0, mut again) = node_1_started_again(dir.path(), "1", &program, None);
    assert_eq!(
        again.exit_code(),
        Some(0),
        "node 1 again:\n{}",
        again.text()
    );
    assert_eq!(node0.exit_code(), Some(0), "node 0:\n{}", node0.text());
    let (log0, log1) = (node0.text(), again.text());
    // After the takeover grace the tests set, not the default.
    assert!(
        log1.contains(&format!(
            "did not move its heartbeat for {TAKEOVER_SECS}s: this launcher"
        )) && log1.contains("takes its place"),
        "node 1 again:\n{log1}"
    );
    assert!(!log1.contains("already held"), "node 1 again:\n{log1}");
    assert!(
        log0.contains("restarting every worker (restart 1 of 1)")
            && log0.contains("and launcher ")
            && log0.contains(" took its place"),
        "node 0 restarts for the new launcher:\n{log0}"
    );
    for log in [&log0, &log1] {
        assert!(log.contains("attempt=1"), "{log}");
    }
}

/// Attempt 0's workers all-reduce: node 0's fail when node 1's die, and node 0 restarts and
/// waits for node 1; the launcher started again once node 0 joined attempt 1 joins that
/// attempt.
#[test]
fn a_launcher_started_again_for_a_dead_node_joins_the_attempt_node_0_waits_in() {
    let dir = tempfile::tempdir().expect("tempdir");
    let worker = worker_path();
    let script = "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then exec \"$0\" --mode loop; fi; \
                  exec \"$0\" --mode env";
    let program = ["sh", "-c", script, worker.to_str().expect("utf-8 path")];
    // Node 0 prints its restart line before it records attempt 1 for a launcher rejoining the
    // job; it says it joined attempt 1 once it did. Started after that, the new launcher finds
    // attempt 1 forming, whatever the machine's load.
    let (mut node0, mut again) = node_1_started_again(
        dir.path(),
        "1",
        &program,
        Some("joined attempt 1; waiting for the other nodes"),
    );
    assert_eq!(
        again.exit_code(),
        Some(0),
        "node 1 again:\n{}",
        again.text()
    );
    assert_eq!(node0.exit_code(), Some(0), "node 0:\n{}", node0.text());
    let log1 = again.text();
    assert!(
        log1.contains("rejoining the job at attempt 1, which the other nodes are forming"),
        "node 1 again:\n{log1}"
    );
    assert!(log1.contains("attempt=1"), "node 1 again:\n{log1}");
}

/// With no restart left, the launcher started again says the job will not restart for it and
/// stops (it does not wait for an attempt that never comes). It leaves the running attempt
/// alone: had the launcher it took for dead only stalled, ending the attempt would have stopped
/// a healthy job.
#[test]
fn a_launcher_started_again_for_a_dead_node_with_no_restart_left_says_so_and_leaves_the_job_alone()
{
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut node0, mut again) = node_1_started_again(dir.path(), "0", &["sleep", "600"], None);
    assert_eq!(
        again.exit_code(),
        Some(1),
        "node 1 again:\n{}",
        again.text()
    );
    let log1 = again.text();
    assert!(
        log1.contains(
            "node 1 cannot rejoin the job: it runs its last attempt (0, --max-restarts 0)"
        ) && log1.contains("leaves the other nodes' attempt alone"),
        "node 1 again:\n{log1}"
    );
    // Node 0 looks for a published failure every 250 ms: give it time to see one, were there
    // one. (This only makes the test catch one more surely.)
    std::thread::sleep(Duration::from_secs(2));
    let log0 = node0.text();
    assert!(!log0.contains(" took its place"), "node 0:\n{log0}");
    assert!(
        node0.child.try_wait().expect("try_wait").is_none(),
        "node 0 stopped:\n{log0}"
    );
}

/// `ddp-run` as node `rank` of a 3-node job at `127.0.0.1:port`: one worker, which fails at once
/// (exit 7) unless the file `node2` exists, and otherwise prints its environment once every
/// rank met. The test creates `node2` just before it starts node 2, so a node that starts its
/// workers before node 2 joined fails the job.
fn node_of_three(dir: &Path, port: u16, rank: usize, name: &str) -> Logged {
    let worker = worker_path();
    let node2 = dir.join("node2");
    let script = "if [ ! -e \"$1\" ]; then echo 'started before node 2 joined' >&2; exit 7; fi; \
                  exec \"$0\" --mode env";
    let program = [
        "sh",
        "-c",
        script,
        worker.to_str().expect("utf-8 path"),
        node2.to_str().expect("utf-8 path"),
    ];
    // Node 0 waits for node 1's launcher to be started again and to watch the dead one's
    // heartbeat: a loaded machine may take a while.
    let mut cmd = node_with(3, rank, port, 1, &["--join-timeout", "180"], &program);
    // A worker waiting on a missing peer gives up in this, not the default 300 s.
    cmd.env("DDP_TIMEOUT_SECS", "60");
    Logged::start(cmd, dir.join(name))
}

/// Starts node 0 and node 1 of a 3-node job and waits until both joined attempt 0 (node 2 is
/// not started yet, so they wait for it).
fn nodes_0_and_1_waiting_for_node_2(dir: &Path, port: u16) -> (Logged, Logged) {
    let mut node0 = node_of_three(dir, port, 0, "node0.log");
    let mut node1 = node_of_three(dir, port, 1, "node1.log");
    node0.wait_for("joined attempt 0; waiting for the other nodes");
    node1.wait_for("joined attempt 0; waiting for the other nodes");
    (node0, node1)
}

/// Creates `node2`, starts node 2, and checks that every launcher given succeeds.
fn start_node_2_and_succeed(dir: &Path, port: u16, mut nodes: Vec<(&str, Logged)>) {
    // Give a node that (wrongly) counted the job formed without node 2 time to start its
    // workers, which then fail for want of `node2`. (This only makes the test catch that
    // more surely; it never makes a correct launcher fail.)
    std::thread::sleep(Duration::from_secs(2));
    std::fs::write(dir.join("node2"), b"").expect("node2 file");
    nodes.push(("node 2", node_of_three(dir, port, 2, "node2.log")));
    for (name, node) in &mut nodes {
        assert_eq!(node.exit_code(), Some(0), "{name}:\n{}", node.text());
    }
    for (name, node) in &nodes {
        let log = node.text();
        assert!(
            !log.contains("started before node 2 joined"),
            "{name}:\n{log}"
        );
        assert!(log.contains("starting workers"), "{name}:\n{log}");
    }
}

/// Node 1's launcher dies after joining attempt 0, while the job still waits for node 2: the
/// launcher started again for node 1 joins the same attempt without counting node 1 a second
/// time, so the attempt forms only once node 2 joins, and the job succeeds.
#[test]
fn a_node_whose_launcher_died_while_the_job_formed_is_counted_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let (node0, mut node1) = nodes_0_and_1_waiting_for_node_2(dir.path(), port);
    node1.child.kill().expect("kill node 1");
    let _ = node1.child.wait();
    let mut again = node_of_three(dir.path(), port, 1, "again.log");
    again.wait_for("rejoining the job at attempt 0, which the other nodes are forming");
    again.wait_for("node 1 is counted in attempt 0 already");
    start_node_2_and_succeed(
        dir.path(),
        port,
        vec![("node 0", node0), ("node 1 again", again)],
    );
}

/// Node 1's launcher stalls (SIGSTOP) while it waits for node 2, long enough for a launcher
/// started again for node 1 to take its place; resumed, it finds its claim gone and stops
/// instead of starting a second node 1, and the job succeeds without it.
#[test]
fn a_stalled_launcher_whose_place_was_taken_while_the_job_formed_stops() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let (node0, mut node1) = nodes_0_and_1_waiting_for_node_2(dir.path(), port);
    let pid = libc::pid_t::try_from(node1.child.id()).expect("pid");
    // SAFETY: signalling the launcher this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let mut again = node_of_three(dir.path(), port, 1, "again.log");
    again.wait_for("node 1 is counted in attempt 0 already");
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert_eq!(node1.exit_code(), Some(1), "node 1:\n{}", node1.text());
    let log1 = node1.text();
    assert!(
        log1.contains("no longer holds --node-rank 1"),
        "node 1:\n{log1}"
    );
    assert!(!log1.contains("starting workers"), "node 1:\n{log1}");
    start_node_2_and_succeed(
        dir.path(),
        port,
        vec![("node 0", node0), ("node 1 again", again)],
    );
}

/// Node 1's workers succeed at once and its launcher exits 0 after waiting `--join-timeout` for
/// node 0, whose workers run until the file `stop` exists. A launcher started again for node 1
/// then (a supervisor restarting whatever exits) says node 1 is done and ends successfully,
/// without ending node 0's attempt (which it would restart, were a restart not spent for it).
#[test]
fn a_launcher_started_again_for_a_node_that_finished_leaves_the_job_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let stop = dir.path().join("stop");
    let stop_arg = stop.to_str().expect("utf-8 path");
    let wait_for_stop = [
        "sh",
        "-c",
        "until [ -e \"$0\" ]; do sleep 0.1; done",
        stop_arg,
    ];
    let flags = ["--max-restarts", "1"];
    let mut node0 = Logged::start(
        node_with(2, 0, port, 1, &flags, &wait_for_stop),
        dir.path().join("node0.log"),
    );
    let launcher1 = |name: &str| {
        Logged::start(
            node_with(2, 1, port, 1, &flags, &["true"]),
            dir.path().join(name),
        )
    };
    let mut node1 = launcher1("node1.log");
    assert_eq!(node1.exit_code(), Some(0), "node 1:\n{}", node1.text());
    let mut again = launcher1("again.log");
    assert_eq!(
        again.exit_code(),
        Some(0),
        "node 1 again:\n{}",
        again.text()
    );
    let log1 = again.text();
    assert!(
        log1.contains("node 1's workers already succeeded in attempt 0")
            && log1.contains("the other nodes are still running theirs"),
        "node 1 again:\n{log1}"
    );
    assert!(!log1.contains("starting workers"), "node 1 again:\n{log1}");
    std::fs::write(&stop, b"").expect("stop file");
    assert_eq!(node0.exit_code(), Some(0), "node 0:\n{}", node0.text());
    let log0 = node0.text();
    assert!(!log0.contains("took its place"), "node 0:\n{log0}");
    assert!(!log0.contains("restarting every worker"), "node 0:\n{log0}");
}
