//! Asynchronous work, below every communicator: the [`Work`] handle that an asynchronous
//! collective returns, and the thread that runs a communicator's jobs in submission order
//! (`JobThread`). The CPU transports' group (`group/`), the NCCL backend (`nccl/`) and the
//! device stand-in (`stand_in/`) all build on them, so none of them imports another for these.

mod handle;
mod job_thread;

pub use handle::{Work, WorkTiming};
#[cfg(feature = "cuda")]
pub(crate) use job_thread::Job;
pub(crate) use job_thread::{JobThread, serve};
