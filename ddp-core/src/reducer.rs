//! The reducer: collects tapped gradients into bucket buffers and all-reduces full buckets.
//!
//! During backward, each tap event copies its gradient into the parameter's place in a flat
//! bucket buffer, scaled by `1 / world_size` (so a sum is an average). When every parameter of
//! a bucket has arrived, the bucket's all-reduce is queued on the communication thread at once,
//! but only after every earlier bucket: all ranks launch the same collectives in the same order.
//! After backward, [`Reducer::finish`] launches what is left (parameters that got no gradient
//! count as zeros), waits for the buckets in order and turns them into `GradientsParams`.
//!
//! Without synchronisation (`no_sync`), events add into the same buffers and nothing is
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

enum InFlight {
    F32(Work<Vec<f32>>),
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
    buffers: Vec<Option<Vec<f32>>>,
    in_flight: Vec<Option<InFlight>>,
    events_left: Vec<usize>,
    bucket_pending: Vec<usize>,
    written: Vec<bool>,
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
            buffers: Vec::new(),
            in_flight: Vec::new(),
            events_left: vec![0; n],
            bucket_pending: Vec::new(),
            written: vec![false; n],
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
        if direct.is_none() {
            state.allocate();
        }
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
            s.written.iter_mut().for_each(|w| *w = false);
            return Ok(Some((grads, std::mem::take(&mut s.times))));
        }
        self.complete_missing(&mut s);
        while s.next_launch < s.layout.buckets.len() {
            let b = s.next_launch;
            self.launch(&mut s, b)?;
        }
        let mut grads = GradientsParams::new();
        for b in 0..s.layout.buckets.len() {
            let buf = self.wait(&mut s, b)?;
            let t0 = Instant::now();
            let bucket = s.layout.buckets[b].slots.clone();
            for slot in bucket {
                let range = s.layout.location[slot].1.clone();
                (s.slots[slot].unpack)(&mut grads, buf[range].to_vec());
            }
            s.times.unpacked[b] = Some((t0, Instant::now()));
            s.buffers[b] = Some(buf);
        }
        s.written.iter_mut().for_each(|w| *w = false);
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
            if !s.written[slot] {
                let (b, range) = s.layout.location[slot].clone();
                if let Some(buf) = s.buffers[b].as_mut() {
                    buf[range].fill(0.0);
                }
                s.written[slot] = true;
                unused.push(s.slots[slot].path.clone());
            }
            s.events_left[slot] = 0;
            let b = s.layout.location[slot].0;
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
        let work = match self.compression {
            GradientCompression::None => {
                let buf = s.buffers[b]
                    .take()
                    .ok_or_else(|| internal("bucket buffer missing at launch"))?;
                InFlight::F32(self.pg.all_reduce_async(buf, ReduceOp::Sum))
            }
            GradientCompression::Fp16 => {
                let buf = s.buffers[b]
                    .as_ref()
                    .ok_or_else(|| internal("bucket buffer missing at launch"))?;
                InFlight::F16(self.pg.all_reduce_async(
                    buf.iter().map(|v| f16::from_f32(*v)).collect(),
                    ReduceOp::Sum,
                ))
            }
            GradientCompression::Bf16 => {
                let buf = s.buffers[b]
                    .as_ref()
                    .ok_or_else(|| internal("bucket buffer missing at launch"))?;
                InFlight::BF16(self.pg.all_reduce_async(
                    buf.iter().map(|v| bf16::from_f32(*v)).collect(),
                    ReduceOp::Sum,
                ))
            }
        };
        s.in_flight[b] = Some(work);
        Ok(())
    }

    fn wait(&self, s: &mut State, b: usize) -> Result<Vec<f32>, DdpError> {
        let ctx = "all-reducing a gradient bucket";
        let work = s.in_flight[b]
            .take()
            .ok_or_else(|| internal("bucket was never launched"))?;
        let (buf, timing) = match work {
            InFlight::F32(w) => {
                let (r, t) = w.wait_timed();
                (r.map_err(DdpError::comm(ctx))?, t)
            }
            InFlight::F16(w) => decompress(w, s.buffers[b].take(), f16::to_f32)?,
            InFlight::BF16(w) => decompress(w, s.buffers[b].take(), bf16::to_f32)?,
        };
        s.times.comm[b] = timing;
        Ok(buf)
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
        self.buffers = self
            .layout
            .buckets
            .iter()
            .map(|b| Some(vec![0.0f32; b.len]))
            .collect();
        self.in_flight = self.layout.buckets.iter().map(|_| None).collect();
    }
}

/// Waits for a compressed all-reduce and widens its result into the bucket's f32 buffer.
fn decompress<H>(
    work: Work<Vec<H>>,
    buf: Option<Vec<f32>>,
    widen: fn(H) -> f32,
) -> Result<(Vec<f32>, Option<WorkTiming>), DdpError>
where
    H: Copy,
{
    let (result, timing) = work.wait_timed();
    let half = result.map_err(DdpError::comm("all-reducing a gradient bucket"))?;
    let mut buf = buf.ok_or_else(|| internal("bucket buffer missing"))?;
    buf.iter_mut().zip(&half).for_each(|(d, h)| *d = widen(*h));
    Ok((buf, timing))
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
            s.written[slot] = true;
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
        let values: &[f32] = match data.as_slice::<f32>() {
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
        let (b, range) = s.layout.location[slot].clone();
        let first = !s.written[slot];
        let scale = self.scale;
        if values.len() != range.len() || s.buffers[b].is_none() {
            let path = s.slots[slot].path.clone();
            let problem = if s.buffers[b].is_none() {
                format!("gradient of '{path}' arrived after its bucket was launched")
            } else {
                format!(
                    "gradient of '{path}' has {} elements, expected {}",
                    values.len(),
                    range.len()
                )
            };
            s.errors.push(problem);
            return;
        }
        let Some(buf) = s.buffers[b].as_mut() else {
            return;
        };
        let dst = &mut buf[range];
        if first {
            dst.iter_mut().zip(values).for_each(|(d, v)| *d = v * scale);
        } else {
            dst.iter_mut()
                .zip(values)
                .for_each(|(d, v)| *d += v * scale);
        }
        s.written[slot] = true;
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
