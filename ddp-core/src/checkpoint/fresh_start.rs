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
//! Starting over clears rank 0's directory only. Without a shared filesystem another host's
//! own directory may still hold the older run's checkpoints, newer than this run's, which
//! would stop every later load ([`CheckpointConfig::with_other_ranks_checked`]). So the fresh
//! start also records, in rank 0's directory
//! ([`SUPERSEDED_RUNS_FILE`](super::SUPERSEDED_RUNS_FILE)), the run ids of the checkpoints the
//! other ranks' directories hold (not those in rank 0's own): the check passes over those runs'
//! checkpoints from then on.

use super::config::CheckpointConfig;
use super::error::{CheckpointError, StorageError};
use super::full::FullCheckpointer;
use super::manifest::MANIFEST_FILE;
use super::sharded::SHARDED_MANIFEST_FILE;
use super::sharded::ShardedCheckpointer;
use super::storage::durable::{rename, sync_dir, write_synced};
use super::storage::naming::TMP_PREFIX;
use super::storage::rank0::{all_gather_bytes, broadcast_bytes, on_rank0};
use super::storage::run_id::{add_superseded, run_ids_in};
use ddp_comm::ProcessGroup;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The file naming the launch that last started the directory over.
pub const FRESH_START_FILE: &str = "fresh-start";

impl FullCheckpointer {
    /// Records that launch `launch_id` started this directory over: call it after removing
    /// the older run's checkpoints ([`rewind_to`](Self::rewind_to)) and before training. Rank 0
    /// writes it atomically.
    ///
    /// It also marks the runs whose checkpoints the other ranks' own directories hold (each
    /// rank lists its own; the run ids in their manifests) as superseded, except those still in
    /// rank 0's directory: without a shared filesystem, starting over leaves them there, and
    /// the other-ranks check of every later load passes over them with a warning instead of
    /// refusing ([`CheckpointConfig::with_other_ranks_checked`]).
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// Rank 0's I/O errors (on every rank); [`CheckpointError::Comm`].
    pub fn record_fresh_start(&self, launch_id: &str) -> Result<(), CheckpointError> {
        record(
            self.process_group(),
            self.config(),
            MANIFEST_FILE,
            launch_id,
        )
    }

    /// The launch id the last [`record_fresh_start`](Self::record_fresh_start) recorded, if
    /// any (rank 0 reads it, every rank gets its answer).
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// Rank 0's I/O errors (on every rank).
    pub fn fresh_start_launch(&self) -> Result<Option<String>, CheckpointError> {
        recorded(self.process_group(), self.config().dir())
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
    /// Rank 0's I/O errors (on every rank); [`CheckpointError::Comm`].
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
    /// Rank 0's I/O errors (on every rank).
    pub fn fresh_start_launch(&self) -> Result<Option<String>, CheckpointError> {
        recorded(self.process_group(), self.config().dir())
    }
}

/// The runs one rank's own directory holds at a fresh start.
#[derive(Debug, Serialize, Deserialize)]
struct RunsHeld {
    dir: PathBuf,
    run_ids: BTreeSet<String>,
}

fn record(
    pg: &ProcessGroup,
    config: &CheckpointConfig,
    manifest_file: &str,
    launch_id: &str,
) -> Result<(), CheckpointError> {
    config.writable("record a fresh start")?;
    let dir = config.dir().to_path_buf();
    let mine = RunsHeld {
        dir: dir.clone(),
        run_ids: run_ids_in(&dir, manifest_file),
    };
    // Nothing fails before the collective: an unencodable listing travels as empty bytes.
    let held = all_gather_bytes(pg, serde_json::to_vec(&mine).unwrap_or_default())?;
    on_rank0(pg, "record the fresh start", || {
        // Before the launch record: once a restart finds its launch there, the superseded runs
        // are on disk too.
        let mut superseded = BTreeSet::new();
        for (rank, bytes) in held.iter().enumerate().skip(1) {
            let Ok(theirs) = serde_json::from_slice::<RunsHeld>(bytes) else {
                tracing::warn!(
                    rank,
                    "rank {rank} sent no readable list of its checkpoints' runs; marking none of them superseded"
                );
                continue;
            };
            for run_id in theirs.run_ids.difference(&mine.run_ids) {
                tracing::info!(
                    rank,
                    dir = %theirs.dir.display(),
                    run_id = %run_id,
                    "fresh start: run {run_id}, whose checkpoints are in rank {rank}'s directory {}, is superseded; later loads pass over them",
                    theirs.dir.display()
                );
                superseded.insert(run_id.clone());
            }
        }
        add_superseded(&dir, superseded)?;
        let tmp = dir.join(format!(
            "{TMP_PREFIX}{FRESH_START_FILE}-{}",
            std::process::id()
        ));
        write_synced(&tmp, format!("{launch_id}\n").as_bytes())?;
        rename(&tmp, &dir.join(FRESH_START_FILE))?;
        Ok::<_, CheckpointError>(sync_dir(&dir)?)
    })?;
    Ok(())
}

fn recorded(pg: &ProcessGroup, dir: &Path) -> Result<Option<String>, CheckpointError> {
    let path = dir.join(FRESH_START_FILE);
    let read = on_rank0(pg, "read the fresh-start record", || {
        match std::fs::read(&path) {
            Ok(bytes) => Ok(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(source) => Err(CheckpointError::from(StorageError::Read {
                path: path.clone(),
                source,
            })),
        }
    })?;
    let bytes = broadcast_bytes(
        pg,
        read.unwrap_or_default(),
        0,
        "sharing the fresh-start record",
    )?;
    let id = String::from_utf8_lossy(&bytes).trim().to_string();
    Ok((!id.is_empty()).then_some(id))
}
