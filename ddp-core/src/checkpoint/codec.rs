//! Model and optimizer to bytes and back.
//!
//! - The model goes to safetensors through burn's `SafetensorsStore`: tensor names are module
//!   paths (`fc1.weight`), so other tools (Python's `safetensors`) read it with meaningful names.
//! - burn's optimizer state is keyed by `ParamId`, which is random per process and not part
//!   of safetensors. `param_ids.json` maps each module path to its id, and a restored module
//!   takes the saved ids, so the optimizer state reattaches to the right parameters (on every
//!   rank, since DDP made every rank hold rank 0's ids before the save).
//! - The safetensors header is rewritten in canonical form (sorted keys), so equal tensors
//!   give equal bytes.
//! - The optimizer state goes through burn's `BinBytesRecorder` at full precision. An optimizer
//!   whose record is only part of its state (ZeRO's shard before `consolidate_state`) says so
//!   through [`mark_partial_optimizer_record`], and the save is refused instead of writing it.

use super::canonical::canonical_safetensors;
use super::error::CheckpointError;
use super::manifest::{MODEL_FILE, OPTIMIZER_FILE, PARAM_IDS_FILE};
use burn::module::{AutodiffModule, ModuleMapper, Param, ParamId, Parameter};
use burn::optim::Optimizer;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::store::{ModuleSnapshot, SafetensorsStore};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Int, Tensor};
use std::cell::Cell;
use std::collections::BTreeMap;

thread_local! {
    /// What the last `to_record` on this thread left out, when it gave only part of an
    /// optimizer's state. burn's `Optimizer::to_record` cannot fail, so this is how such a
    /// record reaches the save that called it: the save fails on every rank instead of writing
    /// one rank's shard as if it were the whole state.
    static PARTIAL_RECORD: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// Called from an optimizer's `to_record` when the record it returns is only part of its
/// state; `what` says which part and how to save the whole (it ends the save's error).
pub(crate) fn mark_partial_optimizer_record(what: &'static str) {
    PARTIAL_RECORD.with(|p| p.set(Some(what)));
}

/// Module path to `ParamId` value.
type ParamIds = BTreeMap<String, u64>;

/// The model as safetensors bytes and its `param_ids.json`.
pub(crate) fn encode_model<B: Backend, M: ModuleSnapshot<B>>(
    model: &M,
) -> Result<(Vec<u8>, Vec<u8>), CheckpointError> {
    let fail = |reason: String| CheckpointError::SerializeModel {
        file: MODEL_FILE.into(),
        reason,
    };
    let mut store = SafetensorsStore::from_bytes(None);
    model
        .save_into(&mut store)
        .map_err(|e| fail(e.to_string()))?;
    let bytes = store.get_bytes().map_err(|e| fail(e.to_string()))?;
    // Equal tensors must give equal bytes (burn writes its metadata in a random order).
    let bytes = canonical_safetensors(&bytes).map_err(fail)?;
    let mut ids = ParamIds::new();
    for snapshot in model.collect(None, None, false) {
        if let Some(id) = snapshot.tensor_id {
            ids.insert(snapshot.full_path(), id.val());
        }
    }
    let ids = serde_json::to_vec_pretty(&ids).map_err(CheckpointError::json(format!(
        "serialising {PARAM_IDS_FILE}"
    )))?;
    Ok((bytes, ids))
}

/// Loads safetensors `bytes` into `model` on `device` and gives its parameters the ids in
/// `ids_json`. Every tensor of the model must be in the file and every tensor of the file in
/// the model, with the same shapes.
pub(crate) fn decode_model<B: Backend, M: ModuleSnapshot<B>>(
    model: &mut M,
    device: &B::Device,
    bytes: Vec<u8>,
    ids_json: &[u8],
    name: &str,
    rank: usize,
) -> Result<(), CheckpointError> {
    let fail = |file: &str, reason: String| CheckpointError::LoadModel {
        name: name.to_string(),
        file: file.to_string(),
        rank,
        reason,
    };
    let ids: ParamIds =
        serde_json::from_slice(ids_json).map_err(|e| fail(PARAM_IDS_FILE, e.to_string()))?;
    // `fork`, not `to_device`: on an autodiff backend `to_device` is a recorded op whose
    // output no longer requires gradients.
    let mut loaded = model.clone().fork(device);
    let mut store = SafetensorsStore::from_bytes(Some(bytes));
    let result = loaded
        .load_from(&mut store)
        .map_err(|e| fail(MODEL_FILE, e.to_string()))?;
    if !result.unused.is_empty() {
        return Err(fail(
            MODEL_FILE,
            format!(
                "the file has tensors the model lacks: {}",
                result.unused.join(", ")
            ),
        ));
    }
    let mut mapper = SetIds {
        path: Vec::new(),
        ids: &ids,
        missing: Vec::new(),
    };
    let loaded = loaded.map(&mut mapper);
    if !mapper.missing.is_empty() {
        return Err(fail(
            PARAM_IDS_FILE,
            format!("no parameter id for {}", mapper.missing.join(", ")),
        ));
    }
    *model = loaded;
    Ok(())
}

/// The optimizer state as bytes.
pub(crate) fn encode_optimizer<B, M, O>(optim: &O) -> Result<Vec<u8>, CheckpointError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    PARTIAL_RECORD.with(|p| p.set(None));
    let record = optim.to_record();
    if let Some(what) = PARTIAL_RECORD.with(Cell::take) {
        return Err(CheckpointError::PartialOptimizerState {
            what: what.to_string(),
        });
    }
    Recorder::<B>::record(&recorder, record, ()).map_err(|e| CheckpointError::SerializeOptimizer {
        file: OPTIMIZER_FILE.into(),
        reason: e.to_string(),
    })
}

/// Restores the optimizer state from `bytes`, its tensors on `device`.
pub(crate) fn decode_optimizer<B, M, O>(
    optim: &mut O,
    device: &B::Device,
    bytes: Vec<u8>,
    name: &str,
    rank: usize,
) -> Result<(), CheckpointError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let record = Recorder::<B>::load(&recorder, bytes, device).map_err(|e| {
        CheckpointError::LoadOptimizer {
            name: name.to_string(),
            file: OPTIMIZER_FILE.into(),
            rank,
            reason: e.to_string(),
        }
    })?;
    *optim = optim.clone().load_record(record);
    Ok(())
}

/// Gives every parameter the id saved for its path (same path rules as burn-store's collector
/// without enum-variant skipping).
struct SetIds<'a> {
    path: Vec<String>,
    ids: &'a ParamIds,
    missing: Vec<String>,
}

impl SetIds<'_> {
    fn id_for(&mut self, current: ParamId) -> ParamId {
        let path = self.path.join(".");
        match self.ids.get(&path) {
            Some(id) => ParamId::from(*id),
            None => {
                self.missing.push(path);
                current
            }
        }
    }

    /// `param` with the id saved for the current path: the one mapping of every kind of tensor.
    fn with_saved_id<T: Parameter>(&mut self, param: Param<T>) -> Param<T> {
        let (id, tensor, mapper) = param.consume();
        Param::from_mapped_value(self.id_for(id), tensor, mapper)
    }
}

impl<B: Backend> ModuleMapper<B> for SetIds<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        self.with_saved_id(param)
    }

    fn map_int<const D: usize>(
        &mut self,
        param: Param<Tensor<B, D, Int>>,
    ) -> Param<Tensor<B, D, Int>> {
        self.with_saved_id(param)
    }

    fn map_bool<const D: usize>(
        &mut self,
        param: Param<Tensor<B, D, Bool>>,
    ) -> Param<Tensor<B, D, Bool>> {
        self.with_saved_id(param)
    }
}
