//! A worker's half of [`launch`](crate::launch): join the group, run the training function,
//! report its own failure. Only `launch` calls it, so it is part of the `supervisor` build.

use crate::error::LaunchError;
use crate::worker::context::WorkerContext;
use crate::worker::env::WorkerEnv;
use std::error::Error as StdError;

/// Joins the process group described by `env` and runs `train`: a worker's side of
/// [`launch`](crate::launch).
pub(crate) fn run_worker<F, E>(env: WorkerEnv, train: F) -> Result<(), LaunchError>
where
    F: FnOnce(WorkerContext) -> Result<(), E>,
    E: Into<Box<dyn StdError + Send + Sync>>,
{
    // Before anything can start a program: the launcher's progress pipe is rank 0's alone.
    crate::progress::claim_report_pipe();
    default_worker_logging();
    let rank = env.rank;
    let group = env.init_process_group().inspect_err(|e| {
        crate::worker::torchelastic_error::write_error_file(e);
    })?;
    // Keeps the group's connections (and rank 0's store) open until a failure is out: see
    // `own_failure`.
    let keep_open = group.clone();
    let result =
        train(WorkerContext::new(env, group)).map_err(|e| LaunchError::training(rank, e.into()));
    if let Err(e) = &result {
        crate::worker::own_failure::report_own_failure(e);
    }
    drop(keep_open);
    result
}

/// A stderr subscriber at `RUST_LOG` (default `warn`), unless the program installed one.
fn default_worker_logging() {
    if tracing::dispatcher::has_been_set() {
        return;
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Another thread may have installed one meanwhile: then that one stays.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        // Its default reports a failed write with `eprintln!`, a panic on a closed stderr.
        .log_internal_errors(false)
        .try_init();
}
