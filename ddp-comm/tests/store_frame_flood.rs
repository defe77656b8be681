//! Token holders flooding the store (issue 29): connections that announce a large frame and
//! send only its header must cost the server nothing, and the number of authenticated clients
//! is capped.
//!
//! A binary of its own: the first test measures this process's memory, which other tests
//! running in the same process would disturb.

#[path = "support/proc_net_tcp.rs"]
mod proc_net_tcp;

use ddp_comm::{CommError, Store, StoreConfig, StoreServer};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const TOKEN: &str = "flood-token";
/// Generous for a loaded 2-core machine: only a hang reaches it.
const PATIENCE: Duration = Duration::from_secs(120);

/// The tests in this binary measure or cap the whole process: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// A `kB` field of `/proc/self/status`, in bytes.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} missing from /proc/self/status"));
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("unreadable {line}"));
    kb * 1024
}

/// A complete store hello with the real token, as a rank would send it; panics unless the
/// store admits the connection.
fn authenticated(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(PATIENCE)).expect("timeout");
    let claims = 3u16.to_le_bytes();
    let mut hello = b"DDPA\x01\x01".to_vec();
    hello.extend_from_slice(&(claims.len() as u16).to_le_bytes());
    hello.extend_from_slice(&[0x42; 32]);
    hello.extend_from_slice(&claims);
    s.write_all(&hello).expect("hello");
    let mut challenge = [0u8; 65];
    s.read_exact(&mut challenge).expect("challenge");
    assert_eq!(challenge[0], 0, "the store refused the hello");
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(TOKEN.as_bytes()).expect("key");
    mac.update(b"ddp-comm hello v1: initiator proof");
    mac.update(&hello);
    mac.update(&challenge[1..33]);
    s.write_all(&mac.finalize().into_bytes()).expect("proof");
    let mut verdict = [0u8; 1];
    s.read_exact(&mut verdict).expect("verdict");
    assert_eq!(
        verdict[0], 0,
        "the store refused a connection with the token"
    );
    s
}

/// Receive queues (bytes the server has not read yet) of the server's accepted IPv4
/// connections on `port`.
fn server_receive_queues(port: u16) -> Vec<u64> {
    proc_net_tcp::established_on(port)
        .into_iter()
        .map(|c| c.receive_queue)
        .collect()
}

fn client(addr: &str) -> ddp_comm::Result<Store> {
    Store::connect(
        addr,
        StoreConfig::new()
            .with_token(TOKEN)
            .with_timeout(Duration::from_secs(30)),
    )
}

/// 200 authenticated connections each announce a frame of nearly 64 MiB and send only its
/// header and one byte. Before the fix the server allocated every announced body (12.5 GiB
/// of address space); now a body grows as its bytes arrive, so the process grows by a few
/// MiB. The store keeps serving a real client throughout.
#[test]
fn header_only_frames_from_token_holders_cost_the_store_nothing() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const FLOOD: usize = 200;
    const ANNOUNCED: u32 = (64 << 20) - 1;
    /// Stated bound on the process's growth, resident and committed.
    const BOUND: u64 = 64 << 20;
    // The old 64 MiB default limit, so the frame limit alone cannot be what saves the store.
    let server = StoreServer::bind(
        "127.0.0.1:0",
        StoreConfig::new()
            .with_token(TOKEN)
            .with_max_frame_bytes(64 << 20),
    )
    .expect("bind");
    let addr = server.local_addr().to_string();
    let port = server.local_addr().port();
    let real = client(&addr).expect("a real client connects");
    real.set("before", b"1").expect("set before the flood");

    let (rss0, data0) = (status_bytes("VmRSS:"), status_bytes("VmData:"));
    let mut flood = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        let mut s = authenticated(&addr);
        let mut header = ANNOUNCED.to_le_bytes().to_vec();
        header.push(b'x');
        s.write_all(&header).expect("header");
        flood.push(s);
    }
    // Causality, not timing: wait until the server is counting every connection and has read
    // every byte they sent (its receive queues are empty), so each body has been started.
    let start = Instant::now();
    loop {
        let queues = server_receive_queues(port);
        let all_read = queues.len() > FLOOD && queues.iter().all(|&q| q == 0);
        if server.num_clients() == FLOOD + 1 && all_read {
            break;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "the server never read the flood: {} clients, queues {queues:?}",
            server.num_clients()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The real client is served meanwhile, by a new connection too.
    assert_eq!(real.get("before").expect("get during the flood"), b"1");
    let late = client(&addr).expect("a new real client connects during the flood");
    late.set("during", b"2").expect("set during the flood");
    assert_eq!(real.get("during").expect("get"), b"2");

    let (rss1, data1) = (status_bytes("VmRSS:"), status_bytes("VmData:"));
    let (rss_growth, data_growth) = (rss1.saturating_sub(rss0), data1.saturating_sub(data0));
    eprintln!(
        "flood of {FLOOD} header-only frames of {ANNOUNCED} bytes: VmRSS grew {} KiB, VmData \
         grew {} KiB (bound {} KiB)",
        rss_growth >> 10,
        data_growth >> 10,
        BOUND >> 10
    );
    // Resident memory, and committed memory: an allocated but untouched body would not show
    // in VmRSS until written, but it is committed (and the OOM killer's business) at once.
    assert!(rss_growth < BOUND, "VmRSS grew {rss_growth} bytes");
    assert!(data_growth < BOUND, "VmData grew {data_growth} bytes");
    drop(flood);
}

/// With `max_clients` served, one more authenticated client is refused at its hello with a
/// reason naming the limit; once one leaves, a new one gets in.
#[test]
fn authenticated_clients_are_capped() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let server = StoreServer::bind(
        "127.0.0.1:0",
        StoreConfig::new().with_token(TOKEN).with_max_clients(2),
    )
    .expect("bind");
    let addr = server.local_addr().to_string();
    let a = client(&addr).expect("first client");
    let b = client(&addr).expect("second client");
    a.set("k", b"v").expect("set");
    match client(&addr) {
        Err(CommError::Unauthorized { reason, .. }) => {
            assert!(reason.contains("max_clients"), "{reason}")
        }
        other => panic!("a third client must be refused, got {other:?}"),
    }
    assert_eq!(server.num_clients(), 2);
    drop(a);
    assert!(
        server.wait_for_clients(1, PATIENCE),
        "the server never saw the first client leave"
    );
    let c = client(&addr).expect("a client gets in once one left");
    assert_eq!(c.get("k").expect("get"), b"v");
    assert_eq!(b.get("k").expect("get"), b"v");
}
