//! [`WorkerEnv`]: this process's place in a job, read from the environment a launcher set:
//! `ddp-run` / `launch()`, torchrun (or by hand), Slurm's `srun`, Open MPI's
//! `mpirun`. This module holds the shared reader and the choice of dialect; each dialect's
//! variables are read in its own file (`torchrun.rs`, `slurm.rs`, `open_mpi.rs`).

pub(crate) mod launcher_vars;
mod open_mpi;
pub(crate) mod process_env;
mod slurm;
mod torchrun;
mod worker_env;

use crate::error::LaunchError;
use ddp_comm::TOKEN_ENV;
use launcher_vars::WORKER_ENV;
use open_mpi::OPEN_MPI_JOB_KEY_VAR;
#[cfg(test)]
pub(crate) use slurm::slurm_port;
#[cfg(test)]
use std::time::Duration;
#[cfg(test)]
pub(crate) use worker_env::DERIVED_PORTS;
pub use worker_env::{DEFAULT_MASTER_PORT, LauncherKind, WorkerEnv};
use worker_env::{Vars, derived_port, master_addr};

use process_env::with_process_env;

impl WorkerEnv {
    /// Whether the group was restarted before this attempt (see
    /// [`WorkerContext::is_restart`](crate::WorkerContext::is_restart)).
    pub fn is_restart(&self) -> bool {
        self.restart_count > 0
    }

    /// Reads the process environment; `Ok(None)` when no launcher set it up as a worker.
    /// Checks, in order: `ddp-run`/torchrun variables (`DDP_LAUNCH_WORKER`, `RANK`), Open MPI,
    /// then Slurm.
    ///
    /// # Errors
    /// [`LaunchError::WorkerEnv`] naming a variable that is missing, unparsable or inconsistent.
    pub fn from_env() -> Result<Option<WorkerEnv>, LaunchError> {
        with_process_env(|vars| WorkerEnv::from_vars(vars))
    }

    /// [`WorkerEnv::from_env`] over any lookup function, e.g. a map in tests.
    ///
    /// # Errors
    /// As [`WorkerEnv::from_env`].
    pub fn from_vars(
        vars: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<WorkerEnv>, LaunchError> {
        if let Some(env) = WorkerEnv::from_launcher_vars(vars)? {
            return Ok(Some(env));
        }
        WorkerEnv::from_external_vars(vars)
    }

    /// Only `ddp-run`/`launch()` and torchrun-style variables.
    pub(crate) fn from_launcher_vars(
        vars: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<WorkerEnv>, LaunchError> {
        let v = Vars(vars);
        let ours = v.get(WORKER_ENV).is_some_and(|x| x == "1");
        if !ours && !v.has("RANK") {
            return Ok(None);
        }
        torchrun::from_torchrun(&v, ours)?.validate()
    }

    /// Only Open MPI and Slurm variables.
    pub(crate) fn from_external_vars(
        vars: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<WorkerEnv>, LaunchError> {
        let v = Vars(vars);
        if v.has("OMPI_COMM_WORLD_RANK") {
            return open_mpi::from_open_mpi(&v).and_then(WorkerEnv::validate);
        }
        if v.has("SLURM_PROCID") && v.first(&["SLURM_STEP_ID", "SLURM_STEPID"]).is_some() {
            return slurm::from_slurm(&v).and_then(WorkerEnv::validate);
        }
        Ok(None)
    }

    fn validate(self) -> Result<Option<WorkerEnv>, LaunchError> {
        let bad = |var: &str, reason: String| Err(LaunchError::worker_env(var, reason));
        if self.world_size == 0 {
            return bad("WORLD_SIZE", "must be at least 1, got 0".into());
        }
        if self.rank >= self.world_size {
            return bad(
                "RANK",
                format!("rank {} is outside 0..{}", self.rank, self.world_size),
            );
        }
        if self.local_world_size == 0 || self.local_world_size > self.world_size {
            return bad(
                "LOCAL_WORLD_SIZE",
                format!(
                    "must be in 1..={}, got {}",
                    self.world_size, self.local_world_size
                ),
            );
        }
        if self.local_rank >= self.local_world_size {
            return bad(
                "LOCAL_RANK",
                format!(
                    "local rank {} is outside 0..{}",
                    self.local_rank, self.local_world_size
                ),
            );
        }
        if self.job_token.is_none() && self.local_world_size < self.world_size {
            return bad(TOKEN_ENV, self.missing_token_advice());
        }
        Ok(Some(self))
    }

    /// Why a multi-node job needs a secret, and how to give one with this launcher. Its ranks
    /// listen where other hosts reach them, and without a secret anyone on the network could
    /// join the store, claim a rank or inject gradients.
    fn missing_token_advice(&self) -> String {
        let how = match self.launcher {
            LauncherKind::Slurm => format!(
                "put `export {TOKEN_ENV}=$(openssl rand -hex 16)` in the batch script before \
                 srun (srun gives every task the script's environment)"
            ),
            LauncherKind::OpenMpi => format!(
                "run `export {TOKEN_ENV}=$(openssl rand -hex 16)` and pass it with \
                 `mpirun -x {TOKEN_ENV} ...` (this mpirun set no {OPEN_MPI_JOB_KEY_VAR}, the \
                 per-job secret Open MPI 4 gives its processes)"
            ),
            LauncherKind::DdpRun | LauncherKind::Torchrun => format!(
                "set the same secret on every node, e.g. `export {TOKEN_ENV}=$(openssl rand -hex 16)`"
            ),
        };
        format!(
            "is not set, and this job runs on several nodes ({} ranks, {} on this node), so its \
             store and ranks listen where other hosts can reach them: without a secret anyone on \
             the network could join it. {how}",
            self.world_size, self.local_world_size
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::HashMap;

    /// An environment of just `pairs`, as `from_vars` reads it (shared with the worker tests).
    pub(crate) fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    pub(crate) fn detect(pairs: &[(&str, &str)]) -> Result<Option<WorkerEnv>, LaunchError> {
        WorkerEnv::from_vars(&vars(pairs))
    }

    /// The worker `pairs` describe (the test fails if they describe none, or wrongly).
    pub(crate) fn worker(pairs: &[(&str, &str)]) -> WorkerEnv {
        detect(pairs).expect("ok").expect("worker")
    }

    /// The message of the error `pairs` are refused with.
    pub(crate) fn refusal(pairs: &[(&str, &str)]) -> String {
        detect(pairs).unwrap_err().to_string()
    }

    /// A detected worker's place in the job, as each launcher's test checks it: rank, world
    /// size, local rank, local world size, node rank.
    pub(crate) fn placement(env: &WorkerEnv) -> (usize, usize, usize, usize, usize) {
        (
            env.rank,
            env.world_size,
            env.local_rank,
            env.local_world_size,
            env.node_rank,
        )
    }

    #[test]
    fn no_launcher_variables_means_not_a_worker() {
        assert_eq!(
            detect(&[("PATH", "/bin"), ("SLURM_JOB_ID", "5")]).expect("ok"),
            None
        );
        // A Slurm batch script (no step) is not a worker either.
        assert_eq!(
            detect(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4")]).expect("ok"),
            None
        );
    }

    /// The refusal of the multi-node job `pairs` describe, for want of a job token.
    fn refused_for_a_token(pairs: &[(&str, &str)]) -> String {
        let e = refusal(pairs);
        assert!(
            e.starts_with("DDP_JOB_TOKEN: is not set, and this job runs on several nodes"),
            "{e}"
        );
        e
    }

    #[test]
    fn a_multi_node_job_without_a_secret_is_refused_with_how_to_set_one() {
        let mpi_two_nodes = [
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("OMPI_MCA_ess_base_jobid", "2041184257"),
            ("MASTER_ADDR", "node0"),
        ];
        // The job id is public (`ps`), so it is no secret.
        let e = refused_for_a_token(&mpi_two_nodes);
        assert!(e.contains("mpirun -x DDP_JOB_TOKEN"), "{e}");
        // mpirun's per-job key is.
        let mut keyed = mpi_two_nodes.to_vec();
        keyed.push((OPEN_MPI_JOB_KEY_VAR, "857e142413aecff8-fd43b546c5cc03a9"));
        let env = worker(&keyed);
        assert!(env.job_token.expect("token").contains("857e142413aecff8"));

        let slurm_two_nodes = [
            ("SLURM_PROCID", "0"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NTASKS_PER_NODE", "1"),
            ("SLURM_JOB_ID", "7"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
        ];
        let e = refused_for_a_token(&slurm_two_nodes);
        assert!(e.starts_with("DDP_JOB_TOKEN: is not set, and this job runs on several nodes (2 ranks, 1 on this node)"), "{e}");
        assert!(e.contains("in the batch script before srun"), "{e}");

        let torchrun_two_nodes = [
            ("RANK", "0"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "node0"),
        ];
        refused_for_a_token(&torchrun_two_nodes);
        let mut with_token = torchrun_two_nodes.to_vec();
        with_token.push((TOKEN_ENV, "secret"));
        assert!(detect(&with_token).expect("ok").is_some());
    }

    #[test]
    fn ddp_launcher_variables_win_over_slurm_and_mpi() {
        let env = worker(&[
            (WORKER_ENV, "1"),
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("SLURM_PROCID", "0"),
            ("SLURM_STEP_ID", "0"),
            ("OMPI_COMM_WORLD_RANK", "0"),
        ]);
        assert_eq!((env.launcher, env.rank), (LauncherKind::DdpRun, 1));
    }
}
