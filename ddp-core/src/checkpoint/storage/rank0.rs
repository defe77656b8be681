//! The collectives of saving and resuming: agreeing on the step, rank 0 telling the others
//! how its part went, rank 0 broadcasting what it read, and every rank agreeing that all of
//! them succeeded (so no rank trains on while another failed).

use super::super::config::CheckpointConfig;
use super::super::error::{CheckpointError, StorageError};
use super::durable::ensure_dir;
use super::install::clean_temporaries;
use super::lock::{DirLock, lock_dir};
use ddp_comm::{ProcessGroup, ReduceOp};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::PathBuf;

/// Fails on every rank, identically, unless all ranks pass the same `step`.
pub(crate) fn agree_on_step(pg: &ProcessGroup, step: u64) -> Result<(), CheckpointError> {
    let context = "agreeing on the checkpoint step";
    let mut lo = [step as i64];
    let mut hi = [step as i64];
    pg.all_reduce(&mut lo, ReduceOp::Min)
        .map_err(CheckpointError::comm(context))?;
    pg.all_reduce(&mut hi, ReduceOp::Max)
        .map_err(CheckpointError::comm(context))?;
    if lo == hi {
        Ok(())
    } else {
        Err(CheckpointError::StepMismatch {
            min: lo[0] as u64,
            max: hi[0] as u64,
        })
    }
}

/// [`ProcessGroup::broadcast_bytes`], with the checkpoint's error; `context` says what moves.
pub(crate) fn broadcast_bytes(
    pg: &ProcessGroup,
    bytes: Vec<u8>,
    root: usize,
    context: &'static str,
) -> Result<Vec<u8>, CheckpointError> {
    pg.broadcast_bytes(bytes, root)
        .map_err(CheckpointError::comm(context))
}

/// A value rank 0 learns alone and every rank then takes as its answer (a save summary, the
/// checkpoint to resume, the names a rewind removed), sent as JSON: what its errors say while
/// it is serialised, shared and decoded.
pub(crate) struct Rank0Json {
    pub(crate) serialising: &'static str,
    pub(crate) sharing: &'static str,
    pub(crate) decoding: &'static str,
}

impl Rank0Json {
    /// On rank 0: `value` as JSON, to [`share`](Self::share).
    pub(crate) fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, CheckpointError> {
        serde_json::to_vec(value).map_err(CheckpointError::json(self.serialising))
    }

    /// Every rank gets the value rank 0 encoded (`rank0_json`, `None` on the others).
    pub(crate) fn share<T: DeserializeOwned>(
        &self,
        pg: &ProcessGroup,
        rank0_json: Option<Vec<u8>>,
    ) -> Result<T, CheckpointError> {
        let bytes = broadcast_bytes(pg, rank0_json.unwrap_or_default(), 0, self.sharing)?;
        serde_json::from_slice(&bytes).map_err(CheckpointError::json(self.decoding))
    }

    /// Runs `work` on rank 0 only, as [`on_rank0`] (its encoding included), and every rank
    /// gets its value.
    pub(crate) fn decide<T, E>(
        &self,
        pg: &ProcessGroup,
        action: &'static str,
        work: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<CheckpointError> + std::fmt::Display,
    {
        let json = on_rank0(pg, action, || Ok::<_, E>(self.encode(&work()?)?))?;
        Ok(self.share(pg, json)?)
    }
}

/// Runs `work` on rank 0 only and shares how it went: rank 0 gets its result (`Some`), the
/// others `Ok(None)` or [`CheckpointError::Rank0Failed`] with rank 0's message. `E`: the
/// caller's error type (the sharded checkpointer's wraps [`CheckpointError`]).
pub(crate) fn on_rank0<T, E: From<CheckpointError> + std::fmt::Display>(
    pg: &ProcessGroup,
    action: &'static str,
    work: impl FnOnce() -> Result<T, E>,
) -> Result<Option<T>, E> {
    let result = if pg.rank() == 0 { Some(work()) } else { None };
    let message = match &result {
        Some(Err(e)) => e.to_string().into_bytes(),
        _ => Vec::new(),
    };
    let mut failed = [i32::from(matches!(result, Some(Err(_))))];
    pg.broadcast(&mut failed, 0)
        .map_err(CheckpointError::comm("sharing rank 0's outcome"))?;
    if failed[0] != 0 {
        let message = broadcast_bytes(pg, message, 0, "sharing rank 0's error")?;
        if pg.rank() != 0 {
            return Err(CheckpointError::Rank0Failed {
                action,
                message: String::from_utf8_lossy(&message).into_owned(),
            }
            .into());
        }
    }
    result.transpose()
}

/// Rank 0 creates the checkpoint directory of `config`, locks it for this job (one job per
/// directory, see [`lock_dir`]) and only then removes what an interrupted write of a `kind`
/// checkpoint left behind (another job's write in progress is never touched); every rank learns
/// how it went. Rank 0 gets the lock, to keep for the checkpointer's life; none without the
/// lock ([`CheckpointConfig::with_dir_lock`]). A read-only checkpointer
/// ([`CheckpointConfig::with_read_only`]) touches nothing: the directory must exist.
pub(crate) fn prepare_dir(
    pg: &ProcessGroup,
    config: &CheckpointConfig,
    kind: &str,
) -> Result<Option<DirLock>, CheckpointError> {
    let dir = config.dir();
    on_rank0(pg, "prepare the checkpoint directory", || {
        if config.read_only() {
            if !dir.is_dir() {
                return Err(CheckpointError::InvalidConfig(format!(
                    "{} is not a directory, and a read-only checkpointer creates nothing \
                     (CheckpointConfig::with_read_only(true)): check the path",
                    dir.display()
                )));
            }
            return Ok(None);
        }
        ensure_dir(dir)?;
        let lock = if config.dir_lock() {
            Some(lock_dir(dir)?)
        } else {
            tracing::warn!(dir = %dir.display(), "the checkpoint directory is not locked (with_dir_lock(false)): one job at a time must write it");
            None
        };
        for path in clean_temporaries(dir)? {
            tracing::info!(path = %path.display(), kind, "removed the leftover of an interrupted checkpoint write");
        }
        Ok::<_, CheckpointError>(lock)
    })
    .map(Option::flatten)
}

/// Every rank learns whether all succeeded: returns this rank's own error, or
/// [`CheckpointError::PeerFailed`] naming the highest failing rank, or the value.
pub(crate) fn all_succeeded<T, E: From<CheckpointError>>(
    pg: &ProcessGroup,
    result: Result<T, E>,
    action: &'static str,
) -> Result<T, E> {
    let mut failed = [if result.is_err() {
        pg.rank() as i64 + 1
    } else {
        0
    }];
    pg.all_reduce(&mut failed, ReduceOp::Max)
        .map_err(CheckpointError::comm("agreeing that every rank succeeded"))?;
    match (result, failed[0]) {
        (Err(e), _) => Err(e),
        (Ok(v), 0) => Ok(v),
        (Ok(_), rank) => Err(CheckpointError::PeerFailed {
            rank: (rank - 1) as usize,
            action,
        }
        .into()),
    }
}

/// [`ProcessGroup::all_gather_bytes`], with the checkpoint's error: every rank's per-rank
/// state (RNG streams, listings, reports) on every rank.
pub(crate) fn all_gather_bytes(
    pg: &ProcessGroup,
    bytes: Vec<u8>,
) -> Result<Vec<Vec<u8>>, CheckpointError> {
    pg.all_gather_bytes(bytes)
        .map_err(CheckpointError::comm("gathering per-rank state"))
}

/// [`ProcessGroup::gather_bytes`] to rank 0, with the checkpoint's error: per-rank state too
/// large to send to every rank.
pub(crate) fn gather_bytes_to_rank0(
    pg: &ProcessGroup,
    bytes: Vec<u8>,
) -> Result<Option<Vec<Vec<u8>>>, CheckpointError> {
    pg.gather_bytes(bytes, 0)
        .map_err(CheckpointError::comm("gathering per-rank state on rank 0"))
}

/// [`ProcessGroup::scatter_bytes`] from rank 0, with the checkpoint's error: each rank's own
/// state, read by rank 0.
pub(crate) fn scatter_bytes_from_rank0(
    pg: &ProcessGroup,
    per_rank: Option<Vec<Vec<u8>>>,
) -> Result<Vec<u8>, CheckpointError> {
    pg.scatter_bytes(per_rank, 0).map_err(CheckpointError::comm(
        "giving every rank its own state from rank 0",
    ))
}

/// Rank 0 reads the files at `paths` and every rank receives their bytes, in order: the other
/// ranks need not see rank 0's filesystem. For checkpoint files read outside a checkpointer,
/// such as ddp-train's burn-train files (a checkpointer verifies a whole checkpoint first).
///
/// # Collective
/// Every rank calls it with the same number of paths (only rank 0's paths are read).
///
/// # Errors
/// On rank 0, [`StorageError::Read`] naming the file it cannot read; on the others,
/// [`CheckpointError::Rank0Failed`] with that message; [`CheckpointError::Comm`] when a
/// broadcast fails.
pub fn read_on_rank0(
    pg: &ProcessGroup,
    paths: &[PathBuf],
) -> Result<Vec<Vec<u8>>, CheckpointError> {
    let files = on_rank0(pg, "read the checkpoint files", || {
        paths
            .iter()
            .map(|path| {
                std::fs::read(path).map_err(|source| StorageError::Read {
                    path: path.clone(),
                    source,
                })
            })
            .collect::<Result<Vec<_>, StorageError>>()
            .map_err(CheckpointError::from)
    })?;
    let mut lengths = vec![0i64; paths.len()];
    if let Some(files) = &files {
        for (length, bytes) in lengths.iter_mut().zip(files) {
            *length = bytes.len() as i64;
        }
    }
    let context = "receiving checkpoint files from rank 0";
    // The lengths first, so that every rank sizes the one buffer all files arrive in.
    pg.broadcast(&mut lengths, 0)
        .map_err(CheckpointError::comm(context))?;
    let sizes: Vec<usize> = lengths
        .iter()
        .map(|&length| usize::try_from(length).unwrap_or(0))
        .collect();
    let total = sizes.iter().sum();
    let mut all = match files {
        Some(files) => files.concat(),
        None => vec![0u8; total],
    };
    if total > 0 {
        pg.broadcast(&mut all, 0)
            .map_err(CheckpointError::comm(context))?;
    }
    let mut at = 0;
    Ok(sizes
        .iter()
        .map(|&size| {
            let part = all[at..at + size].to_vec();
            at += size;
            part
        })
        .collect())
}
