//! [`step_on`](DistributedDataParallel::step_on): the synchronised step for loops that run
//! their own forward and backward in a closure (burn-train's `TrainStep`), on the caller's
//! module instead of the wrapped one.

use super::DistributedDataParallel;
use crate::engine::tap::{InWrapperBackward, TapBackend, TappedCopy};
use crate::error::DdpError;
use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use std::time::Instant;

impl<B: TapBackend, M: AutodiffModule<B>> DistributedDataParallel<B, M> {
    /// Runs `f` on a tapped copy of **your** `module` and returns its output with the
    /// gradients averaged over all ranks, keyed by `module`'s `ParamId`s. `f` does the forward
    /// *and* its own plain `loss.backward()` (and may drop the gradients it gets): for training
    /// loops that own the model and the optimizer and compute gradients themselves, such as
    /// burn-train's `TrainStep::step`.
    ///
    /// The reducer is armed before `f` runs, so as burn's backward inside `f` reaches each
    /// parameter, its gradient goes into its bucket and a full bucket's all-reduce starts while
    /// backward goes on, exactly as with [`forward`](Self::forward) +
    /// [`backward`](Self::backward) (same buckets, same order on every rank, the same
    /// gradients bit for bit). [`layer_boundary`](crate::layer_boundary) in the model's forward
    /// works inside `f`. The taps keep the gradients, so the ones `f`'s backward leaves on the
    /// copy are empty: use the returned ones.
    ///
    /// Rules, each checked:
    /// - `module` has the wrapped module's parameter layout (same float tensors in the same
    ///   order, paths, shapes, dtypes, trainable or not, same tied parameters), else
    ///   [`DdpError::ModelMismatch`] saying so. Its ids may differ from the wrapped module's.
    /// - `f` runs one backward from a loss computed from the copy it is given, else
    ///   [`DdpError::NoGradients`] (when none reached DDP).
    /// - Every rank calls it at the same point, with the same `sync` flavour.
    /// - No [`forward`](Self::forward) is waiting for its backward.
    /// - Not with [`DdpConfig::uneven_inputs`](crate::DdpConfig::uneven_inputs) ([`join`](Self::join) steps the wrapped module,
    ///   not yours): [`DdpError::InvalidConfig`].
    ///
    /// Keeping `module` the same on every rank is the caller's part: start from
    /// [`module`](Self::module) (or rank 0's record) and apply the returned gradients with the
    /// same optimizer everywhere. After the step rank 0's buffers (running statistics) are
    /// written into `module` (they are shared between a module and its clones), as
    /// [`backward`](Self::backward) does for the wrapped one; that broadcast runs after the
    /// last bucket, since only then does every rank issue it at the same point.
    ///
    /// With [`DdpConfig::automatic_overlap`](crate::DdpConfig::automatic_overlap), a depth plan learned by an earlier
    /// `forward`/`backward` is used; `step_on` cannot learn one (the loss stays inside `f`).
    ///
    /// # Collective
    /// Every rank calls it once per step.
    ///
    /// # Errors
    /// The above, and [`DdpError::Comm`]. All are final (see
    /// [Errors are final](Self#errors-are-final)); a panic in `f` also poisons the wrapper and
    /// aborts the group (peers fail at once) before it resumes unwinding.
    pub fn step_on<O>(
        &mut self,
        module: &M,
        f: impl FnOnce(&M) -> O,
    ) -> Result<(O, GradientsParams), DdpError> {
        self.check_usable()?;
        let result = self.closure_step(module, true, f).and_then(|(out, grads)| {
            let grads = grads.ok_or_else(|| {
                DdpError::Internal("a synchronised step_on gave no gradients".into())
            })?;
            Ok((out, grads))
        });
        self.guard(result)
    }

    /// As [`step_on`](Self::step_on), but the gradients are accumulated locally without
    /// communication (PyTorch's `no_sync`): the next synchronised step (`step_on` or
    /// `backward`) adds its own and all-reduces the sum. To abandon a partial accumulation
    /// (burn-train drops the micro-batches left at the end of an epoch), call
    /// [`discard_no_sync_gradients`](Self::discard_no_sync_gradients) on every rank.
    ///
    /// # Errors
    /// As [`step_on`](Self::step_on).
    pub fn step_on_no_sync<O>(
        &mut self,
        module: &M,
        f: impl FnOnce(&M) -> O,
    ) -> Result<O, DdpError> {
        self.check_usable()?;
        let result = self.closure_step(module, false, f).map(|(out, _)| out);
        self.guard(result)
    }

    /// Forgets the gradients accumulated by `no_sync` steps since the last synchronised step;
    /// returns how many parameters had some. Local (no communication): every rank calls it at
    /// the same point, or the ranks' next sums differ.
    ///
    /// # Errors
    /// [`DdpError::Poisoned`]; [`DdpError::Internal`] if called between a
    /// [`forward`](Self::forward) and its backward.
    pub fn discard_no_sync_gradients(&mut self) -> Result<usize, DdpError> {
        self.check_usable()?;
        if self.passes.forward_pending() {
            return Err(DdpError::Internal(
                "discard_no_sync_gradients between a forward and its backward".into(),
            ));
        }
        self.reducer.discard_held()
    }

    /// `step_on`, top to bottom: check, tap, arm, run `f` (its backward feeds the buckets),
    /// finish, buffers.
    fn closure_step<O>(
        &mut self,
        module: &M,
        sync: bool,
        f: impl FnOnce(&M) -> O,
    ) -> Result<(O, Option<GradientsParams>), DdpError> {
        const WHAT: &str = "step_on";
        if self.config.uneven_inputs {
            return Err(DdpError::InvalidConfig(
                "step_on does not support uneven_inputs (join would step the wrapped module, \
                 not the caller's); use forward/backward/join, or give every rank the same \
                 number of batches"
                    .into(),
            ));
        }
        if self.passes.forward_pending() {
            return Err(DdpError::InvalidConfig(
                "step_on was called while a forward from `forward` waits for its backward; \
                 finish that step with backward (or backward_no_sync) first"
                    .into(),
            ));
        }
        // 0. The caller's module must fit the buckets (checked locally; the wrapped layout was
        //    compared across ranks at construction). Gradients are keyed by its ids.
        let rekeyed = self.table.for_caller::<B, M>(module, WHAT)?;
        // 1. Rank 0's buffers, if a forward left them unsynchronised.
        if self.buffers.needs_sync() {
            drop(self.buffers.sync_now::<B, M>(&self.pg, module.clone())?);
        }
        // 2. Arm: every tap event of `f`'s backward is expected.
        let generation = self.reducer.new_forward()?;
        self.reducer.begin(sync, self.pg.world_size())?;
        // 3. The caller's forward and backward on a tapped copy of its module; full buckets
        //    start their all-reduce meanwhile.
        let start = Instant::now();
        let out = self.passes.run(
            module.clone(),
            self.reducer.clone(),
            generation,
            TappedCopy::AliveThroughBackward,
            |tapped| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let _inside = InWrapperBackward::enter();
                    f(tapped)
                }))
            },
        );
        let pass = self.passes.conclude(start, Instant::now());
        let out = match out {
            Ok(out) => out,
            Err(panic) => {
                let _ = self.guard::<()>(Err(DdpError::Internal(
                    "the closure passed to step_on panicked during its forward or backward".into(),
                )));
                std::panic::resume_unwind(panic);
            }
        };
        // 4. The remaining buckets; wait for all of them; averaged gradients (caller's ids).
        let table = rekeyed.as_ref().unwrap_or(&self.table);
        let reduced = self.reducer.finish(table, pass.anchored_taps > 0)?;
        // 5. Rank 0's buffers into the caller's module, after every bucket collective: the
        //    buckets were issued from inside `f`, so only here is the point the same everywhere.
        self.buffers.mark_updated();
        match self.buffers.start::<B, M>(&self.pg, module, 0)? {
            Some(pending) => drop(self.buffers.finish::<B, M>(pending, module.clone())?),
            None => self.buffers.settle_local::<B, M>(module),
        }
        let Some((grads, buckets)) = reduced else {
            return Ok((out, None));
        };
        self.conclude_step((start, start), pass, buckets);
        Ok((out, Some(grads)))
    }
}
