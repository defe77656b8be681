//! `--backend flex|ndarray|tch|cuda|cuda-fused`: which burn backend a worker trains on.

use anyhow::{Result, bail};
use clap::ValueEnum;

/// The backends the examples can train on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// burn's CPU backend.
    Flex,
    /// burn's NdArray CPU backend (build with `--features ndarray`).
    Ndarray,
    /// burn's LibTorch backend on the CPU: PyTorch's kernels (build with `--features tch`, which
    /// needs libtorch 2.9.0: `pip install torch==2.9.0` and `LIBTORCH_USE_PYTORCH=1`).
    Tch,
    /// burn's CUDA backend without fusion, `CudaUnfused` (build with `--features cuda`); a
    /// rank uses GPU `LOCAL_RANK`, or `LOCAL_RANK % GPUs` when a node runs more ranks than it has
    /// GPUs (those ranks share a GPU and their gradients go through host memory: NCCL cannot put
    /// two ranks on one GPU).
    Cuda,
    /// burn's default CUDA backend, `CudaFused`: what `burn::backend::Cuda` is with burn's
    /// default features (kernels fused at run time by burn-fusion); GPUs as for `cuda`.
    CudaFused,
}

impl BackendKind {
    /// Whether this backend trains on a GPU.
    pub fn is_gpu(self) -> bool {
        matches!(self, BackendKind::Cuda | BackendKind::CudaFused)
    }
}

/// burn's CUDA backend without fusion (`burn::backend::Cuda` when burn's `fusion` feature is
/// off), whatever burn features the build has.
#[cfg(feature = "cuda")]
pub type CudaUnfused = burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;

/// burn's CUDA backend with fusion (`burn::backend::Cuda` with burn's default features),
/// whatever burn features the build has.
#[cfg(feature = "cuda")]
pub type CudaFused = burn_fusion::Fusion<CudaUnfused>;

/// `--collectives auto|nccl|host|stand-in`: which collectives reduce the gradient buckets
/// ([`ddp_core::Collectives`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CollectivesArg {
    /// NCCL on `--backend cuda` with more than one rank (when every rank can load libnccl),
    /// otherwise the CPU transports.
    Auto,
    /// NCCL, also with one rank; fails naming what is missing when it cannot run.
    Nccl,
    /// The CPU transports (shared memory, TCP), gradients staged in host memory.
    Host,
    /// The device engine that drives NCCL, on its CPU stand-in (host buffers, a communication
    /// thread per rank): runs the GPU engine's protocol on any machine.
    StandIn,
}

impl From<CollectivesArg> for ddp_core::Collectives {
    fn from(arg: CollectivesArg) -> Self {
        match arg {
            CollectivesArg::Auto => ddp_core::Collectives::Auto,
            CollectivesArg::Nccl => ddp_core::Collectives::Nccl,
            CollectivesArg::Host => ddp_core::Collectives::Host,
            CollectivesArg::StandIn => ddp_core::Collectives::StandIn,
        }
    }
}

/// Fails with a clear message when the CUDA backend is asked for but cannot work: the binary was
/// built without the `cuda` feature, or no CUDA driver is installed. (Without this check the
/// first tensor operation would panic on a device thread.)
pub fn check_available(kind: BackendKind) -> Result<()> {
    match kind {
        BackendKind::Flex => Ok(()),
        #[cfg(feature = "ndarray")]
        BackendKind::Ndarray => Ok(()),
        #[cfg(not(feature = "ndarray"))]
        BackendKind::Ndarray => bail!(
            "--backend ndarray: this binary was built without the NdArray backend; rebuild with `--features ndarray`"
        ),
        #[cfg(feature = "tch")]
        BackendKind::Tch => Ok(()),
        #[cfg(not(feature = "tch"))]
        BackendKind::Tch => bail!(
            "--backend tch: this binary was built without the LibTorch backend; rebuild with `--features tch` (it needs libtorch 2.9.0: `pip install torch==2.9.0`, then build with LIBTORCH_USE_PYTORCH=1)"
        ),
        BackendKind::Cuda | BackendKind::CudaFused => {
            #[cfg(not(feature = "cuda"))]
            bail!(
                "--backend {}: this binary was built without CUDA support; rebuild with `--features cuda`",
                if kind == BackendKind::Cuda {
                    "cuda"
                } else {
                    "cuda-fused"
                }
            );
            #[cfg(feature = "cuda")]
            {
                if !ddp_core::comm::cuda_driver_present() {
                    bail!(
                        "--backend cuda: no CUDA driver found (libcuda could not be loaded); install the NVIDIA driver or use --backend flex"
                    );
                }
                Ok(())
            }
        }
    }
}

/// The GPU of the rank with local rank `local_rank`: its own, or a shared one when the node runs
/// more ranks than it has GPUs. Sharing is said on stderr (the examples install no logger),
/// since such a rank is slower and cannot use NCCL. Without this, a local rank past the last GPU
/// panicked on a device thread ("invalid device ordinal", seen on an H100) before any error
/// could be reported.
///
/// Every example that trains on `--backend cuda` takes its device from here.
///
/// # Errors
/// No CUDA driver, or a driver that sees no GPU.
#[cfg(feature = "cuda")]
pub fn cuda_device_for(name: &str, local_rank: usize) -> Result<burn::backend::cuda::CudaDevice> {
    let count = ddp_core::comm::cuda_device_count()?;
    if count == 0 {
        bail!(
            "--backend cuda: the CUDA driver sees no GPU (check CUDA_VISIBLE_DEVICES and \
             nvidia-smi), or use --backend flex"
        );
    }
    let gpu = local_rank % count;
    if gpu != local_rank {
        eprintln!(
            "{name}: local rank {local_rank}: this node has {count} GPU(s), so it shares GPU {gpu}; \
             ranks sharing a GPU reduce through host memory (NCCL cannot put two ranks on one \
             GPU): for speed, run one rank per GPU (--nproc-per-node {count})"
        );
    }
    Ok(burn::backend::cuda::CudaDevice::new(gpu))
}

/// A worker's GPU, with cubecl's kernel cache turned on first
/// ([`ddp_core::kernel_cache::use_kernel_cache`]: a second run does not compile and autotune
/// again); says on stderr where the cache is, once per node.
///
/// # Errors
/// As [`cuda_device_for`], or a kernel cache directory that cannot be created.
#[cfg(feature = "cuda")]
pub fn prepare_gpu(
    name: &str,
    kind: BackendKind,
    local_rank: usize,
) -> Result<burn::backend::cuda::CudaDevice> {
    check_available(kind)?;
    let cache = ddp_core::kernel_cache::use_kernel_cache()?;
    if local_rank == 0 {
        eprintln!("{name}: {cache}");
    }
    cuda_device_for(name, local_rank)
}

/// A training function that works on any tapped backend; [`run`] picks the backend. Every
/// backend [`run`] picks can also sum `SyncBatchNorm` statistics over ranks (in training and,
/// on the inner backend, in evaluation), so a program's model may use `SyncBatchNorm`.
pub trait TrainOn {
    /// Trains on backend `B`, on `device`, as the worker described by `ctx`.
    fn train<B>(self, ctx: ddp_core::launcher::WorkerContext, device: B::Device) -> Result<()>
    where
        B: ddp_core::TapBackend + ddp_core::nn::SyncBatchNormBackend,
        B::InnerBackend: ddp_core::nn::SyncBatchNormBackend;
}

/// The `main` of an example: launches the workers (or is one), trains on the chosen backend,
/// and turns the outcome into an exit code (the launcher's error printed with the program name).
pub fn run(
    name: &str,
    launch: &ddp_core::launcher::LaunchArgs,
    kind: BackendKind,
    job: impl TrainOn,
) -> std::process::ExitCode {
    // Fail before any worker starts (and before restarts could retry a missing driver).
    if let Err(e) = check_available(kind) {
        eprintln!("{name}: {e}");
        return std::process::ExitCode::from(2);
    }
    let result = ddp_core::launch(launch, |ctx| -> Result<()> {
        match kind {
            BackendKind::Flex => {
                job.train::<burn::backend::Autodiff<burn::backend::Flex>>(ctx, Default::default())
            }
            #[cfg(feature = "ndarray")]
            BackendKind::Ndarray => job
                .train::<burn::backend::Autodiff<burn::backend::NdArray>>(ctx, Default::default()),
            #[cfg(not(feature = "ndarray"))]
            BackendKind::Ndarray => check_available(kind),
            #[cfg(feature = "tch")]
            BackendKind::Tch => job.train::<burn::backend::Autodiff<burn::backend::LibTorch>>(
                ctx,
                burn::backend::libtorch::LibTorchDevice::Cpu,
            ),
            #[cfg(not(feature = "tch"))]
            BackendKind::Tch => check_available(kind),
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => {
                let device = prepare_gpu(name, kind, ctx.device_index())?;
                job.train::<burn::backend::Autodiff<CudaUnfused>>(ctx, device)
            }
            #[cfg(feature = "cuda")]
            BackendKind::CudaFused => {
                let device = prepare_gpu(name, kind, ctx.device_index())?;
                job.train::<burn::backend::Autodiff<CudaFused>>(ctx, device)
            }
            #[cfg(not(feature = "cuda"))]
            BackendKind::Cuda | BackendKind::CudaFused => check_available(kind),
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::ExitCode::from(e.exit_code().max(1))
        }
    }
}
