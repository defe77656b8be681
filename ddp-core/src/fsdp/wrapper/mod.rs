//! [`FullyShardedDataParallel`]: each rank keeps a `1/world` chunk of every unit's parameters;
//! `forward` all-gathers them, `backward` reduce-scatters the gradients and releases them.

mod backward;
mod checkpoint;

use super::config::FsdpConfig;
use super::device::unit_collectives;
use super::error::FsdpError;
use super::layout::{Layout, Slot};
use super::unit_reducer::{FsdpStepStats, UnitComm, UnitReducer};
use crate::engine::model_sync::{broadcast_module, verify_same_model};
use crate::engine::params::{ParamKind, ParamTable};
use crate::engine::tap::{TapBackend, TappedCopy, TappedPasses};
use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use ddp_comm::ProcessGroup;
use std::collections::HashMap;
use std::sync::Arc;

/// This rank's chunk of every unit, one flat tensor per unit: the module the optimizer steps.
///
/// Optimizers that work element by element (SGD with momentum, Adam, AdamW, RMSprop, AdaGrad,
/// weight decay) step a chunk exactly as they would step the parameters it holds. Gradient
/// clipping by norm inside burn's optimizer works per tensor, so here per chunk: clip before
/// the step instead, over the whole gradient, if you need it.
#[derive(Module, Debug)]
pub struct ShardedParams<B: Backend> {
    chunks: Vec<Param<Tensor<B, 1>>>,
}

impl<B: Backend> ShardedParams<B> {
    /// The chunks' ids, one per unit in order.
    pub(super) fn ids(&self) -> Vec<ParamId> {
        self.chunks.iter().map(|c| c.id).collect()
    }
}

/// This rank's averaged gradient chunks, from [`FullyShardedDataParallel::backward`], for
/// [`FullyShardedDataParallel::optimizer_step`].
#[derive(Debug)]
pub struct ShardedGradients {
    grads: GradientsParams,
    elements: usize,
}

impl ShardedGradients {
    pub(super) fn new(grads: GradientsParams, elements: usize) -> Self {
        ShardedGradients { grads, elements }
    }

    /// Bytes of the gradient chunks this rank holds (its `1/world` of every unit, padding
    /// included).
    pub fn bytes(&self) -> u64 {
        self.elements as u64 * 4
    }
}

/// Fully sharded data parallelism (the idea of PyTorch FSDP2's `fully_shard`, ZeRO stage 3):
/// between steps each rank holds `1/world` of the trainable parameters, of their gradients and
/// of the optimizer state.
///
/// A step is `forward`, `backward`, `optimizer_step`, on every rank:
/// - [`forward`](Self::forward) all-gathers every unit's parameters (the units' all-gathers run
///   together) and runs your closure on the whole model;
/// - [`backward`](Self::backward) computes the local gradients, releases the gathered
///   parameters, and reduce-scatters each unit's gradient (`Avg`), so each rank keeps the
///   averaged gradient of its chunk only;
/// - [`optimizer_step`](Self::optimizer_step) steps the chunks with any burn optimizer built
///   for [`ShardedParams`].
///
/// See the [module docs](super) for what burn 0.21 allows (and does not) between forward and
/// backward.
pub struct FullyShardedDataParallel<B: TapBackend, M: AutodiffModule<B>> {
    /// The model; its trainable parameters are empty placeholders except between `forward`
    /// and `backward`.
    module: M,
    layout: Layout,
    /// The unit prefixes, to lay out a module loaded from a checkpoint (its `ParamId`s).
    prefixes: Vec<String>,
    shards: Option<ShardedParams<B>>,
    gathered: bool,
    /// Which float tensors (in module order) are buffers (batch norm's running statistics):
    /// rank 0's travel to every rank after each backward, as DDP does.
    buffers: Vec<bool>,
    pg: ProcessGroup,
    device: B::Device,
    poisoned: Option<String>,
    /// Receives the tapped gradients and starts each unit's reduce-scatter during backward.
    reducer: Arc<UnitReducer<B::InnerBackend>>,
    /// The taps of the forwards since the last backward, anchored where the learned plan says
    /// (DDP's automatic overlap, always on here).
    passes: TappedPasses<B::InnerBackend>,
    /// Backwards so far: the taps of a forward carry it.
    generation: u64,
    /// Whether the units' launch order was taken from rank 0's completion order.
    relaid: bool,
    last_stats: Option<FsdpStepStats>,
}

impl<B: TapBackend, M: AutodiffModule<B>> std::fmt::Debug for FullyShardedDataParallel<B, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FullyShardedDataParallel")
            .field("rank", &self.pg.rank())
            .field("world", &self.pg.world_size())
            .field("units", &self.units())
            .field("gathered", &self.gathered)
            .field("poisoned", &self.poisoned)
            .finish()
    }
}

impl<B: TapBackend, M: AutodiffModule<B>> FullyShardedDataParallel<B, M> {
    /// Shards `module` across the group: checks that every rank built the same model, takes
    /// rank 0's weights (as DDP does), keeps this rank's chunk of every unit and releases the
    /// rest. Collective: every rank calls it.
    pub fn new(module: M, pg: ProcessGroup, config: FsdpConfig) -> Result<Self, FsdpError> {
        crate::cpu_fast_path::prepare_once::<B::Device>(pg.rank());
        let table = ParamTable::describe::<B, M>(&module);
        verify_same_model(&pg, &table).map_err(FsdpError::Setup)?;
        let module = broadcast_module::<B, M>(&pg, module, &table).map_err(FsdpError::Setup)?;
        let (world, rank) = (pg.world_size(), pg.rank());
        let layout = Layout::plan(&module, config.units(), world)?;
        let buffers: Vec<bool> = table
            .kinds()
            .into_iter()
            .map(|k| k == ParamKind::Buffer)
            .collect();
        let device = trainable_device(&module, &layout).unwrap_or_default();
        // Described again: the module now carries rank 0's parameter ids.
        let table = ParamTable::describe::<B, M>(&module);
        let comm = match unit_collectives::<B::InnerBackend>(&pg, config.collectives(), &device)? {
            Some(units) => {
                tracing::info!(
                    rank = pg.rank(),
                    communicator = units.name(),
                    "FSDP: units are gathered and reduce-scattered on the device"
                );
                UnitComm::Device(units, device.clone())
            }
            None => UnitComm::Host,
        };
        let reducer = Arc::new(UnitReducer::new(pg.clone(), &layout, &table, comm));
        let (module, shards) = shard_module(module, &layout, world, rank, &device);
        tracing::debug!(
            units = layout.units.len(),
            chunk_elements = layout.chunk_elements(world),
            "FSDP: model sharded"
        );
        Ok(FullyShardedDataParallel {
            module,
            layout,
            prefixes: config.units().to_vec(),
            shards: Some(shards),
            gathered: false,
            buffers,
            pg,
            device,
            poisoned: None,
            reducer,
            passes: TappedPasses::new(table.kinds(), true),
            generation: 0,
            relaid: false,
            last_stats: None,
        })
    }

    /// Gathers every unit's parameters (if this step has not yet) and runs `f` on the whole
    /// model. Several forwards before one backward gather once.
    ///
    /// # Collective
    /// The first forward after a backward or a step all-gathers the parameters: every rank calls
    /// it at the same point. An evaluation on one rank only (`if rank == 0 { fsdp.forward(..) }`)
    /// waits there for the others until the process group's timeout. Evaluate on every rank
    /// (each on its own shard of the data), or call [`full_module`](Self::full_module) on every
    /// rank and evaluate its copy on one.
    ///
    /// # Errors
    /// [`FsdpError::Poisoned`] after an earlier failure; a failed all-gather (the process
    /// group is then aborted).
    pub fn forward<T>(&mut self, f: impl FnOnce(&M) -> T) -> Result<T, FsdpError> {
        self.check()?;
        self.reducer.warn_strays();
        if !self.gathered {
            self.module = self.gathered_module()?;
            self.gathered = true;
        }
        // Taps on the gathered parameters hand their gradients to the unit reducer; created at
        // each parameter's first use and anchored where the learned plan says (DDP's
        // automatic overlap), so a unit's gradients are complete right after its backward.
        Ok(self.passes.run(
            self.module.clone(),
            self.reducer.clone(),
            self.generation,
            TappedCopy::DroppedAfterForward,
            f,
        ))
    }

    /// Steps this rank's chunks with `optim` (built for [`ShardedParams`]) at learning rate
    /// `lr`. The next `forward` gathers the updated parameters.
    pub fn optimizer_step<O: Optimizer<ShardedParams<B>, B>>(
        &mut self,
        optim: &mut O,
        lr: f64,
        grads: ShardedGradients,
    ) -> Result<(), FsdpError> {
        self.check()?;
        if self.gathered {
            // A forward since the backward (evaluation, logging) holds the old values; its
            // taps will never see a backward.
            self.release();
            self.forget_forwards();
        }
        let Some(shards) = self.shards.take() else {
            return Err(self.poison(poisoned_shards()));
        };
        self.shards = Some(optim.step(lr, shards, grads.grads));
        Ok(())
    }

    /// The whole model with its current parameters, on every rank (for evaluation and
    /// checkpoints). Collective: every rank calls it. The returned module is yours: training
    /// goes on with the shards.
    pub fn full_module(&mut self) -> Result<M, FsdpError> {
        self.check()?;
        self.gathered_module()
    }

    /// The module as it is now: outside a step its trainable parameters are empty
    /// placeholders (frozen parameters are whole).
    pub fn module(&self) -> &M {
        &self.module
    }

    /// The process group.
    pub fn process_group(&self) -> &ProcessGroup {
        &self.pg
    }

    /// The units' names, in the order their chunks appear in [`ShardedParams`] (the marked
    /// prefixes that matched, then `(root)` for the parameters none matched).
    pub fn units(&self) -> Vec<&str> {
        self.layout.units.iter().map(|u| u.name.as_str()).collect()
    }

    /// Bytes of trainable parameters this rank holds between steps: its chunk of every unit.
    pub fn parameter_bytes(&self) -> u64 {
        self.layout.chunk_elements(self.pg.world_size()) as u64 * 4
    }

    /// Trainable parameter elements of the whole model (without padding).
    pub fn total_elements(&self) -> usize {
        self.layout.units.iter().map(|u| u.numel).sum()
    }

    /// The module with every unit's parameters gathered, as leaves that record their
    /// gradients.
    fn gathered_module(&mut self) -> Result<M, FsdpError> {
        if let UnitComm::Device(units, _) = self.reducer.comm().clone() {
            let flats = self.gather_units_on_device(units.as_ref())?;
            return Ok(self
                .module
                .clone()
                .map(&mut InstallFromDevice::<B::InnerBackend> {
                    slots: &self.layout.slots,
                    flats: &flats,
                }));
        }
        let flats = self.gather_units()?;
        Ok(self.module.clone().map(&mut Install {
            slots: &self.layout.slots,
            flats: &flats,
            device: &self.device,
        }))
    }

    /// Every unit's parameters, unpadded, all-gathered on the device communicator.
    fn gather_units_on_device(
        &mut self,
        units: &dyn super::device::UnitCollectives<B::InnerBackend>,
    ) -> Result<Vec<Tensor<B::InnerBackend, 1>>, FsdpError> {
        let Some(shards) = self.shards.as_ref() else {
            return Err(self.poison(poisoned_shards()));
        };
        let chunks: Vec<_> = shards.chunks.iter().map(|c| c.val().inner()).collect();
        let mut flats = Vec::with_capacity(chunks.len());
        for (chunk, unit) in chunks.into_iter().zip(&self.layout.units) {
            match units.all_gather(chunk) {
                // `padded` elements (every rank's chunk), then the padding goes.
                Ok(all) => flats.push(all.narrow(0, 0, unit.numel)),
                Err(e) => {
                    let error = FsdpError::Device {
                        unit: unit.name.clone(),
                        op: e.op,
                        reason: format!("on {}: {}", e.communicator, e.reason),
                    };
                    return Err(self.poison(error));
                }
            }
        }
        Ok(flats)
    }

    fn gather_units(&mut self) -> Result<Vec<Vec<f32>>, FsdpError> {
        let Some(shards) = self.shards.as_ref() else {
            return Err(self.poison(poisoned_shards()));
        };
        let works: Vec<_> = shards
            .chunks
            .iter()
            .map(|c| {
                let values = c.val().into_data().into_vec::<f32>().unwrap_or_default();
                self.pg.all_gather_async(values)
            })
            .collect();
        let mut flats = Vec::with_capacity(works.len());
        for (work, unit) in works.into_iter().zip(&self.layout.units) {
            match work.wait() {
                Ok(mut all) => {
                    // `padded` elements (every rank's chunk), then the padding goes.
                    all.truncate(unit.numel);
                    flats.push(all);
                }
                Err(source) => {
                    return Err(self.poison(FsdpError::Gather {
                        unit: unit.name.clone(),
                        source,
                    }));
                }
            }
        }
        Ok(flats)
    }

    fn release(&mut self) {
        self.module = self.module.clone().map(&mut Release {
            slots: &self.layout.slots,
        });
        self.gathered = false;
    }

    fn check(&self) -> Result<(), FsdpError> {
        match &self.poisoned {
            Some(first) => Err(FsdpError::Poisoned {
                first: first.clone(),
            }),
            None => Ok(()),
        }
    }

    fn poison(&mut self, e: FsdpError) -> FsdpError {
        let reason = e.to_string();
        tracing::error!(%reason, "FSDP failed; aborting the process group");
        self.pg.abort(&reason);
        if let UnitComm::Device(units, _) = self.reducer.comm() {
            units.abort(&reason);
        }
        self.poisoned = Some(reason);
        self.release();
        e
    }
}

/// This rank's chunk of every unit of `module` (whose trainable parameters are whole), and
/// the module with them released.
fn shard_module<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: M,
    layout: &Layout,
    world: usize,
    rank: usize,
    device: &B::Device,
) -> (M, ShardedParams<B>) {
    let flats = read_units(&module, layout);
    let chunks = layout
        .units
        .iter()
        .zip(flats)
        .enumerate()
        .map(|(index, (unit, mut flat))| {
            flat.resize(unit.padded, 0.0);
            let c = unit.chunk(world);
            let mine = flat[rank * c..(rank + 1) * c].to_vec();
            let value = Tensor::from_data(TensorData::new(mine, [c]), device);
            // The same id for unit `index` on every rank and run (an optimizer record keyed by
            // it can be loaded again); the module has no other parameters.
            Param::initialized(ParamId::from(index as u64), value.require_grad())
        })
        .collect();
    let module = module.map(&mut Release {
        slots: &layout.slots,
    });
    (module, ShardedParams { chunks })
}

/// The device of the first trainable (sharded) parameter.
fn trainable_device<B: Backend, M: Module<B>>(module: &M, layout: &Layout) -> Option<B::Device> {
    struct First<'a, D> {
        slots: &'a HashMap<ParamId, Slot>,
        device: Option<D>,
    }
    impl<B: Backend> ModuleVisitor<B> for First<'_, B::Device> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if self.device.is_none() && self.slots.contains_key(&param.id) {
                self.device = Some(param.val().device());
            }
        }
    }
    let mut first = First {
        slots: &layout.slots,
        device: None,
    };
    module.visit(&mut first);
    first.device
}

fn poisoned_shards() -> FsdpError {
    FsdpError::Poisoned {
        first: "an optimizer step did not finish".into(),
    }
}

/// Every unit's flat values (unpadded), read from a whole module.
fn read_units<B: Backend, M: Module<B>>(module: &M, layout: &Layout) -> Vec<Vec<f32>> {
    struct Read<'a> {
        slots: &'a HashMap<ParamId, Slot>,
        flats: Vec<Vec<f32>>,
    }
    impl<B: Backend> ModuleVisitor<B> for Read<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(slot) = self.slots.get(&param.id) {
                let values = param
                    .val()
                    .into_data()
                    .into_vec::<f32>()
                    .unwrap_or_default();
                self.flats[slot.unit][slot.offset..slot.offset + slot.numel()]
                    .copy_from_slice(&values);
            }
        }
    }
    let mut read = Read {
        slots: &layout.slots,
        flats: layout.units.iter().map(|u| vec![0.0; u.numel]).collect(),
    };
    module.visit(&mut read);
    read.flats
}

/// Replaces every sharded parameter with an empty tensor of its rank (no elements).
struct Release<'a> {
    slots: &'a HashMap<ParamId, Slot>,
}

impl<B: Backend> ModuleMapper<B> for Release<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        if !self.slots.contains_key(&id) {
            return Param::from_mapped_value(id, tensor, mapper);
        }
        // `empty`, not `zeros`: zeros launches a fill kernel, and CUDA refuses a launch over
        // zero elements (CUDA_ERROR_INVALID_VALUE, seen on an H100 with burn-cuda 0.21).
        let empty = Tensor::<B, D>::empty([0; D], &tensor.device());
        Param::from_mapped_value(id, empty, mapper)
    }
}

/// Puts each sharded parameter's gathered values back, as a leaf that records its gradient.
struct Install<'a, Dev> {
    slots: &'a HashMap<ParamId, Slot>,
    flats: &'a [Vec<f32>],
    device: &'a Dev,
}

impl<B: Backend> ModuleMapper<B> for Install<'_, B::Device> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(slot) = self.slots.get(&id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let values = self.flats[slot.unit][slot.offset..slot.offset + slot.numel()].to_vec();
        let shape: [usize; D] = std::array::from_fn(|i| slot.shape[i]);
        let value =
            Tensor::<B, D>::from_data(TensorData::new(values, shape), self.device).require_grad();
        Param::from_mapped_value(id, value, mapper)
    }
}

/// [`Install`] from flat tensors on the device: each sharded parameter's gathered values, as
/// a view of its unit's flat tensor.
struct InstallFromDevice<'a, I: Backend> {
    slots: &'a HashMap<ParamId, Slot>,
    flats: &'a [Tensor<I, 1>],
}

impl<B: AutodiffBackend> ModuleMapper<B> for InstallFromDevice<'_, B::InnerBackend> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(slot) = self.slots.get(&id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let shape: [usize; D] = std::array::from_fn(|i| slot.shape[i]);
        let values = self.flats[slot.unit]
            .clone()
            .narrow(0, slot.offset, slot.numel())
            .reshape(shape);
        let value = Tensor::<B, D>::from_inner(values).require_grad();
        Param::from_mapped_value(id, value, mapper)
    }
}
