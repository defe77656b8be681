//! The crate-root paths of ddp-core 0.1's first layout, which moved into modules (one path per
//! type: `ddp_core::comm::ProcessGroup`, `ddp_core::launcher::LaunchArgs`, ...). Each old name is
//! kept here as a deprecated alias for one release, so a program written against the old paths
//! still compiles and its warning names the new path. Traits and functions cannot be aliased
//! this way: `SyncBatchNormBackend` is at `ddp_core::nn`, `init_process_group` at
//! `ddp_core::comm`.

/// Moved to [`ddp_core::comm::ProcessGroup`](crate::comm::ProcessGroup).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::comm::ProcessGroup`")]
pub type ProcessGroup = crate::comm::ProcessGroup;

/// Moved to [`ddp_core::comm::ProcessGroupConfig`](crate::comm::ProcessGroupConfig).
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::comm::ProcessGroupConfig`"
)]
pub type ProcessGroupConfig = crate::comm::ProcessGroupConfig;

/// Moved to [`ddp_core::comm::ReduceOp`](crate::comm::ReduceOp).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::comm::ReduceOp`")]
pub type ReduceOp = crate::comm::ReduceOp;

/// Moved to [`ddp_core::comm::Store`](crate::comm::Store).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::comm::Store`")]
pub type Store = crate::comm::Store;

/// Moved to [`ddp_core::comm::StoreConfig`](crate::comm::StoreConfig).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::comm::StoreConfig`")]
pub type StoreConfig = crate::comm::StoreConfig;

/// Moved to [`ddp_core::comm::StoreServer`](crate::comm::StoreServer).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::comm::StoreServer`")]
pub type StoreServer = crate::comm::StoreServer;

/// Moved to [`ddp_core::comm::CommError`](crate::comm::CommError).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::comm::CommError`")]
pub type CommError = crate::comm::CommError;

/// Moved to [`ddp_core::comm::InitMethod`](crate::comm::InitMethod).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::comm::InitMethod`")]
pub type InitMethod = crate::comm::InitMethod;

/// Moved to [`ddp_core::comm::Work`](crate::comm::Work).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::comm::Work`")]
pub type Work<T> = crate::comm::Work<T>;

/// Moved to [`ddp_core::data::DataError`](crate::data::DataError).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::data::DataError`")]
pub type DataError = crate::data::DataError;

/// Moved to [`ddp_core::data::DistributedSampler`](crate::data::DistributedSampler).
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::data::DistributedSampler`"
)]
pub type DistributedSampler = crate::data::DistributedSampler;

/// Moved to [`ddp_core::data::DistributedSamplerConfig`](crate::data::DistributedSamplerConfig).
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::data::DistributedSamplerConfig`"
)]
pub type DistributedSamplerConfig = crate::data::DistributedSamplerConfig;

/// Moved to [`ddp_core::data::DistributedDataLoader`](crate::data::DistributedDataLoader).
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::data::DistributedDataLoader`"
)]
pub type DistributedDataLoader<B, I, O> = crate::data::DistributedDataLoader<B, I, O>;

/// Moved to [`ddp_core::data::DistributedDataLoaderBuilder`](crate::data::DistributedDataLoaderBuilder).
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::data::DistributedDataLoaderBuilder`"
)]
pub type DistributedDataLoaderBuilder<B, I, O> = crate::data::DistributedDataLoaderBuilder<B, I, O>;

/// Moved to [`ddp_core::data::ExactShard`](crate::data::ExactShard).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::data::ExactShard`")]
pub type ExactShard = crate::data::ExactShard;

/// Moved to [`ddp_core::data::SamplerState`](crate::data::SamplerState).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::data::SamplerState`")]
pub type SamplerState = crate::data::SamplerState;

#[cfg(feature = "launch")]
/// Moved to [`ddp_core::launcher::LaunchArgs`](crate::launcher::LaunchArgs).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::launcher::LaunchArgs`")]
pub type LaunchArgs = crate::launcher::LaunchArgs;

/// Moved to [`ddp_core::launcher::LaunchError`](crate::launcher::LaunchError).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::launcher::LaunchError`")]
pub type LaunchError = crate::launcher::LaunchError;

#[cfg(feature = "launch")]
/// Moved to [`ddp_core::launcher::LaunchPlan`](crate::launcher::LaunchPlan).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::launcher::LaunchPlan`")]
pub type LaunchPlan = crate::launcher::LaunchPlan;

#[cfg(feature = "launch")]
/// Moved to [`ddp_core::launcher::NprocPerNode`](crate::launcher::NprocPerNode).
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::launcher::NprocPerNode`"
)]
pub type NprocPerNode = crate::launcher::NprocPerNode;

/// Moved to [`ddp_core::launcher::WorkerContext`](crate::launcher::WorkerContext).
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::launcher::WorkerContext`"
)]
pub type WorkerContext = crate::launcher::WorkerContext;

/// Moved to [`ddp_core::launcher::WorkerEnv`](crate::launcher::WorkerEnv).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::launcher::WorkerEnv`")]
pub type WorkerEnv = crate::launcher::WorkerEnv;

/// Moved to [`ddp_core::nn::SyncBatchNorm`](crate::nn::SyncBatchNorm).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::nn::SyncBatchNorm`")]
pub type SyncBatchNorm<B> = crate::nn::SyncBatchNorm<B>;

/// Moved to [`ddp_core::nn::SyncBatchNormError`](crate::nn::SyncBatchNormError).
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::nn::SyncBatchNormError`"
)]
pub type SyncBatchNormError = crate::nn::SyncBatchNormError;

/// Moved to [`ddp_core::nn::SyncBatchNormGroup`](crate::nn::SyncBatchNormGroup).
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::nn::SyncBatchNormGroup`"
)]
pub type SyncBatchNormGroup = crate::nn::SyncBatchNormGroup;

/// Moved to [`ddp_core::metrics::EvalTotals`](crate::metrics::EvalTotals).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::metrics::EvalTotals`")]
pub type EvalTotals = crate::metrics::EvalTotals;

/// Moved to [`ddp_core::progress::EpochProgress`](crate::progress::EpochProgress).
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::progress::EpochProgress`"
)]
pub type EpochProgress = crate::progress::EpochProgress;

/// Moved to [`ddp_core::progress::EpochSummary`](crate::progress::EpochSummary).
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::progress::EpochSummary`"
)]
pub type EpochSummary = crate::progress::EpochSummary;

/// Moved to [`ddp_core::checkpoint::CheckpointConfig`](crate::checkpoint::CheckpointConfig).
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::checkpoint::CheckpointConfig`"
)]
pub type CheckpointConfig = crate::checkpoint::CheckpointConfig;

/// Moved to [`ddp_core::checkpoint::CheckpointError`](crate::checkpoint::CheckpointError).
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::checkpoint::CheckpointError`"
)]
pub type CheckpointError = crate::checkpoint::CheckpointError;

/// Moved to [`ddp_core::checkpoint::FullCheckpointer`](crate::checkpoint::FullCheckpointer).
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::checkpoint::FullCheckpointer`"
)]
pub type Checkpointer = crate::checkpoint::FullCheckpointer;

/// Moved to [`ddp_core::checkpoint::LoadOutcome`](crate::checkpoint::LoadOutcome).
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::checkpoint::LoadOutcome`"
)]
pub type LoadOutcome = crate::checkpoint::LoadOutcome;

/// Moved to [`ddp_core::checkpoint::Resumed`](crate::checkpoint::Resumed).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::checkpoint::Resumed`")]
pub type Resumed = crate::checkpoint::Resumed;

/// Moved to [`ddp_core::checkpoint::TrainingState`](crate::checkpoint::TrainingState).
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::checkpoint::TrainingState`"
)]
pub type TrainingState = crate::checkpoint::TrainingState;

/// Moved to [`ddp_core::checkpoint::sharded::ShardedCheckpointer`](crate::checkpoint::sharded::ShardedCheckpointer).
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::checkpoint::sharded::ShardedCheckpointer`"
)]
pub type ShardedCheckpointer = crate::checkpoint::sharded::ShardedCheckpointer;

/// Moved to [`ddp_core::checkpoint::sharded::ShardedCheckpointError`](crate::checkpoint::sharded::ShardedCheckpointError).
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::checkpoint::sharded::ShardedCheckpointError`"
)]
pub type ShardedCheckpointError = crate::checkpoint::sharded::ShardedCheckpointError;

/// Moved to [`ddp_core::zero::ZeroError`](crate::zero::ZeroError).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::zero::ZeroError`")]
pub type ZeroError = crate::zero::ZeroError;

/// Moved to [`ddp_core::zero::ZeroRedundancyOptimizer`](crate::zero::ZeroRedundancyOptimizer).
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::zero::ZeroRedundancyOptimizer`"
)]
pub type ZeroRedundancyOptimizer<O, M, B> = crate::zero::ZeroRedundancyOptimizer<O, M, B>;

/// Moved to [`ddp_core::zero::ZeroStage`](crate::zero::ZeroStage).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::zero::ZeroStage`")]
pub type ZeroStage = crate::zero::ZeroStage;

/// Moved to [`ddp_core::amp::AmpError`](crate::amp::AmpError).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::amp::AmpError`")]
pub type AmpError = crate::amp::AmpError;

/// Moved to [`ddp_core::amp::GradScaler`](crate::amp::GradScaler).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::amp::GradScaler`")]
pub type GradScaler = crate::amp::GradScaler;

/// Moved to [`ddp_core::amp::GradScalerConfig`](crate::amp::GradScalerConfig).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::amp::GradScalerConfig`")]
pub type GradScalerConfig = crate::amp::GradScalerConfig;

/// Moved to [`ddp_core::amp::GradScalerState`](crate::amp::GradScalerState).
#[deprecated(since = "0.1.0", note = "moved: use `ddp_core::amp::GradScalerState`")]
pub type GradScalerState = crate::amp::GradScalerState;

/// Moved to [`ddp_core::comm::init_process_group`](crate::comm::init_process_group).
///
/// # Errors
/// As [`crate::comm::init_process_group`].
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::comm::init_process_group`"
)]
pub fn init_process_group(
    method: &crate::comm::InitMethod,
    config: crate::comm::ProcessGroupConfig,
) -> Result<crate::comm::ProcessGroup, crate::comm::CommError> {
    crate::comm::init_process_group(method, config)
}

/// Moved to `ddp_core::comm::cuda_driver_present` (with the `cuda` feature).
#[cfg(feature = "cuda")]
#[deprecated(
    since = "0.1.0",
    note = "moved: use `ddp_core::comm::cuda_driver_present`"
)]
pub fn cuda_driver_present() -> bool {
    crate::comm::cuda_driver_present()
}
