//! The environment of Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`), with the port and, on one
//! host, the token derived from the job.

use super::{DEFAULT_MASTER_PORT, LauncherKind, Vars, WorkerEnv, derived_port, master_addr};
use crate::error::LaunchError;

/// Variables naming the Open MPI job, the same in every process of one `mpirun` and different
/// between jobs: Open MPI 4's job id, then PMIx's namespace (Open MPI 5).
const OPEN_MPI_JOB_VARS: [&str; 2] = ["OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"];
/// A random key `mpirun` generates per job and gives every process (Open MPI 4).
pub(super) const OPEN_MPI_JOB_KEY_VAR: &str = "OMPI_MCA_orte_precondition_transports";

pub(super) fn from_open_mpi(v: &Vars<'_>) -> Result<WorkerEnv, LaunchError> {
    const NAME: &str = "open mpi";
    let rank: usize = v.required("OMPI_COMM_WORLD_RANK", NAME)?;
    let world_size: usize = v.required("OMPI_COMM_WORLD_SIZE", NAME)?;
    let local_rank: usize = v.required("OMPI_COMM_WORLD_LOCAL_RANK", NAME)?;
    let local_world_size: usize = v.required("OMPI_COMM_WORLD_LOCAL_SIZE", NAME)?;
    let (job_token, timeout, restart_count) = v.common()?;
    // Without MASTER_PORT and DDP_JOB_TOKEN, derive both from the job, so that two mpirun jobs
    // on one host neither fight over one port nor join each other's store.
    let job = v.first(&OPEN_MPI_JOB_VARS).map(|(_, id)| id);
    let master_port = match (v.port()?, &job) {
        (Some(p), _) => p,
        (None, Some(id)) => open_mpi_port(id),
        (None, None) => DEFAULT_MASTER_PORT,
    };
    // The job key is a secret: mpirun generates it per job and only this user's processes can
    // read their environment. Without it the id alone is public (`ps` shows it), so it only
    // tells two jobs on one host apart; `validate` then refuses a multi-node job.
    let job_token = job_token.or_else(|| {
        let id = job.as_deref().unwrap_or_default();
        match v.get(OPEN_MPI_JOB_KEY_VAR) {
            Some(key) => Some(format!("open-mpi:{id}:{key}")),
            None if job.is_some() && local_world_size >= world_size => {
                Some(format!("open-mpi:{id}:"))
            }
            None => None,
        }
    });
    Ok(WorkerEnv {
        launcher: LauncherKind::OpenMpi,
        rank,
        world_size,
        local_rank,
        local_world_size,
        // Open MPI has no node index; with the default by-slot mapping this is it.
        node_rank: rank / local_world_size.max(1),
        master_addr: master_addr(v, local_world_size, world_size, "mpirun")?,
        master_port,
        restart_count,
        job_token,
        timeout,
    })
}

/// The port every process of an Open MPI job agrees on without talking: FNV-1a of the job id,
/// in [`DERIVED_PORTS`](super::worker_env::DERIVED_PORTS) (as
/// [`slurm_port`](super::slurm::slurm_port)).
pub(crate) fn open_mpi_port(job_id: &str) -> u16 {
    let hash = job_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    derived_port(hash)
}

#[cfg(test)]
mod tests {
    use super::super::DERIVED_PORTS;
    use super::super::tests::{placement, refusal, worker};
    use super::*;
    use ddp_comm::TOKEN_ENV;

    #[test]
    fn open_mpi_environment_is_translated() {
        let env = worker(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("MASTER_ADDR", "node0"),
            (TOKEN_ENV, "tok"),
        ]);
        assert_eq!(env.launcher, LauncherKind::OpenMpi);
        assert_eq!(placement(&env), (3, 4, 1, 2, 1));
        assert_eq!(
            (env.master_addr.as_str(), env.master_port),
            ("node0", DEFAULT_MASTER_PORT),
            "no job id: torch's default port"
        );
        assert_eq!(env.job_token.as_deref(), Some("tok"));
        let e = refusal(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ]);
        assert!(
            e.starts_with("MASTER_ADDR: is not set, and mpirun placed ranks on several nodes"),
            "{e}"
        );
        // Single node: loopback.
        let env = worker(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ]);
        assert_eq!(env.master_addr, "127.0.0.1");
    }

    /// What `mpirun -np 2` on one host sets (Open MPI 4.1), for `rank`, in job `job`.
    fn mpirun_vars(rank: &'static str, job: &'static str) -> Vec<(&'static str, &'static str)> {
        vec![
            ("OMPI_COMM_WORLD_RANK", rank),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", rank),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("OMPI_MCA_ess_base_jobid", job),
            (OPEN_MPI_JOB_KEY_VAR, "857e142413aecff8-fd43b546c5cc03a9"),
        ]
    }

    #[test]
    fn open_mpi_job_without_master_port_or_token_derives_both_from_the_job() {
        let r0 = worker(&mpirun_vars("0", "2041184257"));
        let r1 = worker(&mpirun_vars("1", "2041184257"));
        assert_eq!(r0.master_addr, "127.0.0.1");
        assert_eq!(r0.master_port, open_mpi_port("2041184257"));
        assert!(DERIVED_PORTS.contains(&r0.master_port));
        assert_eq!(
            (r1.master_port, &r1.job_token),
            (r0.master_port, &r0.job_token)
        );
        let token = r0.job_token.as_deref().expect("a derived token");
        assert!(
            token.contains("2041184257") && token.contains("857e1424"),
            "{token}"
        );
        // Another job on the same host: another port and token.
        let other = worker(&mpirun_vars("0", "2041250817"));
        assert_ne!(other.master_port, r0.master_port);
        assert_ne!(other.job_token, r0.job_token);
        // Open MPI 5 names the job through PMIx.
        let pmix = worker(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "1"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "1"),
            ("PMIX_NAMESPACE", "prterun-vm-5460@1"),
        ]);
        assert_eq!(pmix.master_port, open_mpi_port("prterun-vm-5460@1"));
        // Explicit settings win.
        let mut explicit = mpirun_vars("0", "2041184257");
        explicit.extend([("MASTER_PORT", "4100"), (TOKEN_ENV, "mine")]);
        let env = worker(&explicit);
        assert_eq!(
            (env.master_port, env.job_token.as_deref()),
            (4100, Some("mine"))
        );
    }
}
