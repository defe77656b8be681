//! The job environment's shared pieces: [`WorkerEnv`] (what a launcher told this process),
//! the variable reader every dialect uses, and the defaults they share. The dialects
//! (`torchrun.rs`, `slurm.rs`, `open_mpi.rs`) build on these; `mod.rs` chooses among them.

use crate::error::LaunchError;
use crate::worker::env::launcher_vars::RESTART_COUNT_ENV;
use ddp_comm::{MAX_TIMEOUT, TIMEOUT_ENV, TOKEN_ENV};
use std::num::{IntErrorKind, ParseIntError};
use std::time::Duration;

/// The unsigned integer types the variables hold, with their maximum for error messages.
pub(super) trait Unsigned: std::str::FromStr<Err = ParseIntError> {
    const MAX: u64;
}

macro_rules! unsigned {
    ($($t:ty),*) => {$(impl Unsigned for $t { const MAX: u64 = <$t>::MAX as u64; })*};
}
unsigned!(u16, u32, u64, usize);

/// The port used when a launcher set no `MASTER_PORT` (torch's default).
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// Which launcher started this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LauncherKind {
    /// `ddp-run` or [`launch`](crate::launch) (`DDP_LAUNCH_WORKER=1`).
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
pub(super) struct Vars<'a>(pub(super) &'a dyn Fn(&str) -> Option<String>);

impl Vars<'_> {
    pub(super) fn get(&self, key: &str) -> Option<String> {
        (self.0)(key)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    pub(super) fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub(super) fn first(&self, keys: &[&str]) -> Option<(String, String)> {
        keys.iter()
            .find_map(|k| self.get(k).map(|v| (k.to_string(), v)))
    }

    pub(super) fn number<T: Unsigned>(&self, key: &str) -> Result<Option<T>, LaunchError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|e: ParseIntError| {
                let reason = match e.kind() {
                    IntErrorKind::PosOverflow => {
                        format!("'{v}' is out of range (at most {})", T::MAX)
                    }
                    _ => format!("'{v}' is not a non-negative integer"),
                };
                LaunchError::worker_env(key, reason)
            }),
        }
    }

    pub(super) fn required<T: Unsigned>(
        &self,
        key: &str,
        launcher: &str,
    ) -> Result<T, LaunchError> {
        self.number(key)?.ok_or_else(|| {
            LaunchError::worker_env(
                key,
                format!("is not set, but {launcher} sets it for every worker"),
            )
        })
    }

    pub(super) fn port(&self) -> Result<Option<u16>, LaunchError> {
        match self.number::<u16>("MASTER_PORT")? {
            Some(0) => Err(LaunchError::worker_env(
                "MASTER_PORT",
                "port 0 is not allowed",
            )),
            p => Ok(p),
        }
    }

    pub(super) fn common(&self) -> Result<(Option<String>, Option<Duration>, u32), LaunchError> {
        let token = self.get(TOKEN_ENV);
        let timeout = match self.get(TIMEOUT_ENV) {
            None => None,
            Some(v) => Some(timeout_secs(&v)?),
        };
        let restarts = match self.number::<u32>(RESTART_COUNT_ENV)? {
            Some(n) => n,
            None => self
                .number::<u32>("TORCHELASTIC_RESTART_COUNT")?
                .unwrap_or(0),
        };
        Ok((token, timeout, restarts))
    }
}

/// `DDP_TIMEOUT_SECS`'s value: whole seconds in `1..=MAX_TIMEOUT`, as ddp-comm accepts.
fn timeout_secs(v: &str) -> Result<Duration, LaunchError> {
    let max = MAX_TIMEOUT.as_secs();
    let reason = match v.parse::<u64>() {
        Ok(s) if (1..=max).contains(&s) => return Ok(Duration::from_secs(s)),
        Err(e) if *e.kind() != IntErrorKind::PosOverflow => {
            format!("'{v}' is not a whole number of seconds (1..={max})")
        }
        _ => format!("'{v}' is out of range: a timeout is 1..={max} seconds (365 days)"),
    };
    Err(LaunchError::worker_env(TIMEOUT_ENV, reason))
}

/// `MASTER_ADDR`, defaulting to loopback when every rank is on this node.
pub(super) fn master_addr(
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

/// Where derived ports fall: below Linux's ephemeral range (32768..61000 by default), from which
/// the kernel hands out the ports of outgoing connections and of other programs' listeners, so
/// such a socket cannot already hold the port a job derives.
pub(crate) const DERIVED_PORTS: std::ops::Range<u16> = 10_000..32_000;

pub(super) fn derived_port(spread: u64) -> u16 {
    let width = u64::from(DERIVED_PORTS.end - DERIVED_PORTS.start);
    DERIVED_PORTS.start + (spread % width) as u16
}
