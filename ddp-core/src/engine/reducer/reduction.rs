//! How a full bucket is reduced: the one interface between DDP's bucket bookkeeping
//! ([`super::Reducer`]) and the data movement.
//!
//! A [`BucketReduction`] decides how a gradient is kept until its bucket is full
//! ([`BucketReduction::hold`], [`BucketReduction::add`]) and how a full bucket becomes averaged
//! gradient tensors ([`BucketReduction::launch`], then [`PendingBucket::wait`]). The bookkeeping
//! decides *when*: which bucket is full, in which order buckets launch, and which parameters no
//! rank used.
//!
//! - [`LocalReduction`] (world size 1, or a hook that leaves gradients local): gradients stay
//!   tensors on their device; nothing moves.
//! - [`HostReduction`]: gradients are read into host memory in their own dtype, and a bucket is one
//!   coalesced all-reduce over ddp-comm (shared memory or TCP).
//! - [`HookReduction`](super::hook_reduction::HookReduction): f32 buckets go through a user's
//!   [`CommHook`](crate::hooks::CommHook) (fp16/bf16 compression, PowerSGD) on a thread of its
//!   own.

use super::host_grad::{HostElement, HostGrad, read_to_host};
use crate::engine::hooks::CommHookState;
use crate::error::{CommHookStateError, DdpError};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, TensorData};
use ddp_comm::{ProcessGroup, ReduceOp, Work, WorkTiming, bf16, f16};

/// A trainable parameter as the reducer sees it: tied parameters (several module entries with
/// one `ParamId`) share one slot.
pub(crate) struct Slot<I: Backend> {
    pub(crate) path: String,
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: DType,
    pub(crate) device: I::Device,
    /// The module entries (parameter indices) of this slot; the first one's id keys the
    /// gradient.
    pub(crate) entries: Vec<usize>,
}

impl<I: Backend> Slot<I> {
    pub(crate) fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// [`DdpError::Gradient`]: this parameter's gradient cannot be reduced, for `reason`.
    pub(crate) fn gradient_error(&self, reason: String) -> DdpError {
        DdpError::Gradient {
            path: self.path.clone(),
            reason,
        }
    }
}

/// The first slot of a bucket, which has at least one (its dtype and device are the bucket's).
pub(crate) fn first_slot<'s, I: Backend>(slots: &[&'s Slot<I>]) -> Result<&'s Slot<I>, DdpError> {
    slots
        .first()
        .copied()
        .ok_or_else(|| internal("empty bucket"))
}

/// A gradient kept until its bucket launches, in the reduction's representation.
pub(crate) enum Held<I: Backend> {
    /// Still a tensor on its device.
    Tensor(FloatTensor<I>),
    /// Read into host memory.
    Host(HostGrad),
}

/// A reduced bucket: one gradient per slot (in bucket order), `None` where the slot had no
/// gradient and nothing was reduced for it, and when the collective ran.
pub(crate) type Reduced<I> = (Vec<Option<FloatTensor<I>>>, Option<WorkTiming>);

/// A launched bucket.
pub(crate) trait PendingBucket<I: Backend>: Send {
    /// Waits for the reduction.
    fn wait(self: Box<Self>, slots: &[&Slot<I>]) -> Result<Reduced<I>, DdpError>;
}

/// How gradients are kept and how a full bucket is reduced.
pub(crate) trait BucketReduction<I: Backend>: Send + Sync {
    /// Takes a gradient as backward produced it. By default it stays a tensor where backward
    /// made it (on the device); reductions that stage in host memory read it here.
    fn hold(&self, _slot: &Slot<I>, grad: FloatTensor<I>) -> Result<Held<I>, DdpError> {
        Ok(Held::Tensor(grad))
    }
    /// Adds a further gradient of the same slot (by default, on the device).
    fn add(&self, _slot: &Slot<I>, acc: Held<I>, more: Held<I>) -> Result<Held<I>, DdpError> {
        match (acc, more) {
            (Held::Tensor(a), Held::Tensor(b)) => Ok(Held::Tensor(I::float_add(a, b))),
            _ => Err(internal(
                "the gradients of this reduction are held as tensors",
            )),
        }
    }
    /// Starts reducing a full bucket.
    fn launch(&self, bucket: FullBucket<'_, I>) -> Result<Box<dyn PendingBucket<I>>, DdpError>;
    /// This rank's DDP failed (`reason`): fail whatever the reduction communicates through
    /// besides the process group (which DDP aborts itself), so peers waiting in it fail
    /// promptly naming this rank instead of at their timeout.
    fn abort(&self, _reason: &str) {}
    /// This rank's state of the communication hook the buckets go through: `None` without one,
    /// or for one that keeps none (the default).
    fn comm_hook_state(&self) -> Result<Option<CommHookState>, DdpError> {
        Ok(None)
    }
    /// Restores the state of the communication hook (registered as `hook`) the buckets go
    /// through. By default there is none here to take it (a hook that leaves gradients local
    /// is not kept).
    fn load_comm_hook_state(&self, hook: &str, state: CommHookState) -> Result<(), DdpError> {
        Err(CommHookStateError::Stateless {
            hook: hook.to_string(),
            found: state.hook().to_string(),
        }
        .into())
    }
}

/// A full bucket handed to [`BucketReduction::launch`]: where it stands in the step, its slots,
/// and their gradients, one entry per slot, `None` where this rank has no gradient for it (it
/// counts as zeros).
pub(crate) struct FullBucket<'a, I: Backend> {
    pub(crate) position: BucketPosition,
    pub(crate) slots: &'a [&'a Slot<I>],
    pub(crate) grads: Vec<Option<Held<I>>>,
}

/// Where a bucket stands in its step's launch order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BucketPosition {
    /// Its index (0 launches first).
    pub(crate) index: usize,
    /// Whether no later bucket of the step holds gradients of its dtype: a comm hook sees the
    /// f32 buckets only, so its last f32 bucket ends its step even when a bf16 bucket follows.
    pub(crate) last_of_its_dtype: bool,
}

fn internal(what: &str) -> DdpError {
    DdpError::Internal(format!("bucket reduction: {what}"))
}

/// World size 1, or each rank keeping its own gradients (ZeRO stage 2): nothing to reduce; a
/// parameter's gradients are summed on the device.
pub(crate) struct LocalReduction;

struct Ready<I: Backend>(Vec<Option<FloatTensor<I>>>);

impl<I: Backend> PendingBucket<I> for Ready<I> {
    fn wait(self: Box<Self>, _slots: &[&Slot<I>]) -> Result<Reduced<I>, DdpError> {
        Ok((self.0, None))
    }
}

impl<I: Backend> BucketReduction<I> for LocalReduction {
    fn launch(&self, bucket: FullBucket<'_, I>) -> Result<Box<dyn PendingBucket<I>>, DdpError> {
        let tensors = bucket
            .grads
            .into_iter()
            .map(|g| match g {
                None => Ok(None),
                Some(Held::Tensor(t)) => Ok(Some(t)),
                Some(Held::Host(_)) => Err(internal("the local reduction holds tensors only")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Box::new(Ready(tensors)))
    }
}

/// Gradients in host memory, buckets all-reduced over the process group's CPU transports.
pub(crate) struct HostReduction {
    pub(crate) pg: ProcessGroup,
}

impl<I: Backend> BucketReduction<I> for HostReduction {
    fn hold(&self, slot: &Slot<I>, grad: FloatTensor<I>) -> Result<Held<I>, DdpError> {
        let data = read_to_host::<I>(grad)
            .map_err(|e| slot.gradient_error(format!("reading it from the device: {e}")))?;
        let g = HostGrad::from_data(data).map_err(|r| slot.gradient_error(r))?;
        if g.len() != slot.numel() {
            return Err(slot.gradient_error(format!(
                "it has {} elements, the parameter has {}",
                g.len(),
                slot.numel()
            )));
        }
        Ok(Held::Host(g))
    }

    fn add(&self, slot: &Slot<I>, acc: Held<I>, more: Held<I>) -> Result<Held<I>, DdpError> {
        match (acc, more) {
            (Held::Host(mut a), Held::Host(b)) => {
                a.add(&b).map_err(|r| slot.gradient_error(r))?;
                Ok(Held::Host(a))
            }
            _ => Err(internal("the host reduction holds host buffers only")),
        }
    }

    fn launch(&self, bucket: FullBucket<'_, I>) -> Result<Box<dyn PendingBucket<I>>, DdpError> {
        let dtype = first_slot(bucket.slots)?.dtype;
        let mut host = Vec::with_capacity(bucket.grads.len());
        for (slot, g) in bucket.slots.iter().zip(bucket.grads) {
            host.push(match g {
                Some(Held::Host(g)) => g,
                // Unused here: zeros, so every rank launches the same collective.
                None => HostGrad::zeros(slot.dtype, slot.numel())
                    .ok_or_else(|| internal("unsupported dtype reached a bucket"))?,
                Some(Held::Tensor(_)) => {
                    return Err(internal("the host reduction holds host buffers only"));
                }
            });
        }
        Ok(match dtype {
            DType::F32 => coalesced::<I, f32>(&self.pg, host)?,
            DType::F64 => coalesced::<I, f64>(&self.pg, host)?,
            DType::F16 => coalesced::<I, f16>(&self.pg, host)?,
            DType::BF16 => coalesced::<I, bf16>(&self.pg, host)?,
            other => return Err(internal(&format!("no reduction for {other:?}"))),
        })
    }
}

/// A bucket reduced in its own dtype: one coalesced `Avg` all-reduce over the gradients' own
/// buffers (shared memory reads and writes them in place; no bucket buffer to pack).
fn coalesced<I: Backend, T: HostElement>(
    pg: &ProcessGroup,
    host: Vec<HostGrad>,
) -> Result<Box<dyn PendingBucket<I>>, DdpError> {
    let bufs = host
        .into_iter()
        .map(T::unwrap)
        .collect::<Option<Vec<Vec<T>>>>()
        .ok_or_else(|| internal("a bucket mixes dtypes"))?;
    Ok(Box::new(CoalescedAllReduce(
        pg.all_reduce_coalesced_async(bufs, ReduceOp::Avg),
    )))
}

/// The in-flight coalesced all-reduce of one bucket's gradients.
struct CoalescedAllReduce<T: HostElement>(Work<Vec<Vec<T>>>);

impl<I: Backend, T: HostElement> PendingBucket<I> for CoalescedAllReduce<T> {
    fn wait(self: Box<Self>, slots: &[&Slot<I>]) -> Result<Reduced<I>, DdpError> {
        let (result, timing) = self.0.wait_timed();
        let bufs = result.map_err(DdpError::comm("all-reducing a gradient bucket"))?;
        let tensors = slots
            .iter()
            .zip(bufs)
            .map(|(slot, v)| Some(to_tensor(slot, TensorData::new(v, slot.shape.clone()))))
            .collect();
        Ok((tensors, timing))
    }
}

fn to_tensor<I: Backend>(slot: &Slot<I>, data: TensorData) -> FloatTensor<I> {
    I::float_from_data(data, &slot.device)
}
