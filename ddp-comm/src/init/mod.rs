//! Joining a job: [`init_process_group`] and the ways ranks find the store.
//!
//! - `env://`: `MASTER_ADDR` and `MASTER_PORT` from the environment (what `ddp-run` and
//!   torchrun set); rank 0 hosts the store on `MASTER_PORT`, listening on `MASTER_ADDR`'s
//!   interface only (loopback for a single-host job; see `bind`).
//! - `tcp://host:port`: the same with an explicit address.
//! - `file:///path`: rank 0 hosts the store on a free port and writes its address to the file;
//!   the others read it from there (the file must be on a filesystem every rank sees). Rank 0
//!   removes the file once everyone has joined.

mod bind;
mod file;
mod host_port;

pub use self::host_port::host_port;
use crate::error::{CommError, Result};
use crate::group::{HostedStore, ProcessGroup, ProcessGroupConfig};
use crate::store::Store;
use std::path::PathBuf;

/// Where the ranks meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitMethod {
    /// `MASTER_ADDR` and `MASTER_PORT` from the environment.
    Env,
    /// An explicit store address.
    Tcp {
        /// Host name or IP address of rank 0.
        host: String,
        /// Port of the store on rank 0.
        port: u16,
    },
    /// A file on a shared filesystem through which rank 0 publishes the store's address.
    File(PathBuf),
}

impl InitMethod {
    /// Parses `env://`, `tcp://host:port` or `file:///path`.
    ///
    /// # Errors
    /// [`CommError::InvalidConfig`] saying what is wrong with the URL.
    pub fn parse(url: &str) -> Result<InitMethod> {
        let bad = |reason: &str| CommError::config("init method", format!("'{url}': {reason}"));
        if url == "env://" || url == "env" {
            return Ok(InitMethod::Env);
        }
        if let Some(rest) = url.strip_prefix("tcp://") {
            let (host, port) = split_host_port(rest).map_err(|r| bad(&r))?;
            return Ok(InitMethod::Tcp { host, port });
        }
        if let Some(path) = url.strip_prefix("file://") {
            if path.is_empty() {
                return Err(bad("the file path is empty"));
            }
            return Ok(InitMethod::File(PathBuf::from(path)));
        }
        Err(bad("expected env://, tcp://host:port or file:///path"))
    }

    /// Reads `MASTER_ADDR` and `MASTER_PORT` into a [`InitMethod::Tcp`].
    pub fn from_env() -> Result<InitMethod> {
        let host = crate::env::env_var("MASTER_ADDR")?.ok_or_else(|| {
            CommError::config(
                "MASTER_ADDR",
                "environment variable is not set (the address of rank 0's host)",
            )
        })?;
        if host.trim().is_empty() {
            return Err(CommError::config("MASTER_ADDR", "is empty"));
        }
        let port = crate::env::env_var("MASTER_PORT")?.ok_or_else(|| {
            CommError::config(
                "MASTER_PORT",
                "environment variable is not set (a free TCP port on rank 0's host)",
            )
        })?;
        let port = parse_port(&port).map_err(|r| CommError::config("MASTER_PORT", r))?;
        Ok(InitMethod::Tcp {
            host: host.trim().to_string(),
            port,
        })
    }
}

fn parse_port(text: &str) -> Result<u16, String> {
    match text.trim().parse::<u16>() {
        Ok(0) => Err("port 0 is not allowed here: every rank must know the port in advance".into()),
        Ok(p) => Ok(p),
        Err(_) => Err(format!("'{text}' is not a port number (1..=65535)")),
    }
}

fn split_host_port(s: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest.split_once("]:").ok_or("expected [ipv6]:port")?;
        (h, p)
    } else {
        s.rsplit_once(':').ok_or("expected host:port")?
    };
    if host.is_empty() {
        return Err("the host is empty".into());
    }
    Ok((host.to_string(), parse_port(port)?))
}

/// Joins the job: rank 0 hosts the store, every rank connects to it and to every other rank.
///
/// # Collective
/// Every rank of the job calls it with the same `world_size` and method.
///
/// # Errors
/// An invalid config (rank outside `0..world_size`, world size 0), a port already in use on
/// rank 0, a store that cannot be reached within the timeout, a rejected token, or ranks that
/// never arrive; each error says which.
///
/// ```no_run
/// use ddp_comm::{InitMethod, ProcessGroupConfig, ReduceOp, init_process_group};
/// let pg = init_process_group(&InitMethod::from_env()?, ProcessGroupConfig::from_env()?)?;
/// let mut grads = vec![1.0f32; 1024];
/// pg.all_reduce(&mut grads, ReduceOp::Avg)?;
/// # Ok::<(), ddp_comm::CommError>(())
/// ```
pub fn init_process_group(method: &InitMethod, config: ProcessGroupConfig) -> Result<ProcessGroup> {
    config.validate()?;
    let method = match method {
        InitMethod::Env => InitMethod::from_env()?,
        other => other.clone(),
    };
    let _span = tracing::info_span!(
        "init_process_group",
        rank = config.rank,
        world_size = config.world_size
    )
    .entered();
    match method {
        InitMethod::Env => unreachable!("resolved above"),
        InitMethod::Tcp { host, port } => {
            // Before waiting for the store: a rank that would listen on the network without a
            // secret says so at once instead of timing out on a store that refused to start.
            if let Some(ip) = exposed_ip(&host, port) {
                config.require_token_if_exposed(&format!("rank {}", config.rank), ip)?;
            }
            let server = if config.rank == 0 {
                let server = bind::bind_store(&host, port, config.store_config())?;
                config.require_token_if_exposed("the store", server.local_addr().ip())?;
                Some(server)
            } else {
                None
            };
            let addr = host_port(&host, port);
            let store = Store::connect(&addr, config.store_config())?;
            let hosted = server.map(|server| HostedStore::new(server, config.timeout));
            ProcessGroup::world(store, config, hosted)
        }
        InitMethod::File(path) => file::init(&path, config),
    }
}

/// A non-loopback address `host` stands for, if any: ranks reach the store there and listen on
/// the interface they reach it through. `None` when it is loopback only or does not resolve (the
/// connection then fails with its own error).
fn exposed_ip(host: &str, port: u16) -> Option<std::net::IpAddr> {
    use std::net::ToSocketAddrs;
    (host, port)
        .to_socket_addrs()
        .ok()?
        .map(|a| a.ip())
        .find(|ip| !ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_addresses_off_loopback_count_as_exposed() {
        assert_eq!(exposed_ip("127.0.0.1", 1), None);
        assert_eq!(exposed_ip("::1", 1), None);
        assert_eq!(
            exposed_ip("localhost", 1).filter(|ip| !ip.is_loopback()),
            None
        );
        assert_eq!(
            exposed_ip("10.1.2.3", 1),
            Some("10.1.2.3".parse().expect("ip"))
        );
    }

    #[test]
    fn a_rank_that_would_listen_off_loopback_without_a_token_fails_before_connecting() {
        let method = InitMethod::Tcp {
            host: "10.255.255.1".into(),
            port: 29_999,
        };
        // Were it to connect first, it would fail only after the timeout, with another error.
        let config = ProcessGroupConfig::new(1, 2).with_timeout(std::time::Duration::from_secs(30));
        let e = init_process_group(&method, config)
            .expect_err("no token")
            .to_string();
        assert!(
            e.starts_with("DDP_JOB_TOKEN: is not set, but rank 1 would listen on 10.255.255.1"),
            "{e}"
        );
    }

    #[test]
    fn parses_each_method() {
        assert_eq!(InitMethod::parse("env://").unwrap(), InitMethod::Env);
        assert_eq!(
            InitMethod::parse("tcp://10.0.0.1:29500").unwrap(),
            InitMethod::Tcp {
                host: "10.0.0.1".into(),
                port: 29500
            }
        );
        assert_eq!(
            InitMethod::parse("tcp://[::1]:80").unwrap(),
            InitMethod::Tcp {
                host: "::1".into(),
                port: 80
            }
        );
        assert_eq!(
            InitMethod::parse("file:///tmp/rdzv").unwrap(),
            InitMethod::File("/tmp/rdzv".into())
        );
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        let e = InitMethod::parse("tcp://host:notaport")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'notaport' is not a port number"), "{e}");
        let e = InitMethod::parse("tcp://host").unwrap_err().to_string();
        assert!(e.contains("expected host:port"), "{e}");
        let e = InitMethod::parse("udp://x:1").unwrap_err().to_string();
        assert!(e.contains("expected env://"), "{e}");
        let e = InitMethod::parse("tcp://h:0").unwrap_err().to_string();
        assert!(e.contains("port 0"), "{e}");
    }

    mod properties {
        use super::super::*;
        use crate::proptest_support::config;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(config())]

            /// Any text is a method or a config error; never a panic (multi-byte characters,
            /// brackets and colons anywhere included).
            #[test]
            fn any_url_parses_safely(url in "(env|tcp|file|udp)?(://)?\\PC{0,24}") {
                let _ = InitMethod::parse(&url);
            }

            #[test]
            fn tcp_urls_round_trip(host in "[a-z0-9.]{1,20}", port in 1u16..) {
                prop_assert_eq!(
                    InitMethod::parse(&format!("tcp://{host}:{port}")).ok(),
                    Some(InitMethod::Tcp { host: host.clone(), port })
                );
                prop_assert_eq!(
                    InitMethod::parse(&format!("tcp://[{host}]:{port}")).ok(),
                    Some(InitMethod::Tcp { host, port })
                );
            }
        }
    }
}
