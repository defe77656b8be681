//! A rank's mesh port under a flood of idle connections (issue 29), and connections made on
//! demand.
//!
//! The listener caps hellos with a grace period (the store's scheme) and a connecting rank
//! whose connection is dropped before its verdict connects again, so a 4-rank group forms,
//! all-reduces and makes an on-demand connection while strangers keep flooding rank 0's port.

use crate::proc_net_tcp;
use ddp_comm::{ProcessGroup, ProcessGroupConfig, ReduceOp, Store, StoreConfig, StoreServer};
use ddp_comm::{Result, TransportKind};
use std::collections::VecDeque;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

const TOKEN: &str = "mesh-flood";
const WORLD: usize = 4;
/// Generous for a loaded 2-core machine: only a hang reaches it.
const TIMEOUT: Duration = Duration::from_secs(60);
/// Idle connections the flood keeps open at once.
const IDLE: usize = 500;
/// Threads opening them.
const FLOODERS: usize = 4;

fn config(rank: usize) -> ProcessGroupConfig {
    ProcessGroupConfig::new(rank, WORLD)
        .with_timeout(TIMEOUT)
        .with_transport(TransportKind::Tcp)
        .with_token(TOKEN)
}

fn store(addr: &str) -> Store {
    Store::connect(
        addr,
        StoreConfig::new().with_token(TOKEN).with_timeout(TIMEOUT),
    )
    .expect("store")
}

/// Where group rank `r` of the world group listens for its peers.
fn mesh_addr(store: &Store, r: usize) -> String {
    String::from_utf8(store.get(&format!("pg/world/addr/{r}")).expect("address")).expect("utf-8")
}

/// Established connections whose local end is `port` (accepted by that listener), from
/// `/proc/net/tcp`. The kernel writes that table in pieces, so while other sockets come and go
/// (other tests) a line can be repeated or missed: lines are deduplicated, and the count is the
/// one three reads in a row agree on.
fn accepted_on(port: u16) -> usize {
    let read = || {
        proc_net_tcp::established_on(port)
            .into_iter()
            .map(|c| (c.local, c.remote))
            .collect::<std::collections::BTreeSet<_>>()
    };
    let mut last = read();
    let mut agreeing = 1;
    for _ in 0..1000 {
        let now = read();
        agreeing = if now == last { agreeing + 1 } else { 1 };
        last = now;
        if agreeing == 3 {
            break;
        }
    }
    last.len()
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("host:port")
}

/// Rank 0 and rank 2 are not ring neighbours in a world of 4: their connection is made on
/// demand, by this exchange.
fn exchange_0_and_2(g: &ProcessGroup) -> Result<()> {
    match g.rank() {
        0 => g.send(&[7.0f32; 8], 2, 5),
        2 => {
            let mut v = [0.0f32; 8];
            g.recv(&mut v, 0, 5)?;
            assert_eq!(v, [7.0; 8]);
            Ok(())
        }
        _ => Ok(()),
    }
}

fn all_reduce_world(g: &ProcessGroup) -> Result<()> {
    let mut v = [g.rank() as f32 + 1.0; 16];
    g.all_reduce(&mut v, ReduceOp::Sum)?;
    assert_eq!(v, [10.0; 16]);
    Ok(())
}

#[test]
fn a_group_forms_all_reduces_and_connects_on_demand_through_a_flood_of_idle_connections() {
    let server =
        StoreServer::bind("127.0.0.1:0", StoreConfig::new().with_token(TOKEN)).expect("bind");
    let addr = server.local_addr().to_string();
    let stop = AtomicBool::new(false);
    let opened = AtomicUsize::new(0);
    let (flooding_tx, flooding) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let rank0 = s.spawn(|| {
            let g = ProcessGroup::with_store(store(&addr), config(0))?;
            all_reduce_world(&g)?;
            exchange_0_and_2(&g)?;
            g.barrier()?;
            Ok::<_, ddp_comm::CommError>(g)
        });
        // The flood: idle connections to rank 0's mesh port from `FLOODERS` threads, opened
        // for as long as the group works, `IDLE` of them open at once (each thread closes its
        // oldest as it opens a new one). The ranks start once twice that many were opened.
        let floods: Vec<_> = (0..FLOODERS)
            .map(|_| {
                let (stop, opened, flooding_tx, addr) =
                    (&stop, &opened, flooding_tx.clone(), &addr);
                s.spawn(move || {
                    let target = mesh_addr(&store(addr), 0);
                    let keep = IDLE / FLOODERS;
                    let mut open = VecDeque::with_capacity(keep + 1);
                    while !stop.load(Ordering::SeqCst) {
                        if let Ok(c) = TcpStream::connect(&target) {
                            open.push_back(c);
                            if opened.fetch_add(1, Ordering::SeqCst) + 1 == 2 * IDLE {
                                let _ = flooding_tx.send(());
                            }
                        }
                        if open.len() > keep {
                            open.pop_front();
                        }
                    }
                })
            })
            .collect();
        flooding.recv().expect("the flood started");
        let others: Vec<_> = (1..WORLD)
            .map(|r| {
                let addr = &addr;
                s.spawn(move || {
                    let g = ProcessGroup::with_store(store(addr), config(r))?;
                    all_reduce_world(&g)?;
                    exchange_0_and_2(&g)?;
                    g.barrier()?;
                    Ok::<_, ddp_comm::CommError>(g)
                })
            })
            .collect();
        let mut results = vec![rank0.join().expect("rank 0 thread")];
        results.extend(others.into_iter().map(|t| t.join().expect("rank thread")));
        stop.store(true, Ordering::SeqCst);
        for f in floods {
            f.join().expect("flood thread");
        }
        for (r, res) in results.into_iter().enumerate() {
            if let Err(e) = res {
                panic!("rank {r} failed under the flood: {e}");
            }
        }
    });
    eprintln!(
        "mesh flood: {} idle connections opened to rank 0's port ({IDLE} open at once)",
        opened.load(Ordering::SeqCst)
    );
    assert!(opened.load(Ordering::SeqCst) >= 2 * IDLE);
}

/// After the group forms only the ring neighbours are connected (rank 0 accepted ranks 1 and
/// 3, not 2); the first exchange between ranks 0 and 2 makes their connection.
#[test]
fn a_group_connects_ranks_only_when_they_first_communicate() {
    let server =
        StoreServer::bind("127.0.0.1:0", StoreConfig::new().with_token(TOKEN)).expect("bind");
    let addr = server.local_addr().to_string();
    // The ranks and this thread: formed, counted, exchanged, counted.
    let step = Arc::new(Barrier::new(WORLD + 1));
    std::thread::scope(|s| {
        let ranks: Vec<_> = (0..WORLD)
            .map(|r| {
                let (addr, step) = (&addr, step.clone());
                s.spawn(move || {
                    let g = ProcessGroup::with_store(store(addr), config(r));
                    step.wait();
                    step.wait();
                    let g = g?;
                    exchange_0_and_2(&g)?;
                    step.wait();
                    step.wait();
                    g.barrier()
                })
            })
            .collect();
        let st = store(&addr);
        let ports: Vec<u16> = (0..WORLD).map(|r| port_of(&mesh_addr(&st, r))).collect();
        step.wait();
        let formed: Vec<usize> = ports.iter().map(|&p| accepted_on(p)).collect();
        step.wait();
        step.wait();
        let after: Vec<usize> = ports.iter().map(|&p| accepted_on(p)).collect();
        step.wait();
        for (r, t) in ranks.into_iter().enumerate() {
            if let Err(e) = t.join().expect("rank thread") {
                panic!("rank {r} failed: {e}");
            }
        }
        // Each rank accepts from the higher ranks it needs: ring neighbours at first.
        assert_eq!(
            formed,
            [2, 1, 1, 0],
            "connections accepted per rank once formed"
        );
        assert_eq!(
            after,
            [3, 1, 1, 0],
            "connections accepted after the 0-2 exchange"
        );
    });
}
