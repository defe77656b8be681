//! Which launch last started the directory over: `<dir>/fresh-start` holds its id.
//!
//! A launcher restart (`--max-restarts`) repeats the command line, `--fresh` included. The
//! restart must resume what *this launch* wrote, but the first attempt may have died before it
//! cleared the older run's checkpoints: then resuming would continue the older run. So the
//! attempt that starts over records the launch's id (the launcher's `DDP_LAUNCH_ID`) here once
//! the directory holds only this launch's state, and a restart resumes only when the record
//! names its own launch; otherwise it starts over itself. The directory lock (one job per
//! directory) keeps other jobs from writing in between.
//!
//! Every rank writes the record into its own directory, and a launch recorded in any rank's
//! counts (`fresh_start_recorded`, exact: a launch id is its launch's own): without a shared
//! filesystem an elastic restart can make another host rank 0, and a record on the old rank-0
//! host only would make that restart start over again. A rank other than 0 writes only while
//! it holds its directory's lock (never into one this job's rank 0 or another job holds), and
//! one that cannot write there only warns: its records matter only once its host is rank 0.
//! Each record also carries a stamp (rank 0's clock in milliseconds, above every stamp the
//! ranks held): `fresh_start_launch` names the newest, for display; no decision rests on
//! clocks.
//!
//! Starting over clears rank 0's directory only. Without a shared filesystem another host's
//! own directory may still hold the older run's checkpoints, newer than this run's, which
//! would stop every later load ([`CheckpointConfig::with_other_ranks_checked`]). So the fresh
//! start also records the run ids of the checkpoints the other ranks' directories hold (not
//! those in rank 0's own) as superseded
//! ([`SUPERSEDED_RUNS_FILE`](super::SUPERSEDED_RUNS_FILE)), merged with what every rank's
//! record held, in every rank's directory: the check passes over those runs' checkpoints from
//! then on, and refuses to resume one when rank 0 later moves back to a host holding them.

use super::config::CheckpointConfig;
use super::error::{CheckpointError, StorageError};
use super::full::FullCheckpointer;
use super::manifest::MANIFEST_FILE;
use super::sharded::SHARDED_MANIFEST_FILE;
use super::sharded::ShardedCheckpointer;
use super::storage::durable::{ensure_dir, rename, sync_dir, write_synced};
use super::storage::lock::{DirLock, lock_dir};
use super::storage::naming::TMP_PREFIX;
use super::storage::rank0::{all_gather_bytes, all_succeeded};
use super::storage::run_id::{read_superseded, run_ids_in, write_superseded};
use ddp_comm::ProcessGroup;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The file naming the launch that last started the directory over.
pub const FRESH_START_FILE: &str = "fresh-start";

impl FullCheckpointer {
    /// Records that launch `launch_id` started this directory over: call it after removing
    /// the older run's checkpoints ([`rewind_to`](Self::rewind_to)) and before training. Every
    /// rank writes it into its own directory atomically (ranks sharing one write the same).
    ///
    /// It also marks the runs whose checkpoints the other ranks' own directories hold (each
    /// rank lists its own; the run ids in their manifests) as superseded, except those still in
    /// rank 0's directory: without a shared filesystem, starting over leaves them there, and
    /// the other-ranks check of every later load passes over them with a warning instead of
    /// refusing ([`CheckpointConfig::with_other_ranks_checked`]), and refuses to resume one.
    ///
    /// # Collective
    /// Every rank calls it at the same point, with the same `launch_id`.
    ///
    /// # Errors
    /// Any rank's I/O error (that rank's own, [`CheckpointError::PeerFailed`] on the others);
    /// [`CheckpointError::ReadOnly`]; [`CheckpointError::InvalidConfig`] for a launch id of
    /// more than one line; [`CheckpointError::Comm`].
    pub fn record_fresh_start(&self, launch_id: &str) -> Result<(), CheckpointError> {
        record(
            self.process_group(),
            self.config(),
            MANIFEST_FILE,
            launch_id,
        )
    }

    /// The launch id the last [`record_fresh_start`](Self::record_fresh_start) recorded, if
    /// any: every rank reads its own directory's record and the newest of them is every rank's
    /// answer (`None` when there is none, or the newest was recorded without a launch id).
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// Any rank's I/O error (that rank's own, [`CheckpointError::PeerFailed`] on the others);
    /// [`CheckpointError::Comm`].
    pub fn fresh_start_launch(&self) -> Result<Option<String>, CheckpointError> {
        recorded(self.process_group(), self.config().dir())
    }

    /// Whether any rank's directory records a fresh start by launch `launch_id`: what a
    /// restart asks to tell its own launch's checkpoints from an older run's. Exact whatever
    /// the hosts' clocks (a launch id is its launch's own), where
    /// [`fresh_start_launch`](Self::fresh_start_launch) orders records by rank 0's clock.
    /// `false` for an empty id.
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// Rank 0's I/O error reading its record (a [`CheckpointError::PeerFailed`] on the
    /// others; another rank's is only warned about); [`CheckpointError::Comm`].
    pub fn fresh_start_recorded(&self, launch_id: &str) -> Result<bool, CheckpointError> {
        recorded_by(self.process_group(), self.config().dir(), launch_id)
    }
}

impl ShardedCheckpointer {
    /// [`FullCheckpointer::record_fresh_start`] for sharded checkpoints (FSDP, ZeRO): call it
    /// after removing the older run's checkpoints and before training. It marks the runs of
    /// the other ranks' directories as superseded in the same way.
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// As [`FullCheckpointer::record_fresh_start`].
    pub fn record_fresh_start(&self, launch_id: &str) -> Result<(), CheckpointError> {
        record(
            self.process_group(),
            self.config(),
            SHARDED_MANIFEST_FILE,
            launch_id,
        )
    }

    /// [`FullCheckpointer::fresh_start_launch`] for sharded checkpoints.
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// As [`FullCheckpointer::fresh_start_launch`].
    pub fn fresh_start_launch(&self) -> Result<Option<String>, CheckpointError> {
        recorded(self.process_group(), self.config().dir())
    }

    /// [`FullCheckpointer::fresh_start_recorded`] for sharded checkpoints.
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// As [`FullCheckpointer::fresh_start_recorded`].
    pub fn fresh_start_recorded(&self, launch_id: &str) -> Result<bool, CheckpointError> {
        recorded_by(self.process_group(), self.config().dir(), launch_id)
    }
}

/// What one rank's own directory holds at a fresh start.
#[derive(Debug, Serialize, Deserialize)]
struct RunsHeld {
    dir: PathBuf,
    /// The runs of its checkpoints.
    run_ids: BTreeSet<String>,
    /// Its record of superseded runs (empty when missing or unreadable).
    superseded: BTreeSet<String>,
    /// The stamp of its fresh-start record (0 when none).
    stamp: u64,
    /// The rank's clock, in milliseconds since the Unix epoch.
    now_ms: u64,
}

/// A fresh-start record: the launch (empty: none given) and its stamp.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Recorded {
    launch: String,
    stamp: u64,
}

fn record(
    pg: &ProcessGroup,
    config: &CheckpointConfig,
    manifest_file: &str,
    launch_id: &str,
) -> Result<(), CheckpointError> {
    let action = "record the fresh start";
    // Decided alike on every rank before anything is written.
    let valid = config.writable(action).and_then(|()| {
        if launch_id.contains(['\n', '\r']) {
            Err(CheckpointError::InvalidConfig(format!(
                "launch id {launch_id:?} for the fresh-start record spans lines; pass a \
                 one-line id (DDP_LAUNCH_ID)"
            )))
        } else {
            Ok(())
        }
    });
    all_succeeded(pg, valid, action)?;
    let dir = config.dir().to_path_buf();
    let (own_superseded, own_readable) = match read_superseded(&dir) {
        Ok(runs) => (runs, true),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "replacing an unreadable record of superseded runs");
            (BTreeSet::new(), false)
        }
    };
    let stamp = match read_record(&dir) {
        Ok(record) => record.map_or(0, |r| r.stamp),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot read the fresh-start record; replacing it");
            0
        }
    };
    let mine = RunsHeld {
        dir: dir.clone(),
        run_ids: run_ids_in(&dir, manifest_file),
        superseded: own_superseded.clone(),
        stamp,
        now_ms: now_ms(),
    };
    // Nothing fails before the collective: an unencodable listing travels as empty bytes.
    let held = all_gather_bytes(pg, serde_json::to_vec(&mine).unwrap_or_default())?;
    let held: Vec<Option<RunsHeld>> = held
        .iter()
        .enumerate()
        .map(|(rank, bytes)| {
            let decoded = serde_json::from_slice::<RunsHeld>(bytes).ok();
            if decoded.is_none() && pg.rank() == 0 {
                tracing::warn!(
                    rank,
                    "rank {rank} sent no readable list of its checkpoints' runs; marking none of them superseded"
                );
            }
            decoded
        })
        .collect();
    // From here on every rank decides from the same gathered data.
    let superseded = superseded_after(&held, pg.rank() == 0);
    let stamp = held
        .iter()
        .flatten()
        .map(|h| h.stamp.saturating_add(1))
        .chain(held.first().and_then(Option::as_ref).map(|h| h.now_ms))
        .max()
        .unwrap_or(1);
    let rank = pg.rank();
    // The superseded runs first, on every rank: once a restart finds its launch in any
    // directory, every directory's record of superseded runs is on disk too.
    // A rank's directory may not exist yet (a full checkpoint is written by rank 0 only): it
    // gets the records too, for when its host becomes rank 0.
    let writer = ensure_dir(&dir)
        .map_err(CheckpointError::from)
        .and_then(|()| records_writer(rank, &dir));
    // The writer (another rank's lock) lives until both records are written.
    let (writes, wrote, _writer) = match writer {
        Ok(writer) => (!matches!(writer, Writer::Skip), Ok(()), Some(writer)),
        Err(e) => (false, Err(e), None),
    };
    let wrote = wrote.and_then(|()| {
        if !writes || (own_readable && own_superseded == superseded) {
            Ok(())
        } else {
            write_superseded(&dir, &superseded, rank)
        }
    });
    all_succeeded(pg, off_rank0_best_effort(rank, &dir, wrote), action)?;
    let record = Recorded {
        launch: launch_id.to_string(),
        stamp,
    };
    let wrote = if writes {
        write_record(&dir, &record, rank)
    } else {
        Ok(())
    };
    all_succeeded(pg, off_rank0_best_effort(rank, &dir, wrote), action)
}

/// Who writes the fresh-start records into a rank's directory.
enum Writer {
    /// Rank 0, which holds its directory's lock (the checkpointer took it).
    Rank0,
    /// Another rank, holding its own directory's lock for the writes.
    Locked {
        /// Held, not read: the lock lives as long as this value.
        _lock: DirLock,
    },
    /// Another rank whose directory another process holds: this job's rank 0 (a directory
    /// they share, where rank 0 writes the same records) or another job, whose directory this
    /// job must not write.
    Skip,
}

/// Whether rank `rank` writes the records into `dir`: rank 0 does; another rank only while
/// it holds `dir`'s lock, so it never writes into a directory another job holds.
fn records_writer(rank: usize, dir: &Path) -> Result<Writer, CheckpointError> {
    if rank == 0 {
        return Ok(Writer::Rank0);
    }
    match lock_dir(dir) {
        Ok(lock) => Ok(Writer::Locked { _lock: lock }),
        Err(StorageError::DirLocked { holder, .. }) => {
            tracing::debug!(rank, dir = %dir.display(), holder = %holder, "not writing the fresh-start records here: another process holds the directory (rank 0 of this job, which writes them, or another job)");
            Ok(Writer::Skip)
        }
        Err(e) => Err(e.into()),
    }
}

/// A rank other than 0 that cannot write the records into its own directory (a path that
/// exists, or is writable, on rank 0's host only) warns and goes on: the records there only
/// matter once its host becomes rank 0, and a host that cannot create the directory cannot
/// become rank 0 anyway (the checkpointer creates and locks it there). Rank 0's failure fails
/// every rank.
fn off_rank0_best_effort(
    rank: usize,
    dir: &Path,
    wrote: Result<(), CheckpointError>,
) -> Result<(), CheckpointError> {
    match wrote {
        Err(e) if rank != 0 => {
            tracing::warn!(rank, dir = %dir.display(), error = %e, "cannot write the fresh-start records into this rank's checkpoint directory; a later resume with this host as rank 0 will not know of this fresh start");
            Ok(())
        }
        wrote => wrote,
    }
}

/// The runs superseded after a fresh start, from what every rank held (`held[r]`, `None`
/// when unreadable): those of the other ranks' checkpoints and every rank's earlier record,
/// less the runs rank 0's directory holds (the new run's, or the one it continues); only the
/// earlier records when rank 0's is unreadable. Logged when `log` (rank 0).
fn superseded_after(held: &[Option<RunsHeld>], log: bool) -> BTreeSet<String> {
    let mut superseded = BTreeSet::new();
    for held in held.iter().flatten() {
        superseded.extend(held.superseded.iter().cloned());
    }
    // Rank 0's runs unknown: the earlier records stand, and marking no more keeps the check
    // as strict as before.
    let Some(Some(rank0)) = held.first() else {
        return superseded;
    };
    for (rank, theirs) in held.iter().enumerate().skip(1) {
        let Some(theirs) = theirs else { continue };
        for run_id in theirs.run_ids.difference(&rank0.run_ids) {
            if log && !superseded.contains(run_id) {
                tracing::info!(
                    rank,
                    dir = %theirs.dir.display(),
                    run_id = %run_id,
                    "fresh start: run {run_id}, whose checkpoints are in rank {rank}'s directory {}, is superseded; later loads pass over them",
                    theirs.dir.display()
                );
            }
            superseded.insert(run_id.clone());
        }
    }
    superseded.retain(|id| !rank0.run_ids.contains(id));
    superseded
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Writes `record` as `dir`'s fresh-start record atomically: the launch id on the first line
/// (an older build, which compares the whole file, takes it for another launch's record), the
/// stamp on the second.
fn write_record(dir: &Path, record: &Recorded, rank: usize) -> Result<(), CheckpointError> {
    let tmp = dir.join(format!(
        "{TMP_PREFIX}{FRESH_START_FILE}-{rank}-{}",
        std::process::id()
    ));
    let text = format!("{}\n{}\n", record.launch, record.stamp);
    write_synced(&tmp, text.as_bytes())?;
    rename(&tmp, &dir.join(FRESH_START_FILE))?;
    Ok(sync_dir(dir)?)
}

/// `dir`'s fresh-start record, if any. A record without a readable stamp (an older build's)
/// has stamp 0.
///
/// # Errors
/// [`StorageError::Read`] for any I/O error but the file's absence.
fn read_record(dir: &Path) -> Result<Option<Recorded>, CheckpointError> {
    let path = dir.join(FRESH_START_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(StorageError::Read { path, source }.into()),
    };
    let text = String::from_utf8_lossy(&bytes);
    let mut lines = text.lines();
    let launch = lines.next().unwrap_or_default().trim().to_string();
    let stamp = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0);
    Ok(Some(Recorded { launch, stamp }))
}

fn recorded(pg: &ProcessGroup, dir: &Path) -> Result<Option<String>, CheckpointError> {
    let all = gather_records(pg, dir)?;
    Ok(newest(&all).map(|r| r.launch).filter(|l| !l.is_empty()))
}

/// Whether any rank's record is of launch `launch` (never for an empty id).
fn recorded_by(pg: &ProcessGroup, dir: &Path, launch: &str) -> Result<bool, CheckpointError> {
    let all = gather_records(pg, dir)?;
    Ok(!launch.is_empty()
        && all
            .iter()
            .filter_map(|bytes| serde_json::from_slice::<Recorded>(bytes).ok())
            .any(|r| r.launch == launch))
}

/// Every rank's fresh-start record, encoded (empty bytes: none). Rank 0's read error fails
/// every rank; another rank's is warned about, as if it had none (see
/// [`off_rank0_best_effort`]).
fn gather_records(pg: &ProcessGroup, dir: &Path) -> Result<Vec<Vec<u8>>, CheckpointError> {
    let mine = match read_record(dir) {
        Err(e) if pg.rank() != 0 => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot read this rank's fresh-start record; taking it for none");
            Ok(None)
        }
        read => read,
    };
    let mine = all_succeeded(pg, mine, "read the fresh-start record")?;
    // Nothing fails before the collective; no record travels as empty bytes.
    let bytes = mine
        .map(|r| serde_json::to_vec(&r).unwrap_or_default())
        .unwrap_or_default();
    all_gather_bytes(pg, bytes)
}

/// The newest of the records the ranks sent (the highest stamp; the lowest rank's on a tie).
fn newest(all: &[Vec<u8>]) -> Option<Recorded> {
    let mut newest: Option<Recorded> = None;
    for record in all
        .iter()
        .filter_map(|bytes| serde_json::from_slice::<Recorded>(bytes).ok())
    {
        if newest.as_ref().is_none_or(|n| record.stamp > n.stamp) {
            newest = Some(record);
        }
    }
    newest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_an_older_builds_has_stamp_0() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(read_record(dir.path()).expect("none"), None);
        let record = Recorded {
            launch: "launch-7".into(),
            stamp: 42,
        };
        write_record(dir.path(), &record, 3).expect("write");
        assert_eq!(read_record(dir.path()).expect("read"), Some(record));
        std::fs::write(dir.path().join(FRESH_START_FILE), "launch-1\n").expect("old");
        let old = read_record(dir.path()).expect("read").expect("some");
        assert_eq!((old.launch.as_str(), old.stamp), ("launch-1", 0));
    }

    #[test]
    fn the_newest_record_wins_and_the_lowest_rank_on_a_tie() {
        let enc = |launch: &str, stamp| {
            serde_json::to_vec(&Recorded {
                launch: launch.into(),
                stamp,
            })
            .expect("json")
        };
        let all = [enc("a", 5), Vec::new(), enc("b", 9), enc("c", 9)];
        assert_eq!(newest(&all).map(|r| r.launch).as_deref(), Some("b"));
        assert_eq!(newest(&[Vec::new(), Vec::new()]), None);
    }

    #[test]
    fn a_fresh_start_never_supersedes_the_runs_rank_0_holds() {
        let held = |dir: &str, runs: &[&str], superseded: &[&str]| {
            Some(RunsHeld {
                dir: dir.into(),
                run_ids: runs.iter().map(|s| s.to_string()).collect(),
                superseded: superseded.iter().map(|s| s.to_string()).collect(),
                stamp: 0,
                now_ms: 0,
            })
        };
        let all = [
            held("h0", &["new"], &["old"]),
            held("h1", &["x", "new"], &["y", "new"]),
            None,
        ];
        let got: Vec<_> = superseded_after(&all, false).into_iter().collect();
        assert_eq!(got, ["old", "x", "y"]);
        let got: Vec<_> = superseded_after(&[None, held("h1", &["x"], &["y"])], false)
            .into_iter()
            .collect();
        assert_eq!(got, ["y"]);
    }
}
