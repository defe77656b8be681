//! [`DistributedDataParallel`]: N processes training one model as if it were one process with
//! an N times larger batch.

use super::config::DdpConfig;
use crate::boundary::{BoundaryFn, with_boundary};
use crate::error::DdpError;
use crate::model_sync::{broadcast_bytes, broadcast_module, verify_same_model};
use crate::params::{Describe, ParamInfo, ReadBuffers, TapMapper, WriteBuffers};
use crate::reducer::{Reducer, Slot};
use crate::tap::{TapBackend, TapScope};
use crate::timeline::{StepStats, StepTimes, Timeline};
use burn::module::{AutodiffModule, ParamId};
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::Tensor;
use burn::tensor::ops::FloatTensor;
use ddp_comm::ProcessGroup;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// Wraps a burn module for data-parallel training over a [`ProcessGroup`].
///
/// - **Construction** forces lazy initialisation, checks that every rank holds the same model
///   (paths, shapes, types; a mismatch fails on every rank naming the first differing
///   parameter), and makes every rank equal to rank 0 (values, buffers and `ParamId`s).
/// - [`forward`](Self::forward) runs your forward on a copy of the module whose trainable
///   parameters pass through gradient taps (and first copies buffers from rank 0 if
///   [`DdpConfig::broadcast_buffers`]).
/// - [`backward`](Self::backward) runs backward; gradients go into buckets whose all-reduces
///   start as soon as they fill, and you get back averaged `GradientsParams` keyed by the
///   module's `ParamId`s, identical on every rank.
/// - [`backward_no_sync`](Self::backward_no_sync) accumulates locally (gradient accumulation);
///   the next `backward` reduces the sum.
/// - [`optimizer_step`](Self::optimizer_step) applies your optimizer to the wrapped module.
///
/// See the [crate docs](crate) for a complete training loop.
pub struct DistributedDataParallel<B: TapBackend, M: AutodiffModule<B>> {
    module: Option<M>,
    pg: ProcessGroup,
    config: DdpConfig,
    trainable: Arc<Vec<bool>>,
    has_buffers: bool,
    reducer: Arc<Reducer<B::InnerBackend>>,
    forward_times: Option<(Instant, Instant)>,
    last_stats: Option<StepStats>,
    timeline: Option<Timeline>,
    step: u64,
    /// The taps of the last forward; cleared after backward.
    scope: Option<Arc<TapScope<B::InnerBackend>>>,
}

impl<B: TapBackend, M: AutodiffModule<B>> std::fmt::Debug for DistributedDataParallel<B, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistributedDataParallel")
            .field("rank", &self.pg.rank())
            .field("world_size", &self.pg.world_size())
            .field("buckets", &self.reducer.num_buckets())
            .field("config", &self.config)
            .finish()
    }
}

/// A module's parameters grouped into reducer slots.
struct SlotPlan {
    slots: Vec<Slot>,
    index_to_slot: Vec<Option<usize>>,
}

fn plan_slots(params: &[ParamInfo]) -> SlotPlan {
    let mut by_id: HashMap<ParamId, usize> = HashMap::new();
    let mut slots: Vec<Slot> = Vec::new();
    let index_to_slot = params
        .iter()
        .map(|p| {
            if !p.trainable {
                return None;
            }
            let slot = *by_id.entry(p.id).or_insert_with(|| {
                slots.push(Slot {
                    path: p.path.clone(),
                    numel: p.numel(),
                    taps: 0,
                    unpack: p.unpack.clone(),
                    register: p.register.clone(),
                });
                slots.len() - 1
            });
            slots[slot].taps += 1;
            Some(slot)
        })
        .collect();
    SlotPlan {
        slots,
        index_to_slot,
    }
}

fn describe<B: TapBackend, M: AutodiffModule<B>>(module: &M) -> Vec<ParamInfo> {
    let mut d = Describe::<B>::new();
    module.visit(&mut d);
    d.params
}

impl<B: TapBackend, M: AutodiffModule<B>> DistributedDataParallel<B, M> {
    /// Wraps `module`; every rank of `pg` must call it with the same model architecture.
    ///
    /// # Collective
    /// All ranks of `pg` call it at the same point.
    ///
    /// # Errors
    /// [`DdpError::ModelMismatch`] on every rank when the models differ;
    /// [`DdpError::Comm`] when a peer fails; [`DdpError::InvalidConfig`].
    pub fn new(module: M, pg: ProcessGroup, config: DdpConfig) -> Result<Self, DdpError> {
        config.validate()?;
        let params = describe::<B, M>(&module);
        verify_same_model(&pg, &params)?;
        let device = module.devices().into_iter().next().ok_or_else(|| {
            DdpError::InvalidConfig("the module has no parameters and no device".into())
        })?;
        let module = broadcast_module::<B, M>(&pg, module, &device)?;
        // Ids (and so slots) come from rank 0 now: describe again.
        let params = describe::<B, M>(&module);
        let trainable = Arc::new(params.iter().map(|p| p.trainable).collect::<Vec<_>>());
        let has_buffers = params.iter().any(|p| !p.trainable);
        let plan = plan_slots(&params);
        let mib = |v: f64| (v * (1u64 << 20) as f64) as usize;
        let reducer = Arc::new(Reducer::new(
            pg.clone(),
            plan.slots,
            plan.index_to_slot,
            config.compression,
            mib(config.first_bucket_cap_mb),
            mib(config.bucket_cap_mb),
        ));
        let timeline = match (&config.timeline_path, pg.rank()) {
            (Some(_), 0) => Some(Timeline::new(pg.global_rank())),
            _ => None,
        };
        tracing::info!(
            rank = pg.rank(),
            params = params.iter().filter(|p| p.trainable).count(),
            buffers = params.iter().filter(|p| !p.trainable).count(),
            buckets = reducer.num_buckets(),
            "DDP ready: every rank holds rank 0's model"
        );
        Ok(DistributedDataParallel {
            module: Some(module),
            pg,
            config,
            trainable,
            has_buffers,
            reducer,
            forward_times: None,
            last_stats: None,
            timeline,
            step: 0,
            scope: None,
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

    /// Replaces the module (for example with one loaded from a checkpoint). The new module must
    /// have the same parameters (ids and shapes) on every rank.
    pub fn set_module(&mut self, module: M) {
        self.module = Some(module);
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
    /// When the model has buffers and [`DdpConfig::broadcast_buffers`] is on, every rank must call
    /// `forward` the same number of times (it copies buffers from rank 0).
    pub fn forward<O>(&mut self, f: impl FnOnce(&M) -> O) -> Result<O, DdpError> {
        if self.has_buffers && self.config.broadcast_buffers {
            self.sync_buffers()?;
        }
        let start = Instant::now();
        let scope = Arc::new(TapScope::new(self.reducer.clone()));
        let tapped = self.inner().clone().map(&mut TapMapper::<B>::new(
            self.trainable.clone(),
            scope.clone(),
        ));
        let boundary_scope = scope.clone();
        let boundary: BoundaryFn = Box::new(move |t| match t.downcast::<FloatTensor<B>>() {
            Ok(p) => Box::new(B::boundary(*p, &boundary_scope)),
            Err(other) => other,
        });
        let out = with_boundary(boundary, || f(&tapped));
        drop(tapped);
        if let Some(old) = self.scope.replace(scope) {
            old.clear();
        }
        self.forward_times = Some((start, Instant::now()));
        Ok(out)
    }

    fn sync_buffers(&mut self) -> Result<(), DdpError> {
        let mut read = ReadBuffers::new(self.trainable.clone());
        self.inner().visit(&mut read);
        let bytes: Vec<u8> = if self.pg.rank() == 0 {
            bytemuck_f32(&read.values)
        } else {
            Vec::new()
        };
        let bytes = broadcast_bytes(&self.pg, bytes, 0)?;
        if self.pg.rank() != 0 {
            let values: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            if values.len() != read.values.len() {
                return Err(DdpError::ModelMismatch(format!(
                    "rank 0 has {} buffer values, rank {} has {}",
                    values.len(),
                    self.pg.rank(),
                    read.values.len()
                )));
            }
            let module = self.module.take().expect("module present");
            self.module = Some(module.map(&mut WriteBuffers::new(self.trainable.clone(), values)));
        }
        Ok(())
    }

    /// Runs backward from `loss` and returns gradients averaged over all ranks, keyed by the
    /// module's `ParamId`s, for your optimizer. Parameters that got no gradient on a rank count
    /// as zeros there.
    ///
    /// # Collective
    /// Every rank calls it once per step.
    ///
    /// # Errors
    /// [`DdpError::Comm`] when a peer fails; [`DdpError::Misuse`] when no gradient reached DDP
    /// (the forward did not go through [`forward`](Self::forward)).
    pub fn backward<const D: usize>(
        &mut self,
        loss: Tensor<B, D>,
    ) -> Result<GradientsParams, DdpError> {
        self.reducer.begin(true)?;
        let start = Instant::now();
        let _local = loss.backward();
        let end = Instant::now();
        let early = self.scope.as_ref().map_or(0, |s| s.early_gradients());
        self.clear_scope();
        let (grads, buckets) = self.reducer.finish()?.ok_or_else(|| {
            DdpError::Misuse("internal error: synchronised backward returned no gradients".into())
        })?;
        let times = StepTimes {
            forward: self.forward_times.take().unwrap_or((start, start)),
            backward: (start, end),
            finished: Instant::now(),
            buckets,
        };
        let mut stats = times.stats();
        stats.early_gradients = early;
        self.last_stats = Some(stats);
        self.step += 1;
        self.record(&times)?;
        Ok(grads)
    }

    /// Runs backward from `loss` and accumulates the gradients locally, without communication
    /// (PyTorch's `no_sync`). The next [`backward`](Self::backward) adds its gradients and
    /// all-reduces the sum: k micro-batches give the gradient of their sum.
    pub fn backward_no_sync<const D: usize>(&mut self, loss: Tensor<B, D>) -> Result<(), DdpError> {
        self.reducer.begin(false)?;
        let _local = loss.backward();
        self.clear_scope();
        self.reducer.finish()?;
        Ok(())
    }

    /// Applies `optimizer` with `grads` (from [`backward`](Self::backward)) to the module.
    pub fn optimizer_step<O: Optimizer<M, B>>(
        &mut self,
        optimizer: &mut O,
        lr: f64,
        grads: GradientsParams,
    ) {
        let start = Instant::now();
        let module = self.module.take().expect("module present");
        self.module = Some(optimizer.step(lr, module, grads));
        if let Some(t) = self
            .timeline
            .as_mut()
            .filter(|_| self.step as usize <= self.config.timeline_steps)
        {
            t.record_optimizer(self.step, start, Instant::now());
            if let Err(e) = self.write_timeline() {
                tracing::warn!(error = %e, "could not write the timeline");
            }
        }
    }

    fn clear_scope(&mut self) {
        if let Some(scope) = self.scope.take() {
            scope.clear();
        }
    }

    /// Timings of the last synchronised step: backward, communication, and how much of the
    /// communication ran during backward.
    pub fn last_step_stats(&self) -> Option<&StepStats> {
        self.last_stats.as_ref()
    }

    /// Global slot lists per bucket (for tests and diagnostics).
    pub fn bucket_assignment(&self) -> Vec<Vec<usize>> {
        self.reducer.bucket_slots()
    }

    fn record(&mut self, times: &StepTimes) -> Result<(), DdpError> {
        let (Some(t), Some(path)) = (self.timeline.as_mut(), self.config.timeline_path.as_ref())
        else {
            return Ok(());
        };
        if self.step as usize > self.config.timeline_steps {
            return Ok(());
        }
        t.record_step(self.step, times);
        let _ = path;
        self.write_timeline()
    }

    fn write_timeline(&self) -> Result<(), DdpError> {
        let (Some(t), Some(path)) = (self.timeline.as_ref(), self.config.timeline_path.as_ref())
        else {
            return Ok(());
        };
        std::fs::write(path, t.to_json()).map_err(|source| DdpError::Timeline {
            path: path.clone(),
            source,
        })
    }
}

fn bytemuck_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
