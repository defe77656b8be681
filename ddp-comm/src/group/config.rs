//! [`ProcessGroupConfig`]: who this process is in the job, and the group's settings.

use crate::auth::{check_token, redacted_token};
use crate::deadline::{check_timeout, parse_timeout_secs};
use crate::error::{CommError, Result};
use crate::setters::setters;
use crate::store::{DEFAULT_TIMEOUT, StoreConfig};
use crate::transport::{TRANSPORT_ENV, TransportKind};
use std::net::IpAddr;
use std::time::Duration;

/// Environment variable holding the job token (set by the launcher).
pub const TOKEN_ENV: &str = "DDP_JOB_TOKEN";
/// Environment variable overriding the timeout, in seconds.
pub const TIMEOUT_ENV: &str = "DDP_TIMEOUT_SECS";

/// This process's place in the job and the group's settings, in burn's config style:
///
/// ```
/// use ddp_comm::ProcessGroupConfig;
/// use std::time::Duration;
/// let config = ProcessGroupConfig::new(1, 4).with_timeout(Duration::from_secs(60));
/// assert_eq!(config.local_rank, 1);
/// ```
#[derive(Clone)]
pub struct ProcessGroupConfig {
    /// Global rank of this process, in `0..world_size`.
    pub rank: usize,
    /// Number of processes in the job.
    pub world_size: usize,
    /// Rank among the processes on this host (selects the device). Defaults to `rank`.
    pub local_rank: usize,
    /// Number of processes on this host. Defaults to `world_size`.
    pub local_world_size: usize,
    /// Deadline for rendezvous and for each collective. Defaults to 300 s; at most
    /// [`MAX_TIMEOUT`](crate::MAX_TIMEOUT).
    pub timeout: Duration,
    /// Shared job token that every connection must present. Defaults to none, which is allowed
    /// only while the store and the ranks listen on loopback: a group reachable from the
    /// network refuses to form without one (see [`ProcessGroupConfig::require_token_if_exposed`]).
    /// At most [`MAX_TOKEN_BYTES`](crate::MAX_TOKEN_BYTES).
    pub token: Vec<u8>,
    /// Socket send/receive buffer size to request; `None` keeps the kernel's auto-tuning.
    pub socket_buffer_bytes: Option<usize>,
    /// Transport between ranks on the same host; `None` reads `DDP_TRANSPORT` when the group
    /// connects (default [`TransportKind::Auto`]: shared memory where possible).
    pub transport: Option<TransportKind>,
    /// Overrides the detected host identity (hostname, boot id, network and pid namespaces):
    /// ranks with equal ids use shared memory with each other. They must really share
    /// `/dev/shm` and a pid namespace. `None` detects it.
    pub host_id: Option<String>,
    /// Bytes of each rank's staging buffers in shared memory (three per rank; larger tensors
    /// stream through them). `None`: `DDP_SHM_BUFFER_BYTES`, else 512 KiB. The value of the
    /// lowest rank on each host is used there.
    pub shm_buffer_bytes: Option<usize>,
}

impl std::fmt::Debug for ProcessGroupConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroupConfig")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("local_rank", &self.local_rank)
            .field("local_world_size", &self.local_world_size)
            .field("timeout", &self.timeout)
            .field("token", &redacted_token(&self.token))
            .field("socket_buffer_bytes", &self.socket_buffer_bytes)
            .field("transport", &self.transport)
            .field("host_id", &self.host_id)
            .field("shm_buffer_bytes", &self.shm_buffer_bytes)
            .finish()
    }
}

impl ProcessGroupConfig {
    /// A config for global `rank` of `world_size`, on a single host.
    pub fn new(rank: usize, world_size: usize) -> Self {
        ProcessGroupConfig {
            rank,
            world_size,
            local_rank: rank,
            local_world_size: world_size,
            timeout: DEFAULT_TIMEOUT,
            token: Vec::new(),
            socket_buffer_bytes: None,
            transport: None,
            host_id: None,
            shm_buffer_bytes: None,
        }
    }

    /// Reads `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `DDP_JOB_TOKEN`,
    /// `DDP_TIMEOUT_SECS` and `DDP_TRANSPORT`, as set by `ddp-run` or torchrun.
    ///
    /// # Errors
    /// [`CommError::InvalidConfig`] naming the variable when one is missing or unparsable, or
    /// when the values contradict each other.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(crate::env::env_var)
    }

    /// [`ProcessGroupConfig::from_env`] over any source of variables (a pure function, so it
    /// can be tested without touching the process environment).
    fn from_vars(var: impl Fn(&str) -> Result<Option<String>>) -> Result<Self> {
        let usize_var = |name: &str| -> Result<Option<usize>> {
            var(name)?
                .map(|v| {
                    v.trim().parse::<usize>().map_err(|e| {
                        CommError::config(name, crate::env::not_a_count(&v, usize::MAX, &e))
                    })
                })
                .transpose()
        };
        let rank = usize_var("RANK")?.ok_or_else(|| missing("RANK"))?;
        let world_size = usize_var("WORLD_SIZE")?.ok_or_else(|| missing("WORLD_SIZE"))?;
        let mut c = ProcessGroupConfig::new(rank, world_size);
        if let Some(lr) = usize_var("LOCAL_RANK")? {
            c.local_rank = lr;
        }
        if let Some(lws) = usize_var("LOCAL_WORLD_SIZE")? {
            c.local_world_size = lws;
        }
        if let Some(t) = var(TIMEOUT_ENV)? {
            c.timeout = parse_timeout_secs(TIMEOUT_ENV, &t)?;
        }
        if let Some(token) = var(TOKEN_ENV)? {
            c.token = token.into_bytes();
        }
        c.transport = Some(match var(TRANSPORT_ENV)? {
            Some(v) if !v.trim().is_empty() => v.parse()?,
            _ => TransportKind::Auto,
        });
        c.validate()?;
        Ok(c)
    }

    /// Sets this process's rank on its host and the number of processes there.
    pub fn with_local(mut self, local_rank: usize, local_world_size: usize) -> Self {
        self.local_rank = local_rank;
        self.local_world_size = local_world_size;
        self
    }
    setters! {
        /// Sets the rendezvous and collective timeout.
        pub fn with_timeout(timeout: Duration) => timeout;
        /// Sets the job token.
        pub fn with_token(token: impl AsRef<[u8]>) => token = token.as_ref().to_vec();
        /// Requests socket buffers of this size (both directions).
        pub fn with_socket_buffer_bytes(bytes: usize) => socket_buffer_bytes = Some(bytes);
        /// Chooses the transport between ranks on the same host (overrides `DDP_TRANSPORT`).
        pub fn with_transport(transport: TransportKind) => transport = Some(transport);
        /// Overrides the host identity that decides which ranks share memory (see
        /// [`ProcessGroupConfig::host_id`]).
        pub fn with_host_id(host_id: impl Into<String>) => host_id = Some(host_id.into());
        /// Sets the size of each rank's shared-memory staging buffers (see
        /// [`ProcessGroupConfig::shm_buffer_bytes`]).
        pub fn with_shm_buffer_bytes(bytes: usize) => shm_buffer_bytes = Some(bytes);
    }

    /// The transport this config asks for: [`ProcessGroupConfig::transport`], else
    /// `DDP_TRANSPORT`, else [`TransportKind::Auto`].
    ///
    /// # Errors
    /// [`CommError::InvalidConfig`] when `DDP_TRANSPORT` is not `auto`, `tcp` or `shm`.
    pub fn resolved_transport(&self) -> Result<TransportKind> {
        match self.transport {
            Some(t) => Ok(t),
            None => TransportKind::from_env(),
        }
    }

    /// Checks that the ranks and sizes are consistent.
    ///
    /// # Errors
    /// [`CommError::InvalidConfig`] saying which value is wrong.
    pub fn validate(&self) -> Result<()> {
        if self.world_size == 0 {
            return Err(CommError::config("WORLD_SIZE", "must be at least 1, got 0"));
        }
        CommError::check_rank("RANK", self.rank, self.world_size)?;
        if self.local_world_size == 0 || self.local_world_size > self.world_size {
            return Err(CommError::config(
                "LOCAL_WORLD_SIZE",
                format!(
                    "must be in 1..={} (WORLD_SIZE), got {}",
                    self.world_size, self.local_world_size
                ),
            ));
        }
        if self.local_rank >= self.local_world_size {
            return Err(CommError::config(
                "LOCAL_RANK",
                format!(
                    "local rank {} is outside 0..{} (LOCAL_WORLD_SIZE)",
                    self.local_rank, self.local_world_size
                ),
            ));
        }
        check_timeout("timeout", self.timeout)?;
        check_token(TOKEN_ENV, &self.token)
    }

    /// Refuses to listen on `ip` without a job token unless `ip` is loopback.
    ///
    /// An empty token is an HMAC key anyone can use, so a store or rank listening where other
    /// hosts can reach it would admit anyone: they could read rank addresses, claim ranks and
    /// inject gradients. Loopback keeps a single-host job off the network; a wildcard address
    /// (`0.0.0.0`, `::`) counts as exposed.
    ///
    /// # Errors
    /// [`CommError::InvalidConfig`] for `DDP_JOB_TOKEN`, naming what would listen where and how
    /// to set a token.
    pub fn require_token_if_exposed(&self, listener: &str, ip: IpAddr) -> Result<()> {
        if !self.token.is_empty() || ip.is_loopback() {
            return Ok(());
        }
        Err(CommError::config(
            TOKEN_ENV,
            format!(
                "is not set, but {listener} would listen on {ip}, which other hosts can reach: \
                 without a secret anyone on the network could join this job. Set the same secret \
                 on every rank (`export {TOKEN_ENV}=$(openssl rand -hex 16)` before launching, or \
                 ProcessGroupConfig::with_token), or, for a job on one host, use \
                 MASTER_ADDR=127.0.0.1"
            ),
        ))
    }

    pub(crate) fn store_config(&self) -> StoreConfig {
        StoreConfig::new()
            .with_timeout(self.timeout)
            .with_token(&self.token)
    }
}

fn missing(name: &str) -> CommError {
    CommError::config(
        name,
        "environment variable is not set (launch with ddp-run, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_outside_world_is_rejected_with_both_values() {
        let err = ProcessGroupConfig::new(4, 4)
            .validate()
            .unwrap_err()
            .to_string();
        assert_eq!(err, "RANK: rank 4 is outside 0..4 (the world size is 4)");
    }

    #[test]
    fn world_size_zero_is_rejected() {
        let err = ProcessGroupConfig::new(0, 0)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("WORLD_SIZE: must be at least 1"), "{err}");
    }

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Result<Option<String>> + use<> {
        let map: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| Ok(map.get(name).cloned())
    }

    #[test]
    fn huge_timeout_is_a_config_error_not_a_panic() {
        for secs in ["9223372036854775808", "18446744073709551615", "31536001"] {
            let env = vars(&[("RANK", "0"), ("WORLD_SIZE", "1"), (TIMEOUT_ENV, secs)]);
            let e = ProcessGroupConfig::from_vars(env)
                .expect_err(secs)
                .to_string();
            assert!(e.starts_with("DDP_TIMEOUT_SECS: "), "{e}");
        }
        let e = ProcessGroupConfig::new(0, 1)
            .with_timeout(Duration::MAX)
            .validate()
            .expect_err("Duration::MAX")
            .to_string();
        assert!(e.contains("maximum"), "{e}");
        let env = vars(&[("RANK", "1"), ("WORLD_SIZE", "2"), (TIMEOUT_ENV, "60")]);
        let c = ProcessGroupConfig::from_vars(env).expect("valid");
        assert_eq!(c.timeout, Duration::from_secs(60));
        assert_eq!(c.transport, Some(TransportKind::Auto));
    }

    #[test]
    fn no_token_is_refused_off_loopback_and_allowed_on_it() {
        let open = ProcessGroupConfig::new(0, 2);
        for ip in ["127.0.0.1", "::1"] {
            let ip: IpAddr = ip.parse().expect("ip");
            open.require_token_if_exposed("the store", ip)
                .expect("loopback needs no token");
        }
        for ip in ["10.1.2.3", "0.0.0.0", "::", "fe80::1"] {
            let ip: IpAddr = ip.parse().expect("ip");
            let e = open
                .require_token_if_exposed("the store", ip)
                .expect_err("exposed without a token")
                .to_string();
            assert!(
                e.starts_with("DDP_JOB_TOKEN: is not set, but the store would listen on"),
                "{e}"
            );
            assert!(e.contains("openssl rand"), "{e}");
            ProcessGroupConfig::new(0, 2)
                .with_token("secret")
                .require_token_if_exposed("the store", ip)
                .expect("a token makes an exposed listener fine");
        }
    }

    #[test]
    fn a_token_over_the_shared_limit_is_a_config_error() {
        let long = vec![b'x'; crate::MAX_TOKEN_BYTES + 1];
        let e = ProcessGroupConfig::new(0, 1)
            .with_token(&long)
            .validate()
            .expect_err("too long")
            .to_string();
        assert!(e.starts_with("DDP_JOB_TOKEN: "), "{e}");
    }

    #[test]
    fn local_rank_must_fit_local_world() {
        let err = ProcessGroupConfig::new(3, 4)
            .with_local(2, 2)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("LOCAL_RANK"), "{err}");
    }

    mod properties {
        use super::super::*;
        use crate::proptest_support::config;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(config())]

            /// Any environment is a valid config or an error naming a variable; never a panic.
            #[test]
            fn any_environment_reads_safely(
                rank in "\\PC{0,22}",
                world in "\\PC{0,22}",
                timeout in "\\PC{0,22}",
                transport in "\\PC{0,8}",
            ) {
                let env = super::vars(&[
                    ("RANK", &rank),
                    ("WORLD_SIZE", &world),
                    (TIMEOUT_ENV, &timeout),
                    (TRANSPORT_ENV, &transport),
                ]);
                if let Ok(c) = ProcessGroupConfig::from_vars(env) {
                    prop_assert!(c.validate().is_ok());
                }
            }
        }
    }
}
