//! [`ElasticSettings`]: the elastic rendezvous flags, validated.

use crate::error::LaunchError;
use crate::plan::args::LaunchArgs;
use crate::plan::node_count::{NodeCount, RdzvBackend};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// Job id used when `--rdzv-id` is not given (torchrun's default too).
const DEFAULT_JOB_ID: &str = "none";
/// The shortest heartbeat timeout accepted: heartbeats go out five times per timeout, and a
/// busy node must still get one through.
const MIN_HEARTBEAT_TIMEOUT: Duration = Duration::from_millis(500);

/// `HOST:PORT` of the rendezvous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub(crate) host: String,
    pub(crate) port: u16,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&ddp_comm::host_port(&self.host, self.port))
    }
}

impl Endpoint {
    /// The first address the host resolves to. Every node takes the first: hosting on one of
    /// several addresses and connecting to another would split the job. `Err`: why not.
    pub(crate) fn resolve(&self) -> Result<SocketAddr, String> {
        self.resolve_all()?
            .into_iter()
            .next()
            .ok_or_else(|| "the host resolves to no address".to_string())
    }

    /// Every address the host resolves to, in the resolver's order.
    pub(crate) fn resolve_all(&self) -> Result<Vec<SocketAddr>, String> {
        Ok((self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve the host: {e}"))?
            .collect())
    }

    /// `host:port`, `[v6]:port`.
    fn parse(s: &str) -> Result<Endpoint, String> {
        let s = s.trim();
        let (host, port) = s
            .rsplit_once(':')
            .ok_or("expected HOST:PORT, e.g. node0:29400")?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err("the host is empty; expected HOST:PORT, e.g. node0:29400".into());
        }
        let port: u16 = port
            .parse()
            .map_err(|_| format!("'{port}' is not a port number (1..=65535)"))?;
        if port == 0 {
            return Err("port 0 is not allowed: every node must name the same port".into());
        }
        Ok(Endpoint {
            host: host.to_string(),
            port,
        })
    }
}

/// How this node takes part in an elastic job.
#[derive(Debug, Clone)]
pub(crate) struct ElasticSettings {
    pub(crate) nodes: NodeCount,
    pub(crate) backend: RdzvBackend,
    pub(crate) endpoint: Endpoint,
    pub(crate) job_id: String,
    pub(crate) last_call: Duration,
    pub(crate) heartbeat_timeout: Duration,
}

impl ElasticSettings {
    /// The error of `node_id` at this job's rendezvous endpoint, for `reason`.
    pub(crate) fn rendezvous_error(&self, node_id: &str, reason: String) -> LaunchError {
        LaunchError::ElasticRendezvous {
            node_id: node_id.to_string(),
            endpoint: self.endpoint.to_string(),
            reason,
        }
    }

    /// The rendezvous of a job of `nodes` nodes: `None` for the static one (the default for a
    /// fixed node count, which cannot run `--nnodes MIN:MAX`), or the validated settings of a
    /// round-based one (the default for `--nnodes MIN:MAX`).
    pub(crate) fn for_nodes(
        args: &LaunchArgs,
        nodes: NodeCount,
    ) -> Result<Option<ElasticSettings>, LaunchError> {
        let default_backend = if nodes.is_elastic() {
            RdzvBackend::C10d
        } else {
            RdzvBackend::Static
        };
        match args.rdzv_backend.unwrap_or(default_backend) {
            RdzvBackend::Static if nodes.is_elastic() => Err(LaunchError::ElasticNeedsRounds {
                nnodes: nodes.to_string(),
            }),
            RdzvBackend::Static => {
                if let Some(endpoint) = &args.rdzv_endpoint {
                    return Err(LaunchError::RdzvConflict {
                        flag: format!("--rdzv-endpoint {endpoint}"),
                        backend: "static".into(),
                        why: "the static rendezvous is on --master-addr:--master-port; --rdzv-endpoint is for --rdzv-backend c10d".into(),
                    });
                }
                Ok(None)
            }
            backend => ElasticSettings::validate(args, nodes, backend).map(Some),
        }
    }

    /// Validates the flags of a job with round-based rendezvous (`backend` is not static).
    pub(crate) fn validate(
        args: &LaunchArgs,
        nodes: NodeCount,
        backend: RdzvBackend,
    ) -> Result<ElasticSettings, LaunchError> {
        let conflict = |flag: String, why: &str| {
            Err(LaunchError::RdzvConflict {
                flag,
                backend: backend.to_string(),
                why: why.to_string(),
            })
        };
        let assigned = "the rendezvous assigns node ranks and the workers' address in each round";
        if let Some(rank) = args.node_rank {
            return conflict(format!("--node-rank {rank}"), assigned);
        }
        if let Some(addr) = &args.master_addr {
            return conflict(format!("--master-addr {addr}"), assigned);
        }
        if let Some(port) = args.master_port {
            return conflict(format!("--master-port {port}"), assigned);
        }
        if args.standalone {
            return conflict(
                "--standalone".into(),
                "--standalone is one node with no rendezvous; leave out --rdzv-backend and use --nnodes 1",
            );
        }
        if backend == RdzvBackend::Etcd && !cfg!(feature = "etcd") {
            return Err(LaunchError::RdzvBackendNotBuilt {
                backend: backend.to_string(),
            });
        }
        let Some(raw) = args.rdzv_endpoint.as_deref() else {
            return Err(LaunchError::MissingRdzvEndpoint {
                backend: backend.to_string(),
            });
        };
        let endpoint = Endpoint::parse(raw).map_err(|reason| LaunchError::InvalidRdzvSetting {
            flag: "--rdzv-endpoint",
            value: raw.to_string(),
            reason,
        })?;
        let job_id = args.rdzv_id.as_deref().unwrap_or(DEFAULT_JOB_ID).trim();
        if job_id.is_empty() || job_id.contains('/') {
            return Err(LaunchError::InvalidRdzvSetting {
                flag: "--rdzv-id",
                value: format!("'{job_id}'"),
                reason: "expected a non-empty job id without '/'".into(),
            });
        }
        if args.rdzv_heartbeat_timeout < MIN_HEARTBEAT_TIMEOUT {
            return Err(LaunchError::InvalidRdzvSetting {
                flag: "--rdzv-heartbeat-timeout",
                value: format!("{:?}", args.rdzv_heartbeat_timeout),
                reason: format!(
                    "must be at least {MIN_HEARTBEAT_TIMEOUT:?}, or live nodes would be taken for dead"
                ),
            });
        }
        Ok(ElasticSettings {
            nodes,
            backend,
            endpoint,
            job_id: job_id.to_string(),
            last_call: args.rdzv_last_call,
            heartbeat_timeout: args.rdzv_heartbeat_timeout,
        })
    }

    /// How often this node's launcher sends a heartbeat: five per timeout.
    pub(crate) fn heartbeat_interval(&self) -> Duration {
        self.heartbeat_timeout / 5
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_with_ipv6_brackets_and_reject_bad_ports() {
        assert_eq!(
            Endpoint::parse("node0:29400"),
            Ok(Endpoint {
                host: "node0".into(),
                port: 29400
            })
        );
        assert_eq!(Endpoint::parse("[::1]:5").map(|e| e.host), Ok("::1".into()));
        assert!(Endpoint::parse("node0").unwrap_err().contains("HOST:PORT"));
        assert!(
            Endpoint::parse("node0:http")
                .unwrap_err()
                .contains("'http'")
        );
        assert!(Endpoint::parse("node0:0").unwrap_err().contains("port 0"));
        assert!(
            Endpoint::parse(":80")
                .unwrap_err()
                .contains("host is empty")
        );
    }
}
