//! `--backend flex|cuda`: which burn backend a worker trains on.

use anyhow::{Result, bail};
use clap::ValueEnum;

/// The backends the examples can train on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// burn's CPU backend.
    Flex,
    /// burn's CUDA backend (build with `--features cuda`); rank `r` uses GPU `LOCAL_RANK`.
    Cuda,
}

/// Fails with a clear message when the CUDA backend is asked for but cannot work: the binary was
/// built without the `cuda` feature, or no CUDA driver is installed. (Without this check the
/// first tensor operation would panic on a device thread.)
pub fn check_available(kind: BackendKind) -> Result<()> {
    match kind {
        BackendKind::Flex => Ok(()),
        BackendKind::Cuda => {
            #[cfg(not(feature = "cuda"))]
            bail!(
                "--backend cuda: this binary was built without CUDA support; rebuild with `--features cuda`"
            );
            #[cfg(feature = "cuda")]
            {
                if !ddp_core::cuda_driver_present() {
                    bail!(
                        "--backend cuda: no CUDA driver found (libcuda could not be loaded); install the NVIDIA driver or use --backend flex"
                    );
                }
                Ok(())
            }
        }
    }
}
