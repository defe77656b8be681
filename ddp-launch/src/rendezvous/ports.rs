//! The ports of a job: the wildcard to bind, binding with an error that names who holds a
//! taken port, and the free port the workers of an attempt get.

use crate::error::LaunchError;
use crate::plan::{LaunchPlan, MasterPort};
use std::net::TcpListener;

/// The wildcard address to bind for a job whose node 0 is `master_addr`.
pub(crate) fn bind_host(master_addr: &str) -> &'static str {
    if master_addr.contains(':') {
        "::"
    } else {
        "0.0.0.0"
    }
}

/// Binds `host:port`, reporting a taken port as [`LaunchError::PortInUse`] naming the address
/// that holds it (binding the wildcard fails when any one address does).
pub(crate) fn bind_port(host: &str, port: u16) -> Result<TcpListener, LaunchError> {
    TcpListener::bind(ddp_comm::host_port(host, port)).map_err(|source| {
        if source.kind() == std::io::ErrorKind::AddrInUse {
            let holders = match host {
                "0.0.0.0" | "::" => crate::rendezvous::port_holder::listening_addresses(port),
                _ => Vec::new(),
            };
            let host = if holders.is_empty() {
                host.to_string()
            } else {
                holders
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" and ")
            };
            LaunchError::PortInUse { host, port, source }
        } else {
            LaunchError::Bind {
                host: host.to_string(),
                port,
                source,
            }
        }
    })
}

/// A port that is free on this host right now (bound and released), other than `avoid` (the
/// previous attempt's, whose sockets may linger in the other ranks).
pub(crate) fn free_port(host: &str, avoid: Option<u16>) -> Result<u16, LaunchError> {
    let mut port = 0;
    for _ in 0..16 {
        let listener = bind_port(host, 0)?;
        port = listener
            .local_addr()
            .map(|a| a.port())
            .map_err(|source| LaunchError::Bind {
                host: host.to_string(),
                port: 0,
                source,
            })?;
        if Some(port) != avoid {
            break;
        }
    }
    Ok(port)
}

/// The workers' port for an attempt on a single node: a fresh free port (not `previous`), or
/// `--master-port` after checking that nothing listens there.
pub(crate) fn single_node_port(
    plan: &LaunchPlan,
    previous: Option<u16>,
) -> Result<u16, LaunchError> {
    let host = bind_host(&plan.master_addr);
    match plan.master_port {
        MasterPort::Auto => free_port(host, previous),
        MasterPort::Fixed(port) => bind_port(host, port).map(|_listener| port),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taken_port_is_reported_as_in_use_with_the_port() {
        let taken = TcpListener::bind("0.0.0.0:0").expect("bind");
        let port = taken.local_addr().expect("addr").port();
        let err = bind_port("0.0.0.0", port).unwrap_err();
        assert!(matches!(err, LaunchError::PortInUse { .. }), "{err:?}");
        assert!(
            err.to_string()
                .starts_with(&format!("port {port} on 0.0.0.0 is already in use")),
            "{err}"
        );
        drop(taken);
    }

    #[test]
    fn free_ports_are_bindable_and_the_wildcard_follows_the_address_family() {
        let port = free_port("0.0.0.0", None).expect("free port");
        assert_ne!(port, 0);
        assert_ne!(free_port("0.0.0.0", Some(port)).expect("free port"), port);
        assert_eq!(bind_host("fe80::1"), "::");
        assert_eq!(bind_host("node0"), "0.0.0.0");
    }
}
