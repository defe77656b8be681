//! Which [`BucketReduction`] reduces the buckets ([`DdpConfig::collectives`],
//! [`DdpConfig::host_staging`], the registered communication hook), and the [`Reducer`] that feeds it.
//!
//! - NCCL on the GPU (the device engine, `DeviceReduction` over `NcclDevice`, feature `cuda`)
//!   when the model is on burn's CUDA backend and the ranks can all load libnccl, or when asked
//!   for; the same engine over its CPU stand-in for [`Collectives::StandIn`].
//! - Otherwise world size 1 keeps gradients where they are, and larger worlds reduce over the
//!   process group's CPU transports: one read per gradient on CPU backends, one per bucket on
//!   the GPU.

use super::config::DdpConfig;
use crate::engine::bucket::BucketCaps;
use crate::engine::hooks::CommHook;
use crate::engine::params::ParamTable;
use crate::engine::reducer::{
    BucketReduction, HookReduction, HostReduction, LocalReduction, Reducer, StagedReduction,
    StandInDevice, StandInReduction,
};
use crate::engine::{Collectives, HostStaging};
use crate::error::DdpError;
use burn::tensor::backend::Backend;
use ddp_comm::ProcessGroup;
use std::sync::Arc;

/// The reduction for `config` on this model, with the communication hook `registered` by
/// [`register_comm_hook`](crate::DistributedDataParallel::register_comm_hook), if any: the one
/// place that decides how buckets are reduced, at construction and when a hook is registered.
///
/// A hook (fp16/bf16 compression, PowerSGD, your own) runs on the CPU transports and reads each
/// gradient on its own, so a config asking for more than that would be ignored:
/// [`Collectives::Nccl`] and [`HostStaging::PerBucket`] beside a hook are
/// [`DdpError::InvalidConfig`], saying what to change.
///
/// # Collective
/// Without a hook every rank calls it (the ranks agree on NCCL); with one it is local.
pub(super) fn choose_reduction<I: Backend>(
    pg: &ProcessGroup,
    config: &DdpConfig,
    table: &ParamTable<I>,
    registered: Option<Box<dyn CommHook>>,
) -> Result<Arc<dyn BucketReduction<I>>, DdpError> {
    let host = || HostReduction { pg: pg.clone() };
    if let Some(hook) = chosen_hook(config, registered)? {
        if hook.leaves_gradients_local() {
            // Nothing to send: the gradients stay tensors where backward left them.
            return Ok(Arc::new(LocalReduction));
        }
        return Ok(Arc::new(HookReduction::new(host(), hook)?));
    }
    if config.collectives == Collectives::StandIn {
        let device = StandInDevice::new(pg)?;
        return Ok(Arc::new(StandInReduction::start(
            device,
            pg.rank(),
            pg.timeout(),
        )?));
    }
    if let Some(reduction) = nccl::reduction(pg, config.collectives, table)? {
        return Ok(reduction);
    }
    if pg.world_size() == 1 {
        return Ok(Arc::new(LocalReduction));
    }
    let per_bucket = match config.host_staging {
        HostStaging::PerGradient => false,
        HostStaging::PerBucket => true,
        HostStaging::Auto => nccl::on_cuda_device(table),
    };
    Ok(if per_bucket {
        Arc::new(StagedReduction { pg: pg.clone() })
    } else {
        Arc::new(host())
    })
}

/// The registered hook, if any (`None`: the built-in exact average). Every setting the hook
/// would make DDP ignore is an error.
fn chosen_hook(
    config: &DdpConfig,
    registered: Option<Box<dyn CommHook>>,
) -> Result<Option<Box<dyn CommHook>>, DdpError> {
    let Some(hook) = registered else {
        return Ok(None);
    };
    let what = format!("register_comm_hook: the {} hook", hook.name());
    // A hook that leaves gradients local reduces nothing here: ZeRO stage 2 reduce-scatters
    // them itself, on the communicator `collectives` names.
    if matches!(config.collectives, Collectives::Nccl | Collectives::StandIn)
        && !hook.leaves_gradients_local()
    {
        return Err(DdpError::InvalidConfig(format!(
            "{what} runs on the CPU transports, which Collectives::{:?} would skip; use \
             Collectives::Auto or Host, or register no hook to reduce on the device",
            config.collectives
        )));
    }
    if config.host_staging == HostStaging::PerBucket {
        return Err(DdpError::InvalidConfig(format!(
            "{what} reads each gradient to the host on its own, so HostStaging::PerBucket \
             would be ignored; use HostStaging::Auto or PerGradient, or register no hook to \
             stage whole buckets"
        )));
    }
    Ok(Some(hook))
}

/// The reducer for `table`, reducing buckets through `reduction`.
pub(super) fn make_reducer<I: Backend>(
    pg: &ProcessGroup,
    config: &DdpConfig,
    table: &ParamTable<I>,
    reduction: Arc<dyn BucketReduction<I>>,
) -> Reducer<I> {
    let mib = |v: f64| (v * (1u64 << 20) as f64) as usize;
    let control = (pg.world_size() > 1).then(|| pg.clone());
    Reducer::new(
        table,
        reduction,
        control,
        BucketCaps {
            first: mib(config.first_bucket_cap_mb),
            rest: mib(config.bucket_cap_mb),
        },
        config.min_buckets,
    )
}

#[cfg(not(feature = "cuda"))]
mod nccl {
    use super::*;

    /// Built without NCCL: only a request for it is an error.
    pub(super) fn reduction<I: Backend>(
        _pg: &ProcessGroup,
        collectives: Collectives,
        _table: &ParamTable<I>,
    ) -> Result<Option<Arc<dyn BucketReduction<I>>>, DdpError> {
        match collectives {
            Collectives::Nccl => Err(DdpError::InvalidConfig(
                "Collectives::Nccl needs ddp-core built with its `cuda` feature \
                 (cargo build --features cuda); or use Collectives::Auto or Host"
                    .into(),
            )),
            Collectives::Auto | Collectives::Host | Collectives::StandIn => Ok(None),
        }
    }

    pub(super) fn on_cuda_device<I: Backend>(_table: &ParamTable<I>) -> bool {
        false
    }
}

#[cfg(feature = "cuda")]
mod nccl {
    use super::*;
    use crate::engine::reducer::{NcclDevice, NcclReduction, nccl_can_run};

    /// The CUDA device of the model's parameters, when the model is on burn's CUDA backend,
    /// fused or not (the backends whose buffers NCCL can reduce in place).
    pub(super) fn cuda_device<I: Backend>(table: &ParamTable<I>) -> Option<usize> {
        NcclDevice::cuda_device::<I>(&table.entries.first()?.device)
    }

    /// Whether the model is on a CUDA GPU, whatever burn's tensor type there: then a bucket
    /// is read to the host in one copy, not one per gradient.
    pub(super) fn on_cuda_device<I: Backend>(table: &ParamTable<I>) -> bool {
        table.entries.first().is_some_and(|e| {
            (&e.device as &dyn std::any::Any)
                .downcast_ref::<cubecl::cuda::CudaDevice>()
                .is_some()
        })
    }

    pub(super) fn reduction<I: Backend>(
        pg: &ProcessGroup,
        collectives: Collectives,
        table: &ParamTable<I>,
    ) -> Result<Option<Arc<dyn BucketReduction<I>>>, DdpError> {
        let device = match (collectives, cuda_device(table)) {
            (Collectives::Auto, None) if pg.world_size() > 1 && on_cuda_device(table) => {
                tracing::warn!(
                    rank = pg.rank(),
                    tensors = std::any::type_name::<burn::tensor::ops::FloatTensor<I>>(),
                    "the model is on a GPU, but NCCL reduces only the buffers of burn's CUDA \
                     backends (CubeBackend<CudaRuntime> and Fusion<CubeBackend<CudaRuntime>>, \
                     i.e. burn::backend::Cuda); gradient buckets go through host memory, one \
                     copy per bucket: train on burn::backend::Cuda for NCCL"
                );
                return Ok(None);
            }
            (Collectives::Host | Collectives::StandIn, _) | (Collectives::Auto, None) => {
                return Ok(None);
            }
            (Collectives::Auto, Some(_)) if pg.world_size() == 1 => return Ok(None),
            (Collectives::Nccl, None) => {
                return Err(DdpError::InvalidConfig(format!(
                    "Collectives::Nccl reduces buffers of burn's CUDA backends in place \
                     (burn::backend::Cuda, fused or not); this model's tensors are {}: train on \
                     burn::backend::Cuda, or use Collectives::Auto or Host",
                    std::any::type_name::<burn::tensor::ops::FloatTensor<I>>()
                )));
            }
            (_, Some(d)) => d,
        };
        match (nccl_can_run(pg, device)?, collectives) {
            (Ok(()), _) => Ok(Some(Arc::new(NcclReduction::start(
                NcclDevice::new(pg, device)?,
                pg.rank(),
                pg.timeout(),
            )?))),
            (Err(why), Collectives::Nccl) => Err(DdpError::InvalidConfig(format!(
                "Collectives::Nccl: {why}; use Collectives::Auto or Host to reduce through host \
                 memory instead"
            ))),
            (Err(why), _) => {
                tracing::warn!(
                    rank = pg.rank(),
                    "{why}; gradient buckets go through host memory"
                );
                Ok(None)
            }
        }
    }
}
