//! The rendezvous side: ports held until the workers bind them, the store connection, and the
//! static multi-node rendezvous below.
//!
//! Ports, and the static multi-node rendezvous between launchers.
//!
//! With `--nnodes N > 1`, node 0's launcher hosts a [`StoreServer`] on `--master-port` (torchrun's
//! static rendezvous) and every launcher, node 0's included, connects to it with the shared job
//! token. For each attempt:
//!
//! 1. node 0 picks a free port on its host for the workers' own store and publishes it;
//! 2. every node joins the attempt (counted once per node rank, however many launchers of that
//!    node join it) and waits for all `N` (up to `--join-timeout`);
//! 3. the nodes run their workers; the first node whose worker fails (or that is interrupted)
//!    publishes the failure, and the others stop their workers when they see it;
//! 4. a node whose workers all succeeded waits for every node to report success (or a failure),
//!    up to `--join-timeout`; past it, like torchrun's exit barrier, it warns naming the nodes
//!    it did not hear from and ends successfully.
//!
//! Every node sees the same outcome and has the same `--max-restarts` (checked when joining,
//! with `--nnodes`, `--nproc-per-node` and the rendezvous protocol version, [`PROTOCOL`](crate::rendezvous_protocol::PROTOCOL)),
//! so they restart together or stop together. A node interrupted by a signal also sets an
//! abort key so the others do not restart. Each launcher claims its node rank when it joins
//! ([`node_claim`]) and keeps a heartbeat on the claim: a second launcher with the same
//! `--node-rank` stops every node while the job forms, and only itself once it runs
//! ([`refusal`]), unless the holder's heartbeat stopped: then it takes the dead launcher's place
//! and joins the attempt the others start next ([`rejoin`]). Every node's workers get node 0's
//! [`LAUNCH_ID_ENV`](crate::LAUNCH_ID_ENV), published with its settings.
//!
//! Node 0 keeps the rendezvous up after its own workers succeeded while other nodes still run
//! theirs (have neither finished nor failed) and are connected: closing it would make their
//! launchers stop healthy workers. A signal ends that wait at once.

mod heartbeat;
mod node_claim;
pub(crate) mod port_holder;
mod refusal;
mod rejoin;
pub(crate) mod store_connect;

use crate::error::LaunchError;
use crate::node_sync::NodeSync;
use crate::plan::{LaunchPlan, MasterPort};
use crate::rendezvous::store_connect::connect_with_retry;
use crate::rendezvous_protocol::{protocol_mismatch, with_protocol};
use crate::signal_names::signal_name;
use crate::signals::SignalGuard;
use crate::summary::FailureCause;
use ddp_comm::{CommError, Store, StoreConfig, StoreServer};
use std::net::TcpListener;
use std::time::{Duration, Instant};

/// How often a node looks for failures published by the others.
const POLL: Duration = Duration::from_millis(250);
/// How long node 0 keeps the rendezvous up for the others to read the outcome.
const CLOSE_WAIT: Duration = Duration::from_secs(30);
const ABORT_KEY: &str = "abort";
const CONFIG_KEY: &str = "config";
/// Node 0's launch id, set before [`CONFIG_KEY`] (so a node that read the settings finds it).
const LAUNCH_ID_KEY: &str = "launch_id";
/// How often a waiting launcher that hosts the rendezvous looks at who is still connected.
const CLIENTS_POLL: Duration = Duration::from_millis(50);

/// The wildcard address to bind for a job whose node 0 is `master_addr`.
pub(crate) fn bind_host(master_addr: &str) -> &'static str {
    if master_addr.contains(':') {
        "::"
    } else {
        "0.0.0.0"
    }
}

/// `host:port`, with brackets for IPv6.
pub(crate) fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Binds `host:port`, reporting a taken port as [`LaunchError::PortInUse`] naming the address
/// that holds it (binding the wildcard fails when any one address does).
pub(crate) fn bind_port(host: &str, port: u16) -> Result<TcpListener, LaunchError> {
    TcpListener::bind(join_host_port(host, port)).map_err(|source| {
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

/// This launcher's membership in a multi-node job.
pub(crate) struct Rendezvous {
    store: Store,
    /// Node 0 hosts the server.
    server: Option<StoreServer>,
    node_rank: usize,
    nnodes: usize,
    addr: String,
    join_timeout: Duration,
    bind_host: &'static str,
    next_poll: Instant,
    /// The workers' port of the previous attempt (node 0 picks another).
    last_port: Option<u16>,
    /// The attempt whose workers all succeeded on this node, once [`finish`](Self::finish)
    /// was called for it.
    finished: Option<u32>,
    /// The job's launch id: node 0's.
    launch_id: String,
    /// This launcher's id in its node's claim (empty until it holds it).
    claimant: String,
    /// Moves the claim's counter while this launcher holds it.
    heartbeat: Option<heartbeat::Heartbeat>,
    /// The attempt this launcher joins first: 0, or a later one when it took the claim of a
    /// launcher that died over (see [`rejoin`]); `None` when that launcher's workers had
    /// already succeeded, so this one has nothing to run.
    first_attempt: Option<u32>,
}

/// How a wait for the other launchers to disconnect from a hosted store ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientsLeft {
    /// At most the clients to keep remain.
    Left,
    /// The time limit passed first.
    TimedOut,
    /// This signal arrived first.
    Interrupted(i32),
}

/// Waits until at most `keep` clients remain connected to `server`, `timeout` passes, or
/// `interrupted` returns a signal (checked as often as the clients).
pub(crate) fn wait_for_clients_to_leave(
    server: &StoreServer,
    keep: usize,
    timeout: Duration,
    mut interrupted: impl FnMut() -> Option<i32>,
) -> ClientsLeft {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(sig) = interrupted() {
            return ClientsLeft::Interrupted(sig);
        }
        if server.num_clients() <= keep {
            return ClientsLeft::Left;
        }
        if Instant::now() >= deadline {
            return ClientsLeft::TimedOut;
        }
        std::thread::sleep(CLIENTS_POLL);
    }
}

/// `"node 1"`, `"nodes 1, 3"`.
fn node_list(nodes: &[usize]) -> String {
    let list: Vec<String> = nodes.iter().map(ToString::to_string).collect();
    match nodes.len() {
        1 => format!("node {}", list[0]),
        _ => format!("nodes {}", list.join(", ")),
    }
}

impl Rendezvous {
    /// Node 0 binds `--master-port`; every node connects (retrying until `--join-timeout`) and
    /// checks that it runs with the same settings as node 0.
    pub(crate) fn connect(
        plan: &LaunchPlan,
        signals: &SignalGuard,
    ) -> Result<Rendezvous, LaunchError> {
        let port = match plan.master_port {
            MasterPort::Fixed(p) => p,
            // Validation requires --master-port for several nodes.
            MasterPort::Auto => {
                return Err(LaunchError::MissingMasterPort {
                    nnodes: plan.nnodes,
                });
            }
        };
        let addr = join_host_port(&plan.master_addr, port);
        let host = bind_host(&plan.master_addr);
        let config = StoreConfig::new()
            .with_token(plan.job_token.as_bytes())
            .with_timeout(Duration::from_secs(5));
        let err = |reason: String| LaunchError::Rendezvous {
            node_rank: plan.node_rank,
            addr: addr.clone(),
            reason,
        };
        let server = if plan.node_rank == 0 {
            let listener = bind_port(host, port)?;
            Some(
                StoreServer::from_listener(listener, config.clone())
                    .map_err(|e| err(e.to_string()))?,
            )
        } else {
            None
        };
        let deadline = Instant::now() + plan.join_timeout;
        let store = connect_with_retry(&addr, &config, deadline, signals, err, |e| {
            format!(
                "node 0's launcher did not answer within {:?} (is it running with --node-rank 0 and the same --master-port?): {e}",
                plan.join_timeout
            )
        })?;
        let mut rdzv = Rendezvous {
            store,
            server,
            node_rank: plan.node_rank,
            nnodes: plan.nnodes,
            addr: addr.clone(),
            join_timeout: plan.join_timeout,
            bind_host: host,
            next_poll: Instant::now(),
            last_port: None,
            finished: None,
            launch_id: plan.launch_id.clone(),
            claimant: String::new(),
            heartbeat: None,
            first_attempt: Some(0),
        };
        rdzv.check_config(plan, signals)?;
        rdzv.claim_node_rank(plan.max_restarts, signals)?;
        tracing::info!(node_rank = plan.node_rank, nnodes = plan.nnodes, %addr, "joined the rendezvous");
        Ok(rdzv)
    }

    fn error(&self, reason: impl Into<String>) -> LaunchError {
        LaunchError::Rendezvous {
            node_rank: self.node_rank,
            addr: self.addr.clone(),
            reason: reason.into(),
        }
    }

    fn lost(&self, e: CommError) -> LaunchError {
        self.error(format!("lost contact with node 0's launcher: {e}"))
    }

    /// The job's launch id (node 0's), for every node's workers.
    pub(crate) fn launch_id(&self) -> &str {
        &self.launch_id
    }

    /// The attempt this launcher joins first: 0, or the one the other nodes start next when
    /// it took the place of a node's launcher that died; `None` when that launcher had finished
    /// this node's part of the job (its workers succeeded), so this one ends successfully.
    pub(crate) fn first_attempt(&self) -> Option<u32> {
        self.first_attempt
    }

    /// Node 0 publishes its settings and launch id; the others compare theirs and adopt its
    /// launch id.
    fn check_config(
        &mut self,
        plan: &LaunchPlan,
        signals: &SignalGuard,
    ) -> Result<(), LaunchError> {
        let mine = with_protocol(&format!(
            "--nnodes {} --nproc-per-node {} --max-restarts {}",
            plan.nnodes, plan.nproc_per_node, plan.max_restarts
        ));
        if self.node_rank == 0 {
            self.store
                .set(LAUNCH_ID_KEY, self.launch_id.as_bytes())
                .map_err(|e| self.lost(e))?;
            return self
                .store
                .set(CONFIG_KEY, mine.as_bytes())
                .map_err(|e| self.lost(e));
        }
        let theirs = self.wait_for(CONFIG_KEY, signals)?;
        if theirs != mine.as_bytes() {
            let theirs = String::from_utf8_lossy(&theirs);
            let versions =
                protocol_mismatch(&theirs).map_or_else(String::new, |v| format!(": {v}"));
            let refusal = format!(
                "node {} cannot join: node 0 runs with {theirs} but node {} with {mine}: every node must use the same settings{versions}",
                self.node_rank, self.node_rank
            );
            let running = self.publish_refusal(&refusal);
            return Err(self.error(format!(
                "node 0 runs with {theirs} but this node with {mine}: every node must use the same settings{versions}{running}"
            )));
        }
        let id = self
            .store
            .get_timeout(LAUNCH_ID_KEY, Duration::from_secs(5))
            .map_err(|e| self.lost(e))?;
        self.launch_id = String::from_utf8_lossy(&id).into_owned();
        Ok(())
    }

    /// Waits for `key`, checking for signals and the join timeout.
    fn wait_for(&self, key: &str, signals: &SignalGuard) -> Result<Vec<u8>, LaunchError> {
        let deadline = Instant::now() + self.join_timeout;
        loop {
            if let Some(sig) = signals.take() {
                return Err(LaunchError::Interrupted { signal: sig });
            }
            match self.store.check(&[key]) {
                Ok(true) => {
                    return self
                        .store
                        .get_timeout(key, Duration::from_secs(5))
                        .map_err(|e| self.lost(e));
                }
                Ok(false) if Instant::now() >= deadline => {
                    return Err(self.error(format!(
                        "node 0 did not publish '{key}' within {:?}",
                        self.join_timeout
                    )));
                }
                Ok(false) => std::thread::sleep(Duration::from_millis(100)),
                Err(e) => return Err(self.lost(e)),
            }
        }
    }

    fn key(attempt: u32, name: &str) -> String {
        format!("attempt/{attempt}/{name}")
    }

    /// The key a node's launcher fills with its claimant id when it joins `attempt`.
    fn joined_key(attempt: u32, node_rank: usize) -> String {
        Self::key(attempt, &format!("joined/{node_rank}"))
    }

    /// Counts this node in `attempt`'s `joined_key` once: a launcher that took the place of
    /// one that died after joining the attempt finds the node counted already, and does not
    /// count it again (two arrivals for one node would let the attempt form with a node
    /// missing).
    fn join(&self, attempt: u32, joined_key: &str) -> Result<(), LaunchError> {
        let mine = self.claimant.as_bytes();
        let held = self
            .store
            .compare_set(&Self::joined_key(attempt, self.node_rank), b"", mine)
            .map_err(|e| self.lost(e))?;
        if held == mine {
            self.store.add(joined_key, 1).map_err(|e| self.lost(e))?;
            tracing::info!(
                node_rank = self.node_rank,
                "joined attempt {attempt}; waiting for the other nodes"
            );
        } else {
            tracing::info!(
                node_rank = self.node_rank,
                "node {} is counted in attempt {attempt} already (launcher {}, whose place this one took, joined it); waiting for the other nodes",
                self.node_rank,
                String::from_utf8_lossy(&held)
            );
        }
        Ok(())
    }

    /// Joins attempt `attempt` and waits for every node; returns the workers' port.
    pub(crate) fn begin(
        &mut self,
        attempt: u32,
        signals: &SignalGuard,
    ) -> Result<u16, LaunchError> {
        self.finished = None;
        self.check_claim()?;
        let port_key = Self::key(attempt, "port");
        if self.node_rank == 0 {
            self.record_latest(attempt)?;
            let port = free_port(self.bind_host, self.last_port)?;
            self.last_port = Some(port);
            self.store
                .set(&port_key, port.to_string().as_bytes())
                .map_err(|e| self.lost(e))?;
        }
        let joined_key = Self::key(attempt, "joined");
        // A refusal quoted when this wait gives up must be one made during it.
        let earlier_refusal = self.late_refusal();
        self.join(attempt, &joined_key)?;
        let deadline = Instant::now() + self.join_timeout;
        loop {
            self.stop_if_interrupted(attempt, signals)?;
            let joined = self.store.add(&joined_key, 0).map_err(|e| self.lost(e))?;
            // On each pass, and after reading the count: a launcher that stalled here long
            // enough for another to take its place over must not start a second copy of this
            // node. (Checked after the read, a takeover that this check missed came after the
            // attempt formed, so the newcomer sees it formed and restarts the job instead.)
            self.check_claim()?;
            if joined >= self.nnodes as i64 {
                self.mark_formed();
                break;
            }
            if self.aborted() {
                return Err(self.error("another node stopped the job"));
            }
            if let Some(e) = self.refused(&joined_key) {
                return Err(e);
            }
            if Instant::now() >= deadline {
                return Err(self.error(format!(
                    "only {joined} of {} nodes joined attempt {attempt} within {:?}{}{}",
                    self.nnodes,
                    self.join_timeout,
                    self.refusals(),
                    Some(self.late_refusal())
                        .filter(|r| *r != earlier_refusal)
                        .unwrap_or_default()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let port = self.wait_for(&port_key, signals)?;
        String::from_utf8_lossy(&port).parse::<u16>().map_err(|_| {
            self.error(format!(
                "node 0 published an invalid port {:?}",
                String::from_utf8_lossy(&port)
            ))
        })
    }

    /// On node 0, what its server refused while the others were awaited (empty if nothing):
    /// a node started with another token cannot say so itself.
    fn refusals(&self) -> String {
        match self.server.as_ref().map_or(0, StoreServer::num_refused) {
            0 => String::new(),
            n => format!(
                "; meanwhile the rendezvous refused {n} connection(s) that could not prove the \
                 job token (logged above as they came): is {} the same on every node?",
                ddp_comm::TOKEN_ENV
            ),
        }
    }

    /// A failure published by another node during `attempt`, checked at most every 250 ms.
    pub(crate) fn poll_failure(&mut self, attempt: u32) -> Option<FailureCause> {
        if Instant::now() < self.next_poll {
            return None;
        }
        self.next_poll = Instant::now() + POLL;
        let key = Self::key(attempt, "failed");
        match self.store.check(&[key.as_str()]) {
            Ok(false) => None,
            Ok(true) => Some(FailureCause::OtherNode {
                description: self
                    .store
                    .get_timeout(&key, Duration::from_secs(5))
                    .map(|v| String::from_utf8_lossy(&v).into_owned())
                    .unwrap_or_else(|e| format!("(unreadable: {e})")),
            }),
            Err(e) => Some(FailureCause::LostRendezvous {
                reason: format!(
                    "{} at {}: {e}",
                    "node 0's launcher is unreachable", self.addr
                ),
            }),
        }
    }

    /// While this node waits for the others: on a signal, tells them to stop and returns
    /// [`LaunchError::Interrupted`].
    fn stop_if_interrupted(&self, attempt: u32, signals: &SignalGuard) -> Result<(), LaunchError> {
        let Some(sig) = signals.take() else {
            return Ok(());
        };
        let description = format!(
            "node {} was interrupted by {}",
            self.node_rank,
            signal_name(sig)
        );
        self.report_failure(attempt, &description, true);
        Err(LaunchError::Interrupted { signal: sig })
    }

    /// Publishes this node's failure (the first one published wins); `abort` also asks every
    /// node not to restart.
    pub(crate) fn report_failure(&self, attempt: u32, description: &str, abort: bool) {
        if abort && let Err(e) = self.store.set(ABORT_KEY, description.as_bytes()) {
            tracing::warn!(%e, "cannot tell the other nodes to stop");
        }
        if let Err(e) =
            self.store
                .compare_set(&Self::key(attempt, "failed"), b"", description.as_bytes())
        {
            tracing::warn!(%e, "cannot report the failure to the other nodes");
        }
    }

    /// Whether a node asked every node not to restart.
    pub(crate) fn aborted(&self) -> bool {
        self.store.check(&[ABORT_KEY]).unwrap_or(true)
    }

    /// After this node's workers all succeeded: waits until every node succeeded (`None`) or
    /// one failed (its cause). Like torchrun's exit barrier, a wait that cannot end so (the
    /// others did not finish within `--join-timeout`, or node 0 is gone) only warns, naming the
    /// nodes not heard from: this node's work is done, so it ends successfully.
    pub(crate) fn finish(
        &mut self,
        attempt: u32,
        signals: &SignalGuard,
    ) -> Result<Option<FailureCause>, LaunchError> {
        self.finished = Some(attempt);
        let key = Self::key(attempt, "finished");
        // This node's own key first: once the count is complete, every node's key is there.
        self.store
            .set(&Self::finished_key(attempt, self.node_rank), b"1")
            .map_err(|e| self.lost(e))?;
        self.store.add(&key, 1).map_err(|e| self.lost(e))?;
        let deadline = Instant::now() + self.join_timeout;
        loop {
            self.stop_if_interrupted(attempt, signals)?;
            match self.store.add(&key, 0) {
                Ok(n) if n >= self.nnodes as i64 => return Ok(None),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(
                        "this node's workers all succeeded, but it lost node 0's launcher at {} while waiting for the other nodes to finish attempt {attempt} ({e}); not waiting for them",
                        self.addr
                    );
                    return Ok(None);
                }
            }
            self.next_poll = Instant::now();
            if let Some(cause) = self.poll_failure(attempt) {
                return Ok(Some(cause));
            }
            if Instant::now() >= deadline {
                let missing = match self.unfinished(attempt) {
                    Ok(nodes) if !nodes.is_empty() => node_list(&nodes),
                    Ok(_) => "the other nodes".to_string(),
                    Err(e) => format!("the other nodes (which ones is unreadable: {e})"),
                };
                tracing::warn!(
                    "this node's workers all succeeded, but it did not hear from {missing} that attempt {attempt} finished within {:?} (--join-timeout); not waiting for them",
                    self.join_timeout
                );
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The key node `node_rank` sets once its workers of `attempt` all succeeded.
    fn finished_key(attempt: u32, node_rank: usize) -> String {
        Self::key(attempt, &format!("finished/{node_rank}"))
    }

    /// The nodes that have not reported their workers of `attempt` all succeeded.
    fn unfinished(&self, attempt: u32) -> Result<Vec<usize>, CommError> {
        let keys: Vec<String> = (0..self.nnodes)
            .map(|k| Self::finished_key(attempt, k))
            .collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let values = self.store.multi_get(&refs)?;
        Ok(values
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k)
            .collect())
    }

    /// On node 0 once its workers of the last attempt succeeded: keeps serving the rendezvous
    /// while some node has neither finished nor failed and other launchers are connected, so
    /// their healthy workers are not stopped for a lost rendezvous. A signal ends the wait
    /// (returned).
    fn serve_running_nodes(&self, server: &StoreServer, signals: &SignalGuard) -> Option<i32> {
        let attempt = self.finished?;
        let failed = Self::key(attempt, "failed");
        let mut said: Option<Vec<usize>> = None;
        loop {
            if let Some(sig) = signals.take() {
                return Some(sig);
            }
            // This launcher's own connection is one of the clients.
            if server.num_clients() <= 1 {
                return None;
            }
            let running = match (
                self.store.check(&[failed.as_str()]),
                self.unfinished(attempt),
            ) {
                (Ok(false), Ok(running)) if !running.is_empty() => running,
                _ => return None,
            };
            if said.as_ref() != Some(&running) {
                tracing::info!(
                    "this node hosts the rendezvous and {} still running attempt {attempt}: serving it until they finish or fail (a signal stops this now, and stops their workers)",
                    match running.len() {
                        1 => format!("{} is", node_list(&running)),
                        _ => format!("{} are", node_list(&running)),
                    }
                );
                said = Some(running);
            }
            std::thread::sleep(POLL);
        }
    }

    /// Leaves the job. Node 0 first keeps the rendezvous up while other nodes still run the
    /// attempt its own workers finished (see [`serve_running_nodes`](Self::serve_running_nodes)),
    /// then until the others have disconnected (at most 30 s), so they can read the outcome.
    /// A signal ends either wait at once.
    pub(crate) fn close(self, signals: &SignalGuard) {
        let interrupted = match &self.server {
            Some(server) => self.serve_running_nodes(server, signals),
            None => None,
        };
        let Rendezvous {
            store,
            server,
            heartbeat,
            ..
        } = self;
        // The heartbeat shares the connection: it goes first, so the connection closes.
        drop(heartbeat);
        drop(store);
        let Some(server) = server else { return };
        let left = match interrupted {
            Some(sig) => ClientsLeft::Interrupted(sig),
            None => {
                let clients = server.num_clients();
                if clients > 0 {
                    tracing::info!(
                        clients,
                        "this node hosts the rendezvous: waiting (at most {CLOSE_WAIT:?}) for the other nodes' launchers to leave"
                    );
                }
                wait_for_clients_to_leave(&server, 0, CLOSE_WAIT, || signals.take())
            }
        };
        match left {
            ClientsLeft::Left => {}
            ClientsLeft::TimedOut => tracing::warn!(
                "other nodes still connected to the rendezvous after {CLOSE_WAIT:?}; closing it"
            ),
            ClientsLeft::Interrupted(sig) => tracing::info!(
                "interrupted by {} while the other nodes' launchers were connected; closing the rendezvous now",
                signal_name(sig)
            ),
        }
        drop(server);
    }
}

impl NodeSync for Rendezvous {
    fn poll_failure(&mut self, attempt: u32) -> Option<FailureCause> {
        Rendezvous::poll_failure(self, attempt)
    }

    fn report_failure(&mut self, attempt: u32, description: &str, abort: bool) {
        Rendezvous::report_failure(self, attempt, description, abort);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{connect, loopback_store, wait_until};

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
    fn free_ports_are_bindable_and_hosts_are_bracketed_for_ipv6() {
        let port = free_port("0.0.0.0", None).expect("free port");
        assert_ne!(port, 0);
        assert_ne!(free_port("0.0.0.0", Some(port)).expect("free port"), port);
        assert_eq!(join_host_port("::1", 80), "[::1]:80");
        assert_eq!(join_host_port("10.0.0.1", 80), "10.0.0.1:80");
        assert_eq!(bind_host("fe80::1"), "::");
        assert_eq!(bind_host("node0"), "0.0.0.0");
    }

    /// Closing a hosted rendezvous waits for the other launchers to leave, but a signal ends
    /// the wait at once (it used to be swallowed for up to 30 s).
    #[test]
    fn a_signal_ends_the_wait_for_connected_launchers() {
        let (server, config) = loopback_store();
        assert_eq!(
            wait_for_clients_to_leave(&server, 0, Duration::from_secs(600), || None),
            ClientsLeft::Left
        );
        let client = connect(&server, config);
        wait_until(Duration::from_secs(120), "the client never counted", || {
            server.num_clients() > 0
        });
        assert_eq!(
            wait_for_clients_to_leave(&server, 0, Duration::from_millis(100), || None),
            ClientsLeft::TimedOut
        );
        let mut checks = 0;
        let left = wait_for_clients_to_leave(&server, 0, Duration::from_secs(600), || {
            checks += 1;
            (checks > 2).then_some(libc::SIGINT)
        });
        assert_eq!(left, ClientsLeft::Interrupted(libc::SIGINT));
        drop(client);
        assert_eq!(
            wait_for_clients_to_leave(&server, 0, Duration::from_secs(120), || None),
            ClientsLeft::Left
        );
    }

    #[test]
    fn node_lists_read_naturally() {
        assert_eq!(node_list(&[1]), "node 1");
        assert_eq!(node_list(&[1, 3]), "nodes 1, 3");
    }
}
