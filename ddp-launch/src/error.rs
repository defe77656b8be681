//! [`LaunchError`]: everything that can stop a launch, one variant per failure.

use crate::signal_names::signal_name;
use crate::summary::FailureSummary;
use ddp_comm::{CommError, TOKEN_ENV};
use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::path::PathBuf;

/// Why a launch (as launcher or as worker) did not succeed.
///
/// Messages are lowercase, name the offending values and say what to do. [`Debug`] prints the
/// same message followed by its causes, so `fn main() -> Result<(), LaunchError>` reports
/// readably; [`LaunchError::exit_code`] gives the process exit status a launcher should use.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// `--nproc-per-node 0`.
    #[error("--nproc-per-node must be at least 1, got 0")]
    ZeroProcsPerNode,
    /// `--nproc-per-node` beyond what this host can run (see [`crate::LaunchArgs`]'s
    /// `oversubscribe`).
    #[error("--nproc-per-node {nproc_per_node} {why}")]
    TooManyWorkers {
        /// The number asked for.
        nproc_per_node: usize,
        /// Which limit it exceeds and what to do.
        why: String,
    },
    /// `--nnodes 0`.
    #[error("--nnodes must be at least 1, got 0")]
    ZeroNodes,
    /// `--node-rank` is not below `--nnodes`.
    #[error(
        "--node-rank {node_rank} is out of range for --nnodes {nnodes} (node ranks are 0..={max})",
        max = nnodes.saturating_sub(1)
    )]
    NodeRankOutOfRange {
        /// The node rank given.
        node_rank: usize,
        /// The number of nodes given.
        nnodes: usize,
    },
    /// `--nnodes` times `--nproc-per-node` does not fit in a `usize`.
    #[error("--nnodes {nnodes} times --nproc-per-node {nproc_per_node} is too many processes")]
    WorldTooLarge {
        /// The number of nodes given.
        nnodes: usize,
        /// Processes per node.
        nproc_per_node: usize,
    },
    /// A multi-node job without `--master-addr`.
    #[error(
        "--master-addr is required when --nnodes is {nnodes}: pass the address of node 0 that every node can reach"
    )]
    MissingMasterAddr {
        /// The number of nodes given.
        nnodes: usize,
    },
    /// A multi-node job without `--master-port`.
    #[error(
        "--master-port is required when --nnodes is {nnodes}: pass a free port on node 0, the same on every node"
    )]
    MissingMasterPort {
        /// The number of nodes given.
        nnodes: usize,
    },
    /// `--master-port 0`.
    #[error("--master-port 0 is not allowed: leave --master-port out to pick a free port")]
    ZeroMasterPort,
    /// `--standalone` together with a flag that contradicts it.
    #[error("--standalone runs one node on this host with a free port, but {flag} was also given")]
    StandaloneConflict {
        /// The contradicting flag and its value, e.g. `--nnodes 2`.
        flag: String,
    },
    /// A multi-node job whose nodes could not agree on a job token.
    #[error(
        "a multi-node job (--nnodes {nnodes}) needs a shared job token: set {TOKEN_ENV} to the same secret on every node, e.g. `export {TOKEN_ENV}=$(openssl rand -hex 16)`"
    )]
    MissingJobToken {
        /// The number of nodes given.
        nnodes: usize,
    },
    /// `--nnodes MIN:MAX` with MIN above MAX.
    #[error(
        "--nnodes {min}:{max} is reversed: MIN must not exceed MAX (e.g. --nnodes {max}:{min})"
    )]
    NodeRangeReversed {
        /// MIN as given.
        min: usize,
        /// MAX as given.
        max: usize,
    },
    /// An elastic node range with the static rendezvous, which cannot change the job's size.
    #[error(
        "--nnodes {nnodes} lets the job change size, which --rdzv-backend static cannot: use --rdzv-backend c10d with --rdzv-endpoint HOST:PORT"
    )]
    ElasticNeedsRounds {
        /// The range given.
        nnodes: String,
    },
    /// A flag that the elastic rendezvous decides itself, or that only another backend uses.
    #[error("{flag} cannot be used with --rdzv-backend {backend}: {why}")]
    RdzvConflict {
        /// The flag and its value.
        flag: String,
        /// The backend in use.
        backend: String,
        /// Why, and what to do instead.
        why: String,
    },
    /// `--rdzv-backend etcd` in a launcher built without the `etcd` feature.
    #[error(
        "--rdzv-backend {backend} is not built into this launcher: build ddp-launch with `--features {backend}` (or ddp-core with `--features {backend}`; the build needs protoc, e.g. apt-get install protobuf-compiler)"
    )]
    RdzvBackendNotBuilt {
        /// The backend asked for (also the feature's name).
        backend: String,
    },
    /// An elastic job without `--rdzv-endpoint`.
    #[error(
        "--rdzv-backend {backend} needs --rdzv-endpoint HOST:PORT, the same on every node (c10d: the launcher on HOST hosts the rendezvous on PORT; etcd: an etcd server's client address)"
    )]
    MissingRdzvEndpoint {
        /// The backend in use.
        backend: String,
    },
    /// An invalid elastic rendezvous setting.
    #[error("{flag} {value}: {reason}")]
    InvalidRdzvSetting {
        /// The flag.
        flag: &'static str,
        /// Its value as given.
        value: String,
        /// What is wrong and what is expected.
        reason: String,
    },
    /// A duration setting beyond 365 days ([`MAX_TIMEOUT`](ddp_comm::MAX_TIMEOUT)), set in
    /// code: the flags refuse such values when parsed.
    #[error(
        "{flag} {} s is longer than the maximum of {} s (365 days)",
        .value.as_secs_f64(),
        ddp_comm::MAX_TIMEOUT.as_secs()
    )]
    DurationTooLong {
        /// The flag.
        flag: &'static str,
        /// The duration asked for.
        value: std::time::Duration,
    },
    /// The elastic rendezvous failed (could not be reached, or the nodes disagree).
    #[error("elastic rendezvous of node {node_id} at {endpoint} failed: {reason}")]
    ElasticRendezvous {
        /// This launcher's node id (`host:pid`).
        node_id: String,
        /// `--rdzv-endpoint`.
        endpoint: String,
        /// What went wrong.
        reason: String,
    },
    /// The master port is taken on this host.
    #[error(
        "port {port} on {host} is already in use: pick another --master-port, or leave it out on a single node to get a free one"
    )]
    PortInUse {
        /// The address we tried to bind.
        host: String,
        /// The port.
        port: u16,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A port could not be bound for another reason than being in use.
    #[error("cannot listen on port {port} of {host}: {source}")]
    Bind {
        /// The address we tried to bind.
        host: String,
        /// The port (0 when picking a free one).
        port: u16,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The program to run does not exist.
    #[error("program '{program}' was not found: {reason}")]
    ProgramNotFound {
        /// The program as given.
        program: String,
        /// Where we looked.
        reason: String,
    },
    /// The program exists but cannot be executed.
    #[error("program '{program}' cannot be executed: {reason}")]
    ProgramNotExecutable {
        /// The program as given.
        program: String,
        /// Why (a directory, no execute permission, ...).
        reason: String,
    },
    /// Starting a worker failed.
    #[error("cannot start rank {rank} ('{program}'): {source}")]
    Spawn {
        /// Global rank of the worker.
        rank: usize,
        /// The program.
        program: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// [`launch`](crate::launch) could not find its own executable to start the workers from.
    #[error("cannot find this program's own executable to start the workers: {source}")]
    CurrentExe {
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The log directory or a log file could not be created.
    #[error("cannot create log file or directory {}: {source}", path.display())]
    LogDir {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The private directory for the workers' failure reports could not be created.
    #[error(
        "cannot create the directory for the workers' failure reports {}: {source} (is TMPDIR writable?)",
        path.display()
    )]
    FailureDir {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The launcher could not install its signal handlers, or another launcher runs in this process.
    #[error("cannot install the launcher's signal handlers: {reason}")]
    Signals {
        /// What went wrong.
        reason: String,
    },
    /// The multi-node rendezvous between launchers failed.
    #[error("rendezvous of node {node_rank} through {addr} failed: {reason}")]
    Rendezvous {
        /// This node's rank.
        node_rank: usize,
        /// The rendezvous store address (`--master-addr:--master-port`).
        addr: String,
        /// What went wrong.
        reason: String,
    },
    /// A worker failed and no restarts were left (the summary was printed to stderr).
    #[error("{0}")]
    WorkerFailed(Box<FailureSummary>),
    /// The launcher got SIGINT/SIGTERM/SIGHUP/SIGQUIT, forwarded it and stopped every worker.
    #[error("the launcher received {} and stopped every worker", signal_name(*signal))]
    Interrupted {
        /// The signal number.
        signal: i32,
    },
    /// An environment variable (a worker's, set by a launcher, or one the launcher reads) is
    /// invalid: not UTF-8, out of range or inconsistent.
    #[error("{var}: {reason}")]
    WorkerEnv {
        /// The environment variable.
        var: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A worker could not join the process group.
    #[error("rank {rank}: joining the process group failed: {source}")]
    ProcessGroup {
        /// Global rank of this worker.
        rank: usize,
        /// The communication error.
        #[source]
        source: CommError,
    },
    /// The training function returned an error.
    #[error("rank {rank}: training failed: {message}")]
    Training {
        /// Global rank of this worker.
        rank: usize,
        /// The error and its causes, joined by `: `.
        message: String,
        /// The error returned by the training function.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
}

impl LaunchError {
    /// The exit status a launcher process should end with: 2 for invalid flags or environment,
    /// 128 + the signal number after an interruption (like a shell), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            LaunchError::ZeroProcsPerNode
            | LaunchError::TooManyWorkers { .. }
            | LaunchError::ZeroNodes
            | LaunchError::NodeRankOutOfRange { .. }
            | LaunchError::WorldTooLarge { .. }
            | LaunchError::MissingMasterAddr { .. }
            | LaunchError::MissingMasterPort { .. }
            | LaunchError::ZeroMasterPort
            | LaunchError::StandaloneConflict { .. }
            | LaunchError::MissingJobToken { .. }
            | LaunchError::NodeRangeReversed { .. }
            | LaunchError::ElasticNeedsRounds { .. }
            | LaunchError::RdzvConflict { .. }
            | LaunchError::MissingRdzvEndpoint { .. }
            | LaunchError::RdzvBackendNotBuilt { .. }
            | LaunchError::InvalidRdzvSetting { .. }
            | LaunchError::DurationTooLong { .. }
            | LaunchError::ProgramNotFound { .. }
            | LaunchError::ProgramNotExecutable { .. }
            | LaunchError::WorkerEnv { .. }
            | LaunchError::PortInUse { .. } => 2,
            LaunchError::Interrupted { signal } => u8::try_from(128 + signal).unwrap_or(1),
            _ => 1,
        }
    }

    /// `train`'s own error in a worker of [`launch`](crate::launch), with its chain of causes.
    #[cfg(feature = "supervisor")]
    pub(crate) fn training(rank: usize, source: Box<dyn StdError + Send + Sync>) -> Self {
        let mut message = source.to_string();
        let mut cause = source.source();
        while let Some(c) = cause {
            // Many errors already print their source inline; do not repeat it.
            let text = c.to_string();
            if !message.contains(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            cause = c.source();
        }
        LaunchError::Training {
            rank,
            message,
            source,
        }
    }

    pub(crate) fn worker_env(var: &str, reason: impl Into<String>) -> Self {
        LaunchError::WorkerEnv {
            var: var.to_string(),
            reason: reason.into(),
        }
    }
}

/// Prints the same message as [`Display`](fmt::Display) (every message already includes its
/// cause), so returning a `LaunchError` from `main` reads well.
impl fmt::Debug for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_values() {
        let e = LaunchError::NodeRankOutOfRange {
            node_rank: 2,
            nnodes: 2,
        };
        assert_eq!(
            e.to_string(),
            "--node-rank 2 is out of range for --nnodes 2 (node ranks are 0..=1)"
        );
        assert_eq!(e.exit_code(), 2);
        let e = LaunchError::Interrupted { signal: 15 };
        assert_eq!(
            e.to_string(),
            "the launcher received SIGTERM and stopped every worker"
        );
        assert_eq!(e.exit_code(), 143);
    }

    #[test]
    #[cfg(feature = "supervisor")]
    fn training_error_message_carries_the_cause_chain_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("loading checkpoint")]
        struct Outer(#[source] io::Error);
        let e = LaunchError::training(3, Box::new(Outer(io::Error::other("disk full"))));
        assert_eq!(
            e.to_string(),
            "rank 3: training failed: loading checkpoint: disk full"
        );
        // A source already printed inline is not repeated.
        let inline: Box<dyn StdError + Send + Sync> = Box::new(LaunchError::LogDir {
            path: "/x".into(),
            source: io::Error::other("disk full"),
        });
        let e = LaunchError::training(0, inline);
        assert_eq!(
            e.to_string(),
            "rank 0: training failed: cannot create log file or directory /x: disk full"
        );
        assert_eq!(format!("{e:?}"), e.to_string());
    }
}
