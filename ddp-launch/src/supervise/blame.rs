//! The chain of blame between failed ranks. Each worker writes its first communication failure
//! to its own file ([`ddp_comm::FAILURE_FILE_ENV`]): the rank it timed out on or lost, and the
//! error. Following that chain from the first rank to fail leads to the root cause, e.g. a rank
//! that stalled (stopped, deadlocked, swapping) and so never failed itself, while the rank that
//! waited for it timed out and exited first.
//!
//! The files, not the workers' store, carry the chain to the launcher: the store lives in rank
//! 0, which may be the rank that hangs or the victim that already exited.

use crate::error::LaunchError;
use crate::summary::{RootCause, Victim};
use ddp_comm::FailureReport;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Follows the blame from `first`. `None` when `first` blamed nobody (it is its own root cause).
/// A cycle (two ranks blaming each other) ends at the last rank not yet visited.
pub(crate) fn trace_root(
    first: usize,
    reports: &BTreeMap<usize, FailureReport>,
) -> Option<RootCause> {
    let mut victims = Vec::new();
    let mut current = first;
    while let Some(report) = reports.get(&current) {
        let Some(next) = report.blame else { break };
        if next == current || victims.iter().any(|v: &Victim| v.rank == next) {
            break;
        }
        victims.push(Victim {
            rank: current,
            blamed: next,
            message: report.message.clone(),
        });
        current = next;
    }
    if victims.is_empty() {
        return None;
    }
    Some(RootCause {
        rank: current,
        own_report: reports.get(&current).map(|r| r.message.clone()),
        victims,
    })
}

/// A private directory for one attempt's failure files, removed when dropped.
#[derive(Debug)]
pub(crate) struct FailureDir {
    path: PathBuf,
}

impl FailureDir {
    /// Creates `ddp-run-<host>-<pid>-<attempt>-<random>` (mode 0700) under the temporary
    /// directory, after removing those that launchers of this host no longer running left there
    /// (see [`remove_stale`]). `<host>` is [`host_marker`]: the temporary directory may be shared
    /// with other hosts or PID namespaces, where `<pid>` means another process.
    pub(crate) fn create(restart_count: u32) -> Result<FailureDir, LaunchError> {
        use std::os::unix::fs::DirBuilderExt;
        let temp = std::env::temp_dir();
        let marker = host_marker();
        if let Some(marker) = marker {
            remove_stale(&temp, marker);
        }
        let name = format!(
            "ddp-run-{}-{}-{restart_count}-{:016x}",
            marker.unwrap_or(UNKNOWN_HOST),
            std::process::id(),
            rand::random::<u64>()
        );
        let path = temp.join(name);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|source| LaunchError::FailureDir {
                path: path.clone(),
                source,
            })?;
        Ok(FailureDir { path })
    }

    /// The file global rank `rank` writes its failure to.
    pub(crate) fn file_for(&self, rank: usize) -> PathBuf {
        self.path.join(format!("rank_{rank}.failure"))
    }

    /// Whether global rank `rank` has written its failure report (it may still be writing it).
    pub(crate) fn has_report(&self, rank: usize) -> bool {
        self.file_for(rank).exists()
    }

    /// The reports of `ranks` that wrote one.
    pub(crate) fn read(
        &self,
        ranks: impl Iterator<Item = usize>,
    ) -> BTreeMap<usize, FailureReport> {
        ranks
            .filter_map(|rank| {
                let text = read_small(&self.file_for(rank))?;
                FailureReport::parse(&text).map(|r| (rank, r))
            })
            .collect()
    }
}

impl Drop for FailureDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(path = %self.path.display(), %e, "cannot remove the failure reports");
        }
    }
}

/// The marker of a launcher whose host could not be told (no boot id, no host name): no
/// launcher removes such a directory as stale.
const UNKNOWN_HOST: &str = "unknown";

/// What tells this host's failure directories from those of other hosts (or containers) that
/// share the temporary directory (shared scratch, or `/tmp` shared between PID namespaces):
/// only a launcher with the same marker can judge from a pid whether their launcher is gone.
///
/// On Linux the boot id (`/proc/sys/kernel/random/boot_id`, random per boot of the kernel, so
/// per host) and the inode of this PID namespace (`/proc/self/ns/pid`: containers on one kernel
/// each have their own pids), as `<boot id hex>.<namespace>`. Elsewhere (no `/proc`) the host
/// name, with anything but ASCII letters, digits and `.` replaced by `_`. `None` when neither
/// can be read. Never contains `-` (the name's separator).
fn host_marker() -> Option<&'static str> {
    static MARKER: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    MARKER
        .get_or_init(|| {
            let namespace = std::fs::read_link("/proc/self/ns/pid")
                .ok()
                .and_then(|link| {
                    let digits: String = link
                        .to_string_lossy()
                        .chars()
                        .filter(char::is_ascii_digit)
                        .collect();
                    (!digits.is_empty()).then_some(digits)
                });
            let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()
                .map(|id| id.trim().replace('-', ""))
                .filter(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()));
            let host = boot_id.or_else(|| hostname().map(|h| sanitise_host(&h)))?;
            Some(match namespace {
                Some(ns) => format!("{host}.{ns}"),
                None => host,
            })
        })
        .as_deref()
}

/// This host's name, if it has one.
fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    (ok && !name.is_empty()).then_some(name)
}

/// `host` with only ASCII letters, digits and `.` (others become `_`), at most 64 of them.
fn sanitise_host(host: &str) -> String {
    host.chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Removes the failure directories in `temp` of launchers of this host that are gone: a
/// launcher killed with SIGKILL cannot remove its own, and each would stay behind, empty, until
/// reboot. Only this user's directories that carry this host's `marker` and whose launcher pid
/// no longer exists are touched: another host's (or container's) pids mean nothing here, so
/// its directories are left alone, and so are directories in the format of earlier launchers
/// (`ddp-run-<pid>-<attempt>-<random>`, no marker: their host cannot be told). Anything
/// unexpected is left alone too.
fn remove_stale(temp: &Path, marker: &str) {
    use std::os::unix::fs::MetadataExt;
    if marker == UNKNOWN_HOST {
        return;
    }
    let Ok(entries) = std::fs::read_dir(temp) else {
        return;
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((host, pid)) = name.to_str().and_then(launcher_of) else {
            continue;
        };
        if host != marker {
            continue;
        }
        let path = entry.path();
        let mine = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir() && m.uid() == me);
        if !mine || pid_exists(pid) {
            continue;
        }
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {
                tracing::debug!(path = %path.display(), "removed a dead launcher's failure reports")
            }
            Err(e) => {
                tracing::debug!(path = %path.display(), %e, "cannot remove a dead launcher's failure reports")
            }
        }
    }
}

/// The host marker and launcher pid in a failure directory's name
/// `ddp-run-<host>-<pid>-<attempt>-<random>`.
fn launcher_of(name: &str) -> Option<(&str, i32)> {
    let mut parts = name.strip_prefix("ddp-run-")?.split('-');
    let host = parts.next()?;
    let pid = parts.next()?.parse().ok()?;
    let attempt = parts.next()?;
    let random = parts.next()?;
    let well_formed = !host.is_empty()
        && attempt.parse::<u32>().is_ok()
        && random.len() == 16
        && random.bytes().all(|b| b.is_ascii_hexdigit())
        && parts.next().is_none();
    (well_formed && pid > 0).then_some((host, pid))
}

/// Whether a process `pid` exists (also when it belongs to another user).
fn pid_exists(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    let signalled = unsafe { libc::kill(pid, 0) } == 0;
    signalled || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// The first 64 KiB of `path`, if it exists (a report is a few lines; more is not ours).
fn read_small(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(64 * 1024)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(blame: Option<usize>, message: &str) -> FailureReport {
        FailureReport {
            blame,
            message: message.into(),
        }
    }

    #[test]
    fn the_chain_ends_at_the_rank_that_blamed_nobody_or_reported_nothing() {
        // 0 timed out on 2, 2 timed out on 1, 1 never reported (stalled).
        let reports: BTreeMap<_, _> = [
            (0, report(Some(2), "timed out waiting for rank 2")),
            (2, report(Some(1), "timed out waiting for rank 1")),
        ]
        .into();
        let root = trace_root(0, &reports).expect("a root cause");
        assert_eq!(root.rank, 1);
        assert_eq!(root.own_report, None);
        let chain: Vec<(usize, usize)> = root.victims.iter().map(|v| (v.rank, v.blamed)).collect();
        assert_eq!(chain, [(0, 2), (2, 1)]);

        // 1 failed on its own: it is the root, with its message.
        let reports: BTreeMap<_, _> = [
            (0, report(Some(1), "rank 1 closed its connection")),
            (1, report(None, "out of memory")),
        ]
        .into();
        let root = trace_root(0, &reports).expect("a root cause");
        assert_eq!(
            (root.rank, root.own_report.as_deref()),
            (1, Some("out of memory"))
        );
    }

    #[test]
    fn no_blame_or_a_cycle_never_loops() {
        let reports: BTreeMap<_, _> = [(0, report(None, "bad input"))].into();
        assert_eq!(trace_root(0, &reports), None);
        assert_eq!(trace_root(5, &reports), None);
        let cycle: BTreeMap<_, _> = [
            (0, report(Some(1), "a")),
            (1, report(Some(2), "b")),
            (2, report(Some(1), "c")),
        ]
        .into();
        let root = trace_root(0, &cycle).expect("a root cause");
        assert_eq!(root.rank, 2);
    }

    #[test]
    fn only_well_formed_names_give_a_host_and_launcher_pid() {
        assert_eq!(
            launcher_of("ddp-run-abc.4026531836-123-0-00000000deadbeef"),
            Some(("abc.4026531836", 123))
        );
        for bad in [
            // The format of earlier launchers, without a host marker.
            "ddp-run-123-0-00000000deadbeef",
            "ddp-run-h-123-0-deadbeef",
            "ddp-run-h-x-0-00000000deadbeef",
            "ddp-run-h-0-0-00000000deadbeef",
            "ddp-run--123-0-00000000deadbeef",
            "ddp-run-h-123-0-00000000deadbeef-x",
            "other-h-123-0-00000000deadbeef",
        ] {
            assert_eq!(launcher_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn host_markers_never_split_the_name() {
        if let Some(marker) = host_marker() {
            assert!(!marker.is_empty() && !marker.contains('-'), "{marker}");
            assert_ne!(marker, UNKNOWN_HOST);
        }
        assert_eq!(sanitise_host("node-0.example"), "node_0.example");
        assert_eq!(sanitise_host(&"x".repeat(300)).len(), 64);
    }

    /// A pid no process has: one that exited and was reaped.
    fn dead_pid() -> i32 {
        loop {
            let mut child = std::process::Command::new("true").spawn().expect("spawn");
            let pid = child.id() as i32;
            child.wait().expect("wait");
            if !pid_exists(pid) {
                return pid;
            }
        }
    }

    /// Only this host's directories of dead launchers go: another host's pid means nothing
    /// here (shared scratch, or /tmp shared between containers), and a directory of an earlier
    /// launcher carries no host at all.
    #[test]
    fn only_this_hosts_dead_launchers_directories_are_removed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dead = dead_pid();
        let live = std::process::id();
        let dir = |name: String| tmp.path().join(format!("ddp-run-{name}"));
        let ours_dead = dir(format!("thishost.1-{dead}-0-00000000deadbeef"));
        let ours_live = dir(format!("thishost.1-{live}-0-00000000cafef00d"));
        let other_host = dir(format!("otherhost.1-{dead}-0-00000000deadbeef"));
        let other_namespace = dir(format!("thishost.2-{dead}-0-00000000deadbeef"));
        let old_format = dir(format!("{dead}-0-00000000deadbeef"));
        let unknown = dir(format!("{UNKNOWN_HOST}-{dead}-0-00000000deadbeef"));
        let all = [
            &ours_dead,
            &ours_live,
            &other_host,
            &other_namespace,
            &old_format,
            &unknown,
        ];
        for d in all {
            std::fs::create_dir(d).expect("mkdir");
        }
        remove_stale(tmp.path(), UNKNOWN_HOST);
        assert!(
            all.iter().all(|d| d.exists()),
            "no host known: nothing goes"
        );
        remove_stale(tmp.path(), "thishost.1");
        assert!(
            !ours_dead.exists(),
            "this host's dead launcher's directory stays"
        );
        for d in [
            &ours_live,
            &other_host,
            &other_namespace,
            &old_format,
            &unknown,
        ] {
            assert!(d.exists(), "{} was removed", d.display());
        }
    }

    #[test]
    fn the_directory_holds_one_file_per_rank_and_is_removed() {
        let dir = FailureDir::create(7).expect("dir");
        let path = dir.path.clone();
        let name = path.file_name().and_then(|n| n.to_str()).expect("name");
        let marker = host_marker().unwrap_or(UNKNOWN_HOST);
        assert_eq!(
            launcher_of(name),
            Some((marker, std::process::id() as i32)),
            "{name}"
        );
        std::fs::write(dir.file_for(1), "blame 0\nlost rank 0\n").expect("write");
        std::fs::write(dir.file_for(2), "not a report").expect("write");
        let reports = dir.read(0..3);
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[&1], report(Some(0), "lost rank 0"));
        drop(dir);
        assert!(!path.exists());
    }
}
