//! Gathering every rank's shard of the optimizer state on rank 0, as one record keyed by
//! `ParamId`: the same record a plain (unsharded) optimizer would have, so a checkpoint written
//! from it resumes with or without ZeRO, at any world size.

use super::error::ZeroError;
use burn::module::ParamId;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Record, Recorder};
use burn::tensor::backend::Backend;
use ddp_comm::ProcessGroup;
use hashbrown::HashMap;

/// Point-to-point tags of the gather (length, then bytes).
const TAG_LEN: u32 = 0x5a45_0001;
const TAG_BYTES: u32 = 0x5a45_0002;

/// A shard's record as bytes (burn's `BinBytesRecorder`, full precision).
pub(crate) fn encode<B: Backend, R: Record<B>>(
    record: HashMap<ParamId, R>,
) -> Result<Vec<u8>, ZeroError> {
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    Recorder::<B>::record(&recorder, record, ()).map_err(|e| ZeroError::Consolidate {
        context: "serialising this rank's shard",
        reason: e.to_string(),
    })
}

fn decode<B: Backend, R: Record<B>>(
    bytes: Vec<u8>,
    device: &B::Device,
    from: usize,
) -> Result<HashMap<ParamId, R>, ZeroError> {
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    Recorder::<B>::load(&recorder, bytes, device).map_err(|e| ZeroError::Consolidate {
        context: "decoding a shard",
        reason: format!("the shard of rank {from}: {e}"),
    })
}

/// Sends `mine` to rank 0; on rank 0 returns every rank's entries merged (tensors placed on
/// `device`), elsewhere `None`.
///
/// # Collective
/// Every rank calls it at the same point.
pub(crate) fn gather_on_rank0<B: Backend, R: Record<B>>(
    pg: &ProcessGroup,
    mine: HashMap<ParamId, R>,
    device: &B::Device,
) -> Result<Option<HashMap<ParamId, R>>, ZeroError> {
    let comm = |context: &'static str| {
        move |e: ddp_comm::CommError| ZeroError::Consolidate {
            context,
            reason: e.to_string(),
        }
    };
    if pg.rank() != 0 {
        let bytes = encode::<B, R>(mine)?;
        pg.send(&[bytes.len() as i64], 0, TAG_LEN)
            .map_err(comm("sending a shard's length"))?;
        pg.send(&bytes, 0, TAG_BYTES)
            .map_err(comm("sending a shard"))?;
        return Ok(None);
    }
    let mut all = mine;
    for from in 1..pg.world_size() {
        let mut len = [0i64];
        pg.recv(&mut len, from, TAG_LEN)
            .map_err(comm("receiving a shard's length"))?;
        let mut bytes = vec![0u8; len[0].max(0) as usize];
        pg.recv(&mut bytes, from, TAG_BYTES)
            .map_err(comm("receiving a shard"))?;
        for (id, state) in decode::<B, R>(bytes, device, from)? {
            if all.insert(id, state).is_some() {
                return Err(ZeroError::Consolidate {
                    context: "merging the shards",
                    reason: format!(
                        "parameter {id} has optimizer state on rank {from} and on another rank; \
                         every rank must use the same model and world size"
                    ),
                });
            }
        }
    }
    Ok(Some(all))
}
