//! The plan side: what was typed ([`args`]), the node and worker counts, the elastic settings
//! and the workers' process environment, validated into one [`LaunchPlan`]. Nothing here starts
//! a process.
//!
//! [`LaunchPlan`]: [`LaunchArgs`] validated into world size, ranks, ports and the environment of
//! each worker. Building a plan is pure (apart from looking the program up); running it is
//! [`LaunchPlan::run`].
//!
//! Beside the plan and its assembly here: the host's cores and variables ([`host`]), the
//! program the workers run ([`program`]) and each worker's variables ([`worker_vars`]).

pub(crate) mod args;
pub(crate) mod elastic_settings;
mod host;
pub(crate) mod node_count;
mod program;
pub(crate) mod takeover;
#[cfg(test)]
mod tests;
pub(crate) mod worker_count;
mod worker_vars;

use crate::error::LaunchError;
use crate::plan::args::{LaunchArgs, NprocPerNode};
use crate::plan::elastic_settings::ElasticSettings;
use crate::plan::host::HostInfo;
use crate::plan::node_count::NodeCount;
use crate::plan::program::{WorkerCommand, resolve_program};
use crate::plan::takeover::{TAKEOVER_ENV, takeover_grace};
use crate::plan::worker_count::{HostLimits, check_worker_count};
use crate::worker::env::launcher_vars::LAUNCH_ID_ENV;
use ddp_comm::TOKEN_ENV;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    /// How long a launcher started for a held `--node-rank` watches the holder's heartbeat
    /// before taking its place (`DDP_NODE_TAKEOVER_SECS`).
    pub(crate) takeover_grace: Duration,
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
        check_durations(args)?;
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
        let elastic = ElasticSettings::for_nodes(args, nodes)?;
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
        let thread_env = host.thread_env(nproc_per_node);
        let takeover_grace = takeover_grace(host.var(TAKEOVER_ENV))?;
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
            takeover_grace,
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
}

/// 128 random bits as hex.
fn random_token() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Refuses a duration beyond [`MAX_DURATION`](crate::MAX_DURATION): one set in code (the flags
/// refuse them when parsed) would otherwise panic later, in `Instant::now() + duration`.
fn check_durations(args: &LaunchArgs) -> Result<(), LaunchError> {
    let durations = [
        ("--grace-period", args.grace_period),
        ("--join-timeout", args.join_timeout),
        ("--rdzv-last-call", args.rdzv_last_call),
        ("--rdzv-heartbeat-timeout", args.rdzv_heartbeat_timeout),
    ];
    match durations
        .into_iter()
        .find(|(_, d)| *d > crate::MAX_DURATION)
    {
        Some((flag, value)) => Err(LaunchError::DurationTooLong { flag, value }),
        None => Ok(()),
    }
}
