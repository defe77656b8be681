//! [`FsdpConfig`]: which parts of the model are units, and which communicator carries them.

use crate::Collectives;

/// How [`FullyShardedDataParallel`](super::FullyShardedDataParallel) groups the parameters.
///
/// A unit is every trainable parameter whose path starts with a marked prefix: mark layers or
/// blocks (`"blocks.0"`, `"blocks.1"`, ... for a `Vec` field `blocks`), as FSDP2's
/// `fully_shard` is applied to each block. The parameters no prefix matches form one more unit,
/// `(root)`. Each unit is gathered and reduce-scattered as one collective; each rank holds
/// `1/world` of each.
#[derive(Debug, Clone)]
pub struct FsdpConfig {
    units: Vec<String>,
    collectives: Collectives,
}

impl Default for FsdpConfig {
    fn default() -> Self {
        FsdpConfig {
            units: Vec::new(),
            collectives: Collectives::Auto,
        }
    }
}

impl FsdpConfig {
    /// No units marked: the whole model is one unit; collectives [`Collectives::Auto`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Which communicator carries the units' all-gathers and reduce-scatters, as
    /// [`DdpConfig::collectives`](crate::DdpConfig::collectives) does for DDP's buckets:
    /// - [`Collectives::Auto`] (the default): NCCL on the GPU when the model is on burn's CUDA
    ///   backend, the world size is above 1 and every rank can run NCCL on a GPU of its own
    ///   (feature `cuda`); otherwise the process group's CPU transports;
    /// - [`Collectives::Nccl`]: NCCL, or an error at construction saying what is missing;
    /// - [`Collectives::Host`]: the CPU transports, through host memory;
    /// - [`Collectives::StandIn`]: the device engine's CPU stand-in (runs the device path on
    ///   machines without GPUs).
    ///
    /// On a device communicator the parameters and gradients stay tensors on the model's
    /// device, and each unit's reduce-scatter is queued during backward by the device engine's
    /// issuing thread, in the units' launch order. Every rank uses the same value.
    pub fn with_collectives(mut self, collectives: Collectives) -> Self {
        self.collectives = collectives;
        self
    }

    /// The communicator asked for.
    pub fn collectives(&self) -> Collectives {
        self.collectives
    }

    /// Marks the parameters under `prefix` (a module path, `.`-separated, such as `"encoder"`
    /// or `"blocks.3"`) as one unit. A prefix that matches no trainable parameter is an error
    /// at construction.
    pub fn with_unit(mut self, prefix: impl Into<String>) -> Self {
        self.units.push(prefix.into());
        self
    }

    /// Marks each prefix as its own unit, in order.
    pub fn with_units<S: Into<String>>(mut self, prefixes: impl IntoIterator<Item = S>) -> Self {
        self.units.extend(prefixes.into_iter().map(Into::into));
        self
    }

    /// The marked prefixes.
    pub fn units(&self) -> &[String] {
        &self.units
    }
}
