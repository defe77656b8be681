//! The reducer: collects tapped gradients per bucket and all-reduces full buckets.
//!
//! During backward, each tap event hands over its gradient. The reducer keeps the gradient's
//! own storage (no copy on the CPU backend: burn gives the buffer up when the tensor is the
//! last reference) in the parameter's slot, or adds it there when the parameter already has a
//! gradient (tied parameters, `no_sync` accumulation). When every parameter of a bucket has
//! arrived, the bucket's all-reduce is queued on the communication thread at once, but only after
//! every earlier bucket: all ranks launch the same collectives in the same order.
//!
//! A bucket is reduced as one collective over its parameters' buffers
//! ([`ProcessGroup::all_reduce_coalesced_async`]): its flat buffer is the transport's staging
//! area (shared memory) or a temporary (TCP), so neither a pack into a bucket buffer of our own
//! nor an unpack out of it is needed, and the reduced buffers become the gradient tensors as
//! they are. The `1 / world_size` scaling is the `Avg` reduction, applied once to each element
//! of the bucket's sum; with fp16/bf16 compression it is applied while narrowing, before the sum,
//! so the half-precision sum cannot overflow where the average would not.
//!
//! After backward, [`Reducer::finish`] launches what is left (parameters that got no gradient
//! count as zeros), waits for the buckets in order and turns them into `GradientsParams`.
//! Without synchronisation (`no_sync`), gradients accumulate in their slots and nothing is
//! launched; the next synchronised backward adds its gradients on top and reduces the sum.

use crate::bucket::BucketLayout;
use crate::ddp::GradientCompression;
use crate::error::DdpError;
use crate::params::{RegisterTensor, Unpack};
use crate::tap::GradientSink;
use burn::optim::GradientsParams;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use ddp_comm::{ProcessGroup, ReduceOp, Work, WorkTiming, bf16, f16};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// A parameter as the reducer sees it: tied parameters (several module entries with one
/// `ParamId`) share one slot.
pub(crate) struct Slot {
    pub(crate) path: String,
    pub(crate) numel: usize,
    /// How many taps feed this slot per backward.
    pub(crate) taps: usize,
    pub(crate) unpack: Unpack,
    pub(crate) register: RegisterTensor,
}

/// A launched bucket: full-precision buffers travel in pieces; compressed ones as one flat
/// half-precision buffer (the f32 buffers stay in their slots and receive the widened result).
enum InFlight {
    F32(Work<Vec<Vec<f32>>>),
    F16(Work<Vec<f16>>),
    BF16(Work<Vec<bf16>>),
}

/// Timings of one synchronised backward, for the timeline and overlap statistics.
#[derive(Debug, Clone, Default)]
pub struct BucketTimes {
    /// When each bucket's last gradient arrived (its all-reduce could start).
    pub ready: Vec<Option<Instant>>,
    /// When each bucket's all-reduce ran on the communication thread.
    pub comm: Vec<Option<WorkTiming>>,
    /// When each bucket's result was turned into gradient tensors.
    pub unpacked: Vec<Option<(Instant, Instant)>>,
}

struct State {
    slots: Vec<Slot>,
    index_to_slot: Vec<Option<usize>>,
    layout: BucketLayout,
    /// Each slot's gradient (sum of its events) until its bucket is launched or unpacked.
    grads: Vec<Option<Vec<f32>>>,
    in_flight: Vec<Option<InFlight>>,
    events_left: Vec<usize>,
    bucket_pending: Vec<usize>,
    next_launch: usize,
    in_backward: bool,
    sync: bool,
    events: usize,
    stray_events: usize,
    arrival: Vec<usize>,
    rebuilt: bool,
    warned_unused: bool,
    times: BucketTimes,
    errors: Vec<String>,
}

/// Shared between the DDP wrapper and the taps (as their [`GradientSink`]).
pub(crate) struct Reducer<I: Backend> {
    state: Mutex<State>,
    /// With one rank there is nothing to reduce: gradients stay tensors (summed on the device
    /// when several arrive for one slot) and go straight into `GradientsParams`.
    direct: Option<Mutex<Vec<Option<FloatTensor<I>>>>>,
    _backend: std::marker::PhantomData<fn(I)>,
    pg: ProcessGroup,
    scale: f32,
    compression: GradientCompression,
    first_cap_bytes: usize,
    cap_bytes: usize,
}

impl<I: Backend> Reducer<I> {
    pub(crate) fn new(
        pg: ProcessGroup,
        slots: Vec<Slot>,
        index_to_slot: Vec<Option<usize>>,
        compression: GradientCompression,
        first_cap_bytes: usize,
        cap_bytes: usize,
    ) -> Self {
        // PyTorch's initial order: reverse registration, as backward tends to produce them.
        let order: Vec<usize> = (0..slots.len()).rev().collect();
        let numel: Vec<usize> = slots.iter().map(|s| s.numel).collect();
        let layout = BucketLayout::new(order, &numel, first_cap_bytes, cap_bytes);
        let n = slots.len();
        let scale = 1.0 / pg.world_size() as f32;
        let mut state = State {
            grads: (0..n).map(|_| None).collect(),
            in_flight: Vec::new(),
            events_left: vec![0; n],
            bucket_pending: Vec::new(),
            next_launch: 0,
            in_backward: false,
            sync: true,
            events: 0,
            stray_events: 0,
            arrival: Vec::with_capacity(n),
            rebuilt: false,
            warned_unused: false,
            times: BucketTimes::default(),
            errors: Vec::new(),
            slots,
            index_to_slot,
            layout,
        };
        let direct = (pg.world_size() == 1 && compression == GradientCompression::None)
            .then(|| Mutex::new((0..n).map(|_| None).collect()));
        state.allocate();
        Reducer {
            direct,
            state: Mutex::new(state),
            _backend: std::marker::PhantomData,
            pg,
            scale,
            compression,
            first_cap_bytes,
            cap_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock can only come from a bug in this file; the state is
        // reset at the next `begin`, so keep going rather than poison every later step.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Number of buckets in the current layout.
    pub(crate) fn num_buckets(&self) -> usize {
        self.lock().layout.buckets.len()
    }

    /// Slot lists of each bucket, for tests and logs.
    pub(crate) fn bucket_slots(&self) -> Vec<Vec<usize>> {
        self.lock()
            .layout
            .buckets
            .iter()
            .map(|b| b.slots.clone())
            .collect()
    }

    /// Arms the reducer for one backward.
    pub(crate) fn begin(&self, sync: bool) -> Result<(), DdpError> {
        let mut s = self.lock();
        if s.stray_events > 0 {
            let n = std::mem::take(&mut s.stray_events);
            return Err(DdpError::Misuse(format!(
                "{n} gradient(s) reached DDP outside `backward`: call `ddp.backward(loss)` (or \
                 `backward_no_sync`) instead of `loss.backward()` on the output of `ddp.forward`"
            )));
        }
        s.in_backward = true;
        s.sync = sync;
        s.events = 0;
        s.next_launch = 0;
        for i in 0..s.slots.len() {
            s.events_left[i] = s.slots[i].taps;
        }
        s.bucket_pending = s.layout.buckets.iter().map(|b| b.slots.len()).collect();
        s.times = BucketTimes {
            ready: vec![None; s.layout.buckets.len()],
            comm: vec![None; s.layout.buckets.len()],
            unpacked: vec![None; s.layout.buckets.len()],
        };
        Ok(())
    }

    /// Ends a backward. With `sync`, returns the averaged gradients.
    pub(crate) fn finish(&self) -> Result<Option<(GradientsParams, BucketTimes)>, DdpError> {
        let mut s = self.lock();
        s.in_backward = false;
        if let Some(e) = s.errors.first().cloned() {
            s.errors.clear();
            // Nothing of this backward may leak into the next one.
            s.grads.iter_mut().for_each(|g| *g = None);
            return Err(DdpError::Misuse(e));
        }
        let total_taps: usize = s.slots.iter().map(|x| x.taps).sum();
        if s.events == 0 && total_taps > 0 {
            return Err(DdpError::Misuse(
                "no gradient reached DDP during backward: run the forward pass through \
                 `ddp.forward(|model| ...)` so that parameters are tapped"
                    .into(),
            ));
        }
        if !s.sync {
            return Ok(None);
        }
        if let Some(direct) = &self.direct {
            let mut grads = GradientsParams::new();
            let mut tensors = direct.lock().unwrap_or_else(PoisonError::into_inner);
            for (slot, t) in tensors.iter_mut().enumerate() {
                if let Some(t) = t.take() {
                    (s.slots[slot].register)(&mut grads, Box::new(t));
                }
            }
            return Ok(Some((grads, std::mem::take(&mut s.times))));
        }
        self.complete_missing(&mut s);
        while s.next_launch < s.layout.buckets.len() {
            let b = s.next_launch;
            self.launch(&mut s, b)?;
        }
        let mut grads = GradientsParams::new();
        for b in 0..s.layout.buckets.len() {
            let reduced = self.wait(&mut s, b)?;
            let t0 = Instant::now();
            let bucket = s.layout.buckets[b].slots.clone();
            for (slot, values) in bucket.into_iter().zip(reduced) {
                (s.slots[slot].unpack)(&mut grads, values);
            }
            s.times.unpacked[b] = Some((t0, Instant::now()));
        }
        if !s.rebuilt {
            self.rebuild(&mut s)?;
        }
        let times = std::mem::take(&mut s.times);
        Ok(Some((grads, times)))
    }

    /// Treats parameters that got no (or only part of their) gradient as zeros, so every rank
    /// launches every bucket: never a hang, no flag needed.
    fn complete_missing(&self, s: &mut State) {
        let mut unused = Vec::new();
        for slot in 0..s.slots.len() {
            if s.events_left[slot] == 0 {
                continue;
            }
            if s.grads[slot].is_none() {
                s.grads[slot] = Some(vec![0.0; s.slots[slot].numel]);
                unused.push(s.slots[slot].path.clone());
            }
            s.events_left[slot] = 0;
            let b = s.layout.bucket_of[slot];
            s.bucket_pending[b] -= 1;
        }
        if !unused.is_empty() && !s.warned_unused {
            s.warned_unused = true;
            tracing::warn!(
                rank = self.pg.rank(),
                params = %unused.join(", "),
                "parameters received no gradient in this backward; they count as zeros (logged once)"
            );
        }
    }

    fn launch(&self, s: &mut State, b: usize) -> Result<(), DdpError> {
        s.next_launch = b + 1;
        if s.times.ready[b].is_none() {
            s.times.ready[b] = Some(Instant::now());
        }
        let slots = &s.layout.buckets[b].slots;
        let work = match self.compression {
            GradientCompression::None => {
                let bufs = slots
                    .iter()
                    .map(|&slot| s.grads[slot].take())
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| internal("a gradient is missing at launch"))?;
                InFlight::F32(self.pg.all_reduce_coalesced_async(bufs, ReduceOp::Avg))
            }
            GradientCompression::Fp16 => InFlight::F16(self.pg.all_reduce_async(
                narrow(&s.grads, slots, |v| f16::from_f32(v * self.scale))?,
                ReduceOp::Sum,
            )),
            GradientCompression::Bf16 => InFlight::BF16(self.pg.all_reduce_async(
                narrow(&s.grads, slots, |v| bf16::from_f32(v * self.scale))?,
                ReduceOp::Sum,
            )),
        };
        s.in_flight[b] = Some(work);
        Ok(())
    }

    /// Waits for bucket `b` and returns its reduced buffers, one per slot in bucket order.
    fn wait(&self, s: &mut State, b: usize) -> Result<Vec<Vec<f32>>, DdpError> {
        let ctx = "all-reducing a gradient bucket";
        let work = s.in_flight[b]
            .take()
            .ok_or_else(|| internal("bucket was never launched"))?;
        let (bufs, timing) = match work {
            InFlight::F32(w) => {
                let (r, t) = w.wait_timed();
                (r.map_err(DdpError::comm(ctx))?, t)
            }
            InFlight::F16(w) => widen(w, s, b, f16::to_f32)?,
            InFlight::BF16(w) => widen(w, s, b, bf16::to_f32)?,
        };
        s.times.comm[b] = timing;
        Ok(bufs)
    }

    /// After the first iteration: lay buckets out in the order gradients arrived on rank 0.
    fn rebuild(&self, s: &mut State) -> Result<(), DdpError> {
        s.rebuilt = true;
        let n = s.slots.len();
        let mut order: Vec<i64> = s.arrival.iter().map(|&x| x as i64).collect();
        // Slots that never arrived keep their initial relative order, at the end.
        for &slot in &s.layout.order {
            if !s.arrival.contains(&slot) {
                order.push(slot as i64);
            }
        }
        order.resize(n, 0);
        self.pg
            .broadcast(&mut order, 0)
            .map_err(DdpError::comm("agreeing on the bucket order"))?;
        let order: Vec<usize> = order.into_iter().map(|x| x as usize).collect();
        let mut seen = vec![false; n];
        if order
            .iter()
            .any(|&x| x >= n || std::mem::replace(&mut seen[x], true))
        {
            return Err(internal("rank 0 sent an invalid bucket order"));
        }
        let numel: Vec<usize> = s.slots.iter().map(|x| x.numel).collect();
        s.layout = BucketLayout::new(order, &numel, self.first_cap_bytes, self.cap_bytes);
        s.allocate();
        tracing::debug!(
            buckets = s.layout.buckets.len(),
            "rebuilt gradient buckets in arrival order"
        );
        Ok(())
    }
}

impl State {
    /// The slot of a tap event, counting it; `None` for buffers and for events outside a DDP
    /// backward (counted as stray, reported by the next `begin`).
    fn accept(&mut self, param_index: usize) -> Option<usize> {
        let slot = self.index_to_slot.get(param_index).copied().flatten()?;
        if !self.in_backward {
            self.stray_events += 1;
            return None;
        }
        self.events += 1;
        Some(slot)
    }

    fn allocate(&mut self) {
        self.in_flight = self.layout.buckets.iter().map(|_| None).collect();
    }
}

/// The half-precision flat buffer of a bucket's `slots`, element by element through `narrow`.
fn narrow<H>(
    grads: &[Option<Vec<f32>>],
    slots: &[usize],
    narrow: impl Fn(f32) -> H,
) -> Result<Vec<H>, DdpError> {
    let mut flat = Vec::new();
    for &slot in slots {
        let g = grads[slot]
            .as_ref()
            .ok_or_else(|| internal("a gradient is missing at launch"))?;
        flat.extend(g.iter().map(|v| narrow(*v)));
    }
    Ok(flat)
}

/// Waits for a compressed all-reduce and widens its result into the bucket's f32 buffers.
fn widen<H: Copy>(
    work: Work<Vec<H>>,
    s: &mut State,
    b: usize,
    widen: fn(H) -> f32,
) -> Result<(Vec<Vec<f32>>, Option<WorkTiming>), DdpError> {
    let (result, timing) = work.wait_timed();
    let half = result.map_err(DdpError::comm("all-reducing a gradient bucket"))?;
    let mut at = 0;
    let mut bufs = Vec::with_capacity(s.layout.buckets[b].slots.len());
    for &slot in &s.layout.buckets[b].slots {
        let mut g = s.grads[slot]
            .take()
            .ok_or_else(|| internal("a compressed gradient is missing after the all-reduce"))?;
        let src = half
            .get(at..at + g.len())
            .ok_or_else(|| internal("the compressed result is shorter than its bucket"))?;
        g.iter_mut().zip(src).for_each(|(d, h)| *d = widen(*h));
        at += g.len();
        bufs.push(g);
    }
    Ok((bufs, timing))
}

fn internal(what: &str) -> DdpError {
    DdpError::Misuse(format!("internal error in the DDP reducer: {what}"))
}

impl<I: Backend> GradientSink<I> for Reducer<I> {
    fn on_gradient(&self, param_index: usize, grad: FloatTensor<I>) {
        if let Some(direct) = &self.direct {
            let mut s = self.lock();
            let Some(slot) = s.accept(param_index) else {
                return;
            };
            let mut tensors = direct.lock().unwrap_or_else(PoisonError::into_inner);
            tensors[slot] = Some(match tensors[slot].take() {
                Some(prev) => I::float_add(prev, grad),
                None => grad,
            });
            return;
        }
        let data = match burn::tensor::try_read_sync(I::float_into_data(grad)) {
            Some(Ok(d)) => d.convert::<f32>(),
            Some(Err(e)) => {
                self.lock()
                    .errors
                    .push(format!("reading a gradient from the device: {e:?}"));
                return;
            }
            None => {
                self.lock().errors.push(
                    "reading a gradient from the device: this platform cannot block on the read"
                        .into(),
                );
                return;
            }
        };
        // Takes over the tensor's storage when it can (no copy on the CPU backend).
        let values: Vec<f32> = match data.into_vec::<f32>() {
            Ok(v) => v,
            Err(e) => {
                self.lock()
                    .errors
                    .push(format!("gradient data is not f32 after conversion: {e:?}"));
                return;
            }
        };
        let mut s = self.lock();
        let Some(slot) = s.accept(param_index) else {
            return;
        };
        let b = s.layout.bucket_of[slot];
        let numel = s.slots[slot].numel;
        let launched = s.sync && b < s.next_launch;
        if values.len() != numel || launched {
            let path = s.slots[slot].path.clone();
            let problem = if launched {
                format!("gradient of '{path}' arrived after its bucket was launched")
            } else {
                format!(
                    "gradient of '{path}' has {} elements, expected {numel}",
                    values.len()
                )
            };
            s.errors.push(problem);
            return;
        }
        match s.grads[slot].as_mut() {
            Some(acc) => acc.iter_mut().zip(&values).for_each(|(d, v)| *d += v),
            None => s.grads[slot] = Some(values),
        }
        s.events_left[slot] = s.events_left[slot].saturating_sub(1);
        if s.events_left[slot] == 0 {
            if !s.rebuilt && !s.arrival.contains(&slot) {
                s.arrival.push(slot);
            }
            s.bucket_pending[b] -= 1;
            if s.bucket_pending[b] == 0 {
                s.times.ready[b] = Some(Instant::now());
            }
            if s.sync {
                while s.next_launch < s.layout.buckets.len() && s.bucket_pending[s.next_launch] == 0
                {
                    let next = s.next_launch;
                    if let Err(e) = self.launch(&mut s, next) {
                        s.errors.push(e.to_string());
                        break;
                    }
                }
            }
        }
    }
}
