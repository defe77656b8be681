//! [`DistributedSampler`]: PyTorch's `DistributedSampler` semantics with a
//! portable shuffle and resumable state.
//!
//! * [`config`]: [`DistributedSamplerConfig`], the builder-style settings.
//! * [`distributed`]: the sampler.
//! * [`exact_shard`]: [`ExactShard`], every index on exactly one rank (evaluation).
//! * [`indices`]: the pure padding / striding arithmetic.
//! * [`permutation`]: the exact, platform-independent shuffle.
//! * [`state`]: [`SamplerState`] and how it is restored (also across world sizes).

pub mod config;
pub mod distributed;
pub mod exact_shard;
pub mod indices;
pub mod permutation;
pub mod state;

pub use config::DistributedSamplerConfig;
pub use distributed::DistributedSampler;
pub use exact_shard::ExactShard;
pub use state::SamplerState;
