//! Where rank 0's store listens: on the interface the other ranks will use to reach it.
//!
//! Every rank connects to `MASTER_ADDR`, so that is the only address the store needs. Binding
//! it (rather than every interface) keeps a single-host job (`MASTER_ADDR=127.0.0.1` or
//! `localhost`) invisible from the network. Where `MASTER_ADDR` is not an address of this
//! host (behind NAT, a container port mapping) or a name that does not pin one down, the store
//! listens on every interface as before.

use crate::error::{CommError, Result};
use crate::store::{StoreConfig, StoreServer};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, ToSocketAddrs};

/// Starts the store for a job whose ranks connect to `host:port` (`port` 0 picks a free one).
///
/// # Errors
/// [`CommError::Bind`] when the port is taken (or cannot be bound).
pub(super) fn bind_store(host: &str, port: u16, config: StoreConfig) -> Result<StoreServer> {
    let listener = bind_listener(host, port)?;
    StoreServer::from_listener(listener, config)
}

fn bind_listener(host: &str, port: u16) -> Result<TcpListener> {
    let bind = |addr: SocketAddr| {
        TcpListener::bind(addr).map_err(|source| CommError::Bind {
            addr: addr.to_string(),
            source,
        })
    };
    let Some(addr) = listen_addr(host, port) else {
        tracing::debug!(
            master_addr = host,
            "the store listens on every interface (MASTER_ADDR is a name for which this host has no \
             single address other ranks will use)"
        );
        return bind(any_of(host.contains(':'), port));
    };
    match TcpListener::bind(addr) {
        Ok(l) => Ok(l),
        Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => {
            tracing::warn!(
                master_addr = host,
                %addr,
                "MASTER_ADDR is not an address of this host; the store listens on every interface"
            );
            bind(any_of(addr.is_ipv6(), port))
        }
        Err(source) => Err(CommError::Bind {
            addr: addr.to_string(),
            source,
        }),
    }
}

/// The one address to listen on, if `host` names one: an IP address as given, `localhost` as
/// loopback, another name as what it resolves to unless that is loopback (a Debian-style
/// `127.0.1.1` entry for the hostname, while other hosts reach it through DNS).
fn listen_addr(host: &str, port: u16) -> Option<SocketAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Some(SocketAddr::new(ip, port));
    }
    let resolved: Vec<SocketAddr> = (host, port).to_socket_addrs().ok()?.collect();
    if host.eq_ignore_ascii_case("localhost") {
        return resolved.into_iter().find(|a| a.ip().is_loopback());
    }
    resolved.into_iter().find(|a| !a.ip().is_loopback())
}

/// The wildcard address of one family.
fn any_of(v6: bool, port: u16) -> SocketAddr {
    if v6 {
        SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))
    } else {
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_master_addr_binds_loopback_only() {
        for host in ["127.0.0.1", "localhost"] {
            let l = bind_listener(host, 0).expect("bind");
            let ip = l.local_addr().expect("addr").ip();
            assert!(ip.is_loopback(), "{host} bound {ip}");
        }
    }

    #[test]
    fn a_master_addr_of_another_host_falls_back_to_every_interface() {
        // Documentation addresses (RFC 5737); the first one this host does not have.
        let foreign = ["203.0.113.77", "198.51.100.77", "192.0.2.77"]
            .into_iter()
            .find(|ip| std::net::UdpSocket::bind((*ip, 0)).is_err())
            .expect("a documentation address that is not ours");
        let l = bind_listener(foreign, 0).expect("bind");
        assert!(l.local_addr().expect("addr").ip().is_unspecified());
    }
}
