//! [`TrainingState`]: everything besides the model and the optimizer that an exact resume
//! needs, and the on-disk `training_state.json` that wraps it with run metadata.

use super::error::CheckpointError;
use crate::engine::hooks::CommHookState;
use ddp_data::SamplerState;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Where training is: passed to [`FullCheckpointer::save`](crate::checkpoint::FullCheckpointer::save) and
/// returned on resume.
///
/// Every rank passes its own; rank 0's is written, except [`rank_rng`](Self::rank_rng), which
/// is gathered from every rank and given back to the same rank on resume (with the same world
/// size; after a world-size change it comes back as `None`), and
/// [`comm_hook_state`](Self::comm_hook_state), which every rank's checkpoint keeps in a binary
/// file of its own and gives back to the same rank the same way.
///
/// ```
/// # use ddp_core::checkpoint::TrainingState;
/// # #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)] struct Rng { seed: u64, word_pos: u64 }
/// let state = TrainingState::new(2, 120).with_rng(&Rng { seed: 7, word_pos: 4096 })?;
/// assert_eq!(state.rng::<Rng>()?, Some(Rng { seed: 7, word_pos: 4096 }));
/// # Ok::<(), ddp_core::checkpoint::CheckpointError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TrainingState {
    /// The epoch in progress (or just finished: the sampler state says how far it got).
    pub epoch: u64,
    /// Optimizer steps taken so far; names the checkpoint (`step-0000000120`).
    pub global_step: u64,
    /// The data loader's (or sampler's) position: `loader.state()`.
    pub sampler: Option<SamplerState>,
    /// Random state shared by all ranks (e.g. a seed and a ChaCha word position), free-form.
    pub rng: Option<serde_json::Value>,
    /// This rank's own random state (e.g. for augmentation or dropout), free-form.
    #[serde(skip)]
    pub rank_rng: Option<serde_json::Value>,
    /// Anything else (best metric, learning-rate schedule position...), free-form JSON.
    pub user: serde_json::Value,
    /// This rank's communication-hook state
    /// ([`DistributedDataParallel::comm_hook_state`](crate::DistributedDataParallel::comm_hook_state):
    /// PowerSGD's step count, generator, error feedback and Q memory), binary, stored as the
    /// checkpoint's `comm_hook_state-<rank>-of-<world>.bin`. On resume it is this rank's again
    /// (restore it with
    /// [`load_comm_hook_state`](crate::DistributedDataParallel::load_comm_hook_state)); after
    /// a world-size change it is `None`, with a warning: error feedback belongs to a rank.
    #[serde(skip)]
    pub comm_hook_state: Option<CommHookState>,
}

impl TrainingState {
    /// A state at `epoch` after `global_step` optimizer steps.
    pub fn new(epoch: u64, global_step: u64) -> Self {
        TrainingState {
            epoch,
            global_step,
            ..Default::default()
        }
    }

    /// Adds the loader's position (`loader.state()`).
    pub fn with_sampler(mut self, sampler: SamplerState) -> Self {
        self.sampler = Some(sampler);
        self
    }

    /// Adds random state shared by all ranks.
    ///
    /// # Errors
    /// [`CheckpointError::Json`] if it does not serialise.
    pub fn with_rng<T: Serialize + ?Sized>(mut self, rng: &T) -> Result<Self, CheckpointError> {
        self.rng = Some(to_json(rng, "the rng state")?);
        Ok(self)
    }

    /// Adds this rank's own random state.
    ///
    /// # Errors
    /// [`CheckpointError::Json`] if it does not serialise.
    pub fn with_rank_rng<T: Serialize + ?Sized>(
        mut self,
        rng: &T,
    ) -> Result<Self, CheckpointError> {
        self.rank_rng = Some(to_json(rng, "this rank's rng state")?);
        Ok(self)
    }

    /// Adds this rank's communication-hook state (`ddp.comm_hook_state()?`; `None` saves none).
    pub fn with_comm_hook_state(mut self, state: Option<CommHookState>) -> Self {
        self.comm_hook_state = state;
        self
    }

    /// The state without this rank's communication-hook state (which is stored apart),
    /// without copying that state.
    pub(crate) fn without_comm_hook_state(&self) -> TrainingState {
        TrainingState {
            epoch: self.epoch,
            global_step: self.global_step,
            sampler: self.sampler.clone(),
            rng: self.rng.clone(),
            rank_rng: self.rank_rng.clone(),
            user: self.user.clone(),
            comm_hook_state: None,
        }
    }

    /// Adds a free-form user payload.
    ///
    /// # Errors
    /// [`CheckpointError::Json`] if it does not serialise.
    pub fn with_user<T: Serialize + ?Sized>(mut self, user: &T) -> Result<Self, CheckpointError> {
        self.user = to_json(user, "the user payload")?;
        Ok(self)
    }

    /// The shared random state as `T` (`None` if none was saved).
    ///
    /// # Errors
    /// [`CheckpointError::Json`] if it is not a `T`.
    pub fn rng<T: DeserializeOwned>(&self) -> Result<Option<T>, CheckpointError> {
        from_json(self.rng.as_ref(), "the rng state")
    }

    /// This rank's random state as `T` (`None` if none was saved for this rank).
    ///
    /// # Errors
    /// [`CheckpointError::Json`] if it is not a `T`.
    pub fn rank_rng<T: DeserializeOwned>(&self) -> Result<Option<T>, CheckpointError> {
        from_json(self.rank_rng.as_ref(), "this rank's rng state")
    }

    /// The user payload as `T` (`None` if it is JSON `null`).
    ///
    /// # Errors
    /// [`CheckpointError::Json`] if it is not a `T`.
    pub fn user<T: DeserializeOwned>(&self) -> Result<Option<T>, CheckpointError> {
        from_json(
            Some(&self.user).filter(|v| !v.is_null()),
            "the user payload",
        )
    }
}

fn to_json<T: Serialize + ?Sized>(
    value: &T,
    what: &str,
) -> Result<serde_json::Value, CheckpointError> {
    serde_json::to_value(value).map_err(CheckpointError::json(format!("serialising {what}")))
}

fn from_json<T: DeserializeOwned>(
    value: Option<&serde_json::Value>,
    what: &str,
) -> Result<Option<T>, CheckpointError> {
    value
        .map(|v| T::deserialize(v).map_err(CheckpointError::json(format!("decoding {what}"))))
        .transpose()
}

/// The contents of `training_state.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StateFile {
    /// Rank 0's training state.
    pub(crate) training: TrainingState,
    /// Every rank's `rank_rng`, by rank.
    pub(crate) rank_rngs: Vec<Option<serde_json::Value>>,
    /// The world size at save time.
    pub(crate) world_size: usize,
    /// Hash of the run config, if one was configured.
    pub(crate) run_config_hash: Option<String>,
    /// ddp-core's version.
    pub(crate) framework_version: String,
    /// Wall-clock time of the save, milliseconds since the Unix epoch.
    pub(crate) created_unix_ms: u64,
}

impl StateFile {
    /// The training state rank `rank` of `world` resumes: rank 0's, with this rank's own
    /// `rank_rng` when the world size is the saved one; otherwise without, with the warning
    /// `changed` about `checkpoint`.
    pub(crate) fn training_for(
        self,
        rank: usize,
        world: usize,
        checkpoint: &str,
        changed: &str,
    ) -> TrainingState {
        let mut state = self.training;
        if self.world_size == world {
            state.rank_rng = self.rank_rngs.into_iter().nth(rank).flatten();
        } else {
            tracing::warn!(
                checkpoint,
                saved = self.world_size,
                current = world,
                "{changed}"
            );
        }
        state
    }
}

/// ddp-core's version, recorded in every checkpoint.
pub const FRAMEWORK_VERSION: &str = env!("CARGO_PKG_VERSION");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_rng_is_not_part_of_the_shared_json() {
        let s = TrainingState::new(1, 2)
            .with_rank_rng(&5u32)
            .unwrap()
            .with_user(&"x")
            .unwrap();
        let json = serde_json::to_string(&s).unwrap();
        assert!(!json.contains("rank_rng"), "{json}");
        let back: TrainingState = serde_json::from_str(&json).unwrap();
        assert_eq!(back.user::<String>().unwrap().as_deref(), Some("x"));
        assert_eq!(back.rank_rng::<u32>().unwrap(), None);
    }
}
