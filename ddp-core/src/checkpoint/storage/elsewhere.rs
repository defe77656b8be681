//! Checkpoints rank 0 cannot see. Rank 0 alone picks the checkpoint to resume, in its own
//! directory; without a shared filesystem, an elastic restart that makes another host rank 0
//! would resume an older checkpoint there, or none, while a newer one sits on the host that
//! was rank 0 before. So after rank 0's search every rank lists its own directory (names only,
//! nothing hashed) and the ranks compare: a newer complete checkpoint on any rank stops the
//! load on every rank. Ranks that share rank 0's directory list what rank 0 saw, so nothing
//! changes for them; the cost is one listing, one small broadcast and one small all-gather.
//!
//! Starting over clears rank 0's directory only. A fresh start
//! (`record_fresh_start`, `--fresh`) therefore marks the runs the other ranks' directories
//! hold then as superseded ([`run_id`](super::run_id)), and this check passes over their
//! checkpoints (read by the run id in their manifests) with a warning naming the directory.
//! A newer checkpoint of the run rank 0 resumes, of a run no fresh start superseded, or
//! without a run id (an older build's) still stops the load.

use super::super::config::CheckpointConfig;
use super::super::error::{CheckpointError, InvalidCheckpoint, StorageError};
use super::super::manifest::ReadFailure;
use super::naming::{list_checkpoints, parse_checkpoint_name};
use super::rank0::{all_gather_bytes, broadcast_bytes};
use super::run_id::{read_superseded, run_id_of};
use ddp_comm::ProcessGroup;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// What one rank found in its own directory.
#[derive(Debug, Serialize, Deserialize)]
struct Listing {
    /// The rank's checkpoint directory (on its host).
    dir: PathBuf,
    /// Its newest complete checkpoint of a run not superseded, `(step, name)`, or why it could
    /// not be listed.
    newest: Result<Newest, String>,
    /// The newer complete checkpoints passed over as superseded runs', newest first.
    #[serde(default)]
    stale: Vec<Stale>,
}

/// A rank's newest complete checkpoint `(step, name)` of a run not superseded.
type Newest = Option<(u64, String)>;

/// A complete checkpoint of a run a fresh start superseded.
#[derive(Debug, Serialize, Deserialize)]
struct Stale {
    step: u64,
    name: String,
    run_id: String,
}

/// Fails on every rank alike when another rank's directory (`config`'s on its host) holds a
/// complete checkpoint (one with its `manifest_file`) newer than `resumed`, the checkpoint
/// rank 0 resumes (`None`: a fresh start). `passed_over` are the checkpoints rank 0 found
/// invalid and set aside: a rank sharing the directory may still list one under its old name
/// (NFS caches listings). Checkpoints of the runs a fresh start in rank 0's directory
/// superseded (`record_fresh_start`) are passed over with a warning naming the rank, the
/// checkpoint and the directory, unless `resumed` is of that run itself; one without a run id
/// is never passed over. Does nothing when `config` turns the check off
/// ([`CheckpointConfig::with_other_ranks_checked`]).
///
/// # Collective
/// Every rank calls it with the same `resumed` and `passed_over` (rank 0's resume header).
/// Rank 0 reads its record of superseded runs and shares it: the other ranks need not see rank
/// 0's directory.
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
    let stale_runs = superseded_runs(pg, dir, manifest_file, resumed)?;
    let (newest, stale) = match newest_complete(dir, manifest_file, passed_over, &stale_runs) {
        Ok((newest, stale)) => (Ok(newest), stale),
        Err(e) => (Err(e.to_string()), Vec::new()),
    };
    let mine = Listing {
        dir: dir.to_path_buf(),
        newest,
        stale,
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
        for stale in &listing.stale {
            if resumed_step.is_none_or(|r| stale.step > r) {
                tracing::warn!(
                    rank,
                    dir = %listing.dir.display(),
                    checkpoint = %stale.name,
                    step = stale.step,
                    run_id = %stale.run_id,
                    "passing over checkpoint {} (step {}) in rank {rank}'s directory {}: it is of run {}, which a fresh start superseded; remove it there when it is no longer needed",
                    stale.name,
                    stale.step,
                    listing.dir.display(),
                    stale.run_id
                );
            }
        }
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

/// Every rank: the runs whose checkpoints the others pass over, as rank 0 decides them: the
/// runs a fresh start in its directory superseded, less the run of `resumed` (rank 0's
/// checkpoint). An unreadable record is only warned about: passing over nothing keeps the
/// check as strict as it was.
fn superseded_runs(
    pg: &ProcessGroup,
    dir: &Path,
    manifest_file: &str,
    resumed: Option<&str>,
) -> Result<BTreeSet<String>, CheckpointError> {
    let mine = if pg.rank() == 0 {
        let mut runs = read_superseded(dir).unwrap_or_else(|e| {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot read the record of superseded runs; passing over no other rank's checkpoints");
            BTreeSet::new()
        });
        if !runs.is_empty()
            && let Some(name) = resumed
        {
            match run_id_of(&dir.join(name), manifest_file) {
                Ok(Some(id)) => {
                    runs.remove(&id);
                }
                Ok(None) => {}
                Err(e) => {
                    let e = e.into_error(name, dir);
                    tracing::warn!(error = %e, "cannot read the run id of the checkpoint to resume; passing over no other rank's checkpoints");
                    runs.clear();
                }
            }
        }
        // Nothing fails before the collective: an unencodable set travels as empty bytes.
        serde_json::to_vec(&runs).unwrap_or_default()
    } else {
        Vec::new()
    };
    let bytes = broadcast_bytes(pg, mine, 0, "sharing the superseded runs")?;
    Ok(serde_json::from_slice(&bytes).unwrap_or_default())
}

/// The newest checkpoint of `dir` that holds `manifest_file` (written last, so the checkpoint
/// was complete when committed), leaving out `passed_over` and the checkpoints of the
/// `superseded` runs (returned, newest first, as far as they are newer than the one found).
/// Not verified: a listing only; the manifests are read only when runs were superseded.
fn newest_complete(
    dir: &Path,
    manifest_file: &str,
    passed_over: &[InvalidCheckpoint],
    superseded: &BTreeSet<String>,
) -> Result<(Newest, Vec<Stale>), StorageError> {
    let mut all = list_checkpoints(dir)?;
    all.retain(|(_, name)| !passed_over.iter().any(|bad| bad.name == *name));
    all.sort_by(|a, b| b.cmp(a)); // newest first
    let mut stale = Vec::new();
    for (step, name) in all {
        let manifest = dir.join(&name).join(manifest_file);
        match std::fs::metadata(&manifest) {
            Ok(meta) if meta.is_file() && superseded.is_empty() => {
                return Ok((Some((step, name)), stale));
            }
            Ok(meta) if meta.is_file() => match run_id_of(&dir.join(&name), manifest_file) {
                Ok(Some(run_id)) if superseded.contains(&run_id) => {
                    stale.push(Stale { step, name, run_id });
                }
                // Gone since (pruned, set aside): as if never listed.
                Err(ReadFailure::Invalid(_)) => {}
                Err(ReadFailure::Io { path, source }) => {
                    return Err(StorageError::Read { path, source });
                }
                Ok(_) | Err(ReadFailure::Incompatible(_)) => {
                    return Ok((Some((step, name)), stale));
                }
            },
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
    Ok((None, stale))
}
