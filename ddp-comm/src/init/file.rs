//! `file://` rendezvous: the store's address travels through a file on a shared filesystem.
//!
//! Rank 0 starts the store on a free port, stores a random nonce in it, and atomically writes
//! `address nonce` to the file. The other ranks poll the file, connect, and accept the store only
//! if it holds the same nonce, so a file left by a crashed run is never trusted: they keep
//! polling until rank 0 replaces it. Rank 0 removes the file once every rank has joined.

use crate::error::{CommError, Result};
use crate::group::{HostedStore, ProcessGroup, ProcessGroupConfig};
use crate::store::Store;
use std::path::Path;
use std::time::{Duration, Instant};

const NONCE_KEY: &str = "init/file-nonce";

pub(super) fn init(path: &Path, config: ProcessGroupConfig) -> Result<ProcessGroup> {
    if config.rank == 0 {
        host(path, config)
    } else {
        join(path, config)
    }
}

fn host(path: &Path, config: ProcessGroupConfig) -> Result<ProcessGroup> {
    let advertise = std::env::var("MASTER_ADDR").unwrap_or_else(|_| "127.0.0.1".into());
    let server = super::bind::bind_store(&advertise, 0, config.store_config())?;
    let addr = format!("{advertise}:{}", server.local_addr().port());
    let store = Store::connect(&addr, config.store_config())?;
    let nonce = format!("{:016x}", rand::random::<u64>());
    store.set(NONCE_KEY, nonce.as_bytes())?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let io = |e| CommError::io(format!("file:// rendezvous: writing {}", path.display()), e);
    std::fs::write(&tmp, format!("{addr} {nonce}\n")).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    let hosted = HostedStore {
        server,
        linger: config.timeout,
    };
    let pg = ProcessGroup::world(store, config, Some(hosted));
    // Every rank has joined (or failed): the file has served its purpose either way.
    let _ = std::fs::remove_file(path);
    pg
}

fn join(path: &Path, config: ProcessGroupConfig) -> Result<ProcessGroup> {
    let deadline = crate::deadline::deadline_after(config.timeout);
    let mut last = String::from("the file does not exist yet");
    while Instant::now() < deadline {
        if let Some((addr, nonce)) = read_address(path) {
            let left = deadline.saturating_duration_since(Instant::now());
            // Probe with a short timeout: a stale file may name a port nobody listens on.
            let probe = Store::connect(
                &addr,
                config
                    .store_config()
                    .with_timeout(left.min(Duration::from_secs(5))),
            )
            .and_then(|s| s.get_timeout(NONCE_KEY, Duration::from_secs(1)));
            match probe {
                Ok(found) if found == nonce.as_bytes() => {
                    let store = Store::connect(&addr, config.store_config())?;
                    return ProcessGroup::world(store, config, None);
                }
                Ok(_) => last = format!("{} names a store from another run", path.display()),
                Err(e) => last = e.to_string(),
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(CommError::config(
        "file:// rendezvous",
        format!(
            "rank 0 did not publish a usable store address in {} within {:?}: {last}",
            path.display(),
            config.timeout
        ),
    ))
}

fn read_address(path: &Path) -> Option<(String, String)> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut parts = text.split_whitespace();
    Some((parts.next()?.to_string(), parts.next()?.to_string()))
}
