//! A [`PowerSgdHook`]'s state taken for a checkpoint and given back on resume: the snapshot
//! of its step count, generator and per-bucket buffers, and the checks a saved state passes
//! (same settings, buffers that fit their layouts) before it replaces the hook's own. Apart
//! from the hook's arithmetic (`powersgd.rs`) and from the bytes (`state_format.rs`).

use super::state_format::{BucketState, POWERSGD_STATE_VERSION, Settings, Snapshot};
use super::{POWERSGD, PowerSgdHook};
use crate::engine::hooks::{CommHookState, CommHookStateError};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

impl PowerSgdHook {
    /// This hook's whole state, for [`CommHook::state`](crate::engine::hooks::CommHook::state).
    pub(super) fn saved_state(&self) -> CommHookState {
        CommHookState::new(POWERSGD, POWERSGD_STATE_VERSION, self.snapshot().encode())
    }

    /// Replaces this hook's state by `state`, once it is known to be a PowerSGD state of this
    /// format, written with these settings, with buffers that fit their layouts.
    pub(super) fn restore_saved(&mut self, state: CommHookState) -> Result<(), CommHookStateError> {
        state.check_written_by(POWERSGD, POWERSGD_STATE_VERSION)?;
        let snapshot =
            Snapshot::decode(state.payload()).map_err(|reason| CommHookStateError::Corrupt {
                hook: POWERSGD.into(),
                reason,
            })?;
        if let Some((setting, saved, current)) =
            snapshot.settings.first_difference(&self.settings())
        {
            return Err(CommHookStateError::ConfigMismatch {
                hook: POWERSGD.into(),
                setting,
                saved,
                current,
            });
        }
        for bucket in &snapshot.buckets {
            self.check_fits(bucket)?;
        }
        self.restore(snapshot);
        Ok(())
    }

    fn settings(&self) -> Settings {
        let c = &self.config;
        Settings {
            rank: c.rank as u64,
            start_iter: c.start_iter as u64,
            min_compression_rate: c.min_compression_rate,
            warm_start: c.warm_start,
            error_feedback: c.error_feedback,
            orthogonalization_epsilon: c.orthogonalization_epsilon,
        }
    }

    fn snapshot(&self) -> Snapshot {
        let mut indices: Vec<usize> = self.layouts.keys().copied().collect();
        indices.sort_unstable();
        Snapshot {
            settings: self.settings(),
            iter: self.iter as u64,
            rng_seed: self.rng.get_seed(),
            rng_stream: self.rng.get_stream(),
            rng_word_pos: self.rng.get_word_pos(),
            buckets: indices
                .into_iter()
                .map(|index| BucketState {
                    index,
                    layout: self.layouts[&index].clone(),
                    error: self.error.get(&index).cloned(),
                    q_memory: self.q_memory.get(&index).cloned(),
                })
                .collect(),
        }
    }

    /// Checks that `bucket`'s saved buffers are what this hook's settings make of its saved
    /// layout: the error as long as the bucket, the Q memory as long as the Q of its
    /// compressed matrices.
    fn check_fits(&self, bucket: &BucketState) -> Result<(), CommHookStateError> {
        let mismatch = |detail: String| CommHookStateError::LayoutMismatch {
            hook: POWERSGD.into(),
            bucket: bucket.index,
            detail,
        };
        let mut at = 0;
        for p in &bucket.layout {
            if p.offset != at {
                return Err(mismatch(format!(
                    "{} starts at {}, after {at} elements of the parameters before it",
                    p.path, p.offset
                )));
            }
            at += p.numel();
        }
        if let Some(error) = &bucket.error
            && error.len() != at
        {
            return Err(mismatch(format!(
                "its error feedback has {} elements, its parameters {at}",
                error.len()
            )));
        }
        let (matrices, _) = self.split(&bucket.layout);
        let q_len: usize = matrices.iter().map(|x| x.m * x.r).sum();
        if let Some(q) = &bucket.q_memory
            && q.len() != q_len
        {
            return Err(mismatch(format!(
                "its Q memory has {} elements, rank {} makes {q_len} of its matrices",
                q.len(),
                self.config.rank
            )));
        }
        Ok(())
    }

    /// Replaces the whole state by `snapshot`'s (checked).
    fn restore(&mut self, snapshot: Snapshot) {
        let mut rng = ChaCha8Rng::from_seed(snapshot.rng_seed);
        rng.set_stream(snapshot.rng_stream);
        rng.set_word_pos(snapshot.rng_word_pos);
        self.rng = rng;
        self.iter = snapshot.iter as usize;
        self.error.clear();
        self.q_memory.clear();
        self.layouts.clear();
        self.parked.clear();
        for bucket in snapshot.buckets {
            if let Some(error) = bucket.error {
                self.error.insert(bucket.index, error);
            }
            if let Some(q) = bucket.q_memory {
                self.q_memory.insert(bucket.index, q);
            }
            self.layouts.insert(bucket.index, bucket.layout);
        }
    }
}
