//! Strangers on the store's port: connections that never say hello, or say it one byte at a
//! time, are dropped at the hello deadline and never keep real ranks waiting.

use ddp_comm::{Store, StoreConfig, StoreServer};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn server(hello_timeout: Duration) -> (StoreServer, String) {
    let s = StoreServer::bind(
        "127.0.0.1:0",
        StoreConfig::new().with_hello_timeout(hello_timeout),
    )
    .expect("bind");
    let addr = s.local_addr().to_string();
    (s, addr)
}

/// Connects a real client and does a set and a get; returns how long that took.
fn real_client_round_trip(addr: &str) -> Duration {
    let start = Instant::now();
    let st = Store::connect(
        addr,
        StoreConfig::new().with_timeout(Duration::from_secs(10)),
    )
    .expect("a real client is served");
    st.set("k", b"v").expect("set");
    assert_eq!(st.get("k").expect("get"), b"v");
    start.elapsed()
}

/// Whether the server has already closed `s` (EOF or reset), without waiting.
fn closed_now(mut s: &TcpStream) -> bool {
    s.set_nonblocking(true).expect("nonblocking");
    let mut buf = [0u8; 16];
    let closed = match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    };
    s.set_nonblocking(false).expect("blocking");
    closed
}

/// Whether the server has closed `s` (EOF or reset), waiting at most `wait`.
fn closed_within(mut s: &TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).expect("timeout");
    let mut buf = [0u8; 16];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
    }
}

#[test]
fn idle_connections_are_capped_never_block_real_clients_and_close_at_the_deadline() {
    const IDLE: usize = 200;
    // Long enough that a real client served late (after the deadline) cannot pass for one
    // served at once, however busy the machine.
    const DEADLINE: Duration = Duration::from_secs(10);
    let (_s, addr) = server(DEADLINE);
    let start = Instant::now();
    let idle: Vec<TcpStream> = (0..IDLE)
        .map(|_| TcpStream::connect(&addr).expect("connect"))
        .collect();
    let took = real_client_round_trip(&addr);
    assert!(
        took < DEADLINE / 2,
        "the real client took {took:?}: it waited behind the strangers"
    );
    // At most 64 strangers are kept waiting for their hello; the others are already gone,
    // long before the deadline.
    std::thread::sleep(Duration::from_millis(200));
    let early_closed = idle.iter().filter(|s| closed_now(s)).count();
    assert!(start.elapsed() < DEADLINE, "checked before the deadline");
    assert!(
        early_closed >= IDLE - 64,
        "only {early_closed} of {IDLE} idle connections were dropped before the deadline"
    );
    // The rest are dropped at the deadline.
    let still_open = idle
        .iter()
        .filter(|s| !closed_within(s, DEADLINE + Duration::from_secs(2)))
        .count();
    assert_eq!(
        still_open, 0,
        "idle connections outlived the hello deadline"
    );
    assert!(start.elapsed() < DEADLINE + Duration::from_secs(5));
}

#[test]
fn a_hello_dripped_one_byte_at_a_time_is_cut_at_the_deadline() {
    const DEADLINE: Duration = Duration::from_secs(1);
    let (_s, addr) = server(DEADLINE);
    let mut drip = TcpStream::connect(&addr).expect("connect");
    let start = Instant::now();
    // A well-formed hello announcing 64 bytes of claims, a byte every 100 ms: each read sees
    // data well within any per-read timeout, but the whole hello would take 10 s.
    let mut bytes = b"DDPA\x01\x01".to_vec();
    bytes.extend_from_slice(&64u16.to_le_bytes());
    bytes.extend(std::iter::repeat_n(7u8, 32 + 64));
    let mut cut_after = None;
    // The whole hello takes at least 102 x 100 ms; it must be cut long before, at the deadline
    // (the margin is for a busy machine).
    for b in bytes {
        if drip.write_all(&[b]).is_err() || closed_within(&drip, Duration::from_millis(100)) {
            cut_after = Some(start.elapsed());
            break;
        }
    }
    let cut_after = cut_after.expect("the dripping connection must be cut");
    assert!(
        cut_after < DEADLINE + Duration::from_secs(6),
        "cut after {cut_after:?}"
    );
    // Meanwhile and after, real clients are served.
    let took = real_client_round_trip(&addr);
    assert!(
        took < Duration::from_secs(5),
        "the real client took {took:?}"
    );
}
