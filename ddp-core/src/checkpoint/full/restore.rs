//! Restoring a checkpoint on every rank: getting its files to every rank (broadcast from rank
//! 0, or read from a shared filesystem; each rank's communication-hook state file to that rank
//! only), decoding them into copies of the model and optimizer, and committing only when every
//! rank succeeded.

use super::super::codec::{decode_model, decode_optimizer};
use super::super::comm_hook_files::{
    comm_hook_state_file, decode_comm_hook_state, warn_comm_hook_states_dropped,
};
use super::super::error::{CheckpointError, InvalidCheckpoint};
use super::super::manifest::{
    CHECKPOINT_FILES, HookStateFiles, MODEL_FILE, OPTIMIZER_FILE, PARAM_IDS_FILE, STATE_FILE,
    VerifiedFiles,
};
use super::super::outcome::{CheckpointInfo, Resumed};
use super::super::storage::rank0::{all_succeeded, broadcast_bytes, scatter_bytes_from_rank0};
use super::checkpointer::FullCheckpointer;
use super::reader::{FoundCheckpoint, parse_state, read_one_with};
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::tensor::backend::AutodiffBackend;
use std::collections::BTreeMap;

impl FullCheckpointer {
    /// Brings checkpoint `name` (read by rank 0 as `found`) to every rank and loads it.
    pub(super) fn restore<B, M, O>(
        &self,
        device: &B::Device,
        model: &mut M,
        optim: &mut O,
        name: &str,
        found: Option<FoundCheckpoint>,
        invalid: Vec<InvalidCheckpoint>,
    ) -> Result<Resumed, CheckpointError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let (rank, dir) = (self.base.pg.rank(), self.base.config.dir().to_path_buf());
        let world_size = self.base.pg.world_size();
        let files = self.distribute(name, found)?;
        let hook_file = comm_hook_state_file(rank, world_size);
        let written_by = files.manifest.framework_version.as_str();
        let state = parse_state(files.get(STATE_FILE), written_by).map_err(|reason| {
            CheckpointError::Incompatible {
                name: name.to_string(),
                dir: dir.clone(),
                reason: Box::new(reason),
            }
        });
        // Decode into copies: on any rank's failure, every rank's model and optimizer stay as
        // they were.
        let decoded = state.and_then(|state| {
            self.base
                .config
                .check_run_config(name, state.run_config_hash.as_deref())?;
            let (mut m, mut o) = (model.clone(), optim.clone());
            decode_model::<B, M>(
                &mut m,
                device,
                files.get(MODEL_FILE).to_vec(),
                files.get(PARAM_IDS_FILE),
                name,
                rank,
            )?;
            decode_optimizer::<B, M, O>(
                &mut o,
                device,
                files.get(OPTIMIZER_FILE).to_vec(),
                name,
                rank,
            )?;
            let hook_state = decode_comm_hook_state(files.get(&hook_file), &hook_file, name, &dir)?;
            Ok((m, o, state, hook_state))
        });
        let (m, o, saved, hook_state) =
            all_succeeded(&self.base.pg, decoded, "load the checkpoint")?;
        *model = m;
        *optim = o;

        let info = CheckpointInfo::of_saved(
            name,
            dir.join(name),
            files.manifest.global_step,
            files.manifest.total_bytes(),
            &saved,
            world_size,
        );
        let saved_world = saved.world_size;
        let mut state = saved.training_for(
            rank,
            world_size,
            name,
            "resuming on a different world size: model and optimizer load as saved; the sampler position \
             is translated by global sample count where exact; per-rank rng states are dropped",
        );
        match files.hook_states_world() {
            Some(world) if world == world_size => state.comm_hook_state = hook_state,
            Some(_) => warn_comm_hook_states_dropped(name, saved_world, world_size),
            None => {}
        }
        Ok(Resumed::logged("checkpoint", info, state, invalid))
    }

    /// Every rank gets checkpoint `name`'s files: rank 0 from `found`, the others by broadcast
    /// or (shared filesystem) by reading and verifying them themselves; of the
    /// communication-hook state files, each rank gets its own only, and only when the world
    /// size is the saved one.
    fn distribute(
        &self,
        name: &str,
        found: Option<FoundCheckpoint>,
    ) -> Result<VerifiedFiles, CheckpointError> {
        let dir = self.base.config.dir();
        if self.base.config.shared_filesystem() {
            let mine = match found {
                Some(found) => Ok(found.files),
                None => read_one_with(
                    dir,
                    name,
                    HookStateFiles::OfRank {
                        rank: self.base.pg.rank(),
                        world: self.base.pg.world_size(),
                    },
                )
                .map(|f| f.files)
                .map_err(|e| e.into_error(name, dir)),
            };
            return all_succeeded(
                &self.base.pg,
                mine,
                "read the checkpoint from the shared filesystem",
            );
        }
        let mut found = found.map(|f| f.files);
        // Nothing fails on rank 0 alone before the broadcast: an unencodable manifest travels
        // as empty bytes, which every rank then fails to decode, together.
        let manifest = match &found {
            Some(files) => serde_json::to_vec(&files.manifest).unwrap_or_default(),
            None => Vec::new(),
        };
        let manifest = broadcast_bytes(&self.base.pg, manifest, 0, "broadcasting the manifest")?;
        let manifest = serde_json::from_slice(&manifest)
            .map_err(CheckpointError::json("decoding the broadcast manifest"))?;
        let mut files = BTreeMap::new();
        for file in CHECKPOINT_FILES {
            let bytes = found
                .as_mut()
                .and_then(|f| f.files.remove(file))
                .unwrap_or_default();
            files.insert(
                file.to_string(),
                broadcast_bytes(&self.base.pg, bytes, 0, "broadcasting checkpoint files")?,
            );
        }
        let mut files = VerifiedFiles { manifest, files };
        let world = self.base.pg.world_size();
        // Every rank has the manifest now: they agree on whether the scatter happens.
        if files.hook_states_world() == Some(world) {
            let per_rank = found.map(|mut found| {
                (0..world)
                    .map(|r| {
                        found
                            .files
                            .remove(&comm_hook_state_file(r, world))
                            .unwrap_or_default()
                    })
                    .collect()
            });
            let mine = scatter_bytes_from_rank0(&self.base.pg, per_rank)?;
            if !mine.is_empty() {
                let own = comm_hook_state_file(self.base.pg.rank(), world);
                files.files.insert(own, mine);
            }
        }
        Ok(files)
    }
}
