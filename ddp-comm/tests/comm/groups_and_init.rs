//! Subgroups, rank translation, and the tcp:// and file:// init methods.
use crate::common::run_ok;
use ddp_comm::{InitMethod, ProcessGroupConfig, ReduceOp, init_process_group};
use std::time::Duration;

#[test]
fn subgroups_reduce_among_their_members_only() {
    let results = run_ok(4, |pg| {
        let evens = pg.new_group(&[0, 2])?;
        let odds = pg.new_group(&[3, 1])?;
        let mine = if pg.rank() % 2 == 0 {
            evens.as_ref()
        } else {
            odds.as_ref()
        };
        let sub = mine.expect("every rank is in one of the two");
        assert!(evens.is_some() != odds.is_some());
        assert_eq!(sub.world_size(), 2);
        assert_eq!(sub.rank(), pg.rank() / 2);
        assert_eq!(sub.global_rank_of(sub.rank()), Some(pg.rank()));
        assert_eq!(sub.group_rank_of(pg.rank()), Some(sub.rank()));
        let mut v = vec![pg.rank() as i32; 5];
        sub.all_reduce(&mut v, ReduceOp::Sum)?;
        // The world group still works alongside.
        let mut w = vec![1i32; 3];
        pg.all_reduce(&mut w, ReduceOp::Sum)?;
        assert_eq!(w, vec![4; 3]);
        Ok((sub.ranks().to_vec(), v[0]))
    });
    assert_eq!(results[0], (vec![0, 2], 2));
    assert_eq!(results[1], (vec![1, 3], 4));
    assert_eq!(results[2], (vec![0, 2], 2));
    assert_eq!(results[3], (vec![1, 3], 4));
}

#[test]
fn new_group_rejects_bad_lists() {
    run_ok(2, |pg| {
        let e = pg.new_group(&[]).unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
        let e = pg.new_group(&[1, 1]).unwrap_err().to_string();
        assert!(e.contains("duplicates"), "{e}");
        let e = pg.new_group(&[0, 5]).unwrap_err().to_string();
        assert!(e.contains("global rank 5 is not a member"), "{e}");
        Ok(())
    });
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn run_init(n: usize, method: InitMethod) -> Vec<f64> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let method = method.clone();
                s.spawn(move || {
                    let config = ProcessGroupConfig::new(rank, n)
                        .with_timeout(Duration::from_secs(30))
                        .with_token("tok");
                    let pg = init_process_group(&method, config).unwrap();
                    let mut v = vec![rank as f64; 4];
                    pg.all_reduce(&mut v, ReduceOp::Avg).unwrap();
                    v[0]
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn tcp_init_hosts_the_store_on_rank_zero() {
    let m = InitMethod::parse(&format!("tcp://127.0.0.1:{}", free_port())).unwrap();
    assert_eq!(run_init(3, m), vec![1.0; 3]);
}

#[test]
fn file_init_meets_through_a_file_and_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rendezvous");
    // A stale file from a "crashed" run must not mislead anyone.
    std::fs::write(
        &path,
        format!("127.0.0.1:{} 0123456789abcdef\n", free_port()),
    )
    .unwrap();
    let m = InitMethod::parse(&format!("file://{}", path.display())).unwrap();
    assert_eq!(run_init(2, m), vec![0.5; 2]);
    assert!(!path.exists(), "rank 0 removes the rendezvous file");
}

#[test]
fn port_in_use_on_rank_zero_is_reported() {
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let e = init_process_group(
        &InitMethod::Tcp {
            host: "127.0.0.1".into(),
            port,
        },
        ProcessGroupConfig::new(0, 2).with_timeout(Duration::from_secs(2)),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains(&format!("{port}")) && e.contains("MASTER_PORT"),
        "{e}"
    );
}

#[test]
fn invalid_rank_is_rejected_before_any_network_call() {
    let e = init_process_group(
        &InitMethod::Tcp {
            host: "127.0.0.1".into(),
            port: 1,
        },
        ProcessGroupConfig::new(2, 2),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("rank 2 is outside 0..2"), "{e}");
}

/// This host's address on the network (the source address of its default route), if any.
fn network_ip() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    // Connecting a UDP socket sends nothing; it only picks the route and source address.
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[test]
fn a_loopback_master_addr_keeps_the_store_off_the_network() {
    let Some(ip) = network_ip() else {
        eprintln!("no network interface besides loopback: nothing to check");
        return;
    };
    let port = free_port();
    let m = InitMethod::parse(&format!("tcp://127.0.0.1:{port}")).unwrap();
    let pg = init_process_group(&m, ProcessGroupConfig::new(0, 1)).unwrap();
    // The store is up (the group joined through it) but not reachable from the network.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    let from_network = std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::new(ip, port),
        Duration::from_secs(2),
    );
    assert!(
        from_network.is_err(),
        "the store of a single-host job answers on {ip}:{port}"
    );
    drop(pg);
}

#[test]
fn a_store_on_the_network_needs_a_token() {
    let Some(ip) = network_ip() else {
        eprintln!("no network interface besides loopback: the unit tests cover the rule");
        return;
    };
    let m = InitMethod::parse(&format!("tcp://{ip}:{}", free_port())).unwrap();
    let e = init_process_group(&m, ProcessGroupConfig::new(0, 1))
        .expect_err("a store reachable from the network without a token")
        .to_string();
    assert!(
        e.starts_with(&format!(
            "DDP_JOB_TOKEN: is not set, but rank 0 would listen on {ip}"
        )),
        "{e}"
    );
    let m = InitMethod::parse(&format!("tcp://{ip}:{}", free_port())).unwrap();
    let pg = init_process_group(&m, ProcessGroupConfig::new(0, 1).with_token("secret"))
        .expect("with a token");
    drop(pg);
}

/// Rank 0 of a world of 2 whose rank 1 never comes, through `method`, with a group timeout of
/// `timeout`: returns the error and how long init took.
fn init_alone(method: &InitMethod, timeout: Duration) -> (String, Duration) {
    let start = std::time::Instant::now();
    let e = init_process_group(method, ProcessGroupConfig::new(0, 2).with_timeout(timeout))
        .expect_err("rank 1 never comes");
    (e.to_string(), start.elapsed())
}

/// Rank 0 hosting the store returns its failed init's error after one timeout, not two: the
/// store it hosted is stopped at once (the generation is abandoned) instead of lingering a
/// whole timeout for its own connection to close. Old code took at least twice the timeout.
#[test]
fn rank_zero_whose_peer_never_comes_fails_after_one_timeout() {
    let timeout = Duration::from_secs(4);
    // Twice the timeout is the old behaviour; anything below it is one timeout and whatever a
    // busy machine adds.
    let hang = timeout * 2 - Duration::from_millis(500);
    let dir = tempfile::tempdir().unwrap();
    let file = InitMethod::parse(&format!("file://{}", dir.path().join("rv").display())).unwrap();
    let tcp = InitMethod::parse(&format!("tcp://127.0.0.1:{}", free_port())).unwrap();
    for method in [tcp, file] {
        let (e, took) = init_alone(&method, timeout);
        assert!(
            e.contains("rank 1"),
            "{method:?}: the error names the missing rank: {e}"
        );
        assert!(
            took < hang,
            "{method:?}: init took {took:?} with a timeout of {timeout:?}: {e}"
        );
    }
}

/// Set in the child process [`file_init_brackets_an_ipv6_master_addr`] starts.
const IPV6_CHILD_ENV: &str = "DDP_TEST_IPV6_FILE_INIT_CHILD";

/// file:// rendezvous with `MASTER_ADDR=::1` (IPv6): rank 0 publishes `[::1]:port`, the form
/// every parser reads (as `tcp://` init writes it), not `::1:port`, and the ranks meet there.
/// The environment is the child process's own, so no other test sees `MASTER_ADDR`.
#[test]
fn file_init_brackets_an_ipv6_master_addr() {
    const NAME: &str = "groups_and_init::file_init_brackets_an_ipv6_master_addr";
    if std::env::var_os(IPV6_CHILD_ENV).is_none() {
        if std::net::TcpListener::bind("[::1]:0").is_err() {
            eprintln!("skipped: this machine has no IPv6 loopback");
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .env(IPV6_CHILD_ENV, "1")
            .env("MASTER_ADDR", "::1")
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "the child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rendezvous");
    let m = InitMethod::parse(&format!("file://{}", path.display())).unwrap();
    let init = |rank| {
        let config = ProcessGroupConfig::new(rank, 2).with_timeout(Duration::from_secs(10));
        let pg = init_process_group(&m, config).unwrap();
        let mut v = vec![rank as f64; 4];
        pg.all_reduce(&mut v, ReduceOp::Avg).unwrap();
        v[0]
    };
    std::thread::scope(|s| {
        let rank0 = s.spawn(|| init(0));
        // What rank 0 published, read before rank 1 joins (rank 0 removes it after).
        let start = std::time::Instant::now();
        let published = loop {
            match std::fs::read_to_string(&path) {
                Ok(text) if text.ends_with('\n') => break text,
                _ => {
                    assert!(start.elapsed() < Duration::from_secs(30), "never published");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        };
        assert!(published.starts_with("[::1]:"), "{published}");
        assert_eq!(init(1), 0.5);
        assert_eq!(rank0.join().unwrap(), 0.5);
    });
}

/// A rank that times out joining through a file naming a loopback address (what rank 0
/// publishes without MASTER_ADDR) is told to set MASTER_ADDR for a job on several hosts.
#[test]
fn a_file_join_timing_out_on_loopback_says_to_set_master_addr() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rendezvous");
    std::fs::write(
        &path,
        format!("127.0.0.1:{} 0123456789abcdef\n", free_port()),
    )
    .unwrap();
    let m = InitMethod::parse(&format!("file://{}", path.display())).unwrap();
    let e = init_process_group(
        &m,
        ProcessGroupConfig::new(1, 2).with_timeout(Duration::from_secs(1)),
    )
    .expect_err("nobody hosts that store")
    .to_string();
    assert!(
        e.contains("loopback address") && e.contains("set MASTER_ADDR on rank 0"),
        "{e}"
    );
}
