//! [`launch`]: the entry point of a training binary, launcher or worker, decided from the
//! environment. It is the one place that needs both halves of the crate: the plan and the
//! supervisor (`supervisor` feature) for the launcher, the worker side for the workers.

use crate::error::LaunchError;
use crate::plan::LaunchPlan;
use crate::plan::args::LaunchArgs;
use crate::worker::context::WorkerContext;
use crate::worker::env::WorkerEnv;
use crate::worker::env::process_env::with_process_env;
use crate::worker::run::run_worker;
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
/// The launcher cleans up after its workers, as `ddp-run` does: it becomes a child subreaper,
/// so processes a worker leaves behind become its children, and it reaps those that exit and
/// kills those still running when an attempt ends. It cannot tell them from children this
/// program starts itself from another thread while `launch` runs, which get the same
/// treatment; children started before `launch` is called are left alone.
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
    match with_process_env(|vars| role(args, vars))? {
        Role::Launcher => LaunchPlan::for_current_exe(args)?.run(),
        Role::Worker(env) => run_worker(env, train),
    }
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
