//! Which device communicator ZeRO stage 2 and FSDP use for their collectives
//! ([`choose_device`]): the one decision, from [`Collectives`], the model's device and what
//! every rank can run.

#[cfg(feature = "cuda")]
use super::NcclDevice;
use super::StandInDevice;
use crate::Collectives;
use crate::error::DdpError;
use burn::tensor::backend::Backend;
use ddp_comm::ProcessGroup;

/// A device communicator, or the process group's CPU transports.
pub(crate) enum DeviceChoice {
    /// The CPU transports, through host memory.
    Host,
    /// The device engine's CPU stand-in.
    StandIn(StandInDevice),
    /// NCCL on the model's GPU.
    #[cfg(feature = "cuda")]
    Nccl(NcclDevice),
}

/// The communicator `collectives` asks `user` ("ZeRO stage 2", "FSDP") to use for a model on
/// `device`:
/// - `StandIn`: the stand-in; `Host`: the CPU transports;
/// - `Nccl`: NCCL on the model's GPU, or an error saying what is missing;
/// - `Auto`: NCCL when the model is on burn's CUDA backend, the world size is above 1 and every
///   rank can run NCCL on a GPU of its own; otherwise the CPU transports.
///
/// # Collective
/// Every rank calls it, with the same `collectives`.
pub(crate) fn choose_device<I: Backend>(
    pg: &ProcessGroup,
    collectives: Collectives,
    device: &I::Device,
    user: &str,
) -> Result<DeviceChoice, DdpError> {
    match collectives {
        Collectives::Host => Ok(DeviceChoice::Host),
        Collectives::StandIn => Ok(DeviceChoice::StandIn(StandInDevice::new(pg)?)),
        Collectives::Nccl | Collectives::Auto => nccl::choose::<I>(pg, collectives, device, user),
    }
}

#[cfg(not(feature = "cuda"))]
mod nccl {
    use super::*;

    /// Built without NCCL: only a request for it is an error.
    pub(super) fn choose<I: Backend>(
        _pg: &ProcessGroup,
        collectives: Collectives,
        _device: &I::Device,
        user: &str,
    ) -> Result<DeviceChoice, DdpError> {
        match collectives {
            Collectives::Nccl => Err(DdpError::InvalidConfig(format!(
                "{user} with Collectives::Nccl needs ddp-core built with its `cuda` feature \
                 (cargo build --features cuda); or use Collectives::Auto or Host"
            ))),
            _ => Ok(DeviceChoice::Host),
        }
    }
}

#[cfg(feature = "cuda")]
mod nccl {
    use super::*;

    pub(super) fn choose<I: Backend>(
        pg: &ProcessGroup,
        collectives: Collectives,
        device: &I::Device,
        user: &str,
    ) -> Result<DeviceChoice, DdpError> {
        let refuse = |why: String| {
            Err(DdpError::InvalidConfig(format!(
                "{user} with Collectives::Nccl: {why}; use Collectives::Auto or Host to go \
                 through host memory instead"
            )))
        };
        let ordinal = match (collectives, NcclDevice::cuda_device::<I>(device)) {
            (Collectives::Nccl, None) => {
                return refuse(format!(
                    "NCCL reduces buffers of burn's CUDA backends (burn::backend::Cuda, fused or \
                     not) in place; this model's tensors are {}",
                    std::any::type_name::<burn::tensor::ops::FloatTensor<I>>()
                ));
            }
            // (Host and StandIn never come here.)
            (Collectives::Auto | Collectives::Host | Collectives::StandIn, None) => {
                return Ok(DeviceChoice::Host);
            }
            (Collectives::Auto, Some(_)) if pg.world_size() == 1 => {
                return Ok(DeviceChoice::Host);
            }
            (_, Some(d)) => d,
        };
        match nccl_can_run(pg, ordinal)? {
            Ok(()) => Ok(DeviceChoice::Nccl(NcclDevice::new(pg, ordinal)?)),
            Err(why) if collectives == Collectives::Nccl => refuse(why),
            Err(why) => {
                tracing::warn!(
                    rank = pg.rank(),
                    "{why}; {user}'s collectives go through host memory"
                );
                Ok(DeviceChoice::Host)
            }
        }
    }
}

/// Whether NCCL can run on every rank, each on a GPU of its own; otherwise why not. One
/// small all-gather over the CPU group, so the ranks agree: a rank that went ahead alone
/// would wait for the others in NCCL's rendezvous, and two ranks on one GPU make NCCL fail.
#[cfg(feature = "cuda")]
pub(crate) fn nccl_can_run(
    pg: &ProcessGroup,
    device: usize,
) -> Result<Result<(), String>, DdpError> {
    let here = ddp_comm::nccl_device_uuid(device);
    // Per rank: [can run, GPU UUID as two words].
    let mut mine = [0i64; 3];
    if let Ok(uuid) = &here {
        mine[0] = 1;
        mine[1] = i64::from_le_bytes(uuid[..8].try_into().unwrap_or_default());
        mine[2] = i64::from_le_bytes(uuid[8..].try_into().unwrap_or_default());
    }
    let mut all = vec![0i64; 3 * pg.world_size()];
    pg.all_gather(&mine, &mut all)
        .map_err(DdpError::comm("agreeing on NCCL for the gradient buckets"))?;
    if let Err(e) = here {
        return Ok(Err(format!("NCCL cannot run on this rank ({e})")));
    }
    let ranks: Vec<&[i64]> = all.chunks(3).collect();
    if let Some(r) = ranks.iter().position(|r| r[0] == 0) {
        return Ok(Err(format!(
            "NCCL cannot run on rank {r} (its log says why)"
        )));
    }
    for (a, ra) in ranks.iter().enumerate() {
        if let Some(b) = (a + 1..ranks.len()).find(|&b| ranks[b][1..] == ra[1..]) {
            return Ok(Err(format!(
                "ranks {a} and {b} use the same GPU, and NCCL needs one GPU per rank \
                 (give each rank its own device: LOCAL_RANK, CUDA_VISIBLE_DEVICES)"
            )));
        }
    }
    Ok(Ok(()))
}
