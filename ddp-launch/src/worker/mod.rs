//! The worker side, the only part a training process needs: [`launch`], the one reader of the
//! job environment ([`env`]: ddp-run/torchrun, Slurm, Open MPI), [`init_from_env`](init), and
//! the [`WorkerContext`] handed to the training function.
//!
//! [`launch`]: the entry point of a training binary — launcher or worker, decided from the
//! environment.

pub(crate) mod context;
pub(crate) mod env;
pub(crate) mod init;
pub(crate) mod own_failure;

use crate::error::LaunchError;
use crate::plan::LaunchPlan;
use crate::plan::args::LaunchArgs;
use crate::worker::context::WorkerContext;
use crate::worker::env::WorkerEnv;
use std::error::Error as StdError;

/// What this process is.
#[derive(Debug)]
pub(crate) enum Role {
    /// Start and supervise the workers.
    Launcher,
    /// Run the training function.
    Worker(WorkerEnv),
}

/// Decides the role: a `ddp-run`/[`launch`]/torchrun environment (`DDP_LAUNCH_WORKER`, `RANK`)
/// always makes a worker; otherwise explicit launcher flags (`--nproc-per-node`, `--nnodes`)
/// make a launcher; otherwise an Open MPI or Slurm step environment makes a worker; otherwise a
/// launcher.
pub(crate) fn role(
    args: &LaunchArgs,
    vars: &dyn Fn(&str) -> Option<String>,
) -> Result<Role, LaunchError> {
    if let Some(env) = WorkerEnv::from_launcher_vars(vars)? {
        return Ok(Role::Worker(env));
    }
    if args.is_explicit() {
        return Ok(Role::Launcher);
    }
    Ok(match WorkerEnv::from_external_vars(vars)? {
        Some(env) => Role::Worker(env),
        None => Role::Launcher,
    })
}

/// Runs `train` on every rank of a data-parallel job, starting the job first if needed.
///
/// - **As the launcher** (started by you, e.g. `cargo run --release --example train --
///   --nproc-per-node 2`): builds a [`LaunchPlan`] from `args`, starts this program again
///   `--nproc-per-node` times with the same arguments and the worker environment, supervises
///   them exactly like `ddp-run` (output prefixed with `[rank N]: `, failure summary, restarts,
///   signal forwarding), and returns when they are done. `train` is not called here.
/// - **As a worker** (started by this launcher, `ddp-run`, torchrun, `srun` or `mpirun`): reads
///   its place from the environment, joins the process group (rank 0 hosts the store) and calls
///   `train` with a [`WorkerContext`]. `args` is ignored, so the launcher flags on the repeated
///   command line do no harm.
///
/// Explicit `--nproc-per-node`/`--nnodes` win over a Slurm or Open MPI environment (run
/// `srun --ntasks-per-node 1 ./train --nproc-per-node 4 ...` to launch per node), while a
/// `ddp-run` or torchrun environment (`DDP_LAUNCH_WORKER` or `RANK` set) always means worker.
///
/// Call it first thing in `main`, after parsing arguments: everything before it runs in the
/// launcher and in every worker, and so does everything after it (`Ok(())` means "all workers
/// succeeded" in the launcher and "`train` succeeded" in a worker). Call it from the main
/// thread: workers are killed when the thread that started them ends.
///
/// A worker whose program installed no `tracing` subscriber before calling `launch` gets a
/// plain one on stderr (level from `RUST_LOG`, default `warn`), so ddp-comm's warnings, such as
/// strangers refused on rank 0's store port or a rank's mesh port, reach the rank's log
/// instead of nowhere. Install yours before calling `launch` to use it instead.
///
/// # Errors
/// In the launcher: invalid flags, a taken port, a failed worker after all restarts
/// ([`LaunchError::WorkerFailed`], summary already printed), an interruption. In a worker:
/// an invalid environment, a failed rendezvous ([`LaunchError::ProcessGroup`]), or `train`'s own
/// error ([`LaunchError::Training`]). [`LaunchError::exit_code`] gives the status to exit with.
///
/// # Example
/// See the [module documentation](crate) for a complete program.
pub fn launch<F, E>(args: &LaunchArgs, train: F) -> Result<(), LaunchError>
where
    F: FnOnce(WorkerContext) -> Result<(), E>,
    E: Into<Box<dyn StdError + Send + Sync>>,
{
    match crate::plan::process_env::with_process_env(|vars| role(args, vars))? {
        Role::Launcher => LaunchPlan::for_current_exe(args)?.run(),
        Role::Worker(env) => run_worker(env, train),
    }
}

/// Joins the process group described by `env` and runs `train`.
fn run_worker<F, E>(env: WorkerEnv, train: F) -> Result<(), LaunchError>
where
    F: FnOnce(WorkerContext) -> Result<(), E>,
    E: Into<Box<dyn StdError + Send + Sync>>,
{
    // Before anything can start a program: the launcher's progress pipe is rank 0's alone.
    crate::progress::claim_report_pipe();
    default_worker_logging();
    let rank = env.rank;
    let group = env.init_process_group()?;
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
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::args::NprocPerNode;
    use crate::worker::env::LauncherKind;
    use crate::worker::env::tests::vars;

    const SLURM: [(&str, &str); 7] = [
        ("SLURM_PROCID", "1"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NTASKS_PER_NODE", "2"),
        ("SLURM_JOB_ID", "9"),
        ("SLURM_JOB_NODELIST", "n1"),
    ];

    #[test]
    fn plain_environment_makes_a_launcher() {
        assert!(matches!(
            role(&LaunchArgs::new(), &vars(&[])),
            Ok(Role::Launcher)
        ));
    }

    #[test]
    fn launcher_environment_makes_a_worker_even_with_launch_flags() {
        let args = LaunchArgs::new().with_nproc_per_node(NprocPerNode::Count(4));
        let r = role(
            &args,
            &vars(&[
                ("DDP_LAUNCH_WORKER", "1"),
                ("RANK", "0"),
                ("WORLD_SIZE", "4"),
            ]),
        );
        assert!(
            matches!(r, Ok(Role::Worker(ref e)) if e.launcher == LauncherKind::DdpRun),
            "{r:?}"
        );
    }

    #[test]
    fn slurm_step_makes_a_worker_unless_launch_flags_are_explicit() {
        let r = role(&LaunchArgs::new(), &vars(&SLURM));
        assert!(
            matches!(r, Ok(Role::Worker(ref e)) if e.launcher == LauncherKind::Slurm && e.rank == 1),
            "{r:?}"
        );
        let explicit = LaunchArgs::new().with_nproc_per_node(NprocPerNode::Count(2));
        assert!(matches!(role(&explicit, &vars(&SLURM)), Ok(Role::Launcher)));
    }
}
