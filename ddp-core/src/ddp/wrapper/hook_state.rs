//! The registered communication hook's state, taken for a checkpoint and restored on resume
//! ([`comm_hook_state`](DistributedDataParallel::comm_hook_state),
//! [`load_comm_hook_state`](DistributedDataParallel::load_comm_hook_state)): the hook runs
//! on a thread of its own, so both go through that thread, after the buckets before them.

use super::DistributedDataParallel;
use crate::engine::hooks::{CommHookState, CommHookStateError};
use crate::engine::tap::TapBackend;
use crate::error::DdpError;
use burn::module::AutodiffModule;

impl<B: TapBackend, M: AutodiffModule<B>> DistributedDataParallel<B, M> {
    /// This rank's state of the registered communication hook
    /// ([`CommHook::state`](crate::hooks::CommHook::state)), for a checkpoint
    /// ([`TrainingState::with_comm_hook_state`](crate::checkpoint::TrainingState::with_comm_hook_state)):
    /// `None` without a hook or with one that keeps no state. PowerSGD's differs per rank
    /// (error feedback) and is as large as the gradients. Call it between steps, where the
    /// training state is taken.
    ///
    /// # Errors
    /// [`DdpError::Poisoned`] after an earlier error (the hook may have stopped mid-step);
    /// [`DdpError::CommHook`] when the hook's thread is gone (it panicked).
    pub fn comm_hook_state(&self) -> Result<Option<CommHookState>, DdpError> {
        self.check_usable()?;
        if self.hook_name.is_none() {
            return Ok(None);
        }
        self.reduction.comm_hook_state()
    }

    /// Restores the registered hook's state from a checkpoint
    /// ([`CommHook::load_state`](crate::hooks::CommHook::load_state)): the state
    /// [`comm_hook_state`](Self::comm_hook_state) returned on this rank of the saved run, as
    /// [`Resumed::state`](crate::checkpoint::Resumed::state) gives it back
    /// (`comm_hook_state`). Register the hook first, with the saved run's settings, and restore
    /// before the first step. Every rank restores its own state, or none does: ranks whose
    /// hooks are at different steps issue different collectives.
    ///
    /// Not collective, and not final: on error the hook is unchanged and the wrapper usable
    /// (to go on without the state, or to stop: the other ranks may have restored theirs).
    ///
    /// # Errors
    /// [`DdpError::CommHookState`] with [`CommHookStateError::NoHookRegistered`], or the hook's
    /// refusal (another hook's state, another format version, other settings, layouts that do
    /// not fit); [`DdpError::Poisoned`]; [`DdpError::CommHook`] when the hook's thread is gone.
    pub fn load_comm_hook_state(&mut self, state: CommHookState) -> Result<(), DdpError> {
        self.check_usable()?;
        let Some(hook) = &self.hook_name else {
            return Err(CommHookStateError::NoHookRegistered {
                found: state.hook().to_string(),
            }
            .into());
        };
        self.reduction.load_comm_hook_state(hook, state)?;
        tracing::info!(
            rank = self.pg.rank(),
            hook = hook.as_str(),
            "restored the communication hook's state"
        );
        Ok(())
    }
}
