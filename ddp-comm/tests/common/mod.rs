//! Test harness: ranks as threads in one process, sharing a store server.
#![allow(dead_code)]

use ddp_comm::{CommError, ProcessGroup, ProcessGroupConfig, Store, StoreConfig, StoreServer};
use std::time::Duration;

/// Runs `body` on `n` ranks (threads), each with its own process group, and returns each
/// rank's result in rank order.
pub fn run_world<T: Send>(
    n: usize,
    timeout: Duration,
    body: impl Fn(ProcessGroup) -> Result<T, CommError> + Sync,
) -> Vec<Result<T, CommError>> {
    let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new()).expect("bind store");
    let addr = server.local_addr().to_string();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let (addr, body) = (addr.clone(), &body);
                s.spawn(move || {
                    let store = Store::connect(&addr, StoreConfig::new().with_timeout(timeout))?;
                    let config = ProcessGroupConfig::new(rank, n).with_timeout(timeout);
                    let pg = ProcessGroup::with_store(store, config)?;
                    body(pg)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// Like [`run_world`] but every rank must succeed.
pub fn run_ok<T: Send>(
    n: usize,
    body: impl Fn(ProcessGroup) -> Result<T, CommError> + Sync,
) -> Vec<T> {
    run_world(n, Duration::from_secs(60), body)
        .into_iter()
        .enumerate()
        .map(|(r, res)| res.unwrap_or_else(|e| panic!("rank {r} failed: {e}")))
        .collect()
}
