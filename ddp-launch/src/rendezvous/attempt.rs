//! One attempt of a static multi-node job: every node joins it (counted once per node rank)
//! and waits for all, node 0 publishes the workers' port, and a node whose workers fail, or
//! that is interrupted, publishes the failure for the others to see ([`NodeSync`]).

use super::{POLL, Rendezvous};
use crate::error::LaunchError;
use crate::node_sync::NodeSync;
use crate::rendezvous::ports::free_port;
use crate::signal_names::signal_name;
use crate::signals::SignalGuard;
use crate::summary::FailureCause;
use ddp_comm::StoreServer;
use std::time::{Duration, Instant};

const ABORT_KEY: &str = "abort";

impl Rendezvous {
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
    pub(super) fn stop_if_interrupted(
        &self,
        attempt: u32,
        signals: &SignalGuard,
    ) -> Result<(), LaunchError> {
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
}

impl NodeSync for Rendezvous {
    fn poll_failure(&mut self, attempt: u32) -> Option<FailureCause> {
        Rendezvous::poll_failure(self, attempt)
    }

    fn report_failure(&mut self, attempt: u32, description: &str, abort: bool) {
        Rendezvous::report_failure(self, attempt, description, abort);
    }
}
