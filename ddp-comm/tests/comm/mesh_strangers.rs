//! Strangers on a rank's mesh port: connections that say nothing or drip bytes neither stall
//! the rendezvous nor get a real rank blamed, and are cut off at the hello deadline (5 s) while
//! the group goes on working.

use ddp_comm::{ProcessGroup, ProcessGroupConfig, Store, StoreConfig, StoreServer, TransportKind};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(20);
const SILENT: usize = 10;

fn config(rank: usize) -> ProcessGroupConfig {
    ProcessGroupConfig::new(rank, 2)
        .with_timeout(TIMEOUT)
        .with_transport(TransportKind::Tcp)
        .with_token("tok")
}

fn store(addr: &str) -> Store {
    Store::connect(
        addr,
        StoreConfig::new().with_token("tok").with_timeout(TIMEOUT),
    )
    .expect("store")
}

#[test]
fn silent_and_dripping_strangers_neither_stall_the_mesh_nor_outlive_it() {
    let server =
        StoreServer::bind("127.0.0.1:0", StoreConfig::new().with_token("tok")).expect("bind");
    let addr = server.local_addr().to_string();
    let (go, wait_for_strangers) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        // The strangers find rank 0's mesh port (it is in the store) and occupy it before
        // rank 1 arrives: ten say nothing, one drips a plausible hello a byte at a time.
        let strangers = s.spawn(|| {
            let mesh = String::from_utf8(store(&addr).get("pg/world/addr/0").expect("address"))
                .expect("utf-8");
            let silent: Vec<TcpStream> = (0..SILENT)
                .map(|_| TcpStream::connect(&mesh).expect("connect"))
                .collect();
            let mut drip = TcpStream::connect(&mesh).expect("connect");
            drip.write_all(b"DD").expect("drip");
            go.send(()).expect("signal");
            (silent, drip)
        });
        let rank0 = s.spawn(|| ProcessGroup::with_store(store(&addr), config(0)));
        wait_for_strangers.recv().expect("strangers in place");
        let start = Instant::now();
        let rank1 = s.spawn(|| ProcessGroup::with_store(store(&addr), config(1)));
        let g1 = rank1.join().expect("rank 1").expect("rank 1 joins");
        let g0 = rank0
            .join()
            .expect("rank 0")
            .expect("rank 0 joins despite the strangers");
        let took = start.elapsed();
        // Waiting behind the strangers would take their 5 s hello deadline.
        assert!(
            took < Duration::from_millis(4500),
            "rendezvous took {took:?}"
        );
        // The strangers' connections are cut at the hello deadline (5 s after they connected).
        let (silent, drip) = strangers.join().expect("strangers");
        for mut c in silent.into_iter().chain([drip]) {
            let left = Duration::from_secs(10).saturating_sub(start.elapsed());
            c.set_read_timeout(Some(left.max(Duration::from_millis(10))))
                .expect("timeout");
            let mut buf = [0u8; 64];
            let cut = match c.read(&mut buf) {
                Ok(0) => true,
                Ok(_) => buf[0] != 0, // a rejection, then the close
                Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            };
            assert!(cut, "a stranger's connection outlived the rendezvous");
        }
        // And the group works.
        let t = s.spawn(move || {
            let mut v = [1.0f32; 4];
            g1.all_reduce(&mut v, ddp_comm::ReduceOp::Sum).map(|()| v)
        });
        let mut v = [1.0f32; 4];
        g0.all_reduce(&mut v, ddp_comm::ReduceOp::Sum)
            .expect("rank 0 reduces");
        assert_eq!(t.join().expect("rank 1").expect("rank 1 reduces"), [2.0; 4]);
        assert_eq!(v, [2.0; 4]);
    });
}
