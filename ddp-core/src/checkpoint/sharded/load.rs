//! Loading a sharded checkpoint at any world size: every rank reads the manifest and every
//! model shard (each replica needs the whole model), then the optimizer shards holding the
//! state it needs (all of them for a replicated optimizer; under ZeRO only those holding the
//! parameters it owns at the new world size), verifying each file against the manifest.

use super::super::base::{RESUME_HEADER, ResumeHeader};
use super::super::codec::decode_model;
use super::super::comm_hook_files::{decode_comm_hook_state, warn_comm_hook_states_dropped};
use super::super::error::{CheckpointError, InvalidCheckpoint};
use super::super::manifest::ReadFailure;
use super::super::outcome::{CheckpointInfo, LoadOutcome, Resumed};
use super::super::storage::directory::newest_valid_to_resume;
use super::super::storage::naming::validate_checkpoint_name;
use super::super::storage::rank0::{all_succeeded, on_rank0};
use super::codec::decode_optimizer_shard;
use super::error::ShardedCheckpointError;
use super::manifest::{
    SHARDED_MANIFEST_FILE, ShardedManifest, read_manifest, read_verified, verify_checkpoint,
};
use super::optimizer_state::{ShardedOptimizerState, StateHolding};
use super::ownership::Ownership;
use super::safetensors;
use super::save::ShardedCheckpointer;
use crate::engine::hooks::CommHookState;
use burn::module::{AutodiffModule, ParamId};
use burn::optim::Optimizer;
use burn::record::Record;
use burn::tensor::backend::AutodiffBackend;
use hashbrown::HashMap;
use std::collections::BTreeSet;
use std::path::Path;

impl ShardedCheckpointer {
    /// Restores the newest valid sharded checkpoint, saved at any world size, into `model`
    /// and a replicated optimizer (plain DDP: every rank gets every parameter's state), their
    /// tensors on `device`. Returns [`LoadOutcome::Fresh`] when there is none; invalid
    /// checkpoints (a shard missing, truncated or altered) are skipped with a warning naming
    /// the file, and listed in the outcome.
    ///
    /// Call it **before** wrapping the model in
    /// [`DistributedDataParallel`](crate::DistributedDataParallel) (the module takes the saved
    /// `ParamId`s, to which the optimizer state is keyed).
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// [`CheckpointError::LoadModel`] when the checkpoint does not fit the model,
    /// [`CheckpointError::Invalid`] when a rank cannot read a shard rank 0 verified (no shared
    /// filesystem), [`ShardedCheckpointError::OptimizerState`],
    /// [`CheckpointError::NewerCheckpointElsewhere`] when another rank's directory holds a
    /// newer checkpoint than rank 0's, I/O and communication errors.
    /// On error `model` and `optim` are unchanged on every rank.
    pub fn load_latest<B, M, O, R>(
        &self,
        device: &B::Device,
        model: &mut M,
        optim: &mut O,
    ) -> Result<LoadOutcome, ShardedCheckpointError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B, Record = HashMap<ParamId, R>>,
        R: Record<B>,
    {
        self.load_latest_with::<B, M, R>(device, model, StateHolding::Replicated, |record| {
            *optim = optim.clone().load_record(record);
        })
    }

    /// Restores the newest valid sharded checkpoint, saved at any world size and by any
    /// holder, into `model` and `optim`, which gets the state its
    /// [`holding`](ShardedOptimizerState::holding) asks for: every parameter's, or only that
    /// of the parameters this rank owns at the current world size (each rank then reads only
    /// the optimizer shards holding them). The one load of every holder, as
    /// [`save_state`](Self::save_state) is the one save.
    ///
    /// Call it **before** wrapping the model (the module takes the saved `ParamId`s, to which
    /// the optimizer state is keyed).
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// As [`load_latest`](Self::load_latest). On error `model` and `optim` are unchanged on
    /// every rank.
    pub fn load_latest_state<B, M, S>(
        &self,
        device: &B::Device,
        model: &mut M,
        optim: &mut S,
    ) -> Result<LoadOutcome, ShardedCheckpointError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        S: ShardedOptimizerState<B, M>,
    {
        let holding = optim.holding();
        self.load_latest_with::<B, M, S::Record>(device, model, holding, |record| {
            optim.install_loaded(record)
        })
    }

    /// Restores checkpoint `name` (e.g. `step-0000000120`) like
    /// [`load_latest`](Self::load_latest), failing with [`CheckpointError::Invalid`] (naming
    /// the bad shard file) if it does not verify.
    ///
    /// # Collective
    /// Every rank calls it at the same point.
    ///
    /// # Errors
    /// As [`load_latest`](Self::load_latest), plus [`CheckpointError::Invalid`] and
    /// [`CheckpointError::InvalidName`].
    pub fn load<B, M, O, R>(
        &self,
        name: &str,
        device: &B::Device,
        model: &mut M,
        optim: &mut O,
    ) -> Result<Resumed, ShardedCheckpointError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B, Record = HashMap<ParamId, R>>,
        R: Record<B>,
    {
        validate_checkpoint_name(name)?;
        let dir = self.base.config.dir().to_path_buf();
        on_rank0::<_, ShardedCheckpointError>(&self.base.pg, "verify the checkpoint", || {
            verify_checkpoint(&dir, name)
                .map(|_| ())
                .map_err(|e| e.into_error(name, &dir).into())
        })?;
        self.restore::<B, M, R>(
            device,
            model,
            name,
            Vec::new(),
            StateHolding::Replicated,
            |record| {
                *optim = optim.clone().load_record(record);
            },
        )
    }

    fn load_latest_with<B, M, R>(
        &self,
        device: &B::Device,
        model: &mut M,
        want: StateHolding,
        install: impl FnOnce(HashMap<ParamId, R>),
    ) -> Result<LoadOutcome, ShardedCheckpointError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        R: Record<B>,
    {
        let dir = self.base.config.dir().to_path_buf();
        let read_only = self.base.config.read_only();
        let header = RESUME_HEADER.decide::<_, ShardedCheckpointError>(
            &self.base.pg,
            "search for the latest sharded checkpoint",
            || {
                // As for rank-0 checkpoints: never fresh over a run's checkpoints, and the
                // invalid ones tried are set aside (renamed, never deleted) before any pruning,
                // unless the checkpointer is read-only.
                let search = newest_valid_to_resume(&dir, read_only, verify_checkpoint)?;
                Ok(ResumeHeader {
                    name: search.found.map(|(name, _)| name),
                    invalid: search.invalid,
                })
            },
        )?;
        self.base.resume_or_fresh(
            header,
            SHARDED_MANIFEST_FILE,
            "sharded checkpoint",
            |name, invalid| self.restore::<B, M, R>(device, model, name, invalid, want, install),
        )
    }

    /// Every rank reads what it needs of checkpoint `name` (verified by rank 0) and loads it;
    /// `model` changes, and `install` gets the optimizer state, only when every rank
    /// succeeded.
    fn restore<B, M, R>(
        &self,
        device: &B::Device,
        model: &mut M,
        name: &str,
        invalid: Vec<InvalidCheckpoint>,
        want: StateHolding,
        install: impl FnOnce(HashMap<ParamId, R>),
    ) -> Result<Resumed, ShardedCheckpointError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        R: Record<B>,
    {
        let (rank, world) = (self.base.pg.rank(), self.base.pg.world_size());
        let dir = self.base.config.dir().to_path_buf();
        let path = dir.join(name);
        let loaded = (|| {
            let manifest = read_manifest(&path).map_err(|e| e.into_error(name, &dir))?;
            self.base
                .config
                .check_run_config(name, manifest.state.run_config_hash.as_deref())?;
            let mut m = model.clone();
            load_model::<B, M>(&mut m, device, &path, &manifest, rank)?;
            let needed = match want {
                StateHolding::Replicated => None,
                StateHolding::Partitioned => {
                    let ownership = Ownership::of::<B, M>(&m, world);
                    Some(
                        manifest
                            .tensors
                            .values()
                            .map(|t| ParamId::from(t.param_id))
                            .filter(|id| ownership.owns(rank, *id))
                            .collect::<BTreeSet<ParamId>>(),
                    )
                }
            };
            let record = load_optimizer::<B, R>(device, &path, &manifest, needed.as_ref())?;
            let hook_state = own_comm_hook_state(&path, &manifest, rank, world)?;
            Ok((m, record, manifest, hook_state))
        })();
        let (m, record, manifest, hook_state) = all_succeeded::<_, ShardedCheckpointError>(
            &self.base.pg,
            loaded,
            "load the sharded checkpoint",
        )?;
        *model = m;
        install(record);

        let bytes = manifest.total_bytes();
        let info = CheckpointInfo::of_saved(
            name,
            path,
            manifest.global_step,
            bytes,
            &manifest.state,
            world,
        );
        let mut state = manifest.state.training_for(
            rank,
            world,
            name,
            "resuming a sharded checkpoint at another world size: the model and optimizer are resharded; \
             per-rank rng states are dropped",
        );
        state.comm_hook_state = hook_state;
        if manifest.world_size != world && manifest.shards.iter().any(|s| s.comm_hook.is_some()) {
            warn_comm_hook_states_dropped(name, manifest.world_size, world);
        }
        Ok(Resumed::logged("sharded checkpoint", info, state, invalid))
    }
}

/// Rank `rank`'s communication-hook state in the checkpoint in `path`, read and verified:
/// `None` when it saved none, or at another world size than `world` (the state belongs to a
/// rank of that world).
fn own_comm_hook_state(
    path: &Path,
    manifest: &ShardedManifest,
    rank: usize,
    world: usize,
) -> Result<Option<CommHookState>, CheckpointError> {
    let entry = match manifest.shards.get(rank) {
        Some(shard) if manifest.world_size == world => shard.comm_hook.as_ref(),
        _ => None,
    };
    let Some(entry) = entry else {
        return Ok(None);
    };
    let name = manifest.name.as_str();
    let dir = path.parent().unwrap_or(path);
    let bytes = read_verified(path, manifest, &entry.name).map_err(|e| e.into_error(name, dir))?;
    decode_comm_hook_state(&bytes, &entry.name, name, dir)
}

/// Reads every model shard of the checkpoint in `path`, verified, as one safetensors file.
pub(super) fn merged_model(
    path: &Path,
    manifest: &ShardedManifest,
) -> Result<Vec<u8>, CheckpointError> {
    let name = manifest.name.as_str();
    let dir = path.parent().unwrap_or(path);
    let shards = manifest
        .shards
        .iter()
        .map(|s| read_verified(path, manifest, &s.model.name))
        .collect::<Result<Vec<_>, ReadFailure>>()
        .map_err(|e| e.into_error(name, dir))?;
    let slices: Vec<&[u8]> = shards.iter().map(Vec::as_slice).collect();
    safetensors::merge(&slices).map_err(|reason| CheckpointError::LoadModel {
        name: name.to_string(),
        file: "the model shards".into(),
        rank: 0,
        reason,
    })
}

/// The module path to `ParamId` map of `manifest`, as the rank-0 checkpoint's `param_ids.json`.
pub(super) fn param_ids_json(manifest: &ShardedManifest) -> Result<Vec<u8>, CheckpointError> {
    serde_json::to_vec_pretty(&manifest.param_ids())
        .map_err(CheckpointError::json("serialising the parameter ids"))
}

fn load_model<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &mut M,
    device: &B::Device,
    path: &Path,
    manifest: &ShardedManifest,
    rank: usize,
) -> Result<(), CheckpointError> {
    let bytes = merged_model(path, manifest)?;
    let ids = param_ids_json(manifest)?;
    decode_model::<B, M>(model, device, bytes, &ids, &manifest.name, rank)
}

/// Reads the optimizer shards holding the state of `needed` (every shard when `None`) and
/// merges their entries, keeping only `needed`'s.
pub(super) fn load_optimizer<B: AutodiffBackend, R: Record<B>>(
    device: &B::Device,
    path: &Path,
    manifest: &ShardedManifest,
    needed: Option<&BTreeSet<ParamId>>,
) -> Result<HashMap<ParamId, R>, ShardedCheckpointError> {
    let wanted = |id: ParamId| needed.is_none_or(|n| n.contains(&id));
    let ranks: BTreeSet<usize> = manifest
        .tensors
        .values()
        .filter(|t| t.optimizer_state && wanted(ParamId::from(t.param_id)))
        .map(|t| t.rank)
        .collect();
    let dir = path.parent().unwrap_or(path);
    let mut all = HashMap::new();
    for shard in manifest.shards.iter().filter(|s| ranks.contains(&s.rank)) {
        let file = &shard.optimizer.name;
        let bytes =
            read_verified(path, manifest, file).map_err(|e| e.into_error(&manifest.name, dir))?;
        for (id, state) in decode_optimizer_shard::<B, R>(bytes, device, file)? {
            if !wanted(id) {
                continue;
            }
            if all.insert(id, state).is_some() {
                return Err(ShardedCheckpointError::Duplicate {
                    name: manifest.name.clone(),
                    what: format!("the optimizer state of parameter {id}"),
                });
            }
        }
    }
    Ok(all)
}
