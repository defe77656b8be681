//! fp16/bf16 compression as hooks: half the bytes of an f32 all-reduce.

use super::comm_hook::{CommHook, GradBucket, HookError};
use ddp_comm::{Element, ProcessGroup, ReduceOp, bf16, f16};

/// Sends gradients as f16 (PyTorch's `fp16_compress_hook`): each value is scaled by
/// `1 / world_size` while narrowing (so the half-precision sum cannot overflow where the
/// average would not), summed, and widened back.
#[derive(Debug, Default, Clone, Copy)]
pub struct Fp16CompressHook;

/// Sends gradients as bf16 (PyTorch's `bf16_compress_hook`): f32's range, 8 bits of mantissa.
#[derive(Debug, Default, Clone, Copy)]
pub struct Bf16CompressHook;

impl CommHook for Fp16CompressHook {
    fn reduce(&mut self, bucket: &mut GradBucket, pg: &ProcessGroup) -> Result<(), HookError> {
        narrowed(bucket, pg, f16::from_f32, f16::to_f32)
    }

    fn name(&self) -> &str {
        "fp16 compression"
    }
}

impl CommHook for Bf16CompressHook {
    fn reduce(&mut self, bucket: &mut GradBucket, pg: &ProcessGroup) -> Result<(), HookError> {
        narrowed(bucket, pg, bf16::from_f32, bf16::to_f32)
    }

    fn name(&self) -> &str {
        "bf16 compression"
    }
}

fn narrowed<H: Element>(
    bucket: &mut GradBucket,
    pg: &ProcessGroup,
    narrow: fn(f32) -> H,
    widen: fn(H) -> f32,
) -> Result<(), HookError> {
    let scale = 1.0 / pg.world_size() as f32;
    let mut half: Vec<H> = bucket.buffer().iter().map(|v| narrow(v * scale)).collect();
    pg.all_reduce(&mut half, ReduceOp::Sum)?;
    bucket
        .buffer_mut()
        .iter_mut()
        .zip(half)
        .for_each(|(d, h)| *d = widen(h));
    Ok(())
}
