//! [`LaunchArgs`]: the launcher flags as the user typed them (or set through `DDP_*`
//! environment variables). Nothing is validated here; [`LaunchPlan`](crate::LaunchPlan) does that.

use crate::plan::node_count::{NodeCount, RdzvBackend};
use clap::Args;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// How many worker processes to start on this node (`--nproc-per-node`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NprocPerNode {
    /// Exactly this many processes (0 is rejected when the plan is built).
    Count(usize),
    /// One process per CPU core available to the launcher
    /// ([`std::thread::available_parallelism`]). GPUs are not counted yet: on a GPU machine,
    /// pass the number of GPUs explicitly.
    Auto,
}

impl FromStr for NprocPerNode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("auto") {
            return Ok(NprocPerNode::Auto);
        }
        s.parse::<usize>()
            .map(NprocPerNode::Count)
            .map_err(|_| format!("expected a number of processes or 'auto', got '{s}'"))
    }
}

impl fmt::Display for NprocPerNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NprocPerNode::Count(n) => write!(f, "{n}"),
            NprocPerNode::Auto => f.write_str("auto"),
        }
    }
}

/// Help heading of the launcher's flags (per flag, so it does not leak into the flags that
/// follow a flattened `LaunchArgs`).
const HEADING: &str = "Launcher options";

/// The longest duration any of the launcher's `SECS` flags accepts: 365 days (ddp-comm's
/// [`MAX_TIMEOUT`](ddp_comm::MAX_TIMEOUT)), far beyond any real wait and small enough that no
/// deadline made from it overflows (`Instant + Duration` panics on overflow).
pub const MAX_DURATION: Duration = ddp_comm::MAX_TIMEOUT;

/// Parses a non-negative number of seconds (fractions allowed), at most [`MAX_DURATION`], into
/// a [`Duration`].
pub(crate) fn parse_secs(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("expected a number of seconds, got '{s}'"))?;
    match Duration::try_from_secs_f64(secs) {
        Ok(d) if d <= MAX_DURATION => Ok(d),
        Ok(_) => Err(too_long(s.trim())),
        // Positive overflow ("1e30", "inf") is too long, not negative.
        Err(_) if secs > 0.0 => Err(too_long(s.trim())),
        Err(_) => Err(format!(
            "expected a non-negative number of seconds, got '{s}'"
        )),
    }
}

/// The error for a duration beyond [`MAX_DURATION`], naming the limit.
pub(crate) fn too_long(value: &str) -> String {
    format!(
        "{value} s is longer than the maximum of {} s (365 days)",
        MAX_DURATION.as_secs()
    )
}

/// The launcher's flags, torchrun's names. Flatten it into your own clap parser:
///
/// ```
/// use clap::Parser;
/// #[derive(Parser)]
/// struct Args {
///     /// Your own flags pass through to every worker unchanged.
///     #[arg(long, default_value_t = 3)]
///     epochs: usize,
///     #[command(flatten)]
///     launch: ddp_launch::LaunchArgs,
/// }
/// let args = Args::parse_from(["train", "--nproc-per-node", "2", "--epochs", "5"]);
/// assert_eq!(args.launch.nproc_per_node, Some(ddp_launch::NprocPerNode::Count(2)));
/// ```
///
/// Most flags also read a `DDP_*` environment variable when not given (`DDP_NPROC_PER_NODE`,
/// `DDP_NNODES`, `DDP_NODE_RANK`, `DDP_MASTER_ADDR`, `DDP_MASTER_PORT`, `DDP_MAX_RESTARTS`,
/// `DDP_LOG_DIR`, `DDP_RDZV_BACKEND`, `DDP_RDZV_ENDPOINT`, `DDP_RDZV_ID`). Workers ignore these flags: they get their place in the job from the
/// environment the launcher sets. Your program must not define flags with the same names.
///
/// Build one in code with [`LaunchArgs::new`] and the `with_*` methods; the defaults equal
/// parsing an empty command line.
#[derive(Debug, Clone, PartialEq, Args)]
// clap turns a flattened struct's doc comment into the parent command's `about`; keep ours out.
#[command(about = None, long_about = None)]
#[non_exhaustive]
pub struct LaunchArgs {
    /// Worker processes on this node: a number, or `auto` for one per CPU core [default: 1].
    /// More than 32 per CPU core is refused unless --oversubscribe is given (a typo would
    /// otherwise start workers until the OS refuses), and never more than the user's process
    /// limit (`ulimit -u`)
    #[arg(long, help_heading = HEADING, value_name = "N|auto", env = "DDP_NPROC_PER_NODE")]
    pub nproc_per_node: Option<NprocPerNode>,

    /// Allow more than 32 workers per CPU core on this node (like mpirun's --oversubscribe)
    #[arg(long, help_heading = HEADING)]
    pub oversubscribe: bool,

    /// Number of nodes: N (above 1, --master-addr and --master-port are required), or MIN:MAX
    /// for an elastic job that re-forms when nodes fail or arrive (needs --rdzv-endpoint)
    /// [default: 1]
    #[arg(long, help_heading = HEADING, value_name = "N|MIN:MAX", env = "DDP_NNODES")]
    pub nnodes: Option<NodeCount>,

    /// This node's rank, in 0..nnodes; node k's local rank j is global rank k*nproc_per_node+j.
    /// A launcher started again for a node whose launcher died takes its place after 15 s
    /// (the job restarts if it was running) [default: 0]
    #[arg(long, help_heading = HEADING, value_name = "K", env = "DDP_NODE_RANK")]
    pub node_rank: Option<usize>,

    /// Address of node 0 as every node reaches it [default: 127.0.0.1 on a single node]
    #[arg(long, help_heading = HEADING, value_name = "HOST", env = "DDP_MASTER_ADDR")]
    pub master_addr: Option<String>,

    /// Port on node 0: the workers' store on a single node, the launchers' rendezvous on
    /// several [default: a free port, single node only]
    #[arg(long, help_heading = HEADING, value_name = "PORT", env = "DDP_MASTER_PORT")]
    pub master_port: Option<u16>,

    /// Single node on this host with a free port (torchrun's --standalone; also the default
    /// when --nnodes is 1)
    #[arg(long, help_heading = HEADING)]
    pub standalone: bool,

    /// Restart the whole group this many times after a failure (DDP_RESTART_COUNT tells the
    /// workers which attempt they are; elastic: rounds that ended in a failure, a node joining
    /// is free)
    #[arg(long, help_heading = HEADING, value_name = "N", default_value_t = 0, env = "DDP_MAX_RESTARTS")]
    pub max_restarts: u32,

    /// Also write each rank's output to DIR/LAUNCH/attempt_A/rank_R.log (LAUNCH: this launch's
    /// DDP_LAUNCH_ID, A: restart count, R: rank), so launches do not overwrite each other's
    #[arg(long, help_heading = HEADING, value_name = "DIR", env = "DDP_LOG_DIR")]
    pub log_dir: Option<PathBuf>,

    /// Seconds between SIGTERM and SIGKILL when stopping workers
    #[arg(long, help_heading = HEADING, value_name = "SECS", default_value = "5", value_parser = parse_secs)]
    pub grace_period: Duration,

    /// Lines of the failing rank's output shown in the failure summary
    #[arg(long, help_heading = HEADING, value_name = "N", default_value_t = 20)]
    pub tail_lines: usize,

    /// Seconds to wait for every node to join the rendezvous (multi-node only; elastic: for
    /// MIN nodes to join a round)
    #[arg(long, help_heading = HEADING, value_name = "SECS", default_value = "600", value_parser = parse_secs)]
    pub join_timeout: Duration,

    /// How the nodes' launchers meet: `static` (fixed --node-rank, node 0 hosts), `c10d`
    /// (rounds over a store hosted by the first launcher at --rdzv-endpoint) or `etcd` (rounds
    /// in the etcd server at --rdzv-endpoint; needs the `etcd` feature) [default: static for
    /// --nnodes N, c10d for MIN:MAX]
    #[arg(long, help_heading = HEADING, value_name = "BACKEND", env = "DDP_RDZV_BACKEND")]
    pub rdzv_backend: Option<RdzvBackend>,

    /// HOST:PORT of the elastic rendezvous (c10d: the launcher on HOST hosts it there; etcd: the
    /// etcd server's client address, e.g. node0:2379)
    #[arg(long, help_heading = HEADING, value_name = "HOST:PORT", env = "DDP_RDZV_ENDPOINT")]
    pub rdzv_endpoint: Option<String>,

    /// Job id: launchers meet only those with the same id at the endpoint [default: none]
    #[arg(long, help_heading = HEADING, value_name = "ID", env = "DDP_RDZV_ID")]
    pub rdzv_id: Option<String>,

    /// Elastic: once MIN nodes joined a round, seconds to wait for more (up to MAX) before
    /// starting
    #[arg(long, help_heading = HEADING, value_name = "SECS", default_value = "10", value_parser = parse_secs)]
    pub rdzv_last_call: Duration,

    /// Elastic: a node whose launcher sent no heartbeat for this many seconds is dead, and the
    /// others re-form the job without it
    #[arg(long, help_heading = HEADING, value_name = "SECS", default_value = "15", value_parser = parse_secs)]
    pub rdzv_heartbeat_timeout: Duration,
}

impl Default for LaunchArgs {
    fn default() -> Self {
        LaunchArgs {
            nproc_per_node: None,
            oversubscribe: false,
            nnodes: None,
            node_rank: None,
            master_addr: None,
            master_port: None,
            standalone: false,
            max_restarts: 0,
            log_dir: None,
            grace_period: Duration::from_secs(5),
            tail_lines: 20,
            join_timeout: Duration::from_secs(600),
            rdzv_backend: None,
            rdzv_endpoint: None,
            rdzv_id: None,
            rdzv_last_call: Duration::from_secs(10),
            rdzv_heartbeat_timeout: Duration::from_secs(15),
        }
    }
}

impl LaunchArgs {
    /// The defaults: one process, one node, free port, no restarts.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets `--nproc-per-node`.
    pub fn with_nproc_per_node(mut self, n: NprocPerNode) -> Self {
        self.nproc_per_node = Some(n);
        self
    }
    /// Sets `--oversubscribe`: more than 32 workers per CPU core are allowed.
    pub fn with_oversubscribe(mut self, oversubscribe: bool) -> Self {
        self.oversubscribe = oversubscribe;
        self
    }
    /// Sets `--nnodes` and `--node-rank`.
    pub fn with_nodes(mut self, nnodes: usize, node_rank: usize) -> Self {
        self.nnodes = Some(NodeCount::fixed(nnodes));
        self.node_rank = Some(node_rank);
        self
    }
    /// Sets `--nnodes MIN:MAX` (an elastic job) and `--rdzv-endpoint`.
    pub fn with_elastic_nodes(
        mut self,
        min: usize,
        max: usize,
        endpoint: impl Into<String>,
    ) -> Self {
        self.nnodes = Some(NodeCount::range(min, max));
        self.rdzv_endpoint = Some(endpoint.into());
        self
    }
    /// Sets `--rdzv-backend`.
    pub fn with_rdzv_backend(mut self, backend: RdzvBackend) -> Self {
        self.rdzv_backend = Some(backend);
        self
    }
    /// Sets `--rdzv-id`.
    pub fn with_rdzv_id(mut self, id: impl Into<String>) -> Self {
        self.rdzv_id = Some(id.into());
        self
    }
    /// Sets `--rdzv-last-call`.
    pub fn with_rdzv_last_call(mut self, wait: Duration) -> Self {
        self.rdzv_last_call = wait;
        self
    }
    /// Sets `--rdzv-heartbeat-timeout`.
    pub fn with_rdzv_heartbeat_timeout(mut self, timeout: Duration) -> Self {
        self.rdzv_heartbeat_timeout = timeout;
        self
    }
    /// Sets `--master-addr`.
    pub fn with_master_addr(mut self, addr: impl Into<String>) -> Self {
        self.master_addr = Some(addr.into());
        self
    }
    /// Sets `--master-port`.
    pub fn with_master_port(mut self, port: u16) -> Self {
        self.master_port = Some(port);
        self
    }
    /// Sets `--standalone`.
    pub fn with_standalone(mut self, standalone: bool) -> Self {
        self.standalone = standalone;
        self
    }
    /// Sets `--max-restarts`.
    pub fn with_max_restarts(mut self, n: u32) -> Self {
        self.max_restarts = n;
        self
    }
    /// Sets `--log-dir`.
    pub fn with_log_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.log_dir = Some(dir.into());
        self
    }
    /// Sets `--grace-period`.
    pub fn with_grace_period(mut self, grace: Duration) -> Self {
        self.grace_period = grace;
        self
    }
    /// Sets `--tail-lines`.
    pub fn with_tail_lines(mut self, n: usize) -> Self {
        self.tail_lines = n;
        self
    }
    /// Sets `--join-timeout`.
    pub fn with_join_timeout(mut self, timeout: Duration) -> Self {
        self.join_timeout = timeout;
        self
    }

    /// Whether the user asked for a launch explicitly (`--nproc-per-node` or `--nnodes` given).
    /// Explicit flags win over a Slurm or Open MPI environment; see [`launch`](crate::launch).
    pub fn is_explicit(&self) -> bool {
        self.nproc_per_node.is_some() || self.nnodes.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        launch: LaunchArgs,
        #[arg(long)]
        epochs: Option<u32>,
    }

    fn parse(args: &[&str]) -> Result<LaunchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("prog").chain(args.iter().copied())).map(|c| c.launch)
    }

    #[test]
    fn defaults_equal_an_empty_command_line() {
        // Only meaningful when no DDP_* variable is set in the test environment.
        if std::env::vars().any(|(k, _)| k.starts_with("DDP_")) {
            eprintln!("skipping: DDP_* variables are set");
            return;
        }
        assert_eq!(parse(&[]).expect("parses"), LaunchArgs::default());
    }

    #[test]
    fn torchrun_flags_parse_and_user_flags_pass_through() {
        let cli = Cli::try_parse_from([
            "prog",
            "--nproc-per-node",
            "auto",
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--master-addr",
            "10.0.0.1",
            "--master-port",
            "29500",
            "--max-restarts",
            "3",
            "--log-dir",
            "/tmp/logs",
            "--grace-period",
            "0.5",
            "--epochs",
            "7",
        ])
        .expect("parses");
        let a = cli.launch;
        assert_eq!(a.nproc_per_node, Some(NprocPerNode::Auto));
        assert_eq!(
            (a.nnodes, a.node_rank),
            (Some(NodeCount::fixed(2)), Some(1))
        );
        assert_eq!(a.master_addr.as_deref(), Some("10.0.0.1"));
        assert_eq!(a.master_port, Some(29500));
        assert_eq!(a.max_restarts, 3);
        assert_eq!(a.log_dir, Some(PathBuf::from("/tmp/logs")));
        assert_eq!(a.grace_period, Duration::from_millis(500));
        assert_eq!(cli.epochs, Some(7));
        assert!(a.is_explicit());
    }

    #[test]
    fn bad_values_are_rejected_by_the_parser_with_the_value() {
        let e = parse(&["--nproc-per-node", "two"]).unwrap_err().to_string();
        assert!(
            e.contains("expected a number of processes or 'auto', got 'two'"),
            "{e}"
        );
        let e = parse(&["--grace-period=-1"]).unwrap_err().to_string();
        assert!(
            e.contains("non-negative number of seconds, got '-1'"),
            "{e}"
        );
        let e = parse(&["--master-port", "70000"]).unwrap_err().to_string();
        assert!(e.contains("70000"), "{e}");
    }

    #[test]
    fn flattening_does_not_touch_the_programs_about_or_its_flags_heading() {
        use clap::CommandFactory;
        /// My trainer.
        #[derive(Parser)]
        struct Documented {
            #[command(flatten)]
            launch: LaunchArgs,
            /// Own flag after the flattened ones.
            #[arg(long)]
            epochs: Option<u32>,
        }
        let cmd = Documented::command();
        assert_eq!(
            cmd.get_about().map(|a| a.to_string()).as_deref(),
            Some("My trainer")
        );
        let heading = |id: &str| {
            cmd.get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_help_heading())
        };
        assert_eq!(heading("epochs"), None);
        assert_eq!(heading("nproc_per_node"), Some(HEADING));
        // Without a doc comment of its own, the program has no about (not ours).
        assert!(Cli::command().get_about().is_none());
    }

    #[test]
    fn zero_processes_parses_so_the_plan_can_reject_it_clearly() {
        assert_eq!(
            parse(&["--nproc-per-node", "0"])
                .expect("parses")
                .nproc_per_node,
            Some(NprocPerNode::Count(0))
        );
    }

    #[test]
    fn builder_sets_the_same_fields_as_flags() {
        let built = LaunchArgs::new()
            .with_nproc_per_node(NprocPerNode::Count(4))
            .with_nodes(2, 1)
            .with_master_addr("h")
            .with_master_port(1234)
            .with_max_restarts(2);
        assert_eq!(built.nproc_per_node, Some(NprocPerNode::Count(4)));
        assert_eq!(
            (built.nnodes, built.node_rank),
            (Some(NodeCount::fixed(2)), Some(1))
        );
        let elastic = LaunchArgs::new()
            .with_elastic_nodes(2, 3, "h:29400")
            .with_rdzv_backend(RdzvBackend::C10d)
            .with_rdzv_id("job7")
            .with_rdzv_last_call(Duration::from_secs(1))
            .with_rdzv_heartbeat_timeout(Duration::from_secs(3));
        let parsed = parse(&[
            "--nnodes",
            "2:3",
            "--rdzv-endpoint",
            "h:29400",
            "--rdzv-backend",
            "c10d",
            "--rdzv-id",
            "job7",
            "--rdzv-last-call",
            "1",
            "--rdzv-heartbeat-timeout",
            "3",
        ])
        .expect("parses");
        assert_eq!(elastic, parsed);
        assert_eq!(built.master_port, Some(1234));
        assert_eq!(built.max_restarts, 2);
        assert!(!LaunchArgs::new().is_explicit());
    }

    /// Every duration flag takes up to [`MAX_DURATION`] and refuses more (which would panic in
    /// `Instant::now() + d`), naming the limit; no value panics the parser.
    #[test]
    fn duration_flags_refuse_values_beyond_a_year() {
        let max = MAX_DURATION.as_secs().to_string();
        let over = (MAX_DURATION.as_secs() + 1).to_string();
        for flag in [
            "--grace-period",
            "--join-timeout",
            "--rdzv-last-call",
            "--rdzv-heartbeat-timeout",
        ] {
            let arg = |value: &str| format!("{flag}={value}");
            let a = parse(&[&arg(&max)]).unwrap_or_else(|e| panic!("{flag} {max}: {e}"));
            assert_eq!(
                [
                    a.grace_period,
                    a.join_timeout,
                    a.rdzv_last_call,
                    a.rdzv_heartbeat_timeout
                ]
                .iter()
                .filter(|d| **d == MAX_DURATION)
                .count(),
                1,
                "{flag}"
            );
            for value in [over.as_str(), "1e19", "1e300", "inf"] {
                let err = parse(&[&arg(value)]).expect_err(value).to_string();
                assert!(
                    err.contains("is longer than the maximum of 31536000 s (365 days)"),
                    "{flag} {value}: {err}"
                );
            }
            for value in ["-1", "NaN", "-inf"] {
                let err = parse(&[&arg(value)]).expect_err(value).to_string();
                assert!(
                    err.contains("non-negative number of seconds"),
                    "{flag} {value}: {err}"
                );
            }
        }
    }
}
