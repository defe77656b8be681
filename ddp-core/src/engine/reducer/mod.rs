//! The reducer: the bucket bookkeeping of one backward, in one place.
//!
//! 1. [`Reducer::begin`] arms it: every trainable parameter expects one gradient per tap per
//!    forward made since the last backward (a parameter used twice has two taps; two forwards
//!    whose outputs feed one loss give every tap two events, each counted once).
//! 2. Each tap event ([`GradientSink::on_gradient`]) is kept by the [`BucketReduction`] in its
//!    parameter's slot (added to what is there for tied parameters and `no_sync` accumulation).
//!    When a slot has all its events, its bucket counts it; when a bucket is full it is
//!    launched, but only after every earlier bucket, so all ranks start the same collectives in
//!    the same order.
//! 3. [`Reducer::finish`] launches what is left (a parameter this rank did not use counts as
//!    zeros, so no rank waits forever), agrees with the other ranks on which parameters *some*
//!    rank used, waits for the buckets in order and builds `GradientsParams`: parameters no rank
//!    used get no gradient at all, so the optimizer leaves them alone, as PyTorch does.
//! 4. After the first synchronised backward, buckets are laid out again in the order gradients
//!    arrived on rank 0 (every rank adopts it).
//!
//! *How* a bucket is reduced is the reduction's business ([`reduction`]).

mod device;
mod flat_bucket;
mod hook_reduction;
mod host_grad;
mod layout_check;
mod reduction;
mod staged_reduction;

pub(crate) use device::{
    ChunkInFlight, DeviceChoice, DeviceReduction, DeviceShards, ReductionDevice, ShardCollectives,
    ShardError, StandInDevice, StandInReduction, UnitGradient, choose_device,
};
#[cfg(feature = "cuda")]
pub(crate) use device::{NcclDevice, NcclReduction, nccl_can_run};
pub(crate) use hook_reduction::HookReduction;
pub(crate) use host_grad::read_to_host;
pub(crate) use reduction::{BucketReduction, HostReduction, LocalReduction, Slot};
pub(crate) use staged_reduction::StagedReduction;

use crate::engine::arrival_order::{OrderError, agree_on_rank0_order};
use crate::engine::bucket::{BucketCaps, BucketLayout};
use crate::engine::params::{ParamKind, ParamTable};
use crate::engine::tap::{GradientSink, InWrapperBackward};
use crate::error::DdpError;
use burn::module::ParamId;
use burn::optim::GradientsParams;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use ddp_comm::{ProcessGroup, ReduceOp, WorkTiming};
use reduction::{BucketPosition, FullBucket, Held, PendingBucket};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// Timings of one synchronised backward, for the timeline and overlap statistics.
#[derive(Debug, Clone, Default)]
pub(crate) struct BucketTimes {
    /// When each bucket's last gradient arrived (its all-reduce could start).
    pub(crate) ready: Vec<Option<Instant>>,
    /// When each bucket's all-reduce ran on the communication thread.
    pub(crate) comm: Vec<Option<WorkTiming>>,
    /// When each bucket's result was turned into gradient tensors.
    pub(crate) unpacked: Vec<Option<(Instant, Instant)>>,
    /// Buckets launched by tap events, i.e. while backward was running (the others were
    /// launched by `finish`, after it).
    pub(crate) launched_during_backward: usize,
}

/// Where the reducer is between calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Between backwards: tap events now come from a plain `loss.backward()`.
    Idle,
    /// Inside `ddp.backward` (`sync`) or `ddp.backward_no_sync`; `shadow` on a rank that has
    /// joined (no data left): it only answers the others' collectives.
    Backward { sync: bool, shadow: bool },
}

struct State<I: Backend> {
    layout: BucketLayout,
    /// Per slot: its gradient so far (kept across `no_sync` backwards).
    held: Vec<Option<Held<I>>>,
    /// Per slot: events still expected in this backward.
    events_left: Vec<usize>,
    /// Per slot: whether this rank produced a gradient since the last synchronised backward.
    used: Vec<bool>,
    /// Per bucket: slots still incomplete.
    bucket_waiting: Vec<usize>,
    in_flight: Vec<Option<Box<dyn PendingBucket<I>>>>,
    next_launch: usize,
    phase: Phase,
    /// The forward generation: taps of forwards made since the last backward carry it.
    generation: u64,
    forwards: usize,
    events: usize,
    /// Tap events between backwards, from a plain `loss.backward()`.
    stray_events: usize,
    /// Tap events between backwards, during another wrapper's backward.
    foreign_events: usize,
    arrival: Vec<usize>,
    rebuilt: bool,
    /// Whether buckets were laid out again from a backward whose taps were anchored
    /// (automatic overlap): the first re-layout follows the learning step's plain taps, whose
    /// order mixes layers; this second one follows the order anchored taps produce.
    relaid_anchored: bool,
    /// Whether the ranks compared their bucket layouts since the last re-layout.
    layout_verified: bool,
    times: BucketTimes,
    /// The first error of this backward; later events are dropped.
    error: Option<DdpError>,
    /// How many ranks this step's summed gradients are divided by: the ranks still training
    /// (all of them unless some have joined), or the whole world if the user asked for
    /// PyTorch's `divide_by_initial_world_size`.
    averaged_over: usize,
}

/// Shared between the DDP wrapper and the taps (as their [`GradientSink`]).
pub(crate) struct Reducer<I: Backend> {
    state: Mutex<State<I>>,
    slots: Vec<Slot<I>>,
    /// Parameter index (module order) to slot; `None` for buffers and frozen parameters.
    slot_of: Vec<Option<usize>>,
    reduction: Arc<dyn BucketReduction<I>>,
    world: usize,
    /// For the control collectives (used parameters, bucket order); `None` at world size 1.
    pg: Option<ProcessGroup>,
    /// The bucket caps, already lowered for this model's size.
    caps: BucketCaps,
}

impl<I: Backend> Reducer<I> {
    /// A reducer for `table`'s trainable parameters; `pg` is `None` at world size 1.
    /// `configured` are the configured caps, lowered to `1/min_buckets` of the model's
    /// gradient bytes for small models ([`BucketCaps::for_model`]).
    pub(crate) fn new(
        table: &ParamTable<I>,
        reduction: Arc<dyn BucketReduction<I>>,
        pg: Option<ProcessGroup>,
        configured: BucketCaps,
        min_buckets: usize,
    ) -> Self {
        let (slots, slot_of) = plan_slots(table);
        let total_bytes = slots.iter().map(|s| s.numel() * s.dtype.size()).sum();
        let caps =
            BucketCaps::for_model(configured.first, configured.rest, min_buckets, total_bytes);
        // PyTorch's initial order: reverse registration, as backward tends to produce them.
        let order: Vec<usize> = (0..slots.len()).rev().collect();
        let layout = layout(&slots, order, caps);
        let n = slots.len();
        let state = State {
            held: (0..n).map(|_| None).collect(),
            events_left: vec![0; n],
            used: vec![false; n],
            bucket_waiting: Vec::new(),
            in_flight: layout.buckets.iter().map(|_| None).collect(),
            next_launch: 0,
            phase: Phase::Idle,
            generation: 0,
            forwards: 0,
            events: 0,
            stray_events: 0,
            foreign_events: 0,
            arrival: Vec::with_capacity(n),
            rebuilt: false,
            relaid_anchored: false,
            layout_verified: false,
            times: BucketTimes::default(),
            error: None,
            averaged_over: 1,
            layout,
        };
        Reducer {
            state: Mutex::new(state),
            slots,
            slot_of,
            reduction,
            world: pg.as_ref().map_or(1, ProcessGroup::world_size),
            pg,
            caps,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<I>> {
        // A panic while holding the lock can only come from a bug in this file; the wrapper is
        // poisoned by the error that follows, so the state is not trusted again.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Number of buckets in the current layout.
    pub(crate) fn num_buckets(&self) -> usize {
        self.lock().layout.buckets.len()
    }

    /// Slot lists of each bucket, for tests and logs.
    #[cfg(any(test, feature = "test-hooks"))]
    pub(crate) fn bucket_slots(&self) -> Vec<Vec<usize>> {
        self.lock()
            .layout
            .buckets
            .iter()
            .map(|b| b.slots.clone())
            .collect()
    }

    /// Registers a forward: returns the generation its taps carry.
    ///
    /// # Errors
    /// [`DdpError::BackwardOutsideDdp`] when gradients arrived from a plain `loss.backward()`.
    pub(crate) fn new_forward(&self) -> Result<u64, DdpError> {
        let mut s = self.lock();
        take_stray(&mut s)?;
        s.forwards += 1;
        Ok(s.generation)
    }

    /// The weights changed (an optimizer step): the forwards made before it (an evaluation
    /// between backward and step) no longer count, since their gradients belong to the old
    /// weights; a later backward of one fails ([`DdpError::StaleForward`], or
    /// [`DdpError::BackwardWithoutForward`] when no forward came after the step).
    pub(crate) fn weights_changed(&self) {
        let mut s = self.lock();
        s.generation += 1;
        s.forwards = 0;
    }

    /// Arms the reducer for one backward; the summed gradients are divided by `averaged_over`
    /// ranks (joined ranks contribute zeros).
    pub(crate) fn begin(&self, sync: bool, averaged_over: usize) -> Result<(), DdpError> {
        let mut s = self.lock();
        take_stray(&mut s)?;
        if s.forwards == 0 {
            return Err(DdpError::BackwardWithoutForward);
        }
        self.arm(
            &mut s,
            Phase::Backward {
                sync,
                shadow: false,
            },
            averaged_over,
        )
    }

    /// Arms the reducer on a rank that has joined: no forward, no gradients; `finish` launches
    /// every bucket with zeros, as the training ranks' buckets.
    pub(crate) fn begin_shadow(&self, sync: bool, averaged_over: usize) -> Result<(), DdpError> {
        let mut s = self.lock();
        take_stray(&mut s)?;
        self.arm(
            &mut s,
            Phase::Backward { sync, shadow: true },
            averaged_over,
        )
    }

    fn arm(&self, s: &mut State<I>, phase: Phase, averaged_over: usize) -> Result<(), DdpError> {
        if let (Phase::Backward { sync: true, .. }, false, Some(pg)) =
            (phase, s.layout_verified, &self.pg)
        {
            layout_check::verify(pg, &self.slots, &s.layout, "before the first bucket")?;
            s.layout_verified = true;
        }
        if s.rebuilt && !s.relaid_anchored {
            // Waiting for an anchored backward to lay the buckets out again: its own order.
            s.arrival.clear();
        }
        s.phase = phase;
        s.averaged_over = averaged_over;
        s.events = 0;
        s.next_launch = 0;
        s.error = None;
        let forwards = s.forwards;
        for (slot, left) in self.slots.iter().zip(s.events_left.iter_mut()) {
            *left = slot.entries.len() * forwards;
        }
        s.bucket_waiting = s.layout.buckets.iter().map(|b| b.slots.len()).collect();
        let n = s.layout.buckets.len();
        s.times = BucketTimes {
            ready: vec![None; n],
            comm: vec![None; n],
            unpacked: vec![None; n],
            launched_during_backward: 0,
        };
        Ok(())
    }

    /// Ends a backward; the forwards before it are consumed. With `sync`, returns the averaged
    /// gradients (ids from `table`) and the bucket timings. `anchored`: this backward's taps
    /// were anchored (automatic overlap); the first synchronised backward anchored on every
    /// rank lays the buckets out again, once, in its arrival order.
    pub(crate) fn finish(
        &self,
        table: &ParamTable<I>,
        anchored: bool,
    ) -> Result<Option<(GradientsParams, BucketTimes)>, DdpError> {
        let mut s = self.lock();
        let Phase::Backward { sync, shadow } = std::mem::replace(&mut s.phase, Phase::Idle) else {
            return Err(DdpError::Internal("finish without begin".into()));
        };
        s.generation += 1;
        s.forwards = 0;
        if let Some(e) = s.error.take() {
            // Nothing of this backward may leak into the next one.
            s.held.iter_mut().for_each(|g| *g = None);
            return Err(e);
        }
        if s.events == 0 && !self.slots.is_empty() && !shadow {
            return Err(DdpError::NoGradients);
        }
        if !sync {
            return Ok(None);
        }
        s.times.launched_during_backward = s.next_launch;
        self.complete_missing(&mut s);
        while s.next_launch < s.layout.buckets.len() {
            let b = s.next_launch;
            self.launch(&mut s, b)?;
        }
        // Every bucket is in before the control collectives: a hook's thread may still be
        // communicating, and the order of collectives must be the same on every rank.
        let mut results = Vec::with_capacity(s.layout.buckets.len());
        for b in 0..s.layout.buckets.len() {
            let pending = s.in_flight[b]
                .take()
                .ok_or_else(|| DdpError::Internal(format!("bucket {b} was never launched")))?;
            let slots: Vec<&Slot<I>> = s.layout.buckets[b]
                .slots
                .iter()
                .map(|&i| &self.slots[i])
                .collect();
            let (reduced, timing) = pending.wait(&slots)?;
            s.times.comm[b] = timing;
            results.push(reduced);
        }
        let wants_relayout = s.rebuilt && !s.relaid_anchored && anchored;
        let (used, relayout) = self.used_anywhere(&mut s, wants_relayout)?;
        // Ranks that joined sent zeros: the average the collective took over the whole world
        // becomes one over `averaged_over` ranks.
        let rescale =
            (s.averaged_over < self.world).then(|| self.world as f32 / s.averaged_over as f32);
        let mut grads = GradientsParams::new();
        for (b, reduced) in results.into_iter().enumerate() {
            let t0 = Instant::now();
            for (&slot, grad) in s.layout.buckets[b].slots.iter().zip(reduced) {
                if let (true, Some(mut grad)) = (used[slot], grad) {
                    if let Some(factor) = rescale {
                        grad = I::float_mul_scalar(grad, factor.into());
                    }
                    let entry = &table.entries[self.slots[slot].entries[0]];
                    (entry.register)(&mut grads, entry.id, grad);
                }
            }
            s.times.unpacked[b] = Some((t0, Instant::now()));
        }
        s.used.iter_mut().for_each(|u| *u = false);
        if !s.rebuilt {
            self.rebuild(&mut s)?;
        } else if relayout {
            s.relaid_anchored = true;
            self.rebuild(&mut s)?;
        }
        Ok(Some((grads, std::mem::take(&mut s.times))))
    }

    /// Whether `no_sync` backwards accumulated gradients that no synchronised one reduced yet.
    pub(crate) fn holds_gradients(&self) -> bool {
        self.lock().held.iter().any(Option::is_some)
    }

    /// Drops the gradients accumulated by `no_sync` backwards since the last synchronised one
    /// (a partial accumulation the caller abandons), so they cannot leak into the next step.
    ///
    /// # Errors
    /// [`DdpError::Internal`] while a backward is armed.
    pub(crate) fn discard_held(&self) -> Result<usize, DdpError> {
        let mut s = self.lock();
        if s.phase != Phase::Idle {
            return Err(DdpError::Internal(
                "discarding accumulated gradients during a backward".into(),
            ));
        }
        let dropped = s.held.iter().filter(|g| g.is_some()).count();
        s.held.iter_mut().for_each(|g| *g = None);
        s.used.iter_mut().for_each(|u| *u = false);
        Ok(dropped)
    }

    /// Marks slots that did not get all their events as complete: their bucket can launch, with
    /// zeros for a parameter this rank did not use at all.
    fn complete_missing(&self, s: &mut State<I>) {
        let mut unused = Vec::new();
        for slot in 0..self.slots.len() {
            if s.events_left[slot] == 0 {
                continue;
            }
            if s.held[slot].is_none() {
                unused.push(self.slots[slot].path.as_str());
            }
            s.events_left[slot] = 0;
            let b = s.layout.bucket_of[slot];
            s.bucket_waiting[b] -= 1;
        }
        if !unused.is_empty() {
            tracing::debug!(params = %unused.join(", "), "parameters without a gradient on this rank");
        }
    }

    /// Launches bucket `b` (the next in order).
    fn launch(&self, s: &mut State<I>, b: usize) -> Result<(), DdpError> {
        s.next_launch = b + 1;
        if s.times.ready[b].is_none() {
            s.times.ready[b] = Some(Instant::now());
        }
        let bucket = &s.layout.buckets[b].slots;
        let slots: Vec<&Slot<I>> = bucket.iter().map(|&i| &self.slots[i]).collect();
        let grads: Vec<Option<Held<I>>> = bucket.iter().map(|&i| s.held[i].take()).collect();
        let dtype = slots.first().map(|slot| slot.dtype);
        let last_of_its_dtype = s.layout.buckets[b + 1..]
            .iter()
            .all(|later| later.slots.first().map(|&i| self.slots[i].dtype) != dtype);
        let position = BucketPosition {
            index: b,
            last_of_its_dtype,
        };
        let pending = self.reduction.launch(FullBucket {
            position,
            slots: &slots,
            grads,
        })?;
        s.in_flight[b] = Some(pending);
        Ok(())
    }

    /// Per slot: whether any rank produced a gradient for it since the last synchronised
    /// backward; and whether every rank `wants_relayout` (one small all-reduce of flags, after
    /// the last bucket, so the ranks decide together).
    fn used_anywhere(
        &self,
        s: &mut State<I>,
        wants_relayout: bool,
    ) -> Result<(Vec<bool>, bool), DdpError> {
        let Some(pg) = &self.pg else {
            return Ok((s.used.clone(), wants_relayout));
        };
        let mut flags: Vec<u8> = s.used.iter().map(|&u| u8::from(u)).collect();
        // Max of "does not want" is 0 only when every rank wants it.
        flags.push(u8::from(!wants_relayout));
        pg.all_reduce(&mut flags, ReduceOp::Max)
            .map_err(DdpError::comm("agreeing on which parameters were used"))?;
        let relayout = flags.pop() == Some(0);
        Ok((flags.into_iter().map(|f| f != 0).collect(), relayout))
    }

    /// After the first synchronised backward: lay buckets out in the order gradients arrived on
    /// rank 0.
    fn rebuild(&self, s: &mut State<I>) -> Result<(), DdpError> {
        s.rebuilt = true;
        let order = agree_on_rank0_order(self.pg.as_ref(), &s.arrival, &s.layout.order).map_err(
            |e| match e {
                OrderError::Comm(source) => DdpError::Comm {
                    context: "agreeing on the bucket order",
                    source,
                },
                invalid => DdpError::Internal(format!("bucket order: {invalid}")),
            },
        )?;
        s.layout = layout(&self.slots, order, self.caps);
        s.in_flight = s.layout.buckets.iter().map(|_| None).collect();
        if let Some(pg) = &self.pg {
            layout_check::verify(pg, &self.slots, &s.layout, "after re-laying them out")?;
        }
        tracing::debug!(
            buckets = s.layout.buckets.len(),
            "rebuilt gradient buckets in arrival order"
        );
        Ok(())
    }

    /// One tap event; errors are kept for [`finish`](Self::finish).
    fn accept(
        &self,
        s: &mut State<I>,
        param_index: usize,
        generation: u64,
        grad: FloatTensor<I>,
    ) -> Result<(), DdpError> {
        let Some(slot) = self.slot_of.get(param_index).copied().flatten() else {
            return Ok(()); // buffers and frozen parameters have no taps; nothing to do
        };
        let Phase::Backward { sync, .. } = s.phase else {
            if InWrapperBackward::active() {
                s.foreign_events += 1;
            } else {
                s.stray_events += 1;
            }
            return Ok(());
        };
        let info = &self.slots[slot];
        if generation != s.generation {
            return Err(DdpError::StaleForward {
                path: info.path.clone(),
            });
        }
        if s.events_left[slot] == 0 {
            return Err(DdpError::Internal(format!(
                "more gradient events for '{}' than taps",
                info.path
            )));
        }
        s.events += 1;
        let held = self.reduction.hold(info, grad)?;
        let held = match s.held[slot].take() {
            Some(acc) => self.reduction.add(info, acc, held)?,
            None => held,
        };
        s.held[slot] = Some(held);
        s.used[slot] = true;
        s.events_left[slot] -= 1;
        if s.events_left[slot] > 0 {
            return Ok(());
        }
        // (`relaid_anchored` implies `rebuilt`: no re-layout is left to come.)
        if !s.relaid_anchored && !s.arrival.contains(&slot) {
            s.arrival.push(slot);
        }
        let b = s.layout.bucket_of[slot];
        s.bucket_waiting[b] -= 1;
        if s.bucket_waiting[b] == 0 {
            s.times.ready[b] = Some(Instant::now());
        }
        if sync {
            while s.next_launch < s.layout.buckets.len() && s.bucket_waiting[s.next_launch] == 0 {
                let next = s.next_launch;
                self.launch(s, next)?;
            }
        }
        Ok(())
    }
}

impl<I: Backend> GradientSink<I> for Reducer<I> {
    fn on_gradient(&self, param_index: usize, generation: u64, grad: FloatTensor<I>) {
        let mut s = self.lock();
        if s.error.is_some() {
            return; // this backward already failed: launch nothing more
        }
        if let Err(e) = self.accept(&mut s, param_index, generation, grad) {
            s.error = Some(e);
        }
    }
}

fn take_stray<I: Backend>(s: &mut State<I>) -> Result<(), DdpError> {
    let foreign = std::mem::take(&mut s.foreign_events);
    match std::mem::take(&mut s.stray_events) {
        0 if foreign == 0 => Ok(()),
        0 => Err(DdpError::BackwardOfAnotherWrapper { count: foreign }),
        count => Err(DdpError::BackwardOutsideDdp { count }),
    }
}

/// Groups the trainable entries into slots: one per distinct `ParamId`.
fn plan_slots<I: Backend>(table: &ParamTable<I>) -> (Vec<Slot<I>>, Vec<Option<usize>>) {
    let mut by_id: HashMap<ParamId, usize> = HashMap::new();
    let mut slots: Vec<Slot<I>> = Vec::new();
    let slot_of = table
        .entries
        .iter()
        .enumerate()
        .map(|(index, e)| {
            if e.kind != ParamKind::Trainable {
                return None;
            }
            let slot = *by_id.entry(e.id).or_insert_with(|| {
                slots.push(Slot {
                    path: e.path.clone(),
                    shape: e.shape.clone(),
                    dtype: e.dtype,
                    device: e.device.clone(),
                    entries: Vec::new(),
                });
                slots.len() - 1
            });
            slots[slot].entries.push(index);
            Some(slot)
        })
        .collect();
    (slots, slot_of)
}

fn layout<I: Backend>(slots: &[Slot<I>], order: Vec<usize>, caps: BucketCaps) -> BucketLayout {
    let bytes: Vec<usize> = slots.iter().map(|s| s.numel() * s.dtype.size()).collect();
    let dtypes: Vec<_> = slots.iter().map(|s| s.dtype).collect();
    BucketLayout::new(order, &bytes, &dtypes, caps.first, caps.rest)
}
