//! FSDP's reduce-scatters during backward: DDP's gradient taps hand each gathered parameter's
//! gradient to [`UnitReducer`] as backward produces it; when every parameter of a unit has
//! its gradient, the unit's reduce-scatter starts while backward goes on.
//!
//! All ranks must start the same collectives in the same order, whatever order their units
//! complete in (a rank may not use a unit at all). So units launch in a fixed order: a unit
//! starts only when it and every unit before it in the order are complete, and backward's end
//! launches the rest (a unit this rank did not use sends zeros). The order starts as the
//! reverse of the units' (backward usually reaches the last layers first) and, once, after the
//! first backward whose taps were anchored on every rank, becomes the order rank 0's units
//! completed in (every rank adopts it), as DDP lays its buckets out again.

use super::device::{PendingChunk, UnitCollectives};
use super::layout::Layout;
use crate::engine::params::{ParamKind, ParamTable};
use crate::engine::reducer::{UnitGradient, read_to_host};
use crate::engine::tap::{GradientSink, InWrapperBackward};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorMetadata, TensorPrimitive};
use ddp_comm::{ProcessGroup, ReduceOp, Work};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Where a tapped parameter's gradient goes: its unit and its range in the unit's buffer.
#[derive(Debug, Clone, Copy)]
struct Target {
    unit: usize,
    offset: usize,
    numel: usize,
}

/// How an FSDP backward went, from
/// [`FullyShardedDataParallel::last_step_stats`](super::FullyShardedDataParallel::last_step_stats).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FsdpStepStats {
    /// Units (each one reduce-scatter).
    pub units: usize,
    /// Units whose reduce-scatter started while backward was still running (the others started
    /// when it ended). Few or none on the first step, which learns where to anchor the taps
    /// (its taps fire at the end of backward).
    pub reduced_during_backward: usize,
    /// Taps anchored at a learned depth (0 on the first step).
    pub anchored_taps: usize,
}

/// One unit's reduce-scatter in flight.
pub(super) enum Launched<I: Backend> {
    /// On the CPU transports: the chunk comes back in host memory.
    Host(Work<Vec<f32>>),
    /// On a device communicator: the chunk comes back as a tensor on the device.
    Device(Box<dyn PendingChunk<I>>),
}

/// What backward left: every unit's reduce-scatter, which units this rank used, the order
/// units completed in on this rank, and how many launched before backward ended.
pub(super) struct Finished<I: Backend> {
    pub(super) works: Vec<Launched<I>>,
    pub(super) used: Vec<u8>,
    pub(super) arrival: Vec<usize>,
    pub(super) during_backward: usize,
}

struct State<I: Backend> {
    armed: bool,
    generation: u64,
    /// Forwards made for this backward (tap events expected per parameter).
    forwards: usize,
    /// Host path: each unit's flat gradient.
    flats: Vec<Vec<f32>>,
    /// Device path: each parameter's gradient (summed over the forwards), until its unit
    /// launches.
    grads: Vec<Option<FloatTensor<I>>>,
    /// Per parameter index: tap events still expected in this backward.
    events_left: Vec<usize>,
    /// Per unit: parameters still incomplete.
    waiting: Vec<usize>,
    used: Vec<u8>,
    /// Per unit: its reduce-scatter, once launched.
    launched: Vec<Option<Launched<I>>>,
    next: usize,
    arrival: Vec<usize>,
    during_backward: usize,
    /// The first failure (a gradient that could not be read); reported by `finish`.
    error: Option<String>,
    /// Tap events outside a backward: from a plain `loss.backward()`, and during another
    /// wrapper's backward; reported by [`UnitReducer::warn_strays`].
    strays: (usize, usize),
    /// Launch order of the units.
    order: Vec<usize>,
}

/// Where the units' reduce-scatters run: the process group's CPU transports, or a device
/// communicator (with the device the chunks live on).
#[derive(Clone)]
pub(super) enum UnitComm<I: Backend> {
    Host,
    Device(Arc<dyn UnitCollectives<I>>, I::Device),
}

/// The [`GradientSink`] of FSDP's taps.
pub(super) struct UnitReducer<I: Backend> {
    state: Mutex<State<I>>,
    /// Per parameter index (module order): where its gradient goes, `None` if not sharded.
    targets: Vec<Option<Target>>,
    /// Per unit: its parameters' indices, by offset in the unit (the device path assembles
    /// the unit's flat gradient from them).
    members: Vec<Vec<usize>>,
    /// Per unit: padded length, parameter count.
    padded: Vec<usize>,
    params: Vec<usize>,
    pg: ProcessGroup,
    comm: UnitComm<I>,
}

impl<I: Backend> UnitReducer<I> {
    /// A reducer for `layout`'s units, reducing through `comm`; `table` describes the module
    /// the taps are put on.
    pub(super) fn new(
        pg: ProcessGroup,
        layout: &Layout,
        table: &ParamTable<I>,
        comm: UnitComm<I>,
    ) -> Self {
        let targets: Vec<Option<Target>> = table
            .entries
            .iter()
            .map(|e| {
                let slot = layout.slots.get(&e.id)?;
                (e.kind == ParamKind::Trainable).then(|| Target {
                    unit: slot.unit,
                    offset: slot.offset,
                    numel: slot.numel(),
                })
            })
            .collect();
        let units = layout.units.len();
        let mut params = vec![0; units];
        let mut members = vec![Vec::new(); units];
        for (index, t) in targets.iter().enumerate() {
            if let Some(t) = t {
                params[t.unit] += 1;
                members[t.unit].push(index);
            }
        }
        for unit in &mut members {
            unit.sort_by_key(|&i| targets[i].map_or(0, |t| t.offset));
        }
        UnitReducer {
            state: Mutex::new(State {
                armed: false,
                generation: 0,
                strays: (0, 0),
                forwards: 0,
                flats: Vec::new(),
                grads: Vec::new(),
                events_left: Vec::new(),
                waiting: Vec::new(),
                used: Vec::new(),
                launched: Vec::new(),
                next: 0,
                arrival: Vec::new(),
                during_backward: 0,
                error: None,
                order: (0..units).rev().collect(),
            }),
            targets,
            members,
            padded: layout.units.iter().map(|u| u.padded).collect(),
            params,
            pg,
            comm,
        }
    }

    /// Where the reduce-scatters run.
    pub(super) fn comm(&self) -> &UnitComm<I> {
        &self.comm
    }

    fn lock(&self) -> MutexGuard<'_, State<I>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Says, once per call, that tap events arrived outside a backward since the last call.
    /// Not an error (DDP's is): FSDP's gradients only come from `fsdp.backward`, so nothing
    /// trains silently without it, and a plain backward for input gradients (an adversarial
    /// example, a saliency map) or another wrapper's backward through this one's output (a
    /// GAN's generator step) is legitimate; only the parameters' gradients are dropped.
    pub(super) fn warn_strays(&self) {
        match std::mem::take(&mut self.lock().strays) {
            (0, 0) => {}
            (plain, other) => tracing::warn!(
                plain_backward = plain,
                other_wrapper = other,
                "FSDP: gradients of its parameters arrived outside `fsdp.backward` (a plain \
                 `loss.backward()`, or another DDP or FSDP wrapper's backward through this \
                 wrapper's `forward` output) and were dropped: only `fsdp.backward` reduces \
                 them"
            ),
        }
    }

    /// Arms the reducer for a backward over `forwards` forwards of generation `generation`.
    pub(super) fn begin(&self, forwards: usize, generation: u64) {
        let mut s = self.lock();
        s.armed = true;
        s.generation = generation;
        s.forwards = forwards;
        match self.comm {
            UnitComm::Host => s.flats = self.padded.iter().map(|&n| vec![0.0; n]).collect(),
            UnitComm::Device(..) => s.grads = self.targets.iter().map(|_| None).collect(),
        }
        s.events_left = self
            .targets
            .iter()
            .map(|t| if t.is_some() { forwards } else { 0 })
            .collect();
        s.waiting = self.params.clone();
        s.used = vec![0; self.padded.len()];
        s.launched = self.padded.iter().map(|_| None).collect();
        s.next = 0;
        s.arrival.clear();
        s.during_backward = 0;
        s.error = None;
    }

    /// Launches every unit not launched yet (in order) and hands back what backward left.
    ///
    /// # Errors
    /// A gradient that could not be read during backward (its message).
    pub(super) fn finish(&self) -> Result<Finished<I>, String> {
        let mut s = self.lock();
        s.armed = false;
        self.launch_in_order(&mut s, false);
        if let Some(e) = s.error.take() {
            // Launched units are dropped: each waits (bounded by its communicator) for its
            // collective before its memory goes.
            s.launched.clear();
            return Err(e);
        }
        let works = s
            .launched
            .iter_mut()
            .map(|w| {
                w.take()
                    .ok_or_else(|| "a unit was never launched".to_string())
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Finished {
            works,
            used: std::mem::take(&mut s.used),
            arrival: std::mem::take(&mut s.arrival),
            during_backward: s.during_backward,
        })
    }

    /// The launch order of the units.
    pub(super) fn order(&self) -> Vec<usize> {
        self.lock().order.clone()
    }

    /// Adopts `order` (a permutation of the units) as the launch order.
    pub(super) fn set_order(&self, order: Vec<usize>) {
        self.lock().order = order;
    }

    fn launch(&self, s: &mut State<I>, unit: usize) {
        match &self.comm {
            UnitComm::Host => {
                let flat = std::mem::take(&mut s.flats[unit]);
                let work = self.pg.reduce_scatter_async(flat, ReduceOp::Avg);
                s.launched[unit] = Some(Launched::Host(work));
            }
            UnitComm::Device(comm, device) => {
                let len = self.padded[unit];
                let gradient = UnitGradient {
                    unit,
                    flat: self.device_flat(s, unit, device),
                    len,
                    chunk_len: len / self.pg.world_size(),
                };
                match comm.launch_reduce_scatter(gradient, device) {
                    Ok(pending) => s.launched[unit] = Some(Launched::Device(pending)),
                    Err(e) => {
                        let reason = format!("launching unit {unit}'s reduce-scatter: {e}");
                        // The peers would wait for this rank's collective: fail it for them.
                        comm.abort(&reason);
                        s.error.get_or_insert(reason);
                    }
                }
            }
        }
    }

    /// Device path: unit `unit`'s flat gradient, assembled on the device from its parameters'
    /// gradients (zeros for a parameter without one, and for the padding).
    fn device_flat(&self, s: &mut State<I>, unit: usize, device: &I::Device) -> FloatTensor<I> {
        let zeros = |n: usize| Tensor::<I, 1>::zeros([n], device);
        let mut pieces = Vec::with_capacity(self.members[unit].len() + 1);
        let mut at = 0;
        for &index in &self.members[unit] {
            let Some(t) = self.targets[index] else {
                continue;
            };
            if t.offset > at {
                pieces.push(zeros(t.offset - at));
            }
            pieces.push(match s.grads[index].take() {
                Some(g) => Tensor::<I, 1>::from_primitive(TensorPrimitive::Float(
                    I::float_reshape(g, [t.numel].into()),
                )),
                None => zeros(t.numel),
            });
            at = t.offset + t.numel;
        }
        if self.padded[unit] > at {
            pieces.push(zeros(self.padded[unit] - at));
        }
        Tensor::cat(pieces, 0).into_primitive().tensor()
    }

    /// Launches the units not launched yet, in order: with `complete_only`, only as far as
    /// the first unit still waiting for gradients (during backward); else all (at its end).
    fn launch_in_order(&self, s: &mut State<I>, complete_only: bool) {
        while let Some(&u) = s.order.get(s.next) {
            if complete_only && s.waiting[u] != 0 {
                break;
            }
            self.launch(s, u);
            s.next += 1;
            if complete_only {
                s.during_backward += 1;
            }
        }
    }
}

impl<I: Backend> GradientSink<I> for UnitReducer<I> {
    fn on_gradient(&self, param_index: usize, generation: u64, grad: FloatTensor<I>) {
        let Some(Some(t)) = self.targets.get(param_index).copied() else {
            return;
        };
        if let UnitComm::Device(..) = self.comm {
            self.on_device_gradient(param_index, t, generation, grad);
            return;
        }
        // Read on the backward thread, outside the lock (a GPU read waits for the device).
        let values =
            read_to_host::<I>(grad).and_then(|d| d.into_vec::<f32>().map_err(|e| format!("{e:?}")));
        let mut s = self.lock();
        if !Self::expected(&mut s, param_index, generation) {
            return;
        }
        let values = match values {
            Ok(v) if v.len() == t.numel => v,
            Ok(v) => {
                s.error.get_or_insert(format!(
                    "a gradient has {} elements, its parameter {}",
                    v.len(),
                    t.numel
                ));
                return;
            }
            Err(e) => {
                s.error
                    .get_or_insert(format!("reading a gradient from the device: {e}"));
                return;
            }
        };
        let first = s.events_left[param_index] == s.forwards;
        let Some(flat) = s.flats[t.unit].get_mut(t.offset..t.offset + t.numel) else {
            s.error
                .get_or_insert("a gradient arrived after its unit's reduce-scatter began".into());
            return;
        };
        if first {
            // The first event of this parameter: its gradient as is (no `0.0 + g`).
            flat.copy_from_slice(&values);
        } else {
            for (acc, v) in flat.iter_mut().zip(values) {
                *acc += v;
            }
        }
        self.counted(&mut s, param_index, t.unit);
    }
}

impl<I: Backend> UnitReducer<I> {
    /// Whether a gradient event of `param_index` for backward `generation` is one this
    /// backward waits for (one too many is recorded as the error).
    fn expected(s: &mut State<I>, param_index: usize, generation: u64) -> bool {
        if !s.armed {
            // A backward outside `FullyShardedDataParallel::backward`.
            if InWrapperBackward::active() {
                s.strays.1 += 1;
            } else {
                s.strays.0 += 1;
            }
            return false;
        }
        if s.generation != generation {
            s.error.get_or_insert(
                "a gradient comes from a forward made before the previous backward or \
                 optimizer_step: every backward must use outputs of the `fsdp.forward` calls \
                 made since both"
                    .into(),
            );
            return false;
        }
        if s.events_left[param_index] == 0 {
            s.error
                .get_or_insert("more gradients for a parameter than forwards made".into());
            return false;
        }
        true
    }

    /// Counts one gradient event of `param_index` (in `unit`), and launches the units it
    /// completes, in order.
    fn counted(&self, s: &mut State<I>, param_index: usize, unit: usize) {
        s.used[unit] = 1;
        let left = &mut s.events_left[param_index];
        *left = left.saturating_sub(1);
        if *left == 0 {
            s.waiting[unit] -= 1;
            if s.waiting[unit] == 0 {
                s.arrival.push(unit);
                self.launch_in_order(s, true);
            }
        }
    }

    /// Device path: keeps the gradient as a tensor (summed with the earlier forwards' ones),
    /// and launches the units it completes. Nothing is read from the device.
    fn on_device_gradient(
        &self,
        param_index: usize,
        t: Target,
        generation: u64,
        grad: FloatTensor<I>,
    ) {
        let numel = grad.shape().num_elements();
        let mut s = self.lock();
        if !Self::expected(&mut s, param_index, generation) {
            return;
        }
        if numel != t.numel {
            s.error.get_or_insert(format!(
                "a gradient has {numel} elements, its parameter {}",
                t.numel
            ));
            return;
        }
        if s.launched[t.unit].is_some() {
            s.error
                .get_or_insert("a gradient arrived after its unit's reduce-scatter began".into());
            return;
        }
        let sum = match s.grads[param_index].take() {
            // The first event of this parameter: its gradient as is (no `0.0 + g`).
            None => grad,
            Some(earlier) => I::float_add(earlier, grad),
        };
        s.grads[param_index] = Some(sum);
        self.counted(&mut s, param_index, t.unit);
    }
}
