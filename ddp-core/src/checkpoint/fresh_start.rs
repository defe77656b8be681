//! Which launch last started the directory over: `<dir>/fresh-start` holds its id.
//!
//! A launcher restart (`--max-restarts`) repeats the command line, `--fresh` included. The
//! restart must resume what *this launch* wrote, but the first attempt may have died before it
//! cleared the older run's checkpoints: then resuming would continue the older run. So the
//! attempt that starts over records the launch's id (the launcher's `DDP_LAUNCH_ID`) here once
//! the directory holds only this launch's state, and a restart resumes only when the record
//! names its own launch; otherwise it starts over itself. The directory lock (one job per
//! directory) keeps other jobs from writing in between.

use super::config::CheckpointConfig;
use super::error::{CheckpointError, StorageError};
use super::full::FullCheckpointer;
use super::sharded::ShardedCheckpointer;
use super::storage::durable::{rename, sync_dir, write_synced};
use super::storage::naming::TMP_PREFIX;
use super::storage::rank0::{broadcast_bytes, on_rank0};
use ddp_comm::ProcessGroup;
use std::path::Path;

/// The file naming the launch that last started the directory over.
pub const FRESH_START_FILE: &str = "fresh-start";

impl FullCheckpointer {
    /// Records that launch `launch_id` started this directory over: call it after removing
    /// the older run's checkpoints ([`rewind_to`](Self::rewind_to)) and before training. Rank 0
    /// writes it atomically.
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// Rank 0's I/O errors (on every rank).
    pub fn record_fresh_start(&self, launch_id: &str) -> Result<(), CheckpointError> {
        record(self.process_group(), self.config(), launch_id)
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
    /// after removing the older run's checkpoints and before training.
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// Rank 0's I/O errors (on every rank).
    pub fn record_fresh_start(&self, launch_id: &str) -> Result<(), CheckpointError> {
        record(self.process_group(), self.config(), launch_id)
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

fn record(
    pg: &ProcessGroup,
    config: &CheckpointConfig,
    launch_id: &str,
) -> Result<(), CheckpointError> {
    config.writable("record a fresh start")?;
    let dir = config.dir().to_path_buf();
    on_rank0(pg, "record the fresh start", || {
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
