//! [`DdpConfig`]: the settings of [`DistributedDataParallel`](super::DistributedDataParallel).

use crate::engine::{Collectives, HostStaging};
use burn::config::Config;

/// Settings of the DDP wrapper, in burn's config style:
/// `DdpConfig::new().with_bucket_cap_mb(25.0).with_first_bucket_cap_mb(1.0)`.
#[derive(Config, Debug)]
pub struct DdpConfig {
    /// Largest bucket, in MiB of f32 gradients. Larger buckets mean fewer, more efficient
    /// all-reduces but a later start.
    #[config(default = 25.0)]
    pub bucket_cap_mb: f64,
    /// Cap of the first bucket (the last layers' gradients), so communication starts early.
    #[config(default = 1.0)]
    pub first_bucket_cap_mb: f64,
    /// Small models get smaller buckets: both caps are lowered to `1/min_buckets` of the
    /// model's gradient bytes (not below 16 KiB), so no bucket holds more than that share
    /// unless one parameter alone is larger. A model whose gradients fit in one bucket cannot
    /// overlap anything, since that bucket is complete only when backward ends; PyTorch's
    /// 25 MiB cap puts a whole 6M-parameter MLP in one. `1` gives PyTorch's layout (the caps
    /// alone). Models of over `min_buckets` x `bucket_cap_mb` are not affected.
    #[config(default = 4)]
    pub min_buckets: usize,
    /// Copy buffers (non-trainable float state such as batch-norm statistics) from rank 0 before
    /// every forward, as PyTorch does by default.
    #[config(default = true)]
    pub broadcast_buffers: bool,
    /// Let gradients leave during backward without [`layer_boundary`](crate::layer_boundary)
    /// marks (on by default; `false` is the switch to turn it off). burn runs backward deepest
    /// node first and a
    /// plain tap sits right above its parameter, so it would fire at the very end. Instead each
    /// tap is created at its parameter's first use in the forward and, from the second backward
    /// on, anchored at the depth probes measured on the first (one level below its shallowest
    /// consumer): backward reaches it right after the layer that used the parameter, and every
    /// other node keeps its depth, so the results are bitwise those of plain taps. A forward
    /// that uses parameters in another order gets plain taps from the first difference on; when
    /// that happens or the loss's depth changed, the next backward learns again. Marks still
    /// work and hand over what they find first. The first backward whose taps are anchored on
    /// every rank lays the buckets out again, once, in the order they then arrive. See the
    /// crate docs' Overlap section.
    #[config(default = true)]
    pub automatic_overlap: bool,
    /// Which collectives reduce the buckets: NCCL on the GPU or the CPU transports.
    #[config(default = "Collectives::Auto")]
    pub collectives: Collectives,
    /// How gradients are staged in host memory for the CPU transports (world size > 1).
    /// [`HostStaging::PerBucket`] is refused with a communication hook (compression, PowerSGD), which
    /// reads each gradient on its own.
    #[config(default = "HostStaging::Auto")]
    pub host_staging: HostStaging,
    /// Ranks may run out of batches at different steps (PyTorch's `Join`): every backward first
    /// agrees, in one tiny all-reduce, on which ranks still train, and a rank with no batches
    /// left calls [`join`](crate::DistributedDataParallel::join), which answers the others'
    /// steps with zero gradients (not counted in the average) until every rank has joined.
    #[config(default = false)]
    pub uneven_inputs: bool,
    /// With [`uneven_inputs`](Self::uneven_inputs): divide every step's summed gradients by
    /// the world size, joined ranks included, instead of by the ranks still training.
    /// PyTorch's `Join(divide_by_initial_world_size=True)`, its default; here off by default,
    /// so that a step with joined ranks averages over the batches it actually saw, as one
    /// process training on those batches would (the gradient-equivalence rule).
    #[config(default = false)]
    pub divide_by_initial_world_size: bool,
    /// Write a Chrome trace (chrome://tracing, Perfetto) of the steps to this file on rank 0.
    /// A file that cannot be written turns the timeline off with a warning; training goes on.
    pub timeline_path: Option<String>,
    /// How many steps the timeline records.
    #[config(default = 20)]
    pub timeline_steps: usize,
}

impl DdpConfig {
    pub(crate) fn validate(&self) -> Result<(), crate::DdpError> {
        let ok = |v: f64| v.is_finite() && v > 0.0;
        if !ok(self.bucket_cap_mb) || !ok(self.first_bucket_cap_mb) {
            return Err(crate::DdpError::InvalidConfig(format!(
                "bucket caps must be positive, got bucket_cap_mb = {} and first_bucket_cap_mb = {}",
                self.bucket_cap_mb, self.first_bucket_cap_mb
            )));
        }
        if self.min_buckets == 0 {
            return Err(crate::DdpError::InvalidConfig(
                "min_buckets must be at least 1 (1 keeps the bucket caps as they are)".into(),
            ));
        }
        Ok(())
    }
}
