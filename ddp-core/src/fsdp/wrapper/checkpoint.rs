//! FSDP checkpoints: [`ShardedCheckpointer`]'s format (each rank writes its shard, rank 0
//! commits atomically), with the optimizer state stored per parameter instead of per chunk
//! (`state.rs`), so that a checkpoint reshards to any world size and also loads under DDP or
//! ZeRO.
//!
//! Saving gathers the units' parameters (as [`full_module`](FullyShardedDataParallel::full_module)
//! does) and, one unit at a time, every rank's chunk of the unit's optimizer state; each rank
//! keeps the state of the parameters it writes (ZeRO's partition) and writes its shard.
//! Loading reads the model and the state of the parameters this rank owns at the new world
//! size, then, one unit at a time, every rank shares what it read and keeps its new chunk.

use super::{FullyShardedDataParallel, ShardedParams, shard_module};
use crate::checkpoint::sharded::{
    Ownership, ShardedCheckpointer, ShardedOptimizerState, StateHolding,
};
use crate::checkpoint::{LoadOutcome, SavedCheckpoint, TrainingState};
use crate::checkpoint::{all_gather_bytes, all_succeeded};
use crate::engine::params::ParamTable;
use crate::engine::tap::TapBackend;
use crate::fsdp::error::FsdpError;
use crate::fsdp::layout::Layout;
use crate::fsdp::state;
use crate::fsdp::unit_reducer::UnitReducer;
use burn::module::{AutodiffModule, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::record::AdaptorRecord;
use burn::optim::{Optimizer, SimpleOptimizer};
use burn::tensor::backend::AutodiffBackend;
use ciborium::Value;
use hashbrown::HashMap;

/// FSDP's optimizer: a burn optimizer (element-wise, see [`ShardedParams`]) over the chunks.
type ChunkOptimizer<O, B> = OptimizerAdaptor<O, ShardedParams<B>, B>;

/// FSDP's optimizer state as a sharded checkpoint holds it: per parameter, this rank's
/// partition (cut out of the units' chunks before a save; dealt back into chunks after a load).
struct UnitOwnedState<O: SimpleOptimizer<B::InnerBackend>, B: AutodiffBackend>(
    Option<HashMap<ParamId, AdaptorRecord<O, B>>>,
);

impl<O, B, M> ShardedOptimizerState<B, M> for UnitOwnedState<O, B>
where
    O: SimpleOptimizer<B::InnerBackend>,
    B: AutodiffBackend,
    M: AutodiffModule<B>,
{
    type Record = AdaptorRecord<O, B>;

    fn holding(&self) -> StateHolding {
        StateHolding::Partitioned
    }

    fn state_to_save(&self) -> HashMap<ParamId, Self::Record> {
        self.0.clone().unwrap_or_default()
    }

    fn install_loaded(&mut self, state: HashMap<ParamId, Self::Record>) {
        self.0 = Some(state);
    }
}

/// What a rank sends for one unit: nothing (no optimizer state), its payload, or its failure.
const HAS_STATE: u8 = 1;
const FAILED: u8 = 0;

impl<B: TapBackend, M: AutodiffModule<B>> FullyShardedDataParallel<B, M> {
    /// Saves the model, `optim`'s state and `state` as sharded checkpoint
    /// `step-<global_step>` with `checkpointer`: each rank writes about `1/world` of the
    /// bytes, rank 0 commits once every shard is written (a crash before leaves the previous
    /// checkpoint the latest). The optimizer state is stored per parameter, so the checkpoint
    /// resumes at any world size, under FSDP ([`load_checkpoint`](Self::load_checkpoint)),
    /// DDP or ZeRO ([`ShardedCheckpointer`]'s loads), and
    /// [`convert_to_full`](crate::checkpoint::sharded::convert_to_full) makes a rank-0
    /// checkpoint of it.
    ///
    /// Memory: the whole model for the duration of the save, and one unit's whole optimizer
    /// state at a time.
    ///
    /// # Collective
    /// Every rank calls it at the same point, with the same `checkpointer` directory.
    ///
    /// # Errors
    /// [`FsdpError::Checkpoint`] (I/O, a peer's failure; nothing is committed),
    /// [`FsdpError::CheckpointState`] when the optimizer's state is not element by element,
    /// the collectives' errors.
    pub fn save_checkpoint<O: SimpleOptimizer<B::InnerBackend>>(
        &mut self,
        checkpointer: &ShardedCheckpointer,
        optim: &ChunkOptimizer<O, B>,
        state: &TrainingState,
    ) -> Result<SavedCheckpoint, FsdpError> {
        self.check()?;
        // Before gathering the full module.
        checkpointer.config().writable("save a checkpoint")?;
        let full = self.full_module()?;
        let (rank, world) = (self.pg.rank(), self.pg.world_size());
        let ownership = Ownership::of::<B, M>(&full, world);
        let mut chunks = optim.to_record();
        let mut mine: Result<HashMap<ParamId, AdaptorRecord<O, B>>, FsdpError> = Ok(HashMap::new());
        for (u, unit) in self.layout.units.iter().enumerate() {
            let fail = |reason: String| FsdpError::CheckpointState {
                unit: unit.name.clone(),
                reason,
            };
            // Every rank takes part in every unit's exchange, even after a failure of its own,
            // so that no peer waits; failures are agreed on before anything is written.
            let payload = match (&mine, chunks.remove(&ParamId::from(u as u64))) {
                (Err(_), _) => failed("an earlier unit failed"),
                (Ok(_), None) => Vec::new(),
                (Ok(_), Some(record)) => match state::encode::<B, _>(record) {
                    Ok(bytes) => with_status(HAS_STATE, bytes),
                    Err(reason) => failed(&reason),
                },
            };
            let pieces = all_gather_bytes(&self.pg, payload)?;
            let Ok(states) = mine.as_mut() else { continue };
            let joined = received(pieces)
                .and_then(|parts| match parts {
                    None => Ok(None),
                    Some(parts) if parts.len() != world => Err(format!(
                        "{} of {world} ranks hold optimizer state for it; the ranks' optimizers \
                         must have stepped the same units",
                        parts.len()
                    )),
                    Some(parts) => {
                        state::join(&parts, &vec![unit.chunk(world); world], unit.padded).map(Some)
                    }
                })
                .map_err(fail);
            match joined {
                Ok(None) => {}
                Ok(Some(whole)) => {
                    for (id, slot) in unit_slots(&self.layout, u) {
                        if !ownership.owns(rank, id) {
                            continue;
                        }
                        let range = slot.offset..slot.offset + slot.numel();
                        let record = state::cut(&whole, range, &slot.shape)
                            .and_then(|v| state::decode::<B, _>(v, &self.device))
                            .map_err(fail);
                        match record {
                            Ok(r) => {
                                states.insert(id, r);
                            }
                            Err(e) => {
                                mine = Err(e);
                                break;
                            }
                        }
                    }
                }
                Err(e) => mine = Err(e),
            }
        }
        let mine = all_succeeded(
            &self.pg,
            mine,
            "cut the FSDP optimizer state into parameters",
        )?;
        Ok(checkpointer.save_state(&full, &UnitOwnedState::<O, B>(Some(mine)), state)?)
    }

    /// Restores the newest valid sharded checkpoint in `checkpointer`'s directory, saved by
    /// [`save_checkpoint`](Self::save_checkpoint) at any world size (or by DDP or ZeRO with
    /// [`ShardedCheckpointer`]), into this wrapper and `optim`: each rank keeps its chunk of
    /// the parameters and of the optimizer state at the current world size. Returns
    /// [`LoadOutcome::Fresh`] when there is none; invalid checkpoints are skipped, as
    /// [`ShardedCheckpointer::load_latest`] does. The data loader position and epoch are in
    /// the outcome's [`TrainingState`].
    ///
    /// A unit's parameters are stepped together, so a DDP or ZeRO checkpoint loads only where
    /// every parameter of a unit was stepped the same number of times: one in which some
    /// parameter got no gradient on some steps (an unused branch) is refused with an error
    /// that says so.
    ///
    /// # Collective
    /// Every rank calls it at the same point, before training resumes.
    ///
    /// # Errors
    /// [`FsdpError::Checkpoint`] when the checkpoint does not fit the model or cannot be
    /// read, [`FsdpError::CheckpointState`], the collectives' errors. When the checkpoint
    /// cannot be used, the wrapper and `optim` are unchanged on every rank; a failed
    /// collective (gathering the parameters) makes the wrapper unusable, as in training.
    pub fn load_checkpoint<O: SimpleOptimizer<B::InnerBackend>>(
        &mut self,
        checkpointer: &ShardedCheckpointer,
        optim: &mut ChunkOptimizer<O, B>,
    ) -> Result<LoadOutcome, FsdpError> {
        self.check()?;
        let mut full = self.full_module()?;
        let mut loaded = UnitOwnedState::<O, B>(None);
        let outcome = checkpointer.load_latest_state(&self.device, &mut full, &mut loaded)?;
        let Some(mut owned) = loaded.0 else {
            return Ok(outcome);
        };
        let (rank, world) = (self.pg.rank(), self.pg.world_size());
        // The loaded module carries the checkpoint's parameter ids: lay it out again.
        let layout = all_succeeded(
            &self.pg,
            Layout::plan(&full, &self.prefixes, world),
            "lay out the loaded model",
        )?;
        let mut chunks: Result<HashMap<ParamId, AdaptorRecord<O, B>>, FsdpError> =
            Ok(HashMap::new());
        for (u, unit) in layout.units.iter().enumerate() {
            let fail = |reason: String| FsdpError::CheckpointState {
                unit: unit.name.clone(),
                reason,
            };
            let slots = unit_slots(&layout, u);
            let payload = match &chunks {
                Err(_) => failed("an earlier unit failed"),
                Ok(_) => match owned_pieces(&slots, &mut owned) {
                    Ok(None) => Vec::new(),
                    Ok(Some(bytes)) => with_status(HAS_STATE, bytes),
                    Err(reason) => failed(&reason),
                },
            };
            let gathered = all_gather_bytes(&self.pg, payload)?;
            let Ok(states) = chunks.as_mut() else {
                continue;
            };
            let c = unit.chunk(world);
            let chunk = received(gathered)
                .and_then(|parts| parts.map(|p| in_offset_order(p, slots.len())).transpose())
                .and_then(|parts| {
                    parts
                        .map(|parts| {
                            let sizes: Vec<usize> = slots.iter().map(|(_, s)| s.numel()).collect();
                            let whole = state::join(&parts, &sizes, unit.padded)?;
                            let v = state::cut(&whole, rank * c..(rank + 1) * c, &[c])?;
                            state::decode::<B, AdaptorRecord<O, B>>(v, &self.device)
                        })
                        .transpose()
                })
                .map_err(fail);
            match chunk {
                Ok(Some(record)) => {
                    states.insert(ParamId::from(u as u64), record);
                }
                Ok(None) => {}
                Err(e) => chunks = Err(e),
            }
        }
        let chunks = all_succeeded(
            &self.pg,
            chunks,
            "join the FSDP optimizer state into chunks",
        )?;
        let table = ParamTable::describe::<B, M>(&full);
        self.reducer = std::sync::Arc::new(UnitReducer::new(
            self.pg.clone(),
            &layout,
            &table,
            self.reducer.comm().clone(),
        ));
        self.passes.relayout(table.kinds());
        self.relaid = false;
        let (module, shards) = shard_module(full, &layout, world, rank, &self.device);
        self.module = module;
        self.layout = layout;
        self.shards = Some(shards);
        // A forward made before the load (evaluation) is gone with the old parameters.
        self.gathered = false;
        self.forget_forwards();
        self.last_stats = None;
        *optim = optim.clone().load_record(chunks);
        Ok(outcome)
    }
}

/// The slots of unit `u` with their parameter ids, in the order of the unit's flat buffer.
fn unit_slots(layout: &Layout, u: usize) -> Vec<(ParamId, crate::fsdp::layout::Slot)> {
    let mut slots: Vec<_> = layout
        .slots
        .iter()
        .filter(|(_, s)| s.unit == u)
        .map(|(id, s)| (*id, s.clone()))
        .collect();
    slots.sort_by_key(|(_, s)| s.offset);
    slots
}

/// This rank's pieces of a unit's state: `[offset, record]` for each parameter of the unit
/// whose state it read, as CBOR; `None` when it read none.
fn owned_pieces<B: AutodiffBackend, O: SimpleOptimizer<B::InnerBackend>>(
    slots: &[(ParamId, crate::fsdp::layout::Slot)],
    owned: &mut HashMap<ParamId, AdaptorRecord<O, B>>,
) -> Result<Option<Vec<u8>>, String> {
    let mut pieces = Vec::new();
    for (id, slot) in slots {
        if let Some(record) = owned.remove(id) {
            let value = state::parse(&state::encode::<B, _>(record)?)?;
            pieces.push(Value::Array(vec![
                Value::Integer(slot.offset.into()),
                value,
            ]));
        }
    }
    if pieces.is_empty() {
        return Ok(None);
    }
    state::unparse(&Value::Array(pieces)).map(Some)
}

/// Every rank's `[offset, record]` pieces of a unit, as records in offset order; all of the
/// unit's `count` parameters must have one (a chunk is stepped whole).
fn in_offset_order(parts: Vec<Value>, count: usize) -> Result<Vec<Value>, String> {
    let mut pieces = Vec::new();
    for part in parts {
        let Value::Array(items) = part else {
            return Err("a rank sent a malformed piece".into());
        };
        for item in items {
            let Value::Array(pair) = item else {
                return Err("a rank sent a malformed piece".into());
            };
            let [Value::Integer(offset), record] = <[Value; 2]>::try_from(pair)
                .map_err(|_| "a rank sent a malformed piece".to_string())?
            else {
                return Err("a rank sent a malformed piece".into());
            };
            let offset = u64::try_from(offset).map_err(|_| "a negative offset".to_string())?;
            pieces.push((offset, record));
        }
    }
    if pieces.len() != count {
        return Err(format!(
            "the checkpoint holds optimizer state for {} of its {count} parameters; a unit's \
             parameters are stepped together, so all or none must have state (a parameter that \
             never got a gradient in the run that saved it has none: give it a unit of its own, \
             or resume that run with DDP)",
            pieces.len()
        ));
    }
    pieces.sort_by_key(|(o, _)| *o);
    Ok(pieces.into_iter().map(|(_, r)| r).collect())
}

/// What every rank sent for a unit: `None` when no rank has state, else the parsed payloads
/// of those that have, in rank order.
fn received(pieces: Vec<Vec<u8>>) -> Result<Option<Vec<Value>>, String> {
    let mut values = Vec::new();
    for (rank, p) in pieces.iter().enumerate() {
        match p.split_first() {
            None => {}
            Some((&HAS_STATE, bytes)) => values.push(state::parse(bytes)?),
            Some((_, message)) => {
                return Err(format!(
                    "rank {rank} failed: {}",
                    String::from_utf8_lossy(message)
                ));
            }
        }
    }
    Ok((!values.is_empty()).then_some(values))
}

fn with_status(status: u8, bytes: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 1);
    out.push(status);
    out.extend(bytes);
    out
}

fn failed(reason: &str) -> Vec<u8> {
    with_status(FAILED, reason.as_bytes().to_vec())
}
