//! The rendezvous side: ports ([`ports`]), the store connection ([`store_connect`]), and the
//! static multi-node rendezvous between launchers.
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
//!
//! The files: this one connects ([`Rendezvous::connect`]) and checks the settings; [`attempt`]
//! forms each attempt and carries failures between the nodes, [`finish`] waits for the others
//! once this node's workers succeeded, and [`closing`] leaves the job (node 0 serving the
//! others first).

mod attempt;
mod closing;
mod finish;
mod heartbeat;
pub(crate) mod node_claim;
pub(crate) mod port_holder;
mod ports;
mod refusal;
mod rejoin;
pub(crate) mod store_connect;

pub(crate) use closing::{ClientsLeft, wait_for_clients_to_leave};
pub(crate) use ports::{bind_host, free_port, single_node_port};

use crate::error::LaunchError;
use crate::plan::{LaunchPlan, MasterPort};
use crate::rendezvous::ports::bind_port;
use crate::rendezvous::store_connect::connect_with_retry;
use crate::rendezvous_protocol::{protocol_mismatch, with_protocol};
use crate::signals::SignalGuard;
use ddp_comm::{CommError, Store, StoreConfig, StoreServer, host_port};
use std::time::{Duration, Instant};

/// How often a node looks for failures published by the others.
const POLL: Duration = Duration::from_millis(250);
const CONFIG_KEY: &str = "config";
/// Node 0's launch id, set before [`CONFIG_KEY`] (so a node that read the settings finds it).
const LAUNCH_ID_KEY: &str = "launch_id";

/// This launcher's membership in a multi-node job.
pub(crate) struct Rendezvous {
    store: Store,
    /// Node 0 hosts the server.
    server: Option<StoreServer>,
    node_rank: usize,
    nnodes: usize,
    addr: String,
    join_timeout: Duration,
    /// How long this launcher watches a holder's heartbeat before taking its `--node-rank`.
    takeover_grace: Duration,
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
        let addr = host_port(&plan.master_addr, port);
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
            takeover_grace: plan.takeover_grace,
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
}
