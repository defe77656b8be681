//! The `c10d` backend: the elastic rendezvous over ddp-comm's [`Store`], hosted by the first
//! launcher on the host of `--rdzv-endpoint` to bind its port; the others connect. The host
//! binds the port on every interface (as torchrun's c10d backend does), not only on the
//! address the endpoint resolves to: on Debian and Ubuntu `/etc/hosts` maps the machine's own
//! name to 127.0.1.1, which the other hosts cannot reach.
//!
//! Heartbeats are counters: each launcher bumps `hb/<node id>` from a thread of its own, and a
//! node whose counter this launcher has not seen change for the heartbeat timeout is dead.
//! The host is a single point of failure: when its node dies, the store goes with it and the
//! other launchers stop with the error (they cannot re-form the job).

use super::backend::{BackendError, RendezvousBackend};
use crate::error::LaunchError;
use crate::plan::elastic_settings::{ElasticSettings, Endpoint};
use crate::rendezvous::store_connect::connect_with_retry;
use crate::rendezvous::{ClientsLeft, bind_host, wait_for_clients_to_leave};
use crate::signals::SignalGuard;
use ddp_comm::{CommError, Store, StoreConfig, StoreServer};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the hosting launcher keeps the store up for the others to read the outcome.
const CLOSE_WAIT: Duration = Duration::from_secs(30);
/// Each store request's own time limit: a store that does not answer in this time is lost.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The heartbeat thread and how to stop it.
struct Heartbeat {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

/// The c10d store backend of one launcher.
pub(crate) struct StoreBackend {
    store: Store,
    server: Option<StoreServer>,
    heartbeat: Option<Heartbeat>,
    /// Per node: the last heartbeat value seen and when it changed (or was first seen).
    seen: HashMap<String, (Option<Vec<u8>>, Instant)>,
    heartbeat_timeout: Duration,
    heartbeat_interval: Duration,
    advertised_host: String,
}

fn store_err(e: CommError) -> BackendError {
    BackendError(e.to_string())
}

/// Where this launcher hosts the store for the endpoint address `addr`: the wildcard address
/// of its family ([`bind_host`]) on its port when `addr` is an address of this machine
/// (loopback, or bindable here); `None` when it is another host's.
fn hosting_address(addr: SocketAddr) -> Option<SocketAddr> {
    let mut probe = addr;
    probe.set_port(0);
    let ip = addr.ip();
    let own = ip.is_loopback() || ip.is_unspecified() || TcpListener::bind(probe).is_ok();
    let wildcard: IpAddr = bind_host(&ip.to_string()).parse().ok()?;
    own.then_some(SocketAddr::new(wildcard, addr.port()))
}

/// The warning for an endpoint that resolves (`addrs`) to loopback addresses only while nodes
/// of other hosts may take part (`max_nodes` > 1): they cannot reach it through that name.
fn loopback_warning(endpoint: &Endpoint, addrs: &[SocketAddr], max_nodes: usize) -> Option<String> {
    let first = addrs.first()?;
    if max_nodes <= 1 || !addrs.iter().all(|a| a.ip().is_loopback()) {
        return None;
    }
    let loopback = first.ip();
    let fine = "(fine if every node runs on this host)";
    Some(if endpoint.host.parse::<IpAddr>().is_ok() {
        format!(
            "--rdzv-endpoint {endpoint} is a loopback address ({loopback}): nodes on other hosts cannot reach the rendezvous through it; pass an address of this host that they reach {fine}"
        )
    } else {
        format!(
            "--rdzv-endpoint {endpoint} resolves to {loopback} on this host, a loopback address: nodes on other hosts cannot reach the rendezvous (nor this node's workers) through that name; fix /etc/hosts so that {} names an address the other nodes reach (Debian and Ubuntu map the machine's own name to 127.0.1.1), or pass that address {fine}",
            endpoint.host
        )
    })
}

impl StoreBackend {
    /// Hosts the store if `--rdzv-endpoint` is an address of this host and nobody serves its
    /// port yet (on every interface, see [`hosting_address`]), then connects to it (retrying
    /// until `join_timeout`, stopping on a signal).
    ///
    /// The host's store holds its `config` (the settings every node must share) before it
    /// serves anyone: the host's settings are the job's, and a node with others is refused,
    /// never the host (whose refusal would take the store, and the job, with it).
    pub(crate) fn connect(
        settings: &ElasticSettings,
        config: &str,
        token: &str,
        join_timeout: Duration,
        node_id: &str,
        signals: &SignalGuard,
    ) -> Result<StoreBackend, LaunchError> {
        let err = |reason: String| settings.rendezvous_error(node_id, reason);
        let addr = settings.endpoint.resolve().map_err(err)?;
        if settings.nodes.max > 1 {
            let addrs = settings.endpoint.resolve_all().unwrap_or_default();
            if let Some(warning) = loopback_warning(&settings.endpoint, &addrs, settings.nodes.max)
            {
                tracing::warn!("{warning}");
            }
        }
        let store_config = StoreConfig::new()
            .with_token(token.as_bytes())
            .with_timeout(REQUEST_TIMEOUT);
        let prefix = format!("elastic/{}/", settings.job_id);
        let hosting = hosting_address(addr);
        let listener = match hosting {
            // Another host's address: that host's launcher serves it.
            None => Err(std::io::ErrorKind::AddrNotAvailable.into()),
            Some(bind) => TcpListener::bind(bind),
        };
        let server = match listener {
            Ok(listener) => {
                tracing::info!(%addr, bound = ?hosting, "hosting the c10d rendezvous store");
                let seed = (
                    format!("{prefix}config").into_bytes(),
                    config.as_bytes().to_vec(),
                );
                Some(
                    StoreServer::from_listener_seeded(listener, store_config.clone(), [seed])
                        .map_err(|e| err(format!("cannot host the store: {e}")))?,
                )
            }
            // In use: another launcher on this host serves it (or something else holds the
            // port, which the connection then tells). Not available: another host's.
            Err(e) => {
                tracing::debug!(%addr, %e, "not hosting the rendezvous store");
                None
            }
        };
        let store = connect_with_retry(
            &addr.to_string(),
            &store_config,
            Instant::now() + join_timeout,
            signals,
            err,
            |e| {
                format!(
                    "no launcher hosts the store there after {join_timeout:?} (the launcher on that host hosts it; is one running?): {e}"
                )
            },
        )?;
        let advertised_host = store
            .local_addr()
            .map(|a| a.ip().to_string())
            .map_err(|e| err(format!("cannot tell this node's own address: {e}")))?;
        Ok(StoreBackend {
            store: store.with_prefix(&prefix),
            server,
            heartbeat: None,
            seen: HashMap::new(),
            heartbeat_timeout: settings.heartbeat_timeout,
            heartbeat_interval: settings.heartbeat_interval(),
            advertised_host,
        })
    }
}

impl RendezvousBackend for StoreBackend {
    fn add(&mut self, key: &str, delta: i64) -> Result<i64, BackendError> {
        self.store.add(key, delta).map_err(store_err)
    }

    fn compare_set(
        &mut self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, BackendError> {
        self.store
            .compare_set(key, expected, desired)
            .map_err(store_err)
    }

    fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, BackendError> {
        let mut values = self.store.multi_get(&[key]).map_err(store_err)?;
        Ok(values.pop().flatten())
    }

    fn start_heartbeat(&mut self, node_id: &str) -> Result<(), BackendError> {
        let store = self.store.duplicate().map_err(store_err)?;
        let key = format!("hb/{node_id}");
        // The first beat before returning: others may look for it as soon as we join a round.
        store.add(&key, 1).map_err(store_err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let interval = self.heartbeat_interval;
        let thread = std::thread::Builder::new()
            .name("ddp-heartbeat".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    let next = Instant::now() + interval;
                    while Instant::now() < next && !stopped.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(20).min(interval));
                    }
                    if let Err(e) = store.add(&key, 1) {
                        tracing::warn!(%e, "cannot send a heartbeat to the rendezvous store");
                    }
                }
            })
            .map_err(|e| BackendError(format!("cannot start the heartbeat thread: {e}")))?;
        self.heartbeat = Some(Heartbeat { stop, thread });
        Ok(())
    }

    fn dead_nodes(&mut self, node_ids: &[String]) -> Result<Vec<String>, BackendError> {
        let keys: Vec<String> = node_ids.iter().map(|id| format!("hb/{id}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let values = self.store.multi_get(&refs).map_err(store_err)?;
        let now = Instant::now();
        let mut dead = Vec::new();
        for (id, value) in node_ids.iter().zip(values) {
            let (last, since) = self
                .seen
                .entry(id.clone())
                .or_insert_with(|| (value.clone(), now));
            if *last != value {
                *last = value;
                *since = now;
            } else if now.duration_since(*since) > self.heartbeat_timeout {
                dead.push(id.clone());
            }
        }
        Ok(dead)
    }

    fn advertised_host(&self) -> String {
        self.advertised_host.clone()
    }

    fn close(self: Box<Self>, signals: &SignalGuard) {
        let StoreBackend {
            store,
            server,
            heartbeat,
            ..
        } = *self;
        if let Some(hb) = heartbeat {
            hb.stop.store(true, Ordering::Relaxed);
            let _ = hb.thread.join();
        }
        drop(store);
        let Some(server) = server else { return };
        let clients = server.num_clients();
        if clients > 0 {
            tracing::info!(
                clients,
                "this node hosts the rendezvous: waiting (at most {CLOSE_WAIT:?}) for the other nodes' launchers to leave (a signal stops the wait)"
            );
        }
        match wait_for_clients_to_leave(&server, 0, CLOSE_WAIT, || signals.take()) {
            ClientsLeft::Left => {}
            ClientsLeft::TimedOut => tracing::warn!(
                "other launchers still connected to the rendezvous after {CLOSE_WAIT:?}; closing it"
            ),
            ClientsLeft::Interrupted(sig) => tracing::info!(
                "interrupted by {} while other launchers were connected; closing the rendezvous now",
                crate::signal_names::signal_name(sig)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(host: &str) -> Endpoint {
        Endpoint {
            host: host.into(),
            port: 29400,
        }
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("socket address")
    }

    /// An address of this machine is hosted on every interface (Debian's 127.0.1.1 for the
    /// machine's own name included); another host's is not hosted here.
    #[test]
    fn own_addresses_are_hosted_on_the_wildcard_address() {
        assert_eq!(
            hosting_address(addr("127.0.1.1:29400")),
            Some(addr("0.0.0.0:29400"))
        );
        assert_eq!(
            hosting_address(addr("127.0.0.1:29400")),
            Some(addr("0.0.0.0:29400"))
        );
        assert_eq!(
            hosting_address(addr("[::1]:29400")),
            Some(addr("[::]:29400"))
        );
        // TEST-NET-1: documentation only, on no interface.
        assert_eq!(hosting_address(addr("192.0.2.1:29400")), None);
    }

    #[test]
    fn a_name_of_loopback_only_is_a_warning_when_other_hosts_may_join() {
        let loopback = [addr("127.0.1.1:29400")];
        let warning = loopback_warning(&endpoint("node0"), &loopback, 2).expect("a warning");
        for part in [
            "--rdzv-endpoint node0:29400 resolves to 127.0.1.1",
            "a loopback address",
            "nodes on other hosts cannot reach the rendezvous",
            "fix /etc/hosts",
            "or pass that address",
        ] {
            assert!(warning.contains(part), "{part:?} not in {warning}");
        }
        let literal = loopback_warning(&endpoint("127.0.0.1"), &[addr("127.0.0.1:29400")], 3)
            .expect("a warning");
        assert!(
            literal.starts_with("--rdzv-endpoint 127.0.0.1:29400 is a loopback address (127.0.0.1): nodes on other hosts cannot reach"),
            "{literal}"
        );
        // One node at most, or a name with a routable address too: nothing to say.
        assert_eq!(loopback_warning(&endpoint("node0"), &loopback, 1), None);
        let mixed = [addr("127.0.1.1:29400"), addr("10.0.0.1:29400")];
        assert_eq!(loopback_warning(&endpoint("node0"), &mixed, 2), None);
        assert_eq!(
            loopback_warning(&endpoint("node0"), &[addr("10.0.0.1:29400")], 2),
            None
        );
    }
}
