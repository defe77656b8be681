//! A program written against ddp-core's first layout, whose types sat at the crate root
//! (`ddp_core::ProcessGroup`, `ddp_core::LaunchArgs`, ...), still compiles: the old paths are
//! deprecated aliases of the new ones. This file fails to compile if an alias is missing or
//! names another type.
#![allow(deprecated)]

/// Compiles only when both options hold the same type.
fn same<T>(_: Option<T>, _: Option<T>) {}

#[test]
fn the_old_crate_root_paths_name_the_types_at_their_new_paths() {
    use ddp_core::{amp, checkpoint, comm, data, launcher, metrics, nn, progress, zero};
    type Flex = burn::backend::Flex;
    same(None::<ddp_core::ProcessGroup>, None::<comm::ProcessGroup>);
    same(
        None::<ddp_core::ProcessGroupConfig>,
        None::<comm::ProcessGroupConfig>,
    );
    same(None::<ddp_core::ReduceOp>, None::<comm::ReduceOp>);
    same(None::<ddp_core::Store>, None::<comm::Store>);
    same(None::<ddp_core::StoreConfig>, None::<comm::StoreConfig>);
    same(None::<ddp_core::StoreServer>, None::<comm::StoreServer>);
    same(None::<ddp_core::CommError>, None::<comm::CommError>);
    same(None::<ddp_core::InitMethod>, None::<comm::InitMethod>);
    same(None::<ddp_core::Work<()>>, None::<comm::Work<()>>);
    same(None::<ddp_core::DataError>, None::<data::DataError>);
    same(
        None::<ddp_core::DistributedSampler>,
        None::<data::DistributedSampler>,
    );
    same(
        None::<ddp_core::DistributedSamplerConfig>,
        None::<data::DistributedSamplerConfig>,
    );
    same(None::<ddp_core::ExactShard>, None::<data::ExactShard>);
    same(None::<ddp_core::SamplerState>, None::<data::SamplerState>);
    same(
        None::<ddp_core::DistributedDataLoader<Flex, u8, u8>>,
        None::<data::DistributedDataLoader<Flex, u8, u8>>,
    );
    same(
        None::<ddp_core::DistributedDataLoaderBuilder<Flex, u8, u8>>,
        None::<data::DistributedDataLoaderBuilder<Flex, u8, u8>>,
    );
    same(None::<ddp_core::LaunchArgs>, None::<launcher::LaunchArgs>);
    same(None::<ddp_core::LaunchError>, None::<launcher::LaunchError>);
    same(None::<ddp_core::LaunchPlan>, None::<launcher::LaunchPlan>);
    same(
        None::<ddp_core::NprocPerNode>,
        None::<launcher::NprocPerNode>,
    );
    same(
        None::<ddp_core::WorkerContext>,
        None::<launcher::WorkerContext>,
    );
    same(None::<ddp_core::WorkerEnv>, None::<launcher::WorkerEnv>);
    // The launcher's first module path, `ddp_core::launch`, renamed `ddp_core::launcher`.
    same(
        None::<ddp_core::launch::LaunchArgs>,
        None::<launcher::LaunchArgs>,
    );
    same(
        None::<ddp_core::SyncBatchNorm<Flex>>,
        None::<nn::SyncBatchNorm<Flex>>,
    );
    same(
        None::<ddp_core::SyncBatchNormError>,
        None::<nn::SyncBatchNormError>,
    );
    same(
        None::<ddp_core::SyncBatchNormGroup>,
        None::<nn::SyncBatchNormGroup>,
    );
    same(None::<ddp_core::EvalTotals>, None::<metrics::EvalTotals>);
    same(
        None::<ddp_core::EpochProgress>,
        None::<progress::EpochProgress>,
    );
    same(
        None::<ddp_core::EpochSummary>,
        None::<progress::EpochSummary>,
    );
    same(
        None::<ddp_core::CheckpointConfig>,
        None::<checkpoint::CheckpointConfig>,
    );
    same(
        None::<ddp_core::CheckpointError>,
        None::<checkpoint::CheckpointError>,
    );
    same(
        None::<ddp_core::Checkpointer>,
        None::<checkpoint::FullCheckpointer>,
    );
    same(
        None::<ddp_core::LoadOutcome>,
        None::<checkpoint::LoadOutcome>,
    );
    same(None::<ddp_core::Resumed>, None::<checkpoint::Resumed>);
    same(
        None::<ddp_core::TrainingState>,
        None::<checkpoint::TrainingState>,
    );
    same(
        None::<ddp_core::ShardedCheckpointer>,
        None::<checkpoint::sharded::ShardedCheckpointer>,
    );
    same(
        None::<ddp_core::ShardedCheckpointError>,
        None::<checkpoint::sharded::ShardedCheckpointError>,
    );
    same(None::<ddp_core::ZeroError>, None::<zero::ZeroError>);
    same(None::<ddp_core::ZeroStage>, None::<zero::ZeroStage>);
    same(None::<ddp_core::AmpError>, None::<amp::AmpError>);
    same(None::<ddp_core::GradScaler>, None::<amp::GradScaler>);
    same(
        None::<ddp_core::GradScalerConfig>,
        None::<amp::GradScalerConfig>,
    );
    same(
        None::<ddp_core::GradScalerState>,
        None::<amp::GradScalerState>,
    );
    let init: fn(
        &comm::InitMethod,
        comm::ProcessGroupConfig,
    ) -> Result<comm::ProcessGroup, comm::CommError> = ddp_core::init_process_group;
    let _ = init;
    #[cfg(feature = "cuda")]
    assert_eq!(ddp_core::cuda_driver_present(), comm::cuda_driver_present());
}
