//! [`init_from_env`]: joining a job from whatever launcher started this process, through the
//! same reader of the job environment ([`WorkerEnv`]) that [`launch`](crate::launch) uses.

use crate::error::LaunchError;
use crate::worker::env::WorkerEnv;
use ddp_comm::{InitMethod, ProcessGroup, ProcessGroupConfig, init_process_group};

impl WorkerEnv {
    /// The process group configuration this worker joins with: its ranks, and the job token
    /// and timeout when the launcher set them (other settings, such as `DDP_TRANSPORT`, are
    /// read by ddp-comm when the group is created).
    pub fn process_group_config(&self) -> ProcessGroupConfig {
        let mut config = ProcessGroupConfig::new(self.rank, self.world_size)
            .with_local(self.local_rank, self.local_world_size);
        if let Some(timeout) = self.timeout {
            config = config.with_timeout(timeout);
        }
        if let Some(token) = &self.job_token {
            config = config.with_token(token.as_bytes());
        }
        config
    }

    /// Where the ranks meet: rank 0's store at the master address and port.
    pub fn init_method(&self) -> InitMethod {
        InitMethod::Tcp {
            host: self.master_addr.clone(),
            port: self.master_port,
        }
    }

    /// Joins the process group this environment describes (rank 0 hosts the store).
    ///
    /// # Errors
    /// [`LaunchError::ProcessGroup`]: the rendezvous or the connections failed.
    pub fn init_process_group(&self) -> Result<ProcessGroup, LaunchError> {
        tracing::debug!(env = ?self, "joining the process group");
        init_process_group(&self.init_method(), self.process_group_config()).map_err(|source| {
            LaunchError::ProcessGroup {
                rank: self.rank,
                source,
            }
        })
    }
}

/// Joins the job this process was started in, whichever launcher started it, and returns its
/// process group.
///
/// Understands the environments of:
/// - `ddp-run` and [`launch`](crate::launch) (`DDP_LAUNCH_WORKER=1`, `RANK`, `WORLD_SIZE`, ...);
/// - torchrun, or variables set by hand: `RANK` and `WORLD_SIZE`, optionally `LOCAL_RANK`,
///   `LOCAL_WORLD_SIZE`, `GROUP_RANK`, `MASTER_ADDR` (loopback by default when every rank is
///   local) and `MASTER_PORT` (29500 by default);
/// - Slurm's `srun` (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, ...: the master is the
///   first host of the step, the port derived from the job and step ids);
/// - Open MPI's `mpirun` (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`, ...: the port and, on
///   one host, the token derived from the job).
///
/// `DDP_JOB_TOKEN` and `DDP_TIMEOUT_SECS` apply under every launcher; see [`WorkerEnv`] for
/// the details, and the [crate documentation](crate) for the secret a job across nodes needs.
/// PyTorch's `env://` alone (torchrun variables, `MASTER_ADDR` and `MASTER_PORT` required) is
/// ddp-comm's `init_process_group(&InitMethod::Env, ProcessGroupConfig::from_env()?)`.
///
/// ```no_run
/// # fn main() -> Result<(), ddp_launch::LaunchError> {
/// let pg = ddp_launch::init_from_env()?; // under ddp-run, torchrun, srun or mpirun
/// println!("rank {} of {}", pg.rank(), pg.world_size());
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`LaunchError::WorkerEnv`] when no launcher set up this process or a variable is missing,
/// unparsable or inconsistent (naming it); [`LaunchError::ProcessGroup`] when joining fails.
pub fn init_from_env() -> Result<ProcessGroup, LaunchError> {
    worker_env_or_advice(WorkerEnv::from_env()?)?.init_process_group()
}

/// The environment a launcher set, or an error saying how to start this program.
fn worker_env_or_advice(env: Option<WorkerEnv>) -> Result<WorkerEnv, LaunchError> {
    env.ok_or_else(|| {
        LaunchError::worker_env(
            "RANK",
            "is not set, and neither is a Slurm step's or Open MPI's rank: start this program \
             with ddp-run, torchrun, srun or mpirun (or set RANK and WORLD_SIZE)",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::env::tests::vars;
    use std::time::Duration;

    /// What `srun -N2 -n4` gives task 3 (the second on node 1), with a shared token.
    const SLURM_TASK_3: [(&str, &str); 10] = [
        ("SLURM_PROCID", "3"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NODEID", "1"),
        ("SLURM_TASKS_PER_NODE", "2(x2)"),
        ("SLURM_JOB_ID", "77"),
        ("SLURM_JOB_NODELIST", "gpu[07-08]"),
        ("DDP_JOB_TOKEN", "secret"),
        ("DDP_TIMEOUT_SECS", "45"),
    ];

    #[test]
    fn init_from_env_reads_a_slurm_step_into_the_process_group_config() {
        let env = WorkerEnv::from_vars(&vars(&SLURM_TASK_3))
            .expect("valid")
            .expect("a worker");
        let config = env.process_group_config();
        assert_eq!(
            (
                config.rank,
                config.world_size,
                config.local_rank,
                config.local_world_size
            ),
            (3, 4, 1, 2)
        );
        assert_eq!(config.token, b"secret");
        assert_eq!(config.timeout, Duration::from_secs(45));
        match env.init_method() {
            InitMethod::Tcp { host, port } => {
                assert_eq!(host, "gpu07", "rank 0's host: the first of the step");
                assert_eq!(port, crate::worker::env::slurm_port(77, 0));
            }
            other => panic!("expected a TCP rendezvous, got {other:?}"),
        }
    }

    #[test]
    fn torchrun_variables_keep_the_defaults_of_a_new_config() {
        let env = WorkerEnv::from_vars(&vars(&[("RANK", "1"), ("WORLD_SIZE", "2")]))
            .expect("valid")
            .expect("a worker");
        let config = env.process_group_config();
        let plain = ProcessGroupConfig::new(1, 2);
        assert_eq!(
            (config.local_rank, config.local_world_size, config.timeout),
            (1, 2, plain.timeout)
        );
        assert!(config.token.is_empty());
        assert_eq!(
            env.init_method(),
            InitMethod::Tcp {
                host: "127.0.0.1".into(),
                port: crate::DEFAULT_MASTER_PORT
            }
        );
    }

    #[test]
    fn no_launcher_environment_says_how_to_start_the_program() {
        let e = worker_env_or_advice(None).unwrap_err().to_string();
        assert!(e.starts_with("RANK: is not set"), "{e}");
        assert!(e.contains("ddp-run, torchrun, srun or mpirun"), "{e}");
    }
}
