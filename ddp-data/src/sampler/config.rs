//! Configuration of a [`DistributedSampler`](crate::DistributedSampler). Its constructor,
//! [`DistributedSamplerConfig::init`], is in `distributed.rs`: plain settings do not depend on
//! the sampler they configure.

use burn::config::Config;

use crate::DataError;

/// Settings of a [`DistributedSampler`](crate::DistributedSampler), with PyTorch's defaults:
/// `shuffle = true`, `seed = 0`, `drop_last = false`.
///
/// ```
/// use ddp_data::DistributedSamplerConfig;
///
/// let sampler = DistributedSamplerConfig::new(4, 1)
///     .with_seed(42)
///     .with_drop_last(true)
///     .init(1000)?;
/// assert_eq!(sampler.num_samples(), 250);
/// # Ok::<(), ddp_data::DataError>(())
/// ```
///
/// A burn [`Config`]: `new(num_replicas, rank)` (nothing is validated until
/// [`init`](Self::init)), `with_shuffle`, `with_seed`, `with_drop_last`, and JSON `save`/`load`.
#[derive(Config, Debug, PartialEq, Eq, Hash)]
pub struct DistributedSamplerConfig {
    /// World size: the number of processes taking part in training.
    pub num_replicas: usize,
    /// This process's rank, in `0..num_replicas`.
    pub rank: usize,
    /// Shuffle the order every epoch (default `true`).
    #[config(default = true)]
    pub shuffle: bool,
    /// Base seed of the shuffle; must be the same on every rank (default `0`).
    #[config(default = 0)]
    pub seed: u64,
    /// Drop the tail so the dataset splits evenly instead of padding it with
    /// repeated indices (default `false`).
    #[config(default = false)]
    pub drop_last: bool,
}

impl DistributedSamplerConfig {
    /// Checks the settings without building a sampler.
    ///
    /// # Errors
    ///
    /// [`DataError::ZeroReplicas`], [`DataError::RankOutOfRange`] or
    /// [`DataError::EmptyDataset`].
    pub fn validate(&self, dataset_len: usize) -> Result<(), DataError> {
        if self.num_replicas == 0 {
            return Err(DataError::ZeroReplicas);
        }
        if self.rank >= self.num_replicas {
            return Err(DataError::RankOutOfRange {
                rank: self.rank,
                num_replicas: self.num_replicas,
            });
        }
        if dataset_len == 0 {
            return Err(DataError::EmptyDataset);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_uses_pytorch_defaults() {
        let config = DistributedSamplerConfig::new(2, 1);
        assert!(config.shuffle);
        assert_eq!(config.seed, 0);
        assert!(!config.drop_last);
    }

    #[test]
    fn with_setters_override_defaults() {
        let config = DistributedSamplerConfig::new(2, 0)
            .with_shuffle(false)
            .with_seed(5)
            .with_drop_last(true);
        assert_eq!(
            (config.shuffle, config.seed, config.drop_last),
            (false, 5, true)
        );
    }

    #[test]
    fn validate_checks_world_size_before_rank() {
        assert_eq!(
            DistributedSamplerConfig::new(0, 0).validate(10),
            Err(DataError::ZeroReplicas)
        );
    }
}
