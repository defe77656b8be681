//! [`WorkerEnv`]: this process's place in a job, read from the environment a launcher set:
//! `ddp-run` / [`launch`](super::launch), torchrun (or by hand), Slurm's `srun`, Open MPI's
//! `mpirun`.

use super::error::LaunchError;
use super::plan::{RESTART_COUNT_ENV, WORKER_ENV};
use ddp_comm::{TIMEOUT_ENV, TOKEN_ENV};
use std::time::Duration;

/// The port used when a launcher set no `MASTER_PORT` (torch's default).
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// Which launcher started this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LauncherKind {
    /// `ddp-run` or [`launch`](super::launch) (`DDP_LAUNCH_WORKER=1`).
    DdpRun,
    /// torchrun, or anything that sets `RANK` and `WORLD_SIZE` (including a user by hand).
    Torchrun,
    /// Slurm's `srun` (`SLURM_PROCID` in a job step).
    Slurm,
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_RANK`).
    OpenMpi,
}

/// Where this worker sits in the job and how to reach rank 0, as a launcher described it.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerEnv {
    /// Who started this process.
    pub launcher: LauncherKind,
    /// Global rank.
    pub rank: usize,
    /// Number of workers in the job.
    pub world_size: usize,
    /// Rank on this node (the device index).
    pub local_rank: usize,
    /// Workers on this node.
    pub local_world_size: usize,
    /// This node's rank.
    pub node_rank: usize,
    /// Host of rank 0's store.
    pub master_addr: String,
    /// Port of rank 0's store.
    pub master_port: u16,
    /// How many times the group was restarted before this attempt.
    pub restart_count: u32,
    /// The job token every connection proves, if the launcher set one.
    pub job_token: Option<String>,
    /// `DDP_TIMEOUT_SECS`, if set.
    pub timeout: Option<Duration>,
}

impl std::fmt::Debug for WorkerEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerEnv")
            .field("launcher", &self.launcher)
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("local_rank", &self.local_rank)
            .field("local_world_size", &self.local_world_size)
            .field("node_rank", &self.node_rank)
            .field("master_addr", &self.master_addr)
            .field("master_port", &self.master_port)
            .field("restart_count", &self.restart_count)
            .field("job_token", &self.job_token.as_ref().map(|_| "<set>"))
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Reads variables through a lookup function, so parsing is testable without touching the
/// process environment. Empty values count as unset.
struct Vars<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Vars<'_> {
    fn get(&self, key: &str) -> Option<String> {
        (self.0)(key)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    fn first(&self, keys: &[&str]) -> Option<(String, String)> {
        keys.iter()
            .find_map(|k| self.get(k).map(|v| (k.to_string(), v)))
    }

    fn number<T: std::str::FromStr>(&self, key: &str) -> Result<Option<T>, LaunchError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                LaunchError::worker_env(key, format!("'{v}' is not a non-negative integer"))
            }),
        }
    }

    fn required<T: std::str::FromStr>(&self, key: &str, launcher: &str) -> Result<T, LaunchError> {
        self.number(key)?.ok_or_else(|| {
            LaunchError::worker_env(
                key,
                format!("is not set, but {launcher} sets it for every worker"),
            )
        })
    }

    fn port(&self) -> Result<Option<u16>, LaunchError> {
        match self.number::<u16>("MASTER_PORT")? {
            Some(0) => Err(LaunchError::worker_env(
                "MASTER_PORT",
                "port 0 is not allowed",
            )),
            p => Ok(p),
        }
    }

    fn common(&self) -> Result<(Option<String>, Option<Duration>, u32), LaunchError> {
        let token = self.get(TOKEN_ENV);
        let timeout = self.number::<u64>(TIMEOUT_ENV)?.map(Duration::from_secs);
        let restarts = match self.number::<u32>(RESTART_COUNT_ENV)? {
            Some(n) => n,
            None => self
                .number::<u32>("TORCHELASTIC_RESTART_COUNT")?
                .unwrap_or(0),
        };
        Ok((token, timeout, restarts))
    }
}

impl WorkerEnv {
    /// Whether the group was restarted before this attempt (see
    /// [`WorkerContext::is_restart`](super::WorkerContext::is_restart)).
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
        WorkerEnv::from_vars(&|k| std::env::var(k).ok())
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

    /// Only `ddp-run`/[`launch`](super::launch) and torchrun-style variables.
    pub(crate) fn from_launcher_vars(
        vars: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<WorkerEnv>, LaunchError> {
        let v = Vars(vars);
        let ours = v.get(WORKER_ENV).is_some_and(|x| x == "1");
        if !ours && !v.has("RANK") {
            return Ok(None);
        }
        let (launcher, name) = if ours {
            (LauncherKind::DdpRun, "the ddp launcher")
        } else {
            (LauncherKind::Torchrun, "torchrun")
        };
        let rank: usize = v.required("RANK", name)?;
        let world_size: usize = v.required("WORLD_SIZE", name)?;
        let local_rank = v.number("LOCAL_RANK")?.unwrap_or(rank);
        let local_world_size = v.number("LOCAL_WORLD_SIZE")?.unwrap_or(world_size);
        let node_rank = match v.number("GROUP_RANK")? {
            Some(n) => n,
            None => rank / local_world_size.max(1),
        };
        let (job_token, timeout, restart_count) = v.common()?;
        let env = WorkerEnv {
            launcher,
            rank,
            world_size,
            local_rank,
            local_world_size,
            node_rank,
            master_addr: master_addr(&v, local_world_size, world_size, name)?,
            master_port: v.port()?.unwrap_or(DEFAULT_MASTER_PORT),
            restart_count,
            job_token,
            timeout,
        };
        env.validate()
    }

    /// Only Open MPI and Slurm variables.
    pub(crate) fn from_external_vars(
        vars: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<WorkerEnv>, LaunchError> {
        let v = Vars(vars);
        if v.has("OMPI_COMM_WORLD_RANK") {
            return from_open_mpi(&v).and_then(WorkerEnv::validate);
        }
        if v.has("SLURM_PROCID") && v.first(&["SLURM_STEP_ID", "SLURM_STEPID"]).is_some() {
            return from_slurm(&v).and_then(WorkerEnv::validate);
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

/// `MASTER_ADDR`, defaulting to loopback when every rank is on this node.
fn master_addr(
    v: &Vars<'_>,
    local_world_size: usize,
    world_size: usize,
    launcher: &str,
) -> Result<String, LaunchError> {
    match v.get("MASTER_ADDR") {
        Some(a) => Ok(a),
        None if local_world_size >= world_size => Ok("127.0.0.1".into()),
        None => Err(LaunchError::worker_env(
            "MASTER_ADDR",
            format!(
                "is not set, and {launcher} placed ranks on several nodes: set it to the host of rank 0"
            ),
        )),
    }
}

/// Variables naming the Open MPI job, the same in every process of one `mpirun` and different
/// between jobs: Open MPI 4's job id, then PMIx's namespace (Open MPI 5).
const OPEN_MPI_JOB_VARS: [&str; 2] = ["OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"];
/// A random key `mpirun` generates per job and gives every process (Open MPI 4).
const OPEN_MPI_JOB_KEY_VAR: &str = "OMPI_MCA_orte_precondition_transports";

fn from_open_mpi(v: &Vars<'_>) -> Result<WorkerEnv, LaunchError> {
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
/// in [`DERIVED_PORTS`] (as [`slurm_port`]).
pub(crate) fn open_mpi_port(job_id: &str) -> u16 {
    let hash = job_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    derived_port(hash)
}

/// Where derived ports fall: below Linux's ephemeral range (32768..61000 by default), from which
/// the kernel hands out the ports of outgoing connections and of other programs' listeners, so
/// such a socket cannot already hold the port a job derives.
pub(crate) const DERIVED_PORTS: std::ops::Range<u16> = 10_000..32_000;

fn derived_port(spread: u64) -> u16 {
    let width = u64::from(DERIVED_PORTS.end - DERIVED_PORTS.start);
    DERIVED_PORTS.start + (spread % width) as u16
}

fn from_slurm(v: &Vars<'_>) -> Result<WorkerEnv, LaunchError> {
    const NAME: &str = "srun";
    let rank: usize = v.required("SLURM_PROCID", NAME)?;
    let (world_var, world) = v
        .first(&["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"])
        .ok_or_else(|| {
            LaunchError::worker_env(
                "SLURM_NTASKS",
                "is not set, but srun sets it for every task",
            )
        })?;
    let world_size: usize = world.parse().map_err(|_| {
        LaunchError::worker_env(
            &world_var,
            format!("'{world}' is not a non-negative integer"),
        )
    })?;
    let local_rank: usize = v.required("SLURM_LOCALID", NAME)?;
    let node_rank: usize = v.number("SLURM_NODEID")?.unwrap_or(0);
    let local_world_size = slurm_local_world_size(v, node_rank)?;
    let master_addr = match v.get("MASTER_ADDR") {
        Some(a) => a,
        // Every task on this node: loopback keeps the job off the network.
        None if local_world_size >= world_size => "127.0.0.1".into(),
        None => match v.first(&[
            "SLURM_STEP_NODELIST",
            "SLURM_JOB_NODELIST",
            "SLURM_NODELIST",
        ]) {
            Some((var, list)) => first_host(&list).ok_or_else(|| {
                LaunchError::worker_env(&var, format!("cannot read a host name from '{list}'"))
            })?,
            None => v.get("SLURM_LAUNCH_NODE_IPADDR").ok_or_else(|| {
                LaunchError::worker_env(
                    "MASTER_ADDR",
                    "is not set, and neither is SLURM_JOB_NODELIST: set it to the host of rank 0",
                )
            })?,
        },
    };
    let master_port = match v.port()? {
        Some(p) => p,
        None => {
            let job: u64 = v.required("SLURM_JOB_ID", NAME)?;
            let step: u64 = v
                .first(&["SLURM_STEP_ID", "SLURM_STEPID"])
                .and_then(|(_, s)| s.parse().ok())
                .unwrap_or(0);
            slurm_port(job, step)
        }
    };
    let (job_token, timeout, restart_count) = v.common()?;
    Ok(WorkerEnv {
        launcher: LauncherKind::Slurm,
        rank,
        world_size,
        local_rank,
        local_world_size,
        node_rank,
        master_addr,
        master_port,
        restart_count,
        job_token,
        timeout,
    })
}

/// The port every task of a Slurm step agrees on without talking: derived from the job and step
/// ids, in [`DERIVED_PORTS`].
pub(crate) fn slurm_port(job_id: u64, step_id: u64) -> u16 {
    derived_port(job_id.wrapping_mul(7919).wrapping_add(step_id))
}

/// Tasks on node `node_rank`: from `SLURM_STEP_TASKS_PER_NODE` / `SLURM_TASKS_PER_NODE`
/// (`2(x3),1`) or `SLURM_NTASKS_PER_NODE`.
fn slurm_local_world_size(v: &Vars<'_>, node_rank: usize) -> Result<usize, LaunchError> {
    if let Some((var, spec)) = v.first(&["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]) {
        let counts = parse_tasks_per_node(&spec).ok_or_else(|| {
            LaunchError::worker_env(
                &var,
                format!("cannot parse '{spec}' (expected e.g. 2(x3),1)"),
            )
        })?;
        return counts.get(node_rank).copied().ok_or_else(|| {
            LaunchError::worker_env(
                &var,
                format!(
                    "'{spec}' lists {} nodes, but SLURM_NODEID is {node_rank}",
                    counts.len()
                ),
            )
        });
    }
    v.number("SLURM_NTASKS_PER_NODE")?.ok_or_else(|| {
        LaunchError::worker_env(
            "SLURM_TASKS_PER_NODE",
            "is not set, nor SLURM_STEP_TASKS_PER_NODE or SLURM_NTASKS_PER_NODE",
        )
    })
}

/// Expands Slurm's `2(x3),1` into `[2, 2, 2, 1]`.
pub(crate) fn parse_tasks_per_node(spec: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in spec.split(',') {
        let part = part.trim();
        let (count, repeat) = match part.split_once('(') {
            Some((count, rest)) => {
                let times = rest.strip_prefix('x')?.strip_suffix(')')?;
                (count, times.parse::<usize>().ok()?)
            }
            None => (part, 1),
        };
        let count: usize = count.parse().ok()?;
        out.extend(std::iter::repeat_n(count, repeat));
    }
    (!out.is_empty()).then_some(out)
}

/// The first host of a Slurm host list: `node[01-04,07],gpu5` gives `node01`.
pub(crate) fn first_host(list: &str) -> Option<String> {
    // The first entry ends at the first comma outside brackets.
    let mut depth = 0usize;
    let mut end = list.len();
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1)?,
            ',' if depth == 0 => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let entry = list[..end].trim();
    // Replace every bracket group by its first value (`01-04,07` -> `01`).
    let mut host = String::new();
    let mut rest = entry;
    while let Some(open) = rest.find('[') {
        host.push_str(&rest[..open]);
        let close = rest[open..].find(']')? + open;
        let first = rest[open + 1..close].split([',', '-']).next()?.trim();
        if first.is_empty() {
            return None;
        }
        host.push_str(first);
        rest = &rest[close + 1..];
    }
    host.push_str(rest);
    (!host.is_empty()).then_some(host)
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

    fn detect(pairs: &[(&str, &str)]) -> Result<Option<WorkerEnv>, LaunchError> {
        WorkerEnv::from_vars(&vars(pairs))
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

    #[test]
    fn ddp_launcher_environment_is_read_completely() {
        let env = detect(&[
            (WORKER_ENV, "1"),
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("GROUP_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "1234"),
            (RESTART_COUNT_ENV, "2"),
            (TOKEN_ENV, "tok"),
            (TIMEOUT_ENV, "30"),
        ])
        .expect("ok")
        .expect("worker");
        assert_eq!(env.launcher, LauncherKind::DdpRun);
        assert_eq!(
            (
                env.rank,
                env.world_size,
                env.local_rank,
                env.local_world_size,
                env.node_rank
            ),
            (3, 4, 1, 2, 1)
        );
        assert_eq!(
            (env.master_addr.as_str(), env.master_port),
            ("10.0.0.1", 1234)
        );
        assert_eq!(env.restart_count, 2);
        assert!(env.is_restart());
        assert_eq!(env.job_token.as_deref(), Some("tok"));
        assert_eq!(env.timeout, Some(Duration::from_secs(30)));
        assert!(
            !format!("{env:?}").contains("tok\""),
            "the token is not printed"
        );
    }

    #[test]
    fn torchrun_style_defaults_fill_in_local_values() {
        let env = detect(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("TORCHELASTIC_RESTART_COUNT", "1"),
        ])
        .expect("ok")
        .expect("worker");
        assert_eq!(env.launcher, LauncherKind::Torchrun);
        assert_eq!(
            (env.local_rank, env.local_world_size, env.node_rank),
            (1, 2, 0)
        );
        let first = detect(&[("RANK", "1"), ("WORLD_SIZE", "2")])
            .expect("ok")
            .expect("worker");
        assert!(!first.is_restart(), "no restart count: the first attempt");
        assert_eq!(
            (env.master_addr.as_str(), env.master_port),
            ("127.0.0.1", DEFAULT_MASTER_PORT)
        );
        assert_eq!(env.restart_count, 1);
    }

    #[test]
    fn bad_launcher_variables_are_named() {
        let e = detect(&[(WORKER_ENV, "1"), ("WORLD_SIZE", "2")])
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "RANK: is not set, but the ddp launcher sets it for every worker"
        );
        let e = detect(&[("RANK", "x"), ("WORLD_SIZE", "2")])
            .unwrap_err()
            .to_string();
        assert_eq!(e, "RANK: 'x' is not a non-negative integer");
        let e = detect(&[("RANK", "2"), ("WORLD_SIZE", "2")])
            .unwrap_err()
            .to_string();
        assert_eq!(e, "RANK: rank 2 is outside 0..2");
        let e = detect(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_WORLD_SIZE", "2"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("MASTER_ADDR: is not set, and torchrun placed ranks on several nodes"),
            "{e}"
        );
        let e = detect(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_PORT", "0")])
            .unwrap_err()
            .to_string();
        assert_eq!(e, "MASTER_PORT: port 0 is not allowed");
    }

    #[test]
    fn slurm_step_environment_is_translated() {
        let env = detect(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_STEP_NUM_TASKS", "6"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "2"),
            ("SLURM_STEP_TASKS_PER_NODE", "2(x3)"),
            ("SLURM_JOB_ID", "12345"),
            ("SLURM_STEP_NODELIST", "gpu[07-09]"),
            ("SLURM_LAUNCH_NODE_IPADDR", "10.9.9.9"),
            (TOKEN_ENV, "secret"),
        ])
        .expect("ok")
        .expect("worker");
        assert_eq!(env.launcher, LauncherKind::Slurm);
        assert_eq!(
            (
                env.rank,
                env.world_size,
                env.local_rank,
                env.local_world_size,
                env.node_rank
            ),
            (5, 6, 1, 2, 2)
        );
        assert_eq!(env.master_addr, "gpu07");
        assert_eq!(env.master_port, slurm_port(12345, 0));
        assert!(DERIVED_PORTS.contains(&env.master_port));
    }

    #[test]
    fn slurm_prefers_explicit_master_and_falls_back_to_launch_node() {
        let base = [
            ("SLURM_PROCID", "0"),
            ("SLURM_STEPID", "3"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NTASKS_PER_NODE", "1"),
            ("SLURM_JOB_ID", "7"),
            (TOKEN_ENV, "secret"),
        ];
        let mut with_master = base.to_vec();
        with_master.extend([("MASTER_ADDR", "head"), ("MASTER_PORT", "4000")]);
        let env = detect(&with_master).expect("ok").expect("worker");
        assert_eq!((env.master_addr.as_str(), env.master_port), ("head", 4000));
        assert_eq!(env.local_world_size, 1);
        let mut launch_node = base.to_vec();
        launch_node.push(("SLURM_LAUNCH_NODE_IPADDR", "10.1.2.3"));
        let env = detect(&launch_node).expect("ok").expect("worker");
        assert_eq!(env.master_addr, "10.1.2.3");
        assert_eq!(env.master_port, slurm_port(7, 3));
        let e = detect(&base).unwrap_err().to_string();
        assert!(
            e.starts_with("MASTER_ADDR: is not set, and neither is SLURM_JOB_NODELIST"),
            "{e}"
        );
    }

    #[test]
    fn slurm_node_outside_tasks_per_node_is_an_error() {
        let e = detect(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NODEID", "3"),
            ("SLURM_TASKS_PER_NODE", "1(x2)"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ])
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "SLURM_TASKS_PER_NODE: '1(x2)' lists 2 nodes, but SLURM_NODEID is 3"
        );
    }

    #[test]
    fn open_mpi_environment_is_translated() {
        let env = detect(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("MASTER_ADDR", "node0"),
            (TOKEN_ENV, "tok"),
        ])
        .expect("ok")
        .expect("worker");
        assert_eq!(env.launcher, LauncherKind::OpenMpi);
        assert_eq!(
            (
                env.rank,
                env.world_size,
                env.local_rank,
                env.local_world_size,
                env.node_rank
            ),
            (3, 4, 1, 2, 1)
        );
        assert_eq!(
            (env.master_addr.as_str(), env.master_port),
            ("node0", DEFAULT_MASTER_PORT),
            "no job id: torch's default port"
        );
        assert_eq!(env.job_token.as_deref(), Some("tok"));
        let e = detect(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("MASTER_ADDR: is not set, and mpirun placed ranks on several nodes"),
            "{e}"
        );
        // Single node: loopback.
        let env = detect(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ])
        .expect("ok")
        .expect("worker");
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
        let r0 = detect(&mpirun_vars("0", "2041184257"))
            .expect("ok")
            .expect("worker");
        let r1 = detect(&mpirun_vars("1", "2041184257"))
            .expect("ok")
            .expect("worker");
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
        let other = detect(&mpirun_vars("0", "2041250817"))
            .expect("ok")
            .expect("worker");
        assert_ne!(other.master_port, r0.master_port);
        assert_ne!(other.job_token, r0.job_token);
        // Open MPI 5 names the job through PMIx.
        let pmix = detect(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "1"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "1"),
            ("PMIX_NAMESPACE", "prterun-vm-5460@1"),
        ])
        .expect("ok")
        .expect("worker");
        assert_eq!(pmix.master_port, open_mpi_port("prterun-vm-5460@1"));
        // Explicit settings win.
        let mut explicit = mpirun_vars("0", "2041184257");
        explicit.extend([("MASTER_PORT", "4100"), (TOKEN_ENV, "mine")]);
        let env = detect(&explicit).expect("ok").expect("worker");
        assert_eq!(
            (env.master_port, env.job_token.as_deref()),
            (4100, Some("mine"))
        );
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
        let e = detect(&mpi_two_nodes).unwrap_err().to_string();
        assert!(
            e.starts_with("DDP_JOB_TOKEN: is not set, and this job runs on several nodes"),
            "{e}"
        );
        assert!(e.contains("mpirun -x DDP_JOB_TOKEN"), "{e}");
        // mpirun's per-job key is.
        let mut keyed = mpi_two_nodes.to_vec();
        keyed.push((OPEN_MPI_JOB_KEY_VAR, "857e142413aecff8-fd43b546c5cc03a9"));
        let env = detect(&keyed).expect("ok").expect("worker");
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
        let e = detect(&slurm_two_nodes).unwrap_err().to_string();
        assert!(e.starts_with("DDP_JOB_TOKEN: is not set, and this job runs on several nodes (2 ranks, 1 on this node)"), "{e}");
        assert!(e.contains("in the batch script before srun"), "{e}");

        let torchrun_two_nodes = [
            ("RANK", "0"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "node0"),
        ];
        let e = detect(&torchrun_two_nodes).unwrap_err().to_string();
        assert!(
            e.starts_with("DDP_JOB_TOKEN: is not set, and this job runs on several nodes"),
            "{e}"
        );
        let mut with_token = torchrun_two_nodes.to_vec();
        with_token.push((TOKEN_ENV, "secret"));
        assert!(detect(&with_token).expect("ok").is_some());
    }

    #[test]
    fn a_one_node_slurm_step_meets_on_loopback_and_needs_no_secret() {
        let env = detect(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NTASKS_PER_NODE", "2"),
            ("SLURM_JOB_ID", "7"),
            ("SLURM_JOB_NODELIST", "n1"),
        ])
        .expect("ok")
        .expect("worker");
        assert_eq!(
            (env.master_addr.as_str(), env.job_token),
            ("127.0.0.1", None)
        );
    }

    #[test]
    fn ddp_launcher_variables_win_over_slurm_and_mpi() {
        let env = detect(&[
            (WORKER_ENV, "1"),
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("SLURM_PROCID", "0"),
            ("SLURM_STEP_ID", "0"),
            ("OMPI_COMM_WORLD_RANK", "0"),
        ])
        .expect("ok")
        .expect("worker");
        assert_eq!((env.launcher, env.rank), (LauncherKind::DdpRun, 1));
    }

    #[test]
    fn tasks_per_node_and_host_lists_expand() {
        assert_eq!(parse_tasks_per_node("2(x3),1"), Some(vec![2, 2, 2, 1]));
        assert_eq!(parse_tasks_per_node("4"), Some(vec![4]));
        assert_eq!(parse_tasks_per_node("2(3)"), None);
        assert_eq!(parse_tasks_per_node("x"), None);
        assert_eq!(first_host("node[01-04,07],gpu5").as_deref(), Some("node01"));
        assert_eq!(first_host("gpu5,node[1-2]").as_deref(), Some("gpu5"));
        assert_eq!(
            first_host("rack[3,5]-n[10-12]").as_deref(),
            Some("rack3-n10")
        );
        assert_eq!(first_host("solo").as_deref(), Some("solo"));
        assert_eq!(first_host("bad[").as_deref(), None);
        assert_eq!(first_host("").as_deref(), None);
    }
}
