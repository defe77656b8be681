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
    let advertise = crate::env::env_var("MASTER_ADDR")?
        .filter(|a| !a.trim().is_empty())
        .map_or_else(|| "127.0.0.1".to_string(), |a| a.trim().to_string());
    let server = super::bind::bind_store(&advertise, 0, config.store_config())?;
    config.require_token_if_exposed("the store", server.local_addr().ip())?;
    let addr = super::host_port::host_port(&advertise, server.local_addr().port());
    let store = Store::connect(&addr, config.store_config())?;
    let nonce = format!("{:016x}", rand::random::<u64>());
    store.set(NONCE_KEY, nonce.as_bytes())?;
    publish(path, format!("{addr} {nonce}\n").as_bytes())
        .map_err(|e| CommError::io(format!("file:// rendezvous: writing {}", path.display()), e))?;
    let hosted = HostedStore::new(server, config.timeout);
    let pg = ProcessGroup::world(store, config, Some(hosted));
    // Every rank has joined (or failed): the file has served its purpose either way.
    let _ = std::fs::remove_file(path);
    pg
}

fn join(path: &Path, config: ProcessGroupConfig) -> Result<ProcessGroup> {
    let deadline = crate::deadline::deadline_after(config.timeout);
    let mut last = String::from("the file does not exist yet");
    // The address the file named last, for the hint when it is a loopback one.
    let mut named = None;
    while Instant::now() < deadline {
        if let Some((addr, nonce)) = read_address(path) {
            named = Some(addr.clone());
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
            "rank 0 did not publish a usable store address in {} within {:?}: {last}{}",
            path.display(),
            config.timeout,
            named.as_deref().map_or("", loopback_hint)
        ),
    ))
}

/// Why a store at `addr`, which the rendezvous file named, may be out of this rank's reach: a
/// loopback address, which rank 0 publishes when MASTER_ADDR is unset (or names this host and
/// resolves to loopback there), reaches rank 0 only from its own host.
fn loopback_hint(addr: &str) -> &'static str {
    use std::net::ToSocketAddrs;
    let loopback = addr
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| a.ip().is_loopback());
    if loopback {
        " (the file names a loopback address, which reaches rank 0 only from its own host: for          a job on several hosts, set MASTER_ADDR on rank 0 to an address every host reaches)"
    } else {
        ""
    }
}

/// Attempts at an unused temporary name before giving up (each name has 64 random bits, so a
/// second attempt means someone planted files).
const TEMP_ATTEMPTS: usize = 16;

/// Replaces `path` atomically with `contents`: written to a new file of an unpredictable name
/// in the same directory, then renamed over it. The temporary file is created with
/// `O_CREAT|O_EXCL|O_NOFOLLOW`, so on a shared directory nobody can make us write through a
/// symlink or into a file they prepared (as a fixed `path.tmp<pid>` allowed).
fn publish(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "rendezvous".into());
    let mut last = None;
    for _ in 0..TEMP_ATTEMPTS {
        let tmp = dir.join(format!(".{name}.{:016x}.tmp", rand::random::<u64>()));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp);
        let mut file = match file {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                tracing::warn!(tmp = %tmp.display(), "file:// rendezvous: temporary name taken, trying another");
                last = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        let written = file
            .write_all(contents)
            .and_then(|()| file.sync_all())
            .and_then(|()| std::fs::rename(&tmp, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        return written;
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no unused temporary name")))
}

fn read_address(path: &Path) -> Option<(String, String)> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut parts = text.split_whitespace();
    Some((parts.next()?.to_string(), parts.next()?.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A symlink planted where the old code wrote its temporary file (`<path>.tmp<pid>`, a
    /// name anyone could predict) is not followed: its target stays untouched, and the file
    /// is published.
    #[test]
    fn a_planted_symlink_at_the_old_temporary_name_is_not_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("rendezvous");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").expect("victim");
        let old_tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &old_tmp).expect("plant symlink");

        publish(&path, b"127.0.0.1:1 abc\n").expect("publish");

        assert_eq!(std::fs::read(&victim).expect("victim"), b"precious");
        assert_eq!(
            std::fs::read(&path).expect("published"),
            b"127.0.0.1:1 abc\n"
        );
        assert!(
            !std::fs::symlink_metadata(&path)
                .expect("metadata")
                .file_type()
                .is_symlink(),
            "the published file is a file of its own"
        );
        // No temporary file is left behind besides the planted link.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name())
            .filter(|n| n.to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    /// Publishing over an existing file replaces it (the rename, not a write through it).
    #[test]
    fn publishing_twice_replaces_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("rendezvous");
        publish(&path, b"one").expect("first");
        publish(&path, b"two").expect("second");
        assert_eq!(std::fs::read(&path).expect("read"), b"two");
    }
}
