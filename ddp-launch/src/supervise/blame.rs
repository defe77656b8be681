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
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What one rank wrote when its process group failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FailureReport {
    /// The rank it blames, if its error blamed one.
    pub(crate) blame: Option<usize>,
    /// Its error message.
    pub(crate) message: String,
}

impl FailureReport {
    /// Parses `blame <rank>|none\n<message>`; `None` for anything else (a torn or foreign file
    /// is ignored rather than trusted).
    pub(crate) fn parse(text: &str) -> Option<FailureReport> {
        let (first, message) = text.split_once('\n')?;
        let blame = match first.strip_prefix("blame ")? {
            "none" => None,
            rank => Some(rank.parse().ok()?),
        };
        Some(FailureReport {
            blame,
            message: message.trim_end().to_string(),
        })
    }
}

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
    /// Creates `ddp-run-<pid>-<attempt>-<random>` (mode 0700) under the temporary directory,
    /// after removing those that launchers no longer running left there (see
    /// [`remove_stale`]).
    pub(crate) fn create(restart_count: u32) -> Result<FailureDir, LaunchError> {
        use std::os::unix::fs::DirBuilderExt;
        let temp = std::env::temp_dir();
        remove_stale(&temp);
        let name = format!(
            "ddp-run-{}-{restart_count}-{:016x}",
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

/// Removes the failure directories in `temp` of launchers that are gone: a launcher killed with
/// SIGKILL cannot remove its own, and each would stay behind, empty, until reboot. Only this
/// user's directories whose launcher pid no longer exists are touched; anything unexpected is
/// left alone.
fn remove_stale(temp: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(temp) else {
        return;
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(launcher_pid) else {
            continue;
        };
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

/// The launcher pid in a failure directory's name `ddp-run-<pid>-<attempt>-<random>`.
fn launcher_pid(name: &str) -> Option<i32> {
    let mut parts = name.strip_prefix("ddp-run-")?.split('-');
    let pid = parts.next()?.parse().ok()?;
    let attempt = parts.next()?;
    let random = parts.next()?;
    let well_formed = attempt.parse::<u32>().is_ok()
        && random.len() == 16
        && random.bytes().all(|b| b.is_ascii_hexdigit())
        && parts.next().is_none();
    (well_formed && pid > 0).then_some(pid)
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
    fn reports_parse_and_garbage_is_ignored() {
        assert_eq!(
            FailureReport::parse("blame 3\nall_reduce #4: timed out\n"),
            Some(report(Some(3), "all_reduce #4: timed out"))
        );
        assert_eq!(
            FailureReport::parse("blame none\npanicked\n"),
            Some(report(None, "panicked"))
        );
        for bad in ["", "blame 3", "blame x\nm", "blam 3\nm", "blame -1\nm"] {
            assert_eq!(FailureReport::parse(bad), None, "{bad:?}");
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
    fn only_well_formed_names_give_a_launcher_pid() {
        assert_eq!(launcher_pid("ddp-run-123-0-00000000deadbeef"), Some(123));
        for bad in [
            "ddp-run-123-0-deadbeef",
            "ddp-run-x-0-00000000deadbeef",
            "ddp-run-0-0-00000000deadbeef",
            "ddp-run-123-0-00000000deadbeef-x",
            "other-123-0-00000000deadbeef",
        ] {
            assert_eq!(launcher_pid(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_directory_holds_one_file_per_rank_and_is_removed() {
        let dir = FailureDir::create(7).expect("dir");
        let path = dir.path.clone();
        std::fs::write(dir.file_for(1), "blame 0\nlost rank 0\n").expect("write");
        std::fs::write(dir.file_for(2), "not a report").expect("write");
        let reports = dir.read(0..3);
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[&1], report(Some(0), "lost rank 0"));
        drop(dir);
        assert!(!path.exists());
    }
}
