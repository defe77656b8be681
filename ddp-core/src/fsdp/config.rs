//! [`FsdpConfig`]: which parts of the model are units, and which communicator carries them.

use crate::Collectives;
use burn::config::Config;

/// How [`FullyShardedDataParallel`](super::FullyShardedDataParallel) groups the parameters, in
/// burn's config style (saved and loaded as JSON like any burn config).
///
/// A unit is every trainable parameter whose path starts with a marked prefix: mark layers or
/// blocks (`"blocks.0"`, `"blocks.1"`, ... for a `Vec` field `blocks`), as FSDP2's
/// `fully_shard` is applied to each block. The parameters no prefix matches form one more unit,
/// `(root)`. Each unit is gathered and reduce-scattered as one collective; each rank holds
/// `1/world` of each.
///
/// ```
/// # use ddp_core::fsdp::FsdpConfig;
/// let config = FsdpConfig::new().with_units(["layers.0", "layers.1"]);
/// assert_eq!(config.units(), ["layers.0", "layers.1"]);
/// ```
#[derive(Config, Debug)]
pub struct FsdpConfig {
    /// The marked prefixes, one unit each, in order (module paths, `.`-separated, such as
    /// `"encoder"` or `"blocks.3"`); none: the whole model is one unit. A prefix that matches
    /// no trainable parameter is an error at construction. [`with_unit`](Self::with_unit) and
    /// [`with_units`](Self::with_units) add to them.
    #[config(default = "Vec::new()")]
    pub unit_prefixes: Vec<String>,
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
    #[config(default = "Collectives::Auto")]
    pub collectives: Collectives,
}

impl Default for FsdpConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl FsdpConfig {
    /// The communicator asked for.
    pub fn collectives(&self) -> Collectives {
        self.collectives
    }

    /// Marks the parameters under `prefix` (a module path, `.`-separated, such as `"encoder"`
    /// or `"blocks.3"`) as one unit. A prefix that matches no trainable parameter is an error
    /// at construction.
    pub fn with_unit(mut self, prefix: impl Into<String>) -> Self {
        self.unit_prefixes.push(prefix.into());
        self
    }

    /// Marks each prefix as its own unit, in order, after those already marked.
    pub fn with_units<S: Into<String>>(mut self, prefixes: impl IntoIterator<Item = S>) -> Self {
        self.unit_prefixes
            .extend(prefixes.into_iter().map(Into::into));
        self
    }

    /// The marked prefixes.
    pub fn units(&self) -> &[String] {
        &self.unit_prefixes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_add_up_and_the_config_saves_and_loads_as_a_burn_config() {
        let config = FsdpConfig::new()
            .with_unit("embed")
            .with_units(["layers.0", "layers.1"])
            .with_collectives(Collectives::Host);
        assert_eq!(config.units(), ["embed", "layers.0", "layers.1"]);
        // The derived setter replaces the list.
        assert_eq!(
            config.clone().with_unit_prefixes(vec!["x".into()]).units(),
            ["x"]
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fsdp.json");
        config.save(&path).unwrap();
        let loaded = FsdpConfig::load(&path).unwrap();
        assert_eq!(loaded.units(), config.units());
        assert_eq!(loaded.collectives(), Collectives::Host);
        assert_eq!(FsdpConfig::default().units(), [] as [String; 0]);
        assert_eq!(FsdpConfig::default().collectives(), Collectives::Auto);
    }
}
