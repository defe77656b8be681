//! The crate-root paths of ddp-core 0.1's first layout, which moved into modules (one path per
//! type: `ddp_core::comm::ProcessGroup`, `ddp_core::launcher::LaunchArgs`, ...). Each old name is
//! kept here as a deprecated alias for one release, so a program written against the old paths
//! still compiles and its warning names the new path. Traits and functions cannot be aliased
//! this way: `SyncBatchNormBackend` is at `ddp_core::nn`, `init_process_group` at
//! `ddp_core::comm`.

/// Declares each `Old => module::New, "note"` as a deprecated alias of `crate::module::New`,
/// documented as moved there (rustdoc links the new path); `note` is the deprecation warning.
macro_rules! moved {
    ($(
        $(#[$cfg:meta])*
        $old:ident $(<$($g:ident),+>)? => $top:ident $(::$seg:ident)+, $note:literal;
    )*) => {$(
        $(#[$cfg])*
        #[doc = concat!(
            "Moved to [`ddp_core::", stringify!($top), $("::", stringify!($seg),)+
            "`](crate::", stringify!($top), $("::", stringify!($seg),)+ ")."
        )]
        #[deprecated(since = "0.1.0", note = $note)]
        pub type $old $(<$($g),+>)? = crate::$top$(::$seg)+ $(<$($g),+>)?;
    )*};
}

moved! {
    ProcessGroup => comm::ProcessGroup, "moved: use `ddp_core::comm::ProcessGroup`";
    ProcessGroupConfig => comm::ProcessGroupConfig,
        "moved: use `ddp_core::comm::ProcessGroupConfig`";
    ReduceOp => comm::ReduceOp, "moved: use `ddp_core::comm::ReduceOp`";
    Store => comm::Store, "moved: use `ddp_core::comm::Store`";
    StoreConfig => comm::StoreConfig, "moved: use `ddp_core::comm::StoreConfig`";
    StoreServer => comm::StoreServer, "moved: use `ddp_core::comm::StoreServer`";
    CommError => comm::CommError, "moved: use `ddp_core::comm::CommError`";
    InitMethod => comm::InitMethod, "moved: use `ddp_core::comm::InitMethod`";
    Work<T> => comm::Work, "moved: use `ddp_core::comm::Work`";
    DataError => data::DataError, "moved: use `ddp_core::data::DataError`";
    DistributedSampler => data::DistributedSampler,
        "moved: use `ddp_core::data::DistributedSampler`";
    DistributedSamplerConfig => data::DistributedSamplerConfig,
        "moved: use `ddp_core::data::DistributedSamplerConfig`";
    DistributedDataLoader<B, I, O> => data::DistributedDataLoader,
        "moved: use `ddp_core::data::DistributedDataLoader`";
    DistributedDataLoaderBuilder<B, I, O> => data::DistributedDataLoaderBuilder,
        "moved: use `ddp_core::data::DistributedDataLoaderBuilder`";
    ExactShard => data::ExactShard, "moved: use `ddp_core::data::ExactShard`";
    SamplerState => data::SamplerState, "moved: use `ddp_core::data::SamplerState`";
    #[cfg(feature = "launch")]
    LaunchArgs => launcher::LaunchArgs, "moved: use `ddp_core::launcher::LaunchArgs`";
    LaunchError => launcher::LaunchError, "moved: use `ddp_core::launcher::LaunchError`";
    #[cfg(feature = "launch")]
    LaunchPlan => launcher::LaunchPlan, "moved: use `ddp_core::launcher::LaunchPlan`";
    #[cfg(feature = "launch")]
    NprocPerNode => launcher::NprocPerNode, "moved: use `ddp_core::launcher::NprocPerNode`";
    WorkerContext => launcher::WorkerContext, "moved: use `ddp_core::launcher::WorkerContext`";
    WorkerEnv => launcher::WorkerEnv, "moved: use `ddp_core::launcher::WorkerEnv`";
    SyncBatchNorm<B> => nn::SyncBatchNorm, "moved: use `ddp_core::nn::SyncBatchNorm`";
    SyncBatchNormError => nn::SyncBatchNormError, "moved: use `ddp_core::nn::SyncBatchNormError`";
    SyncBatchNormGroup => nn::SyncBatchNormGroup, "moved: use `ddp_core::nn::SyncBatchNormGroup`";
    EvalTotals => metrics::EvalTotals, "moved: use `ddp_core::metrics::EvalTotals`";
    EpochProgress => progress::EpochProgress, "moved: use `ddp_core::progress::EpochProgress`";
    EpochSummary => progress::EpochSummary, "moved: use `ddp_core::progress::EpochSummary`";
    CheckpointConfig => checkpoint::CheckpointConfig,
        "moved: use `ddp_core::checkpoint::CheckpointConfig`";
    CheckpointError => checkpoint::CheckpointError,
        "moved: use `ddp_core::checkpoint::CheckpointError`";
    Checkpointer => checkpoint::FullCheckpointer,
        "moved: use `ddp_core::checkpoint::FullCheckpointer`";
    LoadOutcome => checkpoint::LoadOutcome, "moved: use `ddp_core::checkpoint::LoadOutcome`";
    Resumed => checkpoint::Resumed, "moved: use `ddp_core::checkpoint::Resumed`";
    TrainingState => checkpoint::TrainingState, "moved: use `ddp_core::checkpoint::TrainingState`";
    ShardedCheckpointer => checkpoint::sharded::ShardedCheckpointer,
        "moved: use `ddp_core::checkpoint::sharded::ShardedCheckpointer`";
    ShardedCheckpointError => checkpoint::sharded::ShardedCheckpointError,
        "moved: use `ddp_core::checkpoint::sharded::ShardedCheckpointError`";
    ZeroError => zero::ZeroError, "moved: use `ddp_core::zero::ZeroError`";
    ZeroRedundancyOptimizer<O, M, B> => zero::ZeroRedundancyOptimizer,
        "moved: use `ddp_core::zero::ZeroRedundancyOptimizer`";
    ZeroStage => zero::ZeroStage, "moved: use `ddp_core::zero::ZeroStage`";
    AmpError => amp::AmpError, "moved: use `ddp_core::amp::AmpError`";
    GradScaler => amp::GradScaler, "moved: use `ddp_core::amp::GradScaler`";
    GradScalerConfig => amp::GradScalerConfig, "moved: use `ddp_core::amp::GradScalerConfig`";
    GradScalerState => amp::GradScalerState, "moved: use `ddp_core::amp::GradScalerState`";
}

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
