//! [`StagedReduction`]: host staging with one device-to-host copy per bucket, for GPU backends
//! whose ranks reduce over the CPU transports.
//!
//! Reading each gradient on its own costs a device synchronisation per parameter (hundreds per
//! step). Here gradients stay on the device until their bucket is full; the bucket is then
//! flattened and concatenated on the device, read in one copy, all-reduced in host memory,
//! written back in one copy, and each gradient is a slice of that device buffer.

use super::flat_bucket::{FlatLayout, flatten, unflatten};
use super::host_grad::{HostElement, HostGrad, read_to_host};
use super::reduction::{BucketReduction, FullBucket, PendingBucket, Reduced, Slot, first_slot};
use crate::error::DdpError;
use burn::tensor::TensorData;
use burn::tensor::backend::Backend;
use ddp_comm::{ProcessGroup, ReduceOp, Work, bf16, f16};

/// Gradients kept on the device; one read and one write per bucket.
pub(crate) struct StagedReduction {
    pub(crate) pg: ProcessGroup,
}

impl<I: Backend> BucketReduction<I> for StagedReduction {
    fn launch(&self, bucket: FullBucket<'_, I>) -> Result<Box<dyn PendingBucket<I>>, DdpError> {
        let first = first_slot(bucket.slots)?;
        let (flat, layout) = flatten(bucket.slots, bucket.grads)?;
        // The one device-to-host copy of this bucket.
        let data = read_to_host::<I>(flat)
            .map_err(|e| first.gradient_error(format!("reading its bucket: {e}")))?;
        let host = HostGrad::from_data(data).map_err(|r| first.gradient_error(r))?;
        Ok(match host {
            HostGrad::F32(v) => start::<I, f32>(&self.pg, v, layout),
            HostGrad::F64(v) => start::<I, f64>(&self.pg, v, layout),
            HostGrad::F16(v) => start::<I, f16>(&self.pg, v, layout),
            HostGrad::BF16(v) => start::<I, bf16>(&self.pg, v, layout),
        })
    }
}

fn start<I: Backend, T: HostElement>(
    pg: &ProcessGroup,
    flat: Vec<T>,
    layout: FlatLayout,
) -> Box<dyn PendingBucket<I>> {
    Box::new(Staged {
        work: pg.all_reduce_async(flat, ReduceOp::Avg),
        layout,
    })
}

struct Staged<T: HostElement> {
    work: Work<Vec<T>>,
    layout: FlatLayout,
}

impl<I: Backend, T: HostElement> PendingBucket<I> for Staged<T> {
    fn wait(self: Box<Self>, slots: &[&Slot<I>]) -> Result<Reduced<I>, DdpError> {
        let (result, timing) = self.work.wait_timed();
        let flat = result.map_err(DdpError::comm("all-reducing a gradient bucket"))?;
        let device = &first_slot(slots)?.device;
        let total = flat.len();
        // The one host-to-device copy; each gradient is a slice of it.
        let bucket = I::float_from_data(TensorData::new(flat, [total]), device);
        let tensors = unflatten(bucket, &self.layout, slots)?;
        Ok((tensors, timing))
    }
}
