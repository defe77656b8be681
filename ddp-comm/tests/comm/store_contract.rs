//! The store: every operation, timeouts that name keys, tokens, and hostile clients.

use ddp_comm::{CommError, Store, StoreConfig, StoreServer};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn server(token: &str) -> (StoreServer, String) {
    let s = StoreServer::bind("127.0.0.1:0", StoreConfig::new().with_token(token)).unwrap();
    let addr = s.local_addr().to_string();
    (s, addr)
}

fn client(addr: &str, token: &str) -> Store {
    Store::connect(
        addr,
        StoreConfig::new()
            .with_token(token)
            .with_timeout(Duration::from_secs(5)),
    )
    .unwrap()
}

#[test]
fn every_operation_behaves_like_c10d() {
    let (_s, addr) = server("t");
    let st = client(&addr, "t");
    st.set("a", b"1").unwrap();
    assert_eq!(st.get("a").unwrap(), b"1");
    assert_eq!(st.add("n", 5).unwrap(), 5);
    assert_eq!(st.add("n", -2).unwrap(), 3);
    assert_eq!(st.get("n").unwrap(), b"3");
    assert!(st.check(&["a", "n"]).unwrap());
    assert!(!st.check(&["a", "zz"]).unwrap());
    // compare_set: missing key with empty expectation sets it.
    assert_eq!(st.compare_set("c", b"", b"x").unwrap(), b"x");
    assert_eq!(st.compare_set("c", b"wrong", b"y").unwrap(), b"x");
    assert_eq!(st.compare_set("c", b"x", b"y").unwrap(), b"y");
    assert_eq!(st.num_keys().unwrap(), 3);
    assert!(st.delete("a").unwrap());
    assert!(!st.delete("a").unwrap());
    assert_eq!(st.num_keys().unwrap(), 2);
}

#[test]
fn prefixes_are_separate_namespaces() {
    let (_s, addr) = server("");
    let st = client(&addr, "");
    let a = st.with_prefix("job1/");
    let b = st.with_prefix("job2/");
    a.set("k", b"a").unwrap();
    b.set("k", b"b").unwrap();
    assert_eq!(a.get("k").unwrap(), b"a");
    assert_eq!(b.get("k").unwrap(), b"b");
    assert_eq!(a.num_keys().unwrap(), 1);
    assert_eq!(st.get("job1/k").unwrap(), b"a");
    assert_eq!(a.with_prefix("x/").num_keys().unwrap(), 0);
}

#[test]
fn a_seeded_server_holds_its_entries_before_any_client_writes() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let seed = (b"job/config".to_vec(), b"host settings".to_vec());
    let s = StoreServer::from_listener_seeded(listener, StoreConfig::new().with_token("t"), [seed])
        .unwrap();
    let st = client(&s.local_addr().to_string(), "t").with_prefix("job/");
    // A client racing to claim the key finds the host's value already there.
    assert_eq!(
        st.compare_set("config", b"", b"other settings").unwrap(),
        b"host settings"
    );
    assert_eq!(st.num_keys().unwrap(), 1);
}

#[test]
fn get_waits_for_a_key_set_later() {
    let (_s, addr) = server("");
    let st = client(&addr, "");
    let other = client(&addr, "");
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        other.set("late", b"v").unwrap();
    });
    assert_eq!(st.get("late").unwrap(), b"v");
    st.wait(&["late"], Duration::from_secs(1)).unwrap();
    t.join().unwrap();
}

#[test]
fn timeouts_name_the_missing_keys() {
    let (_s, addr) = server("");
    let st = client(&addr, "").with_prefix("p/");
    st.set("here", b"").unwrap();
    let start = Instant::now();
    let e = st
        .get_timeout("missing", Duration::from_millis(300))
        .unwrap_err();
    // The store's default timeout is far longer; the margin is for a busy machine.
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(e.to_string().contains("p/missing"), "{e}");
    let e = st
        .wait(&["here", "gone"], Duration::from_millis(300))
        .unwrap_err();
    assert!(
        matches!(e, CommError::StoreTimeout { ref keys, .. } if keys == "p/gone"),
        "{e}"
    );
}

#[test]
fn wrong_or_missing_token_is_rejected_and_others_are_still_served() {
    let (_s, addr) = server("secret");
    let good = client(&addr, "secret");
    good.set("k", b"v").unwrap();
    for bad in ["", "wrong"] {
        let e = Store::connect(
            &addr,
            StoreConfig::new()
                .with_token(bad)
                .with_timeout(Duration::from_secs(2)),
        )
        .unwrap_err();
        assert!(matches!(e, CommError::Unauthorized { .. }), "{e}");
        assert!(e.to_string().contains("token"), "{e}");
    }
    assert_eq!(good.get("k").unwrap(), b"v");
}

#[test]
fn garbage_and_oversized_frames_are_dropped_without_harming_the_store() {
    let (s, addr) = server("");
    let good = client(&addr, "");
    good.set("k", b"v").unwrap();

    // Random bytes instead of a hello.
    let mut g = TcpStream::connect(&addr).unwrap();
    g.write_all(&[0xde; 64]).unwrap();
    // A hello that announces 65535 bytes of claims: refused before reading (or allocating) them.
    let mut big = TcpStream::connect(&addr).unwrap();
    let mut hello = b"DDPA\x01\x01".to_vec();
    hello.extend_from_slice(&u16::MAX.to_le_bytes());
    hello.extend_from_slice(&[0; 32]);
    big.write_all(&hello).unwrap();
    // Both are refused at once (status 1 and a reason) and disconnected, not left hanging.
    for c in [&mut g, &mut big] {
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut reply = Vec::new();
        c.read_to_end(&mut reply)
            .unwrap_or_else(|e| panic!("the server closes the connection: {e} after {reply:?}"));
        assert_eq!(reply.first(), Some(&1), "a refusal, not a challenge");
    }
    // An authenticated client that sends an oversized frame is dropped too; the others go on.
    let small =
        StoreServer::bind("127.0.0.1:0", StoreConfig::new().with_max_frame_bytes(1024)).unwrap();
    let small_addr = small.local_addr().to_string();
    let victim = Store::connect(
        &small_addr,
        StoreConfig::new().with_timeout(Duration::from_secs(2)),
    )
    .unwrap();
    let survivor = Store::connect(
        &small_addr,
        StoreConfig::new().with_timeout(Duration::from_secs(2)),
    )
    .unwrap();
    assert!(victim.set("big", &vec![0u8; 4096]).is_err());
    survivor.set("ok", b"1").unwrap();
    assert_eq!(survivor.get("ok").unwrap(), b"1");

    assert_eq!(good.get("k").unwrap(), b"v");
    assert_eq!(s.num_clients(), 1);
}

#[test]
fn port_in_use_is_a_clear_error() {
    let (s, _) = server("");
    let e = StoreServer::bind(s.local_addr().to_string(), StoreConfig::new()).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, CommError::Bind { .. }), "{msg}");
    assert!(
        msg.contains("in use") || msg.contains("Address already"),
        "{msg}"
    );
}

#[test]
fn unreachable_store_fails_within_the_timeout() {
    // Bind then drop to find a port with nobody listening.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let start = Instant::now();
    let e = Store::connect(
        &format!("127.0.0.1:{port}"),
        StoreConfig::new().with_timeout(Duration::from_millis(500)),
    )
    .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(15));
    assert!(matches!(e, CommError::StoreUnreachable { .. }), "{e}");
    assert!(e.to_string().contains("MASTER_ADDR"), "{e}");
}

/// `Instant + Duration` and `Duration + Duration` panic on overflow: a huge configured timeout
/// is a config error, and a huge per-call timeout waits as long as allowed instead of panicking.
#[test]
fn huge_timeouts_are_config_errors_or_clamped_never_panics() {
    let (_s, addr) = server("");
    let e = Store::connect(&addr, StoreConfig::new().with_timeout(Duration::MAX))
        .expect_err("a timeout of Duration::MAX is refused");
    assert!(
        matches!(e, CommError::InvalidConfig { .. }) && e.to_string().contains("maximum"),
        "{e}"
    );
    let st = client(&addr, "");
    st.set("k", b"v").unwrap();
    assert_eq!(st.get_timeout("k", Duration::MAX).unwrap(), b"v");
    st.wait(&["k"], Duration::MAX).unwrap();
}

/// The store and the mesh share one token limit; a longer token is a config error up front,
/// not a hello the server refuses as oversized.
#[test]
fn a_token_over_the_shared_limit_is_a_config_error() {
    let long = vec![b'x'; ddp_comm::MAX_TOKEN_BYTES + 1];
    let e = StoreServer::bind("127.0.0.1:0", StoreConfig::new().with_token(&long))
        .expect_err("the server refuses it");
    assert!(matches!(e, CommError::InvalidConfig { .. }), "{e}");
    let (_s, addr) = server("");
    let e =
        Store::connect(&addr, StoreConfig::new().with_token(&long)).expect_err("so does a client");
    assert!(matches!(e, CommError::InvalidConfig { .. }), "{e}");
    let ok = vec![b'x'; ddp_comm::MAX_TOKEN_BYTES];
    let (_s, addr) = server(std::str::from_utf8(&ok).unwrap());
    client(&addr, std::str::from_utf8(&ok).unwrap())
        .set("k", b"v")
        .unwrap();
}

/// A proxy to `target` for one client that forwards both ways until `frozen` is set; then it
/// stops reading from the client (a store host that froze), holding the connection open until
/// `release` is set. Returns its address.
fn freezing_proxy(
    target: String,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    release: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> String {
    use std::sync::atomic::Ordering;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let (mut client, _) = listener.accept().unwrap();
        let mut server = TcpStream::connect(&target).unwrap();
        let (mut client_w, mut server_r) =
            (client.try_clone().unwrap(), server.try_clone().unwrap());
        std::thread::spawn(move || std::io::copy(&mut server_r, &mut client_w));
        let mut buf = [0u8; 16384];
        while !frozen.load(Ordering::SeqCst) {
            client
                .set_read_timeout(Some(Duration::from_millis(20)))
                .unwrap();
            match client.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => server.write_all(&buf[..n]).unwrap(),
                Err(_) => {}
            }
        }
        while !release.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    addr
}

/// A request larger than the socket buffers, to a store host that stopped reading, fails
/// within the reply's timeout instead of blocking in the write for ever (the write had no
/// timeout, only the read of the reply).
#[test]
fn a_large_request_to_a_frozen_store_fails_instead_of_blocking() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    const TIMEOUT: Duration = Duration::from_secs(2);
    const HANG: Duration = Duration::from_secs(60);
    // More than the socket buffers on both sides of the proxy hold.
    const VALUE: usize = 48 << 20;
    let (_s, real) = server("t");
    let (frozen, release) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let addr = freezing_proxy(real, frozen.clone(), release.clone());
    let config = StoreConfig::new()
        .with_token("t")
        .with_timeout(TIMEOUT)
        .with_max_frame_bytes(2 * VALUE);
    let st = Store::connect(&addr, config).unwrap();
    st.set("small", b"1").unwrap();
    frozen.store(true, Ordering::SeqCst);
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = st.set("large", &vec![7u8; VALUE]);
        let _ = done.send(r);
    });
    // A bound on a hang only: the set fails once its reply's timeout (at least 10 s) is over.
    let r = result.recv_timeout(HANG);
    release.store(true, Ordering::SeqCst);
    match r {
        Ok(Err(e)) => assert!(e.to_string().contains("store set"), "{e}"),
        Ok(Ok(())) => panic!("the frozen store cannot have taken the value"),
        Err(_) => panic!(
            "the set to a frozen store was still blocked after {:?}",
            HANG
        ),
    }
}
