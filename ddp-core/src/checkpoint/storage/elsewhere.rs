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
//! hold then as superseded ([`run_id`](super::run_id)), in every rank's directory; each rank
//! shares its own record and the union counts. The check passes over the superseded runs'
//! checkpoints (read by the run id in their manifests) with a warning naming the directory. A
//! newer checkpoint of the run rank 0 resumes, of a run no fresh start superseded, or without a
//! run id (an older build's) still stops the load. And when the checkpoint rank 0 would resume
//! is itself of a superseded run (rank 0 is back on a host that still holds the older run after
//! a fresh start elsewhere), the load fails on every rank: resuming it would drop the newer run.

use super::super::config::CheckpointConfig;
use super::super::error::{CheckpointError, InvalidCheckpoint, StorageError};
use super::super::manifest::ReadFailure;
use super::naming::{list_checkpoints, parse_checkpoint_name};
use super::rank0::all_gather_bytes;
use super::run_id::{read_superseded, run_id_of};
use ddp_comm::ProcessGroup;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
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
    /// Rank 0 only, when any run is superseded: the run id of the checkpoint it resumes
    /// (`None` inside: it has none), or why it could not be read.
    #[serde(default)]
    resumed_run: Option<Result<Option<String>, String>>,
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
/// rank 0 resumes (`None`: a fresh start), or when `resumed` is of a run a fresh start
/// superseded. `passed_over` are the checkpoints rank 0 found invalid and set aside: a rank
/// sharing the directory may still list one under its old name (NFS caches listings).
/// Checkpoints of the runs a fresh start superseded (`record_fresh_start`, as any rank's
/// directory records it) are passed over with a warning naming the rank, the checkpoint and
/// the directory; one without a run id is never passed over. Does nothing when `config` turns
/// the check off ([`CheckpointConfig::with_other_ranks_checked`]).
///
/// # Collective
/// Every rank calls it with the same `resumed` and `passed_over` (rank 0's resume header).
/// Each rank reads its own directory's record of superseded runs and the ranks share them;
/// rank 0 reads the run id of `resumed` and shares it: no rank needs to see another's
/// directory.
///
/// # Errors
/// [`CheckpointError::SupersededCheckpoint`] naming `resumed`, its run and the directory
/// whose record superseded it; [`CheckpointError::NewerCheckpointElsewhere`] naming the rank
/// with the newest such checkpoint, its step and its directory; [`CheckpointError::Comm`]. A
/// rank that cannot list its directory or read its record is only warned about (on every
/// rank): detection must not fail a resume that worked before.
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
    let superseded = superseded_runs(pg, dir)?;
    let runs: BTreeSet<String> = superseded.keys().cloned().collect();
    let (newest, stale) = match newest_complete(dir, manifest_file, passed_over, &runs) {
        Ok((newest, stale)) => (Ok(newest), stale),
        Err(e) => (Err(e.to_string()), Vec::new()),
    };
    // Rank 0 tells the run of the checkpoint it resumes, when any run is superseded.
    let resumed_run = match resumed {
        Some(name) if pg.rank() == 0 && !runs.is_empty() => Some(
            run_id_of(&dir.join(name), manifest_file)
                .map_err(|e| e.into_error(name, dir).to_string()),
        ),
        _ => None,
    };
    let mine = Listing {
        dir: dir.to_path_buf(),
        newest,
        stale,
        resumed_run,
    };
    // Nothing fails before the collective: an unencodable listing travels as empty bytes.
    let bytes = serde_json::to_vec(&mine).unwrap_or_default();
    let all = all_gather_bytes(pg, bytes)?;
    let rank0 = all
        .first()
        .and_then(|bytes| serde_json::from_slice::<Listing>(bytes).ok());
    let rank0_dir = rank0
        .as_ref()
        .map_or_else(|| dir.to_path_buf(), |l| l.dir.clone());
    // Whether the superseded runs' checkpoints are passed over: not when rank 0 cannot tell
    // the run it resumes (as strict as before run ids).
    let mut pass_over = true;
    match rank0.as_ref().and_then(|l| l.resumed_run.clone()) {
        Some(Ok(Some(run_id))) => {
            if let (Some(name), Some((rank, record_dir))) = (resumed, superseded.get(&run_id)) {
                let err = CheckpointError::SupersededCheckpoint {
                    name: name.to_string(),
                    run_id,
                    rank0_dir,
                    rank: *rank,
                    dir: record_dir.clone(),
                };
                tracing::error!(error = %err, "not resuming a superseded run's checkpoint");
                return Err(err);
            }
        }
        Some(Ok(None)) => {}
        Some(Err(e)) => {
            tracing::warn!(error = %e, "cannot read the run id of the checkpoint to resume; passing over no other rank's checkpoints");
            pass_over = false;
        }
        None if resumed.is_some() && !runs.is_empty() => {
            tracing::warn!(
                "rank 0 sent no readable run id of the checkpoint to resume; passing over no other rank's checkpoints"
            );
            pass_over = false;
        }
        None => {}
    }
    let resumed_step = resumed.and_then(parse_checkpoint_name);
    let newer = |step: u64| resumed_step.is_none_or(|r| step > r);
    let mut newest: Option<(usize, u64, String, PathBuf)> = None;
    for (rank, bytes) in all.iter().enumerate().skip(1) {
        let listing = match serde_json::from_slice::<Listing>(bytes) {
            Ok(listing) => listing,
            Err(e) => {
                tracing::warn!(rank, error = %e, "rank {rank} sent no readable checkpoint listing; not checking its directory");
                continue;
            }
        };
        let mut candidates = Vec::new();
        for stale in listing.stale {
            if !newer(stale.step) {
                continue;
            }
            if pass_over {
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
            } else {
                candidates.push((stale.step, stale.name));
            }
        }
        match listing.newest {
            Ok(found) => candidates.extend(found),
            Err(e) => tracing::warn!(
                rank,
                dir = %listing.dir.display(),
                error = %e,
                "rank {rank} cannot list its checkpoint directory; not checking it for newer checkpoints"
            ),
        }
        for (step, name) in candidates {
            if newer(step) && newest.as_ref().is_none_or(|(_, s, _, _)| step > *s) {
                newest = Some((rank, step, name, listing.dir.clone()));
            }
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
                rank0_dir,
                resumed: resumed.map(str::to_string),
            };
            tracing::error!(error = %err, "not resuming: a newer checkpoint is on another rank");
            Err(err)
        }
    }
}

/// One rank's record of superseded runs, as it shares it.
#[derive(Debug, Serialize, Deserialize)]
struct SupersededIn {
    dir: PathBuf,
    run_ids: BTreeSet<String>,
}

/// Every rank: the runs a fresh start superseded, as any rank's own directory records them,
/// each with the lowest rank (and its directory) whose record names it. An unreadable record
/// is only warned about: passing over fewer keeps the check as strict as it was.
fn superseded_runs(
    pg: &ProcessGroup,
    dir: &Path,
) -> Result<BTreeMap<String, (usize, PathBuf)>, CheckpointError> {
    let run_ids = read_superseded(dir).unwrap_or_else(|e| {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot read the record of superseded runs; passing over none of the runs it names");
        BTreeSet::new()
    });
    // Nothing fails before the collective; an empty (or unencodable) record travels as empty
    // bytes, so that without any record the exchange is one small all-reduce.
    let bytes = if run_ids.is_empty() {
        Vec::new()
    } else {
        serde_json::to_vec(&SupersededIn {
            dir: dir.to_path_buf(),
            run_ids,
        })
        .unwrap_or_default()
    };
    let all = all_gather_bytes(pg, bytes)?;
    let mut runs = BTreeMap::new();
    for (rank, bytes) in all.iter().enumerate() {
        let Ok(record) = serde_json::from_slice::<SupersededIn>(bytes) else {
            continue;
        };
        for run_id in record.run_ids {
            runs.entry(run_id)
                .or_insert_with(|| (rank, record.dir.clone()));
        }
    }
    Ok(runs)
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
