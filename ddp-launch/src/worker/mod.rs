//! The worker side, the only part a training process needs: the one reader of the job
//! environment ([`env`](mod@env): ddp-run/torchrun, Slurm, Open MPI, and the variables a launcher
//! sets), [`init_from_env`](init), the [`WorkerContext`](context::WorkerContext) handed to the
//! training function, and a worker's half of [`launch`](crate::launch) (`run.rs`). Nothing
//! here starts or supervises a process, so it builds without the `supervisor` feature.

pub(crate) mod context;
pub(crate) mod env;
pub(crate) mod init;
#[cfg(feature = "supervisor")]
pub(crate) mod own_failure;
#[cfg(feature = "supervisor")]
pub(crate) mod run;
#[cfg(feature = "supervisor")]
mod torchelastic_error;
