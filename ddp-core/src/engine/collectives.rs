//! Which communicator reduces gradients ([`Collectives`]) and how they reach the CPU
//! transports ([`HostStaging`]): settings of DDP ([`DdpConfig`](crate::DdpConfig)), and of
//! ZeRO's and FSDP's collectives, which run on the same engine.

use burn::config::Config;

/// Which collectives reduce the gradient buckets.
#[derive(Config, Debug, PartialEq, Eq, Copy)]
pub enum Collectives {
    /// NCCL on the GPU when the model is on burn's CUDA backend, the world size is above 1 and
    /// every rank can load libnccl; otherwise the process group's CPU transports, with
    /// [`HostStaging`]. The ranks agree on the choice.
    Auto,
    /// NCCL, also at world size 1 (to measure its overhead): gradients never leave the device.
    /// Constructing DDP fails, naming what is missing, when the crate was built without the
    /// `cuda` feature, the model is not on burn's CUDA backend, or the driver, libnccl or the
    /// device cannot be found.
    Nccl,
    /// The process group's CPU transports (shared memory, TCP), with [`HostStaging`].
    Host,
    /// The device engine that drives NCCL, run on its CPU stand-in: buckets are staged in host
    /// memory, and a communicator of their own (a subgroup over the CPU transports, with its
    /// own communication thread and watchdog) averages them in issue order, as NCCL does on a
    /// GPU stream. The gradients are the same as with [`Host`](Self::Host), at any backend and
    /// world size; it exists to run and test the GPU engine's protocol (issuing thread, bucket
    /// order across ranks, watchdog, abort) on machines without GPUs.
    StandIn,
}

/// How gradients reach the CPU transports (shared memory, TCP) when ranks do not reduce on the
/// device.
#[derive(Config, Debug, PartialEq, Eq, Copy)]
pub enum HostStaging {
    /// [`PerBucket`](Self::PerBucket) for models on a CUDA GPU (burn's CUDA backend, fused or
    /// not), otherwise
    /// [`PerGradient`](Self::PerGradient).
    Auto,
    /// Each gradient is read on its own as backward produces it. On CPU backends this is free
    /// (the gradient's own buffer is reduced in place, no copy): the default.
    PerGradient,
    /// Gradients stay on the device until their bucket is full; the bucket is then
    /// concatenated on the device and read in one copy, reduced, and written back in one copy.
    /// For GPU backends: one device synchronisation per bucket instead of one per parameter.
    PerBucket,
}
