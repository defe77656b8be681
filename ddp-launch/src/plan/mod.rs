//! The plan side: what was typed ([`args`]), the node and worker counts, the elastic settings
//! and the workers' process environment, validated into one [`LaunchPlan`]. Nothing here starts
//! a process.
//!
//! [`LaunchPlan`]: [`LaunchArgs`] validated into world size, ranks, ports and the environment of
//! each worker. Building a plan is pure (apart from looking the program up); running it is
//! [`LaunchPlan::run`].

pub(crate) mod args;
pub(crate) mod elastic_settings;
pub(crate) mod node_count;
pub(crate) mod worker_count;

use crate::error::LaunchError;
use crate::plan::args::{LaunchArgs, NprocPerNode};
use crate::plan::elastic_settings::ElasticSettings;
use crate::plan::node_count::{NodeCount, RdzvBackend};
use crate::plan::worker_count::{HostLimits, check_worker_count, process_limit};
use crate::worker::env::launcher_vars::{
    ALLOCATOR_ENV, LAUNCH_ID_ENV, RDZV_ROUND_ENV, RESTART_COUNT_ENV, WORKER_ENV,
};
use ddp_comm::TOKEN_ENV;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Thread-pool variables set per worker (to cores / local ranks) unless already set.
const THREAD_VARS: [&str; 2] = ["OMP_NUM_THREADS", "RAYON_NUM_THREADS"];

/// Variables that mean the user chose allocator settings (or another allocator) themselves.
const ALLOCATOR_USER_VARS: [&str; 6] = [
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_ARENA_MAX",
    "GLIBC_TUNABLES",
    "LD_PRELOAD",
];

/// Where the job's port on node 0 comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MasterPort {
    /// A free port is picked before every attempt (single node only).
    Auto,
    /// `--master-port`. On a single node the workers' store listens there; on several nodes
    /// node 0's launcher hosts the rendezvous there and the workers get a fresh free port of
    /// node 0 for every attempt.
    Fixed(u16),
}

/// What the launcher knows about its host: core count and the few variables it consults.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostInfo {
    /// CPU cores available to the launcher.
    pub(crate) cores: usize,
    /// The user's process limit (`RLIMIT_NPROC`), where it applies to the launcher.
    pub(crate) process_limit: Option<u64>,
    /// Environment variables (only [`TOKEN_ENV`], [`LAUNCH_ID_ENV`], the thread variables and
    /// the allocator variables are read).
    pub(crate) vars: HashMap<String, String>,
}

impl HostInfo {
    /// The current process's view.
    ///
    /// # Errors
    /// [`LaunchError::WorkerEnv`] naming a variable whose value is not valid UTF-8.
    pub(crate) fn current() -> Result<Self, LaunchError> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let vars = crate::worker::env::process_env::with_process_env(|lookup| {
            // LAUNCH_ID_ENV: a launch id already set is kept, so a wrapper (or a re-run that
            // should count as the same launch) can choose it; not inside another launch's
            // worker, whose id it is (this launch would share its log directory).
            let nested = lookup(WORKER_ENV).is_some();
            Ok([TOKEN_ENV, LAUNCH_ID_ENV]
                .into_iter()
                .filter(|&k| !(nested && k == LAUNCH_ID_ENV))
                .chain(THREAD_VARS)
                .chain(ALLOCATOR_USER_VARS)
                .filter_map(|k| lookup(k).map(|v| (k.to_string(), v)))
                .collect())
        })?;
        Ok(HostInfo {
            cores,
            process_limit: process_limit(),
            vars,
        })
    }

    fn var(&self, key: &str) -> Option<&str> {
        self.vars
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// The program every worker runs, and how to show it.
#[derive(Debug, Clone)]
pub(crate) struct WorkerCommand {
    /// Path to execute.
    pub(crate) program: PathBuf,
    /// `argv[0]` the workers see.
    pub(crate) arg0: OsString,
    /// The remaining arguments.
    pub(crate) args: Vec<OsString>,
}

/// A validated launch: who runs where, on which ports, with which environment.
///
/// Built from [`LaunchArgs`] by [`LaunchPlan::new`] (a program of your choice, what `ddp-run`
/// does) or [`LaunchPlan::for_current_exe`] (this program again, what
/// [`launch`](crate::launch) does); started with [`LaunchPlan::run`].
///
/// ```
/// use ddp_launch::{LaunchArgs, LaunchPlan, NprocPerNode};
/// let args = LaunchArgs::new().with_nproc_per_node(NprocPerNode::Count(2));
/// let plan = LaunchPlan::new(&args, "true", Vec::<String>::new())?;
/// assert_eq!(plan.world_size(), 2);
/// let env = plan.worker_env(1, 0, 29500);
/// assert!(env.contains(&("RANK".to_string(), "1".to_string())));
/// # Ok::<(), ddp_launch::LaunchError>(())
/// ```
#[derive(Clone)]
pub struct LaunchPlan {
    pub(crate) command: WorkerCommand,
    pub(crate) nproc_per_node: usize,
    pub(crate) nnodes: usize,
    pub(crate) node_rank: usize,
    pub(crate) master_addr: String,
    pub(crate) master_port: MasterPort,
    pub(crate) max_restarts: u32,
    pub(crate) log_dir: Option<PathBuf>,
    pub(crate) grace_period: Duration,
    pub(crate) tail_lines: usize,
    pub(crate) join_timeout: Duration,
    pub(crate) job_token: String,
    /// [`LAUNCH_ID_ENV`] for every worker of every attempt.
    pub(crate) launch_id: String,
    /// Thread-pool and allocator variables to set for every worker.
    pub(crate) thread_env: Vec<(String, String)>,
    /// Round-based rendezvous (`--rdzv-backend c10d`); `nnodes` is then MAX, and each round
    /// runs a copy of the plan with the round's node count, node rank and master.
    pub(crate) elastic: Option<ElasticSettings>,
    /// The round a per-round copy of an elastic plan runs (set in the workers' environment).
    pub(crate) rdzv_round: Option<RoundInfo>,
    /// torchrun's `TORCHELASTIC_RUN_ID`: `--rdzv-id`, or "none" as torchrun's default.
    pub(crate) run_id: String,
}

/// The elastic round a per-round copy of a plan runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RoundInfo {
    /// The round's number (`DDP_RDZV_ROUND`).
    pub(crate) number: u32,
    /// Rounds that ended in a failure before it: torchrun's `TORCHELASTIC_RESTART_COUNT`, which
    /// counts failure restarts only, not the re-forming when a node joins.
    pub(crate) restarts_before: u32,
}

impl std::fmt::Debug for LaunchPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchPlan")
            .field("program", &self.command.program)
            .field("args", &self.command.args)
            .field("nproc_per_node", &self.nproc_per_node)
            .field("nnodes", &self.nnodes)
            .field("node_rank", &self.node_rank)
            .field("master_addr", &self.master_addr)
            .field("master_port", &self.master_port)
            .field("max_restarts", &self.max_restarts)
            .field("log_dir", &self.log_dir)
            .field("grace_period", &self.grace_period)
            .field("job_token", &"<set>")
            .finish_non_exhaustive()
    }
}

impl LaunchPlan {
    /// Validates `args` for running `program` with `program_args` on every rank. The program
    /// is looked up now (a path, or a name searched in `PATH`), so a typo fails before anything
    /// starts. Reads the job token and thread variables from the environment.
    ///
    /// # Errors
    /// The [`LaunchError`] naming the first invalid flag, or [`LaunchError::ProgramNotFound`] /
    /// [`LaunchError::ProgramNotExecutable`].
    pub fn new<I, A>(
        args: &LaunchArgs,
        program: impl Into<OsString>,
        program_args: I,
    ) -> Result<LaunchPlan, LaunchError>
    where
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        let arg0: OsString = program.into();
        let resolved = resolve_program(&arg0, std::env::var_os("PATH").as_deref())?;
        let command = WorkerCommand {
            program: resolved,
            arg0,
            args: program_args.into_iter().map(Into::into).collect(),
        };
        LaunchPlan::with_host(args, command, &HostInfo::current()?)
    }

    /// Validates `args` for running this very program again, with the same arguments, on every
    /// rank (what [`launch`](crate::launch) does in the launcher process).
    ///
    /// # Errors
    /// As [`LaunchPlan::new`], or [`LaunchError::CurrentExe`].
    pub fn for_current_exe(args: &LaunchArgs) -> Result<LaunchPlan, LaunchError> {
        let program =
            std::env::current_exe().map_err(|source| LaunchError::CurrentExe { source })?;
        let mut argv = std::env::args_os();
        let arg0 = argv
            .next()
            .unwrap_or_else(|| program.clone().into_os_string());
        let command = WorkerCommand {
            program,
            arg0,
            args: argv.collect(),
        };
        LaunchPlan::with_host(args, command, &HostInfo::current()?)
    }

    /// The validation proper: no I/O.
    pub(crate) fn with_host(
        args: &LaunchArgs,
        command: WorkerCommand,
        host: &HostInfo,
    ) -> Result<LaunchPlan, LaunchError> {
        let nproc_per_node = match args.nproc_per_node.unwrap_or(NprocPerNode::Count(1)) {
            NprocPerNode::Count(0) => return Err(LaunchError::ZeroProcsPerNode),
            NprocPerNode::Count(n) => n,
            NprocPerNode::Auto => host.cores.max(1),
        };
        let limits = HostLimits {
            cores: host.cores,
            process_limit: host.process_limit,
        };
        check_worker_count(nproc_per_node, args.oversubscribe, &limits)?;
        let nodes = args.nnodes.unwrap_or(NodeCount::fixed(1));
        if nodes.min == 0 || nodes.max == 0 {
            return Err(LaunchError::ZeroNodes);
        }
        if nodes.min > nodes.max {
            return Err(LaunchError::NodeRangeReversed {
                min: nodes.min,
                max: nodes.max,
            });
        }
        let default_backend = if nodes.is_elastic() {
            RdzvBackend::C10d
        } else {
            RdzvBackend::Static
        };
        let elastic = match args.rdzv_backend.unwrap_or(default_backend) {
            RdzvBackend::Static if nodes.is_elastic() => {
                return Err(LaunchError::ElasticNeedsRounds {
                    nnodes: nodes.to_string(),
                });
            }
            RdzvBackend::Static => {
                if let Some(endpoint) = &args.rdzv_endpoint {
                    return Err(LaunchError::RdzvConflict {
                        flag: format!("--rdzv-endpoint {endpoint}"),
                        backend: "static".into(),
                        why: "the static rendezvous is on --master-addr:--master-port; --rdzv-endpoint is for --rdzv-backend c10d".into(),
                    });
                }
                None
            }
            backend => Some(ElasticSettings::validate(args, nodes, backend)?),
        };
        let nnodes = nodes.max;
        let run_id = match &elastic {
            Some(e) => e.job_id.clone(),
            None => args
                .rdzv_id
                .as_deref()
                .map(str::trim)
                .filter(|id| !id.is_empty())
                .unwrap_or("none")
                .to_string(),
        };
        let node_rank = args.node_rank.unwrap_or(0);
        if args.standalone && elastic.is_none() {
            let conflict = |flag: String| Err(LaunchError::StandaloneConflict { flag });
            if nnodes > 1 {
                return conflict(format!("--nnodes {nnodes}"));
            }
            if let Some(port) = args.master_port {
                return conflict(format!("--master-port {port}"));
            }
            if let Some(addr) = &args.master_addr {
                return conflict(format!("--master-addr {addr}"));
            }
        }
        if node_rank >= nnodes {
            return Err(LaunchError::NodeRankOutOfRange { node_rank, nnodes });
        }
        if nnodes.checked_mul(nproc_per_node).is_none() {
            return Err(LaunchError::WorldTooLarge {
                nnodes,
                nproc_per_node,
            });
        }
        if args.master_port == Some(0) {
            return Err(LaunchError::ZeroMasterPort);
        }
        let master_addr = args
            .master_addr
            .as_deref()
            .map(str::trim)
            .filter(|a| !a.is_empty());
        let token = host.var(TOKEN_ENV);
        if elastic.is_some() && token.is_none() {
            return Err(LaunchError::MissingJobToken { nnodes });
        }
        if nnodes > 1 && elastic.is_none() {
            if master_addr.is_none() {
                return Err(LaunchError::MissingMasterAddr { nnodes });
            }
            if args.master_port.is_none() {
                return Err(LaunchError::MissingMasterPort { nnodes });
            }
            if token.is_none() {
                return Err(LaunchError::MissingJobToken { nnodes });
            }
        }
        let job_token = match token {
            Some(t) => t.to_string(),
            None => random_token(),
        };
        let per_rank = (host.cores / nproc_per_node).max(1).to_string();
        let mut thread_env: Vec<(String, String)> = THREAD_VARS
            .iter()
            .filter(|k| host.var(k).is_none())
            .map(|k| (k.to_string(), per_rank.clone()))
            .collect();
        if cfg!(all(target_os = "linux", target_env = "gnu"))
            && ALLOCATOR_USER_VARS.iter().all(|k| host.var(k).is_none())
        {
            thread_env.extend(
                ALLOCATOR_ENV
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string())),
            );
        }
        Ok(LaunchPlan {
            command,
            nproc_per_node,
            nnodes,
            node_rank,
            master_addr: master_addr.unwrap_or("127.0.0.1").to_string(),
            master_port: args.master_port.map_or(MasterPort::Auto, MasterPort::Fixed),
            max_restarts: args.max_restarts,
            log_dir: args.log_dir.clone(),
            grace_period: args.grace_period,
            tail_lines: args.tail_lines,
            join_timeout: args.join_timeout,
            job_token,
            launch_id: host
                .var(LAUNCH_ID_ENV)
                .map_or_else(random_token, str::to_string),
            thread_env,
            elastic,
            rdzv_round: None,
            run_id,
        })
    }

    /// Total number of workers on all nodes.
    pub fn world_size(&self) -> usize {
        self.nnodes * self.nproc_per_node
    }
    /// Workers on this node.
    pub fn nproc_per_node(&self) -> usize {
        self.nproc_per_node
    }
    /// Number of nodes.
    pub fn nnodes(&self) -> usize {
        self.nnodes
    }
    /// This node's rank.
    pub fn node_rank(&self) -> usize {
        self.node_rank
    }
    /// Global rank of this node's `local_rank`: `node_rank * nproc_per_node + local_rank`.
    pub fn global_rank(&self, local_rank: usize) -> usize {
        self.node_rank * self.nproc_per_node + local_rank
    }
    /// Address of node 0 given to the workers.
    pub fn master_addr(&self) -> &str {
        &self.master_addr
    }
    /// Where the port on node 0 comes from.
    pub fn master_port(&self) -> MasterPort {
        self.master_port
    }
    /// How many times the group is restarted after a failure.
    pub fn max_restarts(&self) -> u32 {
        self.max_restarts
    }
    /// Directory for per-rank log files, if any.
    pub fn log_dir(&self) -> Option<&Path> {
        self.log_dir.as_deref()
    }
    /// Time between SIGTERM and SIGKILL when stopping workers.
    pub fn grace_period(&self) -> Duration {
        self.grace_period
    }
    /// The program every worker runs.
    pub fn program(&self) -> &Path {
        &self.command.program
    }
    /// Whether the job spans several nodes (with fixed node ranks: `--rdzv-backend static`).
    pub fn is_multi_node(&self) -> bool {
        self.nnodes > 1 && self.elastic.is_none()
    }
    /// `(MIN, MAX)` nodes of a job that forms in rendezvous rounds (`--rdzv-backend c10d`),
    /// `None` for a static one.
    pub fn elastic_nodes(&self) -> Option<(usize, usize)> {
        self.elastic.as_ref().map(|e| (e.nodes.min, e.nodes.max))
    }

    /// The variables set for `local_rank` on attempt `restart_count`, when the workers' store
    /// is on `master_port`. Everything else is inherited from the launcher.
    pub fn worker_env(
        &self,
        local_rank: usize,
        restart_count: u32,
        master_port: u16,
    ) -> Vec<(String, String)> {
        let torchelastic_restarts = self
            .rdzv_round
            .map_or(restart_count, |round| round.restarts_before);
        let mut env: Vec<(String, String)> = [
            (WORKER_ENV, "1".to_string()),
            ("RANK", self.global_rank(local_rank).to_string()),
            ("LOCAL_RANK", local_rank.to_string()),
            ("WORLD_SIZE", self.world_size().to_string()),
            ("LOCAL_WORLD_SIZE", self.nproc_per_node.to_string()),
            ("GROUP_RANK", self.node_rank.to_string()),
            ("GROUP_WORLD_SIZE", self.nnodes.to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", master_port.to_string()),
            (RESTART_COUNT_ENV, restart_count.to_string()),
            (
                "TORCHELASTIC_RESTART_COUNT",
                torchelastic_restarts.to_string(),
            ),
            ("TORCHELASTIC_MAX_RESTARTS", self.max_restarts.to_string()),
            ("TORCHELASTIC_RUN_ID", self.run_id.clone()),
            // torchrun's single worker role, which spans every rank.
            ("ROLE_NAME", "default".to_string()),
            ("ROLE_RANK", self.global_rank(local_rank).to_string()),
            ("ROLE_WORLD_SIZE", self.world_size().to_string()),
            (TOKEN_ENV, self.job_token.clone()),
            (LAUNCH_ID_ENV, self.launch_id.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        if let Some(round) = self.rdzv_round {
            env.push((RDZV_ROUND_ENV.to_string(), round.number.to_string()));
        }
        env.extend(self.thread_env.iter().cloned());
        env
    }
}

/// 128 random bits as hex.
fn random_token() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Finds the program as `execvp` would, with a clear error when it cannot run.
pub(crate) fn resolve_program(
    program: &OsStr,
    path_var: Option<&OsStr>,
) -> Result<PathBuf, LaunchError> {
    let name = program.to_string_lossy().into_owned();
    if program.is_empty() {
        return Err(LaunchError::ProgramNotFound {
            program: name,
            reason: "the program name is empty".into(),
        });
    }
    if program.as_bytes().contains(&b'/') {
        let path = PathBuf::from(program);
        return match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(LaunchError::ProgramNotFound {
                    program: name,
                    reason: "no such file".into(),
                })
            }
            Err(e) => Err(LaunchError::ProgramNotExecutable {
                program: name,
                reason: e.to_string(),
            }),
            Ok(m) if m.is_dir() => Err(LaunchError::ProgramNotExecutable {
                program: name,
                reason: "it is a directory".into(),
            }),
            Ok(m) if m.permissions().mode() & 0o111 == 0 => {
                Err(LaunchError::ProgramNotExecutable {
                    program: name,
                    reason: "it has no execute permission".into(),
                })
            }
            Ok(_) => Ok(path),
        };
    }
    let Some(path_var) = path_var.filter(|p| !p.is_empty()) else {
        return Err(LaunchError::ProgramNotFound {
            program: name,
            reason: "PATH is not set; give a path such as ./program".into(),
        });
    };
    for dir in std::env::split_paths(path_var) {
        let candidate = dir.join(program);
        if let Ok(m) = std::fs::metadata(&candidate)
            && m.is_file()
            && m.permissions().mode() & 0o111 != 0
        {
            return Ok(candidate);
        }
    }
    Err(LaunchError::ProgramNotFound {
        program: name.clone(),
        reason: format!(
            "no executable '{name}' in PATH (give a path such as ./{name} for a file here)"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command() -> WorkerCommand {
        WorkerCommand {
            program: "/bin/true".into(),
            arg0: "true".into(),
            args: vec![],
        }
    }

    fn host(cores: usize, vars: &[(&str, &str)]) -> HostInfo {
        HostInfo {
            cores,
            process_limit: None,
            vars: vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn plan(args: &LaunchArgs) -> Result<LaunchPlan, LaunchError> {
        LaunchPlan::with_host(args, command(), &host(8, &[]))
    }

    /// A valid plan for `args` on a host with `cores` cores and the variables `vars`.
    fn valid_plan(args: &LaunchArgs, cores: usize, vars: &[(&str, &str)]) -> LaunchPlan {
        LaunchPlan::with_host(args, command(), &host(cores, vars)).expect("valid")
    }

    fn env_of(plan: &LaunchPlan, local_rank: usize) -> HashMap<String, String> {
        plan.worker_env(local_rank, 2, 4242).into_iter().collect()
    }

    /// Asserts that `env` holds each of `expected`'s variables with its value.
    fn assert_vars(env: &HashMap<String, String>, expected: &[(&str, &str)]) {
        for (k, v) in expected {
            assert_eq!(env.get(*k).map(String::as_str), Some(*v), "{k}");
        }
    }

    /// The environment of local rank 0 of [`valid_plan`]`(args, cores, vars)`.
    fn first_env(
        args: &LaunchArgs,
        cores: usize,
        vars: &[(&str, &str)],
    ) -> HashMap<String, String> {
        env_of(&valid_plan(args, cores, vars), 0)
    }

    #[test]
    fn defaults_are_one_process_on_one_node_with_an_auto_port() {
        let p = plan(&LaunchArgs::new()).expect("valid");
        assert_eq!((p.world_size(), p.nnodes(), p.node_rank()), (1, 1, 0));
        assert_eq!(p.master_port(), MasterPort::Auto);
        assert_eq!(p.master_addr(), "127.0.0.1");
        assert_eq!(p.job_token.len(), 32);
    }

    #[test]
    fn node_k_local_rank_j_is_global_rank_k_times_nproc_plus_j() {
        let args = LaunchArgs::new()
            .with_nproc_per_node(NprocPerNode::Count(4))
            .with_nodes(3, 2)
            .with_master_addr("10.0.0.1")
            .with_master_port(29500);
        let p = valid_plan(&args, 8, &[(TOKEN_ENV, "secret")]);
        assert_eq!(p.world_size(), 12);
        assert_eq!(
            (0..4).map(|j| p.global_rank(j)).collect::<Vec<_>>(),
            vec![8, 9, 10, 11]
        );
        assert_vars(
            &env_of(&p, 3),
            &[
                ("RANK", "11"),
                ("LOCAL_RANK", "3"),
                ("WORLD_SIZE", "12"),
                ("LOCAL_WORLD_SIZE", "4"),
                ("GROUP_RANK", "2"),
                ("GROUP_WORLD_SIZE", "3"),
                ("MASTER_ADDR", "10.0.0.1"),
                ("MASTER_PORT", "4242"),
                (TOKEN_ENV, "secret"),
            ],
        );
    }

    #[test]
    fn worker_env_marks_workers_and_carries_restart_count() {
        let p = plan(
            &LaunchArgs::new()
                .with_nproc_per_node(NprocPerNode::Count(2))
                .with_max_restarts(3),
        )
        .expect("valid");
        let env = env_of(&p, 1);
        assert_vars(
            &env,
            &[
                (WORKER_ENV, "1"),
                (RESTART_COUNT_ENV, "2"),
                ("TORCHELASTIC_RESTART_COUNT", "2"),
                ("TORCHELASTIC_MAX_RESTARTS", "3"),
                // torchrun's single role, and its run id
                // (`torch.distributed.is_torchelastic_launched()` looks for it): "none" unless
                // --rdzv-id names one.
                ("TORCHELASTIC_RUN_ID", "none"),
                ("ROLE_NAME", "default"),
                ("ROLE_RANK", "1"),
                ("ROLE_WORLD_SIZE", "2"),
            ],
        );
        // Every rank of one plan shares the token.
        assert_eq!(env_of(&p, 0)[TOKEN_ENV], env[TOKEN_ENV]);
        let named = plan(&LaunchArgs::new().with_rdzv_id("job7")).expect("valid");
        assert_eq!(env_of(&named, 0)["TORCHELASTIC_RUN_ID"], "job7");
    }

    #[test]
    fn thread_counts_default_to_cores_per_local_rank_unless_set() {
        let args = LaunchArgs::new().with_nproc_per_node(NprocPerNode::Count(3));
        let env = first_env(&args, 8, &[]);
        assert_eq!(env["OMP_NUM_THREADS"], "2");
        assert_eq!(env["RAYON_NUM_THREADS"], "2");
        let env = first_env(&args, 8, &[("OMP_NUM_THREADS", "7")]);
        assert!(
            !env.contains_key("OMP_NUM_THREADS"),
            "inherited, not overridden"
        );
        assert_eq!(env["RAYON_NUM_THREADS"], "2");
        // More ranks than cores still gets one thread each.
        let many = LaunchArgs::new().with_nproc_per_node(NprocPerNode::Count(16));
        assert_eq!(first_env(&many, 8, &[])["OMP_NUM_THREADS"], "1");
    }

    #[test]
    fn allocator_defaults_apply_unless_the_user_tunes_the_allocator() {
        let args = LaunchArgs::new().with_nproc_per_node(NprocPerNode::Count(2));
        let env = first_env(&args, 8, &[]);
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            for (k, v) in ALLOCATOR_ENV {
                assert_eq!(env[k], v, "{k}");
            }
        }
        for user in ALLOCATOR_USER_VARS {
            let env = first_env(&args, 8, &[(user, "x")]);
            assert!(
                ALLOCATOR_ENV.iter().all(|(k, _)| !env.contains_key(*k)),
                "{user} set: the user's allocator settings are left alone"
            );
        }
    }

    #[test]
    fn auto_uses_available_cores() {
        let args = LaunchArgs::new().with_nproc_per_node(NprocPerNode::Auto);
        let p = valid_plan(&args, 6, &[]);
        assert_eq!(p.nproc_per_node(), 6);
    }

    #[test]
    fn existing_job_token_is_inherited() {
        let p = valid_plan(&LaunchArgs::new(), 1, &[(TOKEN_ENV, "abc")]);
        assert_eq!(p.job_token, "abc");
        let q = plan(&LaunchArgs::new()).expect("valid");
        assert_ne!(
            q.job_token,
            plan(&LaunchArgs::new()).expect("valid").job_token,
            "random per job"
        );
    }

    #[test]
    fn fixed_port_is_kept() {
        let p = plan(&LaunchArgs::new().with_master_port(1234)).expect("valid");
        assert_eq!(p.master_port(), MasterPort::Fixed(1234));
    }

    #[test]
    fn invalid_flags_are_rejected_with_messages_naming_the_values() {
        let cases: Vec<(LaunchArgs, &str)> = vec![
            (
                LaunchArgs::new().with_nproc_per_node(NprocPerNode::Count(0)),
                "--nproc-per-node must be at least 1, got 0",
            ),
            (
                LaunchArgs::new().with_nodes(0, 0),
                "--nnodes must be at least 1, got 0",
            ),
            (
                LaunchArgs::new()
                    .with_nodes(2, 2)
                    .with_master_addr("h")
                    .with_master_port(1),
                "--node-rank 2 is out of range for --nnodes 2 (node ranks are 0..=1)",
            ),
            (
                LaunchArgs::new().with_nodes(2, 0).with_master_port(1),
                "--master-addr is required when --nnodes is 2",
            ),
            (
                LaunchArgs::new().with_nodes(2, 0).with_master_addr("h"),
                "--master-port is required when --nnodes is 2",
            ),
            (
                LaunchArgs::new()
                    .with_nodes(2, 0)
                    .with_master_addr("h")
                    .with_master_port(9),
                "a multi-node job (--nnodes 2) needs a shared job token: set DDP_JOB_TOKEN",
            ),
            (
                LaunchArgs::new().with_master_port(0),
                "--master-port 0 is not allowed",
            ),
            (
                LaunchArgs::new().with_standalone(true).with_nodes(2, 0),
                "--standalone runs one node on this host with a free port, but --nnodes 2 was also given",
            ),
            (
                LaunchArgs::new().with_standalone(true).with_master_port(80),
                "but --master-port 80 was also given",
            ),
            (
                // Past the per-core bound (asked for), the world size overflows.
                LaunchArgs::new()
                    .with_nproc_per_node(NprocPerNode::Count(usize::MAX))
                    .with_oversubscribe(true)
                    .with_nodes(2, 0),
                "is too many processes",
            ),
        ];
        for (args, expected) in cases {
            let err = plan(&args).expect_err(expected).to_string();
            assert!(
                err.contains(expected),
                "{err:?} should contain {expected:?}"
            );
        }
    }

    #[test]
    fn multi_node_with_token_addr_and_port_is_valid() {
        let args = LaunchArgs::new()
            .with_nodes(2, 1)
            .with_master_addr(" 10.1.1.1 ")
            .with_master_port(29400);
        let p = valid_plan(&args, 4, &[(TOKEN_ENV, "t")]);
        assert!(p.is_multi_node());
        assert_eq!(p.master_addr(), "10.1.1.1");
        assert_eq!(p.global_rank(0), 1);
    }

    #[test]
    fn programs_are_resolved_like_execvp_with_clear_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let exe = dir.path().join("train");
        std::fs::write(&exe, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let data = dir.path().join("data.txt");
        std::fs::write(&data, "x").expect("write");
        let path = Some(dir.path().as_os_str());

        assert_eq!(
            resolve_program(OsStr::new("train"), path).expect("on PATH"),
            exe
        );
        assert_eq!(
            resolve_program(exe.as_os_str(), None).expect("by path"),
            exe
        );
        let e = resolve_program(OsStr::new("./no-such-program"), path)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "program './no-such-program' was not found: no such file");
        let e = resolve_program(OsStr::new("no-such-program"), path)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("program 'no-such-program' was not found: no executable"),
            "{e}"
        );
        let e = resolve_program(data.as_os_str(), path)
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("cannot be executed: it has no execute permission"),
            "{e}"
        );
        let e = resolve_program(dir.path().as_os_str(), path)
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("cannot be executed: it is a directory"), "{e}");
        let e = resolve_program(OsStr::new("data.txt"), path)
            .unwrap_err()
            .to_string();
        assert!(e.contains("was not found"), "{e}");
    }

    #[test]
    fn elastic_plans_need_a_token_and_give_workers_their_round() {
        let args = LaunchArgs::new()
            .with_nproc_per_node(NprocPerNode::Count(2))
            .with_elastic_nodes(2, 3, "127.0.0.1:29400");
        assert!(matches!(
            plan(&args).unwrap_err(),
            LaunchError::MissingJobToken { nnodes: 3 }
        ));
        let p = valid_plan(&args, 8, &[(TOKEN_ENV, "t")]);
        assert_eq!(p.elastic_nodes(), Some((2, 3)));
        assert!(!p.is_multi_node(), "static rendezvous only");
        let mut round = p.clone();
        round.rdzv_round = Some(RoundInfo {
            number: 4,
            restarts_before: 1,
        });
        let env: HashMap<_, _> = round.worker_env(0, 4, 4242).into_iter().collect();
        assert_eq!(env[RDZV_ROUND_ENV], "4");
        assert_eq!(env[RESTART_COUNT_ENV], "4");
        // torchrun counts failure restarts only: rounds re-formed for a joining node do not.
        assert_eq!(env["TORCHELASTIC_RESTART_COUNT"], "1");
        assert_eq!(env["TORCHELASTIC_RUN_ID"], "none", "the default --rdzv-id");
        assert!(!env_of(&p, 0).contains_key(RDZV_ROUND_ENV));
        // N:N with the c10d backend is elastic too (ranks by join order, re-forming on failure).
        let fixed = LaunchArgs::new()
            .with_elastic_nodes(2, 2, "h:1")
            .with_rdzv_backend(RdzvBackend::C10d);
        let p = valid_plan(&fixed, 8, &[(TOKEN_ENV, "t")]);
        assert_eq!(p.elastic_nodes(), Some((2, 2)));
    }
}
