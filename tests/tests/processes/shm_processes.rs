//! ddp-comm's shared-memory transport with ranks as separate processes: collectives, a killed
//! rank, segments left by a crashed run, and two "hosts" made of network namespaces (the
//! hierarchical all-reduce). Every test checks that no segment of its job is left in
//! `/dev/shm` (each test names its job through `DDP_JOB_ID`, which prefixes segment names).

use ddp_tests::{RankOutput, assert_survivors_name_the_dead, spawn_world};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const WORKER: &str = env!("CARGO_BIN_EXE_comm_worker");

/// A job id unique to this test process and `tag` (segment names start `ddp-<job id>-`).
fn job_id(tag: &str) -> String {
    format!("shmtest{}{tag}", std::process::id())
}

/// The segments of job `job` under /dev/shm.
fn segments_of(job: &str) -> Vec<String> {
    let prefix = format!("ddp-{job}-");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The value after `key ` on a line of the rank's stdout.
fn line_value<'a>(o: &'a RankOutput, key: &str) -> Option<&'a str> {
    o.stdout
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
}

#[test]
fn collectives_over_shared_memory_across_processes() {
    for world in 2..=4 {
        let job = job_id(&format!("c{world}"));
        assert!(segments_of(&job).is_empty());
        let out = spawn_world(
            WORKER,
            &["topology"],
            world,
            Duration::from_secs(120),
            |_| env(&[("DDP_TRANSPORT", "shm"), ("DDP_JOB_ID", &job)]),
        );
        let all: Vec<usize> = (0..world).collect();
        for o in &out {
            assert_eq!(
                o.code,
                Some(0),
                "world {world} rank {}: {}",
                o.rank,
                o.stderr
            );
            assert_eq!(line_value(o, "backend"), Some("shm+tcp"), "{}", o.stdout);
            assert_eq!(
                line_value(o, "groups"),
                Some(format!("{:?}", [&all]).as_str()),
                "{}",
                o.stdout
            );
        }
        let digests: Vec<_> = out.iter().map(|o| line_value(o, "digest")).collect();
        assert!(
            digests[0].is_some() && digests.windows(2).all(|w| w[0] == w[1]),
            "not bitwise identical: {digests:?}"
        );
        assert_eq!(
            segments_of(&job),
            Vec::<String>::new(),
            "segments left behind"
        );
    }
}

#[test]
fn killed_rank_is_named_by_the_survivors_and_leaves_no_segment() {
    let job = job_id("die");
    let out = spawn_world(WORKER, &["die"], 4, Duration::from_secs(90), |_| {
        env(&[
            ("DIE_RANK", "2"),
            ("DIE_AT", "5"),
            // Far beyond the harness's 90 s: only the liveness check can end the survivors in
            // time (a rank still waiting then is killed and fails the exit-code check).
            ("DDP_TIMEOUT_SECS", "600"),
            ("DDP_TRANSPORT", "shm"),
            ("DDP_JOB_ID", &job),
        ])
    });
    assert_survivors_name_the_dead(&out, 2);
    assert_eq!(
        segments_of(&job),
        Vec::<String>::new(),
        "segments left behind"
    );
}

/// Removes the files when dropped, so a failing test leaves nothing either.
struct Files(Vec<PathBuf>);

impl Drop for Files {
    fn drop(&mut self) {
        for f in &self.0 {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// A segment header as documented in ddp-comm's `transport::shm` module: magic, version,
/// ranks, buffers, buffer bytes, creator pid and start time, pid namespace, total bytes.
fn segment_header(pid: u32, start: u64) -> Vec<u8> {
    let (local, nbuf, chunk) = (2u32, 2u32, 4096u64);
    let total = 4096 + local as u64 * (4096 + nbuf as u64 * chunk);
    let pid_ns = std::fs::metadata("/proc/self/ns/pid").unwrap().ino();
    let mut h = vec![0u8; 64];
    h[0..8].copy_from_slice(b"DDPSHM01");
    h[8..12].copy_from_slice(&1u32.to_ne_bytes());
    h[12..16].copy_from_slice(&local.to_ne_bytes());
    h[16..20].copy_from_slice(&nbuf.to_ne_bytes());
    h[24..32].copy_from_slice(&chunk.to_ne_bytes());
    h[32..36].copy_from_slice(&pid.to_ne_bytes());
    h[40..48].copy_from_slice(&start.to_ne_bytes());
    h[48..56].copy_from_slice(&pid_ns.to_ne_bytes());
    h[56..64].copy_from_slice(&total.to_ne_bytes());
    h
}

fn start_time(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    s[s.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn segment_left_by_a_crashed_run_is_removed_by_the_next_job_and_live_ones_are_kept() {
    let job = job_id("stale");
    // A creator that is gone: a child we started and reaped.
    let mut child = Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let stale = Path::new("/dev/shm").join(format!("ddp-{job}-crashed"));
    let live = Path::new("/dev/shm").join(format!("ddp-{job}-live"));
    let _cleanup = Files(vec![stale.clone(), live.clone()]);
    std::fs::write(&stale, segment_header(dead_pid, 1)).unwrap();
    // A creator that is alive: this test process.
    std::fs::write(
        &live,
        segment_header(std::process::id(), start_time(std::process::id())),
    )
    .unwrap();

    let out = spawn_world(WORKER, &["collectives"], 2, Duration::from_secs(60), |_| {
        env(&[("DDP_TRANSPORT", "shm"), ("DDP_JOB_ID", &job)])
    });
    for o in &out {
        assert_eq!(o.code, Some(0), "rank {}: {}", o.rank, o.stderr);
    }
    assert!(
        !stale.exists(),
        "the crashed run's segment is removed by the next leader"
    );
    assert!(live.exists(), "a live creator's segment is left alone");
    std::fs::remove_file(&live).unwrap();
    assert_eq!(segments_of(&job), Vec::<String>::new());
}

/// Two network namespaces joined by a veth pair: two "hosts" as far as host detection goes
/// (the network namespace is part of the host id), on one machine. Deleted when dropped.
struct TwoHosts {
    names: [String; 2],
}

impl TwoHosts {
    const ADDRS: [&str; 2] = ["10.78.0.1", "10.78.0.2"];

    fn create(tag: &str) -> Result<TwoHosts, String> {
        Self::remove_leftovers();
        let id = std::process::id();
        let hosts = TwoHosts {
            names: [
                format!("ddpshm-{id}-{tag}-a"),
                format!("ddpshm-{id}-{tag}-b"),
            ],
        };
        let [a, b] = &hosts.names;
        // The veth pair is created inside the namespaces, so no interface of the machine is
        // touched and the fixed names cannot collide.
        let steps: Vec<Vec<&str>> = vec![
            vec!["netns", "add", a],
            vec!["netns", "add", b],
            vec![
                "-n", a, "link", "add", "veth0", "type", "veth", "peer", "name", "veth0", "netns",
                b,
            ],
            vec!["-n", a, "addr", "add", "10.78.0.1/24", "dev", "veth0"],
            vec!["-n", b, "addr", "add", "10.78.0.2/24", "dev", "veth0"],
            vec!["-n", a, "link", "set", "veth0", "up"],
            vec!["-n", b, "link", "set", "veth0", "up"],
            vec!["-n", a, "link", "set", "lo", "up"],
            vec!["-n", b, "link", "set", "lo", "up"],
        ];
        for args in steps {
            let out = Command::new("ip")
                .args(&args)
                .output()
                .map_err(|e| format!("cannot run `ip`: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "`ip {}` failed: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
        Ok(hosts)
    }

    /// Deletes namespaces that a killed run of this test left behind (their names carry the
    /// test process's pid, which no longer exists).
    fn remove_leftovers() {
        let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
            return;
        };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            let pid = name
                .strip_prefix("ddpshm-")
                .and_then(|r| r.split('-').next());
            if let Some(pid) = pid
                && !Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = Command::new("ip").args(["netns", "del", name]).output();
            }
        }
    }

    /// Starts `world` ranks, the first half on host a, the rest on host b, and collects them.
    fn run(
        &self,
        args: &[&str],
        world: usize,
        deadline: Duration,
        extra: &[(&str, &str)],
    ) -> Vec<RankOutput> {
        let per_host = world / 2;
        let children: Vec<Child> = (0..world)
            .map(|rank| {
                let host = rank / per_host;
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", &self.names[host], WORKER])
                    .args(args)
                    .env("RANK", rank.to_string())
                    .env("WORLD_SIZE", world.to_string())
                    .env("LOCAL_RANK", (rank % per_host).to_string())
                    .env("LOCAL_WORLD_SIZE", per_host.to_string())
                    .env("MASTER_ADDR", Self::ADDRS[0])
                    .env("MASTER_PORT", "29500")
                    .env("DDP_JOB_TOKEN", "test-token")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                for (k, v) in extra {
                    cmd.env(k, v);
                }
                cmd.spawn().expect("starting a rank with ip netns exec")
            })
            .collect();
        collect(children, deadline)
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

/// Waits for every child up to `deadline` (killing stragglers), like `spawn_world`.
fn collect(children: Vec<Child>, deadline: Duration) -> Vec<RankOutput> {
    let end = Instant::now() + deadline;
    children
        .into_iter()
        .enumerate()
        .map(|(rank, mut child)| {
            while Instant::now() < end {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let o = child
                .wait_with_output()
                .expect("collecting a rank's output");
            RankOutput {
                rank,
                code: o.status.code(),
                stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            }
        })
        .collect()
}

#[test]
#[ignore = "needs root and iproute2 (network namespaces); .ci/run runs it"]
fn two_hosts_in_network_namespaces_use_the_hierarchical_all_reduce() {
    let hosts = TwoHosts::create("h").unwrap_or_else(|why| {
        panic!("cannot create network namespaces ({why}); this test needs root and iproute2")
    });
    let job = job_id("hier");
    let out = hosts.run(
        &["topology"],
        4,
        Duration::from_secs(120),
        &[("DDP_TRANSPORT", "shm"), ("DDP_JOB_ID", &job)],
    );
    for o in &out {
        assert_eq!(
            o.code,
            Some(0),
            "rank {}: {}\n{}",
            o.rank,
            o.stderr,
            o.stdout
        );
        assert_eq!(line_value(o, "backend"), Some("shm+tcp"), "{}", o.stdout);
        assert_eq!(
            line_value(o, "groups"),
            Some("[[0, 1], [2, 3]]"),
            "rank {}: {}",
            o.rank,
            o.stdout
        );
    }
    let digests: Vec<_> = out.iter().map(|o| line_value(o, "digest")).collect();
    assert!(
        digests[0].is_some() && digests.windows(2).all(|w| w[0] == w[1]),
        "not bitwise identical: {digests:?}"
    );
    assert_eq!(
        segments_of(&job),
        Vec::<String>::new(),
        "segments left behind"
    );

    // A rank that dies behind the other host's leader is still named by every survivor.
    let job = job_id("hierdie");
    let out = hosts.run(
        &["die"],
        4,
        Duration::from_secs(90),
        &[
            ("DIE_RANK", "3"),
            ("DIE_AT", "5"),
            // Far beyond the harness's 90 s: only the liveness check can end the survivors in
            // time (a rank still waiting then is killed and fails the exit-code check).
            ("DDP_TIMEOUT_SECS", "600"),
            ("DDP_TRANSPORT", "shm"),
            ("DDP_JOB_ID", &job),
        ],
    );
    assert_survivors_name_the_dead(&out, 3);
    assert_eq!(
        segments_of(&job),
        Vec::<String>::new(),
        "segments left behind"
    );
}
