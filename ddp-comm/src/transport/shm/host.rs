//! Who shares a host, who is alive, and what a crashed run left behind: all through `/proc` and
//! plain file operations.

use super::segment_layout::{HEADER_BYTES, Header};
use super::sys::open_own_file;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

/// Where segments live.
pub(crate) const SHM_DIR: &str = "/dev/shm";
/// Every segment's name starts with this.
pub(crate) const SEGMENT_PREFIX: &str = "ddp-";
/// An empty `ddp-` file this old is a creator that died before writing a byte.
const EMPTY_SEGMENT_GRACE: Duration = Duration::from_secs(600);

/// This host's identity as far as shared memory goes: ranks with equal ids can map the same
/// `/dev/shm` files and see each other's pids. Hostname and boot id tell machines (and reboots)
/// apart; the network namespace tells containers and `ip netns` "hosts" apart; the pid
/// namespace makes sure pids in slot headers mean the same process to every rank.
pub(crate) fn host_id() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let ns = |p: &str| std::fs::metadata(p).map(|m| m.ino()).unwrap_or(0);
    format!(
        "{}/{}/net:{}/pid:{}",
        read("/proc/sys/kernel/hostname"),
        read("/proc/sys/kernel/random/boot_id"),
        ns("/proc/self/ns/net"),
        ns("/proc/self/ns/pid"),
    )
}

/// Inode of this process's pid namespace.
pub(super) fn pid_ns() -> u64 {
    std::fs::metadata("/proc/self/ns/pid")
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// A process, named so that a reused pid is not mistaken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ProcId {
    pub(super) pid: u32,
    /// Start time in clock ticks after boot (field 22 of `/proc/<pid>/stat`).
    pub(super) start: u64,
}

impl ProcId {
    pub(super) fn me() -> ProcId {
        let pid = std::process::id();
        ProcId {
            pid,
            start: stat(pid).map_or(0, |s| s.1),
        }
    }

    /// Whether the process still runs: it exists, is not a zombie (a killed rank whose parent
    /// has not reaped it yet is dead for us), and started when it did.
    pub(super) fn alive(&self) -> bool {
        match stat(self.pid) {
            Some((state, start)) => !matches!(state, 'Z' | 'X' | 'x') && start == self.start,
            None => false,
        }
    }
}

/// `(state, start time)` from `/proc/<pid>/stat`.
fn stat(pid: u32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ..." where comm may contain anything, parentheses included.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields after the state are 4.. of the man page; start time is field 22.
    let start = fields.nth(22 - 4)?.parse().ok()?;
    Some((state, start))
}

/// Removes segments that crashed runs left in `dir`: files named `ddp-*` whose header names a
/// creator in our pid namespace that is no longer alive (and empty `ddp-*` files older than a
/// few minutes). Live jobs' segments, other namespaces' segments, other users' files and
/// anything that is not a regular file are left alone (and never blocked on). Returns how
/// many were removed.
pub(super) fn remove_stale_segments(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let my_ns = pid_ns();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(SEGMENT_PREFIX) {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        let stale = if meta.len() == 0 {
            meta.modified()
                .ok()
                .and_then(|m| m.elapsed().ok())
                .is_some_and(|age| age > EMPTY_SEGMENT_GRACE)
        } else {
            let mut head = [0u8; HEADER_BYTES];
            let header = open_own_file(&path, false)
                .and_then(|mut f| f.read_exact(&mut head))
                .ok()
                .and_then(|()| Header::decode(&head));
            header.is_some_and(|h| {
                h.pid_ns == my_ns
                    && !ProcId {
                        pid: h.pid,
                        start: h.start,
                    }
                    .alive()
            })
        };
        if stale && std::fs::remove_file(&path).is_ok() {
            tracing::info!(segment = %path.display(), "removed a shared-memory segment left by a crashed run");
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::super::segment_layout::Layout;
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_reaped_child_is_not() {
        let me = ProcId::me();
        assert!(me.start > 0);
        assert!(me.alive());
        assert!(
            !ProcId {
                start: me.start + 1,
                ..me
            }
            .alive(),
            "a reused pid is not the same process"
        );
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(
            !ProcId {
                pid,
                start: stat(pid).map_or(0, |s| s.1)
            }
            .alive()
        );
    }

    #[test]
    fn a_zombie_is_dead() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let start = stat(pid).map(|s| s.1);
        // Not reaped yet: a zombie once it has exited.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while stat(pid).is_some_and(|s| s.0 != 'Z') && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(start) = start {
            assert!(!ProcId { pid, start }.alive());
        }
        child.wait().unwrap();
    }

    #[test]
    fn host_id_names_the_namespaces() {
        let id = host_id();
        assert!(id.contains("/net:") && id.contains("/pid:"), "{id}");
        assert_eq!(id, host_id());
    }

    #[test]
    fn stale_segments_of_dead_creators_are_removed_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout {
            local: 2,
            nbuf: 2,
            chunk: 4096,
        };
        let me = ProcId::me();
        let header = |p: ProcId| {
            Header {
                layout,
                pid: p.pid,
                start: p.start,
                pid_ns: pid_ns(),
            }
            .encode()
        };
        let dead = ProcId {
            start: me.start + 1,
            ..me
        };
        std::fs::write(dir.path().join("ddp-x-dead"), header(dead)).unwrap();
        std::fs::write(dir.path().join("ddp-x-live"), header(me)).unwrap();
        std::fs::write(dir.path().join("ddp-x-garbage"), b"not a segment").unwrap();
        std::fs::write(dir.path().join("other-dead"), header(dead)).unwrap();
        std::fs::write(dir.path().join("ddp-x-empty"), b"").unwrap();
        assert_eq!(remove_stale_segments(dir.path()), 1);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["ddp-x-empty", "ddp-x-garbage", "ddp-x-live", "other-dead"]
        );
    }
}
