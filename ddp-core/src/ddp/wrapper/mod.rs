//! [`DistributedDataParallel`]: N processes training one model as if it were one process with
//! an N times larger batch.

mod guard;
mod hook_state;
mod join;
mod record;
mod step_on;

use super::buffers::{BufferSync, PendingBuffers};
use super::config::DdpConfig;
use super::reduction_choice::{choose_reduction, make_reducer};
use crate::ddp::timeline::{StepStats, StepTimes, Timeline};
use crate::engine::hooks::CommHook;
use crate::engine::model_sync::{broadcast_module, verify_same_model};
use crate::engine::params::{ParamKind, ParamTable};
use crate::engine::reducer::{BucketReduction, BucketTimes, Reducer};
use crate::engine::tap::{BackwardPass, TapBackend, TappedCopy, TappedPasses};
use crate::error::DdpError;
use burn::module::AutodiffModule;
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::Tensor;
use ddp_comm::ProcessGroup;
use std::sync::Arc;
use std::time::Instant;

/// Wraps a burn module for data-parallel training over a [`ProcessGroup`].
///
/// - **Construction** forces lazy initialisation, checks that every rank holds the same model
///   (paths, shapes, dtypes; a mismatch fails on every rank naming the first differing
///   parameter), and makes every rank equal to rank 0, byte for byte (values in their own dtype,
///   buffers, frozen parameters and `ParamId`s).
/// - [`forward`](Self::forward) runs your forward on a copy of the module whose trainable
///   parameters pass through gradient taps. Several forwards before one backward are fine:
///   every tap is counted once.
/// - [`backward`](Self::backward) runs backward; gradients go into buckets whose all-reduces
///   start as soon as they fill, and you get back averaged `GradientsParams` keyed by the
///   module's `ParamId`s, identical on every rank. Parameters that no rank used get no gradient
///   (the optimizer leaves them alone); one used on some ranks only is averaged with zeros from
///   the others. Meanwhile rank 0's buffers (batch-norm running statistics, as this step's
///   forward left them) are broadcast, so after every step all ranks hold rank 0's buffers
///   ([`DdpConfig::broadcast_buffers`], on by default, as in PyTorch).
/// - [`backward_no_sync`](Self::backward_no_sync) accumulates locally (gradient accumulation);
///   the next `backward` reduces the sum.
/// - [`step_on`](Self::step_on) / [`step_on_no_sync`](Self::step_on_no_sync): the same step
///   for loops that own the model and run their own forward *and* `loss.backward()` in a
///   closure (burn-train's `TrainStep`): the closure runs on a tapped copy of the module you
///   pass, with the reducer armed, so buckets are all-reduced during its backward.
/// - [`optimizer_step`](Self::optimizer_step) applies your optimizer to the wrapped module.
/// - [`register_comm_hook`](Self::register_comm_hook) replaces how buckets are averaged
///   (compression, [PowerSGD](crate::hooks::PowerSgdHook)); a stateful hook's state goes into
///   checkpoints with [`comm_hook_state`](Self::comm_hook_state) and comes back with
///   [`load_comm_hook_state`](Self::load_comm_hook_state).
/// - With [`DdpConfig::uneven_inputs`], ranks may have different numbers of batches: a rank
///   that runs out calls [`join`](Self::join).
///
/// # Errors are final
/// An error from `forward`, `backward`, `backward_no_sync` or `set_module` (a peer failed, a
/// misuse such as `backward` without `forward`) aborts the process group, so the other ranks'
/// collectives fail at once with this rank's reason instead of waiting for the timeout, and the
/// wrapper refuses every later call ([`DdpError::Poisoned`]). Restart the job to continue (the
/// launcher's `--max-restarts` resumes from the latest checkpoint).
///
/// See the [crate docs](crate) for a complete training loop.
pub struct DistributedDataParallel<B: TapBackend, M: AutodiffModule<B>> {
    module: Option<M>,
    pg: ProcessGroup,
    config: DdpConfig,
    table: ParamTable<B::InnerBackend>,
    /// How buckets are reduced; kept across `set_module` (a hook keeps its state).
    reduction: Arc<dyn BucketReduction<B::InnerBackend>>,
    /// The registered hook's name, if one is registered.
    hook_name: Option<String>,
    reducer: Arc<Reducer<B::InnerBackend>>,
    buffers: BufferSync,
    /// The taps of the forwards since the last backward, and where to anchor them.
    passes: TappedPasses<B::InnerBackend>,
    poisoned: Option<String>,
    forward_times: Option<(Instant, Instant)>,
    last_stats: Option<StepStats>,
    timeline: Option<Timeline>,
    step: u64,
}

impl<B: TapBackend, M: AutodiffModule<B>> std::fmt::Debug for DistributedDataParallel<B, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistributedDataParallel")
            .field("rank", &self.pg.rank())
            .field("world_size", &self.pg.world_size())
            .field("buckets", &self.reducer.num_buckets())
            .field("config", &self.config)
            .field("poisoned", &self.poisoned)
            .finish()
    }
}

impl<B: TapBackend, M: AutodiffModule<B>> DistributedDataParallel<B, M> {
    /// Wraps `module`; every rank of `pg` must call it with the same model architecture.
    ///
    /// # Collective
    /// All ranks of `pg` call it at the same point.
    ///
    /// # Errors
    /// [`DdpError::ModelMismatch`] on every rank when the models differ;
    /// [`DdpError::Unsupported`] for parameters of a dtype DDP cannot reduce;
    /// [`DdpError::Comm`] when a peer fails; [`DdpError::InvalidConfig`].
    pub fn new(module: M, pg: ProcessGroup, config: DdpConfig) -> Result<Self, DdpError> {
        config.validate()?;
        crate::cpu_fast_path::prepare_once::<B::Device>(pg.rank());
        let table = ParamTable::describe::<B, M>(&module);
        verify_same_model(&pg, &table)?;
        table.check_dtypes()?;
        let module = broadcast_module::<B, M>(&pg, module, &table)?;
        // Ids now come from rank 0: describe again.
        let table = ParamTable::describe::<B, M>(&module);
        let reduction = choose_reduction(&pg, &config, &table, None)?;
        let reducer = Arc::new(make_reducer(&pg, &config, &table, reduction.clone()));
        let timeline = match (&config.timeline_path, pg.rank()) {
            (Some(_), 0) => Some(Timeline::new(pg.global_rank())),
            _ => None,
        };
        tracing::info!(
            rank = pg.rank(),
            params = table.count(ParamKind::Trainable),
            buffers = table.count(ParamKind::Buffer),
            frozen = table.count(ParamKind::Frozen),
            buckets = reducer.num_buckets(),
            "DDP ready: every rank holds rank 0's model"
        );
        Ok(DistributedDataParallel {
            module: Some(module),
            buffers: BufferSync::new(&table, config.broadcast_buffers, pg.world_size()),
            passes: TappedPasses::new(table.kinds(), config.automatic_overlap),
            table,
            pg,
            config,
            reduction,
            hook_name: None,
            reducer,
            poisoned: None,
            forward_times: None,
            last_stats: None,
            timeline,
            step: 0,
        })
    }

    fn inner(&self) -> &M {
        // `module` is only `None` inside `optimizer_step`, which always puts it back.
        self.module
            .as_ref()
            .expect("the DDP module is always present outside optimizer_step")
    }

    /// The wrapped module (identical on every rank after each synchronised step).
    pub fn module(&self) -> &M {
        self.inner()
    }

    /// Unwraps the module.
    pub fn into_inner(mut self) -> M {
        self.module
            .take()
            .expect("the DDP module is always present outside optimizer_step")
    }

    /// Replaces the module, for example with one loaded from a checkpoint: its values (and
    /// `ParamId`s) are taken from rank 0 and every rank continues training *it*. Gradients are
    /// keyed by its ids from now on, so load the optimizer state that belongs to it.
    ///
    /// The documented resume path is simpler: load the checkpoint into the model before
    /// wrapping it (see [`FullCheckpointer::load_latest`](crate::checkpoint::FullCheckpointer::load_latest)).
    ///
    /// # Collective
    /// Every rank calls it, between steps (outputs of earlier forwards can no longer be used).
    ///
    /// # Errors
    /// [`DdpError::ModelMismatch`] when the new module's parameters (paths, shapes, dtypes,
    /// kinds) differ from the wrapped one's; [`DdpError::Comm`]. Both are final (see
    /// [Errors are final](Self#errors-are-final)).
    pub fn set_module(&mut self, module: M) -> Result<(), DdpError> {
        self.check_usable()?;
        let result = self.replace_module(module);
        self.guard(result)
    }

    fn replace_module(&mut self, module: M) -> Result<(), DdpError> {
        let table = ParamTable::describe::<B, M>(&module);
        let old: Vec<String> = self.table.entries.iter().map(|e| e.signature()).collect();
        let new: Vec<String> = table.entries.iter().map(|e| e.signature()).collect();
        if let Some(i) = (0..old.len().max(new.len())).find(|&i| old.get(i) != new.get(i)) {
            return Err(DdpError::ModelMismatch(format!(
                "set_module: tensor #{i} of the new module is {:?}, the wrapped module's is {:?}",
                new.get(i).map(String::as_str).unwrap_or("missing"),
                old.get(i).map(String::as_str).unwrap_or("missing"),
            )));
        }
        let module = broadcast_module::<B, M>(&self.pg, module, &table)?;
        self.table = ParamTable::describe::<B, M>(&module);
        self.reducer = Arc::new(make_reducer(
            &self.pg,
            &self.config,
            &self.table,
            self.reduction.clone(),
        ));
        self.passes.forget();
        self.buffers.mark_synced();
        self.module = Some(module);
        Ok(())
    }

    /// Replaces how buckets of f32 gradients are averaged (PyTorch's `register_comm_hook`):
    /// each bucket goes to `hook` on a communication thread while backward goes on. See
    /// [`hooks`](crate::hooks) for the shipped hooks and when to use which.
    ///
    /// Every rank registers the same hook with the same settings, once, before the first
    /// forward.
    ///
    /// # Errors
    /// [`DdpError::InvalidConfig`] after the first forward, for a second hook, and with
    /// [`Collectives::Nccl`] or [`HostStaging::PerBucket`], which a hook would make DDP ignore
    /// (it runs on the CPU transports and reads each gradient on its own).
    ///
    /// [`Collectives::Nccl`]: crate::Collectives::Nccl
    /// [`HostStaging::PerBucket`]: crate::HostStaging::PerBucket
    pub fn register_comm_hook(&mut self, hook: impl CommHook) -> Result<(), DdpError> {
        self.check_usable()?;
        if self.hook_name.is_some()
            || self.step > 0
            || self.passes.forward_pending()
            || self.reducer.holds_gradients()
        {
            return Err(DdpError::InvalidConfig(
                "register_comm_hook: register one hook, before the first forward".into(),
            ));
        }
        let name = hook.name().to_string();
        // The same choice as at construction, now with the hook: settings it would make DDP
        // ignore are errors here.
        let reduction =
            choose_reduction(&self.pg, &self.config, &self.table, Some(Box::new(hook)))?;
        self.reduction = reduction.clone();
        self.hook_name = Some(name);
        self.reducer = Arc::new(make_reducer(&self.pg, &self.config, &self.table, reduction));
        Ok(())
    }

    /// The process group gradients are averaged over.
    pub fn process_group(&self) -> &ProcessGroup {
        &self.pg
    }

    /// The configuration.
    pub fn config(&self) -> &DdpConfig {
        &self.config
    }

    /// Runs `f` on the module with gradient taps in place; use its output for the loss.
    ///
    /// # Collective
    /// Every rank calls it the same number of times (a forward after a forward without a
    /// backward broadcasts rank 0's buffers first; with uneven inputs, the first training
    /// rank's, after a round a joined rank answers as it answers steps).
    ///
    /// # Errors
    /// [`DdpError::BackwardOutsideDdp`] after a plain `loss.backward()`;
    /// [`DdpError::BackwardOfAnotherWrapper`] after another wrapper's backward went through this
    /// one's forward output; [`DdpError::Comm`].
    /// Both are final (see [Errors are final](Self#errors-are-final)).
    pub fn forward<O>(&mut self, f: impl FnOnce(&M) -> O) -> Result<O, DdpError> {
        self.check_usable()?;
        let result = self.tapped_forward(f);
        self.guard(result)
    }

    fn tapped_forward<O>(&mut self, f: impl FnOnce(&M) -> O) -> Result<O, DdpError> {
        // 1. Every rank starts from rank 0's buffers (already so after a backward). With uneven
        //    inputs a rank may have joined, and its `join` loop answers rounds only: a round
        //    first, which it mirrors, and the buffers of the first rank still training.
        if self.buffers.needs_sync() {
            let root = self.forward_buffers_round()?.root;
            self.sync_buffers_from(root)?;
        }
        // 2. The user's forward on a copy of the module whose trainable parameters pass through
        //    taps; it may update buffers (running statistics).
        let start = Instant::now();
        let generation = self.reducer.new_forward()?;
        let out = self.passes.run(
            self.inner().clone(),
            self.reducer.clone(),
            generation,
            TappedCopy::DroppedAfterForward,
            f,
        );
        self.buffers.mark_updated();
        self.forward_times = Some((start, Instant::now()));
        Ok(out)
    }

    /// Runs backward from `loss` and returns gradients averaged over all ranks, keyed by the
    /// module's `ParamId`s, for your optimizer.
    ///
    /// # Collective
    /// Every rank calls it once per step.
    ///
    /// # Errors
    /// [`DdpError::Comm`] when a peer fails (naming it and its reason);
    /// [`DdpError::BackwardWithoutForward`], [`DdpError::BackwardOutsideDdp`],
    /// [`DdpError::BackwardOfAnotherWrapper`],
    /// [`DdpError::UsedOutsideForward`],
    /// [`DdpError::StaleForward`], [`DdpError::NoGradients`] for misuse. All are final (see
    /// [Errors are final](Self#errors-are-final)).
    ///
    /// # Panics
    /// When burn's backward panics (out of device memory, say). The panic is final as an error
    /// is: before it unwinds on, the peers are told (they fail at once, quoting it) and the
    /// wrapper is poisoned, so a caller that catches it gets [`DdpError::Poisoned`] next.
    pub fn backward<const D: usize>(
        &mut self,
        loss: Tensor<B, D>,
    ) -> Result<GradientsParams, DdpError> {
        self.check_usable()?;
        self.guard_panics("backward", |ddp| {
            ddp.step(loss, true)?.ok_or_else(|| {
                DdpError::Internal("a synchronised backward gave no gradients".into())
            })
        })
    }

    /// Runs backward from `loss` and accumulates the gradients locally, without communication
    /// (PyTorch's `no_sync`). The next [`backward`](Self::backward) adds its gradients and
    /// all-reduces the sum: k micro-batches give the gradient of their sum.
    ///
    /// # Errors
    /// As [`backward`](Self::backward).
    pub fn backward_no_sync<const D: usize>(&mut self, loss: Tensor<B, D>) -> Result<(), DdpError> {
        self.check_usable()?;
        self.guard_panics("backward_no_sync", |ddp| ddp.step(loss, false).map(drop))
    }

    /// One backward, top to bottom.
    fn step<const D: usize>(
        &mut self,
        loss: Tensor<B, D>,
        sync: bool,
    ) -> Result<Option<GradientsParams>, DdpError> {
        // 0. With uneven inputs: which ranks still train (the others answer from `join`).
        let round = self.backward_round(sync)?;
        self.reducer.begin(sync, round.averaged_over)?;
        // 1. Rank 0's buffers, as this step's forward left them, travel while backward runs
        //    (first in every rank's collective queue).
        let buffers = self
            .buffers
            .start::<B, M>(&self.pg, self.inner(), round.root)?;
        // 2. Backward: each tap hands its gradient to the reducer; a full bucket starts its
        //    all-reduce at once (in bucket order). With automatic overlap and no plan yet, the
        //    taps are plain and probes learn where to anchor them from the next step on.
        let (pass, leftover) = self.passes.backward(loss);
        // 3. The remaining buckets; wait for all of them; averaged gradients.
        let reduced = self.reducer.finish(&self.table, pass.anchored_taps > 0)?;
        // 4. Every rank takes rank 0's buffers.
        self.land_buffers(buffers)?;
        // 5. A loss term computed from the wrapped module itself left gradients DDP never saw.
        let outside = self
            .table
            .used_outside_taps::<B, M>(self.inner(), &leftover);
        if !outside.is_empty() {
            return Err(DdpError::UsedOutsideForward { params: outside });
        }
        let Some((grads, buckets)) = reduced else {
            return Ok(None);
        };
        let forward = self
            .forward_times
            .take()
            .unwrap_or((pass.start, pass.start));
        self.conclude_step(forward, pass, buckets);
        Ok(Some(grads))
    }

    /// The end both synchronised steps share (`backward`, `step_on`): the step's statistics,
    /// the step count, the timeline.
    fn conclude_step(
        &mut self,
        forward: (Instant, Instant),
        pass: BackwardPass,
        buckets: BucketTimes,
    ) {
        let times = StepTimes {
            forward,
            backward: (pass.start, pass.end),
            finished: Instant::now(),
            buckets,
        };
        let mut stats = times.stats();
        stats.early_gradients = pass.early_gradients;
        stats.anchored_taps = pass.anchored_taps;
        tracing::trace!(
            buckets = stats.buckets,
            during_backward = stats.buckets_launched_during_backward,
            "buckets launched while backward ran"
        );
        self.last_stats = Some(stats);
        self.step += 1;
        self.record(&times);
    }

    /// Broadcasts `root`'s buffers and writes them into the wrapped module, blocking.
    fn sync_buffers_from(&mut self, root: usize) -> Result<(), DdpError> {
        let pending = self.buffers.start::<B, M>(&self.pg, self.inner(), root)?;
        self.land_buffers(pending)
    }

    fn land_buffers(&mut self, buffers: Option<PendingBuffers>) -> Result<(), DdpError> {
        match buffers {
            Some(pending) => {
                // Into a copy (its tensors are shared handles): if the broadcast fails, the
                // wrapper keeps its module, for `module()` or an emergency save after the error.
                let module = self.buffers.finish::<B, M>(pending, self.inner().clone())?;
                self.module = Some(module);
            }
            None => self.buffers.settle_local::<B, M>(self.inner()),
        }
        Ok(())
    }

    /// Applies `optimizer` with `grads` (from [`backward`](Self::backward)) to the module.
    ///
    /// Outputs of `forward` calls made before it (an evaluation between `backward` and the
    /// step) can no longer be back-propagated: their gradients belong to the old weights, so
    /// such a `backward` fails ([`DdpError::StaleForward`]). Run the next forward after the
    /// step.
    pub fn optimizer_step<O: Optimizer<M, B>>(
        &mut self,
        optimizer: &mut O,
        lr: f64,
        grads: GradientsParams,
    ) {
        let start = Instant::now();
        let module = self.module.take().expect("module present");
        self.module = Some(optimizer.step(lr, module, grads));
        self.reducer.weights_changed();
        self.passes.forget();
        if let Some(t) = self
            .timeline
            .as_mut()
            .filter(|_| self.step as usize <= self.config.timeline_steps)
        {
            t.record_optimizer(self.step, start, Instant::now());
            self.write_timeline();
        }
    }

    /// Timings of the last synchronised step: backward, communication, and how much of the
    /// communication ran during backward.
    pub fn last_step_stats(&self) -> Option<&StepStats> {
        self.last_stats.as_ref()
    }

    /// Global slot lists per bucket (a test hook: feature `test-hooks`).
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn bucket_assignment(&self) -> Vec<Vec<usize>> {
        self.reducer.bucket_slots()
    }
}
