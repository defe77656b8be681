//! Turning a sharded checkpoint into a rank-0 full checkpoint, readable by
//! [`FullCheckpointer::load_latest`](crate::checkpoint::FullCheckpointer::load_latest) and by tools that
//! expect one `model.safetensors`.

use super::super::error::CheckpointError;
use super::super::full::{read_one, write_checkpoint};
use super::super::manifest::{MANIFEST_FILE, OPTIMIZER_FILE};
use super::super::outcome::SavedCheckpoint;
use super::super::storage::directory::check_not_backwards;
use super::super::storage::durable::ensure_dir;
use super::super::storage::lock::lock_dir;
use super::super::storage::naming::parse_checkpoint_name;
use super::super::storage::run_id::run_id_to_save;
use super::codec::encode_optimizer_shard;
use super::error::ShardedCheckpointError;
use super::load::{load_optimizer, merged_model, param_ids_json};
use super::manifest::{read_verified, verify_checkpoint};
use burn::module::{AutodiffModule, ParamId};
use burn::optim::Optimizer;
use burn::record::Record;
use burn::tensor::backend::AutodiffBackend;
use hashbrown::HashMap;
use std::path::Path;

/// Writes sharded checkpoint `name` of `sharded_dir` as a rank-0 full checkpoint of the same
/// name in `full_dir` (atomically, moving `full_dir`'s `latest` to it), so that
/// [`FullCheckpointer::load_latest`](crate::checkpoint::FullCheckpointer::load_latest) on a
/// [`CheckpointConfig`](super::super::CheckpointConfig) of `full_dir` resumes from it at any
/// world size. `O` is the optimizer type the run uses (for a `ZeroRedundancyOptimizer` run,
/// the optimizer it wraps): its record type decodes the optimizer shards. Rank-local, no
/// process group: run it on one rank or offline. It reads every shard (`device` holds the
/// optimizer state meanwhile).
///
/// # Errors
/// [`CheckpointError::Invalid`] naming the bad shard, [`CheckpointError::InvalidName`],
/// [`CheckpointError::NewerCheckpointExists`] when `full_dir` holds a newer valid checkpoint,
/// [`StorageError::DirLocked`](super::super::StorageError::DirLocked) while a job uses `full_dir`,
/// [`ShardedCheckpointError::OptimizerState`] (another optimizer type), I/O errors.
pub fn convert_to_full<B, M, O, R>(
    sharded_dir: &Path,
    name: &str,
    full_dir: &Path,
    device: &B::Device,
) -> Result<SavedCheckpoint, ShardedCheckpointError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B, Record = HashMap<ParamId, R>>,
    R: Record<B>,
{
    let Some(step) = parse_checkpoint_name(name) else {
        return Err(CheckpointError::InvalidName {
            name: name.to_string(),
            reason: "a checkpoint name is step-<global step>",
        }
        .into());
    };
    // The target directory is a checkpoint directory like any other: one job at a time (a run
    // writing there holds its lock), and `latest` never moves below a newer valid checkpoint.
    ensure_dir(full_dir)?;
    let _lock = lock_dir(full_dir)?;
    check_not_backwards(full_dir, step, read_one)?;
    let path = sharded_dir.join(name);
    let manifest =
        verify_checkpoint(sharded_dir, name).map_err(|e| e.into_error(name, sharded_dir))?;
    let model = merged_model(&path, &manifest)?;
    let ids = param_ids_json(&manifest)?;
    let record = load_optimizer::<B, R>(device, &path, &manifest, None)?;
    let optimizer = encode_optimizer_shard::<B, R>(record, OPTIMIZER_FILE)?;
    // The same run in another format: it keeps its id (one of an older build's gets the one
    // a save into `full_dir` would record).
    let run_id = match manifest.run_id.clone() {
        Some(id) => id,
        None => run_id_to_save(full_dir, step, MANIFEST_FILE)?,
    };
    // Every rank's communication-hook state goes along, under the same file name.
    let hook_states = manifest
        .shards
        .iter()
        .filter_map(|s| s.comm_hook.as_ref())
        .map(|entry| {
            read_verified(&path, &manifest, &entry.name)
                .map(|bytes| (entry.name.clone(), bytes))
                .map_err(|e| e.into_error(name, sharded_dir))
        })
        .collect::<Result<Vec<_>, CheckpointError>>()?;
    let (target, written) = write_checkpoint(
        full_dir,
        name,
        manifest.global_step,
        run_id,
        model,
        optimizer,
        &manifest.state,
        ids,
        hook_states,
    )?;
    tracing::info!(
        from = %path.display(),
        to = %target.display(),
        bytes = written.total_bytes(),
        "converted sharded checkpoint {name} (world size {}) to a full checkpoint",
        manifest.world_size
    );
    Ok(SavedCheckpoint {
        name: name.to_string(),
        path: target,
        global_step: manifest.global_step,
        bytes: written.total_bytes(),
        removed: Vec::new(),
    })
}
