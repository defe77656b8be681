//! Checkpoints rank 0 cannot see. Rank 0 alone picks the checkpoint to resume, in its own
//! directory; without a shared filesystem, an elastic restart that makes another host rank 0
//! would resume an older checkpoint there, or none, while a newer one sits on the host that
//! was rank 0 before. So after rank 0's search every rank lists its own directory (names only,
//! nothing hashed) and the ranks compare: a newer complete checkpoint on any rank stops the
//! load on every rank. Ranks that share rank 0's directory list what rank 0 saw, so nothing
//! changes for them; the cost is one listing and one small all-gather.

use super::super::config::CheckpointConfig;
use super::super::error::{CheckpointError, InvalidCheckpoint, StorageError};
use super::naming::{list_checkpoints, parse_checkpoint_name};
use super::rank0::all_gather_bytes;
use ddp_comm::ProcessGroup;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What one rank found in its own directory.
#[derive(Debug, Serialize, Deserialize)]
struct Listing {
    /// The rank's checkpoint directory (on its host).
    dir: PathBuf,
    /// Its newest complete checkpoint, `(step, name)`, or why it could not be listed.
    newest: Result<Option<(u64, String)>, String>,
}

/// Fails on every rank alike when another rank's directory (`config`'s on its host) holds a
/// complete checkpoint (one with its `manifest_file`) newer than `resumed`, the checkpoint
/// rank 0 resumes (`None`: a fresh start). `passed_over` are the checkpoints rank 0 found
/// invalid and set aside: a rank sharing the directory may still list one under its old name
/// (NFS caches listings). Does nothing when `config` turns the check off
/// ([`CheckpointConfig::with_other_ranks_checked`]).
///
/// # Collective
/// Every rank calls it with the same `resumed` and `passed_over` (rank 0's resume header).
///
/// # Errors
/// [`CheckpointError::NewerCheckpointElsewhere`] naming the rank with the newest such
/// checkpoint, its step and its directory; [`CheckpointError::Comm`]. A rank that cannot list
/// its directory is only warned about (on every rank): detection must not fail a resume that
/// worked before.
pub(crate) fn check_no_newer_elsewhere(
    pg: &ProcessGroup,
    config: &CheckpointConfig,
    manifest_file: &str,
    resumed: Option<&str>,
    passed_over: &[InvalidCheckpoint],
) -> Result<(), CheckpointError> {
    if !config.other_ranks_checked() {
        return Ok(());
    }
    let dir = config.dir();
    let mine = Listing {
        dir: dir.to_path_buf(),
        newest: newest_complete(dir, manifest_file, passed_over).map_err(|e| e.to_string()),
    };
    // Nothing fails before the collective: an unencodable listing travels as empty bytes.
    let bytes = serde_json::to_vec(&mine).unwrap_or_default();
    let all = all_gather_bytes(pg, bytes)?;
    let resumed_step = resumed.and_then(parse_checkpoint_name);
    let mut newest: Option<(usize, u64, String, PathBuf)> = None;
    for (rank, bytes) in all.iter().enumerate().skip(1) {
        let listing = match serde_json::from_slice::<Listing>(bytes) {
            Ok(listing) => listing,
            Err(e) => {
                tracing::warn!(rank, error = %e, "rank {rank} sent no readable checkpoint listing; not checking its directory");
                continue;
            }
        };
        match listing.newest {
            Ok(Some((step, name)))
                if resumed_step.is_none_or(|r| step > r)
                    && newest.as_ref().is_none_or(|(_, s, _, _)| step > *s) =>
            {
                newest = Some((rank, step, name, listing.dir));
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(
                rank,
                dir = %listing.dir.display(),
                error = %e,
                "rank {rank} cannot list its checkpoint directory; not checking it for newer checkpoints"
            ),
        }
    }
    match newest {
        None => Ok(()),
        Some((rank, step, name, rank_dir)) => {
            let err = CheckpointError::NewerCheckpointElsewhere {
                rank,
                name,
                step,
                dir: rank_dir,
                rank0_dir: rank0_dir_of(&all).unwrap_or_else(|| dir.to_path_buf()),
                resumed: resumed.map(str::to_string),
            };
            tracing::error!(error = %err, "not resuming: a newer checkpoint is on another rank");
            Err(err)
        }
    }
}

/// Rank 0's directory as it sent it.
fn rank0_dir_of(all: &[Vec<u8>]) -> Option<PathBuf> {
    let bytes = all.first()?;
    serde_json::from_slice::<Listing>(bytes).ok().map(|l| l.dir)
}

/// The newest checkpoint of `dir` that holds `manifest_file` (written last, so the checkpoint
/// was complete when committed), leaving out `passed_over`. Not verified: a listing only.
fn newest_complete(
    dir: &Path,
    manifest_file: &str,
    passed_over: &[InvalidCheckpoint],
) -> Result<Option<(u64, String)>, StorageError> {
    let mut all = list_checkpoints(dir)?;
    all.retain(|(_, name)| !passed_over.iter().any(|bad| bad.name == *name));
    all.sort_by(|a, b| b.cmp(a)); // newest first
    for (step, name) in all {
        let manifest = dir.join(&name).join(manifest_file);
        match std::fs::metadata(&manifest) {
            Ok(meta) if meta.is_file() => return Ok(Some((step, name))),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(StorageError::Read {
                    path: manifest,
                    source,
                });
            }
        }
    }
    Ok(None)
}
