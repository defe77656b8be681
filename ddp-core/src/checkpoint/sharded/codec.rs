//! A rank's shard to bytes and back: its model tensors as safetensors (burn's
//! `SafetensorsStore`, canonical header, like the rank-0 checkpoint's model) and its
//! optimizer entries as burn's `BinBytesRecorder` record, full precision, keyed by `ParamId`
//! (the bytes the rank-0 checkpoint's optimizer file holds, restricted to the shard).

use super::super::canonical::canonical_safetensors;
use super::super::error::CheckpointError;
use super::error::ShardedCheckpointError;
use super::ownership::Ownership;
use super::safetensors;
use burn::module::ParamId;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Record, Recorder};
use burn::store::{ModuleSnapshot, SafetensorsStore};
use burn::tensor::backend::Backend;
use hashbrown::HashMap;

/// Every tensor of `model` as `(module path, ParamId)`, in module order.
pub(super) fn tensor_ids<B: Backend, M: ModuleSnapshot<B>>(model: &M) -> Vec<(String, ParamId)> {
    model
        .collect(None, None, false)
        .into_iter()
        .filter_map(|s| s.tensor_id.map(|id| (s.full_path(), id)))
        .collect()
}

/// The tensors of `model` that `rank`'s shard holds, as canonical safetensors bytes.
pub(super) fn encode_model_shard<B: Backend, M: ModuleSnapshot<B>>(
    model: &M,
    ownership: &Ownership,
    rank: usize,
    file: &str,
) -> Result<Vec<u8>, CheckpointError> {
    let fail = |reason: String| CheckpointError::SerializeModel {
        file: file.into(),
        reason,
    };
    let paths: Vec<String> = tensor_ids::<B, M>(model)
        .into_iter()
        .filter(|(_, id)| ownership.owner(*id) == rank)
        .map(|(path, _)| path)
        .collect();
    if paths.is_empty() {
        // An empty filter would select every tensor.
        return Ok(safetensors::empty());
    }
    let mut store = SafetensorsStore::from_bytes(None).with_full_paths(paths);
    model
        .save_into(&mut store)
        .map_err(|e| fail(e.to_string()))?;
    let bytes = store.get_bytes().map_err(|e| fail(e.to_string()))?;
    canonical_safetensors(&bytes).map_err(fail)
}

/// A shard's optimizer entries as bytes.
pub(super) fn encode_optimizer_shard<B: Backend, R: Record<B>>(
    record: HashMap<ParamId, R>,
    file: &str,
) -> Result<Vec<u8>, ShardedCheckpointError> {
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    Recorder::<B>::record(&recorder, record, ()).map_err(|e| {
        ShardedCheckpointError::OptimizerState {
            file: file.into(),
            reason: e.to_string(),
        }
    })
}

/// A shard's optimizer entries from bytes, tensors placed on `device`.
pub(super) fn decode_optimizer_shard<B: Backend, R: Record<B>>(
    bytes: Vec<u8>,
    device: &B::Device,
    file: &str,
) -> Result<HashMap<ParamId, R>, ShardedCheckpointError> {
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    Recorder::<B>::load(&recorder, bytes, device).map_err(|e| {
        ShardedCheckpointError::OptimizerState {
            file: file.into(),
            reason: e.to_string(),
        }
    })
}
