//! [`DistributedSampler`](crate::DistributedSampler): PyTorch's `DistributedSampler` semantics with a
//! portable shuffle and resumable state.
//!
//! The types are at the crate root; this module keeps the arithmetic behind them, public so
//! that other code can reproduce an order exactly:
//! * [`indices`]: the pure padding / striding arithmetic.
//! * [`permutation`]: the exact, platform-independent shuffle.
//!
//! Files: `config.rs` ([`DistributedSamplerConfig`]),
//! `distributed.rs` (the sampler), `exact_shard.rs` ([`ExactShard`](crate::ExactShard), every index on exactly one rank, for evaluation),
//! `state.rs` ([`SamplerState`](crate::SamplerState) and how it is restored, also across world sizes).

pub(crate) mod config;
pub(crate) mod distributed;
pub(crate) mod exact_shard;
pub mod indices;
pub mod permutation;
pub(crate) mod state;

pub(crate) use config::DistributedSamplerConfig;
