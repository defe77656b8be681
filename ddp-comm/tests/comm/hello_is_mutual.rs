//! Every connection starts with a mutual challenge-response over the job token: a recorded
//! hello cannot be replayed, a server that does not know the token is not trusted, and group
//! ids depend on a per-job nonce.
use crate::common::{Setup, run_ok_with};
use ddp_comm::{CommError, Store, StoreConfig, StoreServer};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn config(token: &str) -> StoreConfig {
    StoreConfig::new()
        .with_token(token)
        .with_timeout(Duration::from_secs(5))
}

/// A TCP proxy to `target` that records every byte the client sends.
fn recording_proxy(target: String) -> (String, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let rec = recorded.clone();
    std::thread::spawn(move || {
        let Ok((mut client, _)) = listener.accept() else {
            return;
        };
        let mut server = TcpStream::connect(&target).expect("connect to the store");
        let mut server_back = server.try_clone().expect("clone");
        let mut client_back = client.try_clone().expect("clone");
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut server_back, &mut client_back);
        });
        let mut buf = [0u8; 4096];
        while let Ok(n) = client.read(&mut buf) {
            if n == 0 {
                break;
            }
            rec.lock().expect("lock").extend_from_slice(&buf[..n]);
            if server.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    (addr, recorded)
}

#[test]
fn a_recorded_store_session_replayed_later_gets_nowhere() {
    let server = StoreServer::bind("127.0.0.1:0", config("secret")).expect("bind");
    let addr = server.local_addr().to_string();
    let (proxy, recorded) = recording_proxy(addr.clone());
    {
        let st = Store::connect(&proxy, config("secret")).expect("a real client via the proxy");
        st.set("k", b"from the real client").expect("set");
    }
    let good = Store::connect(&addr, config("secret")).expect("connect");
    assert!(good.delete("k").expect("delete"));
    // Replay everything the real client sent: its hello, its proof and its `set`.
    let bytes = recorded.lock().expect("lock").clone();
    assert!(!bytes.is_empty());
    let mut replay = TcpStream::connect(&addr).expect("connect");
    replay.write_all(&bytes).expect("replay");
    replay
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut reply = Vec::new();
    let _ = replay.read_to_end(&mut reply);
    // The server challenged with a fresh nonce, so the recorded proof fails, and the replayed
    // `set` never ran.
    assert!(
        !good.check(&["k"]).expect("check"),
        "the replayed set was executed"
    );
}

#[test]
fn a_store_that_cannot_prove_the_token_is_not_trusted() {
    // A fake store: reads the hello, sends a made-up challenge, admits everyone.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut hello = [0u8; 40 + 2];
        s.read_exact(&mut hello).expect("hello");
        let mut challenge = vec![0u8];
        challenge.extend_from_slice(&[0xab; 64]);
        s.write_all(&challenge).expect("challenge");
        let mut proof = [0u8; 32];
        s.read_exact(&mut proof).expect("proof");
        s.write_all(&[0]).expect("verdict");
        s
    });
    let e = Store::connect(&addr, config("secret")).expect_err("an unproven store");
    assert!(matches!(e, CommError::Unauthorized { .. }), "{e}");
    assert!(e.to_string().contains("prove the job token"), "{e}");
    drop(fake.join().expect("fake"));
}

/// The id of the world group in the shared-memory segment name
/// (`ddp-<job id>-<group id>-<nonce>`).
fn world_group_id() -> String {
    let names = run_ok_with(Setup::Shm, 2, |pg| {
        Ok(String::from_utf8(pg.store().get("shm/seg/0")?).expect("utf-8"))
    });
    names[0].split('-').nth(2).expect("a group id").to_string()
}

#[test]
fn group_ids_depend_on_a_per_job_nonce() {
    let (a, b) = (world_group_id(), world_group_id());
    assert_eq!(a.len(), 16, "{a}");
    assert_ne!(a, b, "two jobs' world groups got the same id");
}

#[test]
fn a_client_that_cannot_prove_the_token_gets_nothing_done() {
    let server = StoreServer::bind("127.0.0.1:0", config("secret")).expect("bind");
    let addr = server.local_addr().to_string();
    // A well-formed store hello (claims: protocol version 3), a made-up proof, then a `set`.
    let mut s = TcpStream::connect(&addr).expect("connect");
    let mut hello = b"DDPA\x01\x01".to_vec();
    hello.extend_from_slice(&2u16.to_le_bytes());
    hello.extend_from_slice(&[7; 32]);
    hello.extend_from_slice(&3u16.to_le_bytes());
    s.write_all(&hello).expect("hello");
    let mut challenge = [0u8; 65];
    s.read_exact(&mut challenge).expect("a challenge");
    assert_eq!(challenge[0], 0);
    s.write_all(&[0x55; 32]).expect("proof");
    let key = b"intruder";
    let mut set = vec![2u8]; // Op::Set
    set.extend_from_slice(&(key.len() as u32).to_le_bytes());
    set.extend_from_slice(key);
    set.extend_from_slice(&1u32.to_le_bytes());
    set.push(b'x');
    let mut frame = (set.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&set);
    let _ = s.write_all(&frame);
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut verdict = Vec::new();
    let _ = s.read_to_end(&mut verdict);
    assert_eq!(verdict.first(), Some(&1), "refused");
    let good = Store::connect(&addr, config("secret")).expect("connect");
    assert!(
        !good.check(&["intruder"]).expect("check"),
        "the intruder's set ran"
    );
}
