//! A round while it runs: where its workers meet ([`Rounds::master`]), whether it ended
//! ([`Rounds::poll`]: another node failed, died or asked in), and how this node ends it
//! (finished, failed, or out of restarts).

use super::{POLL, Round, RoundEnd, Rounds};
use crate::error::LaunchError;
use crate::signals::SignalGuard;
use crate::summary::FailureCause;
use std::time::Instant;

/// Where the workers of a round meet.
pub(crate) struct Master {
    pub(crate) host: String,
    pub(crate) port: u16,
}

impl Rounds {
    /// Where the round's workers meet: node 0 of the round publishes `host:port`, the others
    /// wait for it. `None` when the round ended first (node 0 died before publishing).
    pub(crate) fn master(
        &mut self,
        round: &Round,
        pick_port: impl FnOnce() -> Result<u16, LaunchError>,
        signals: &SignalGuard,
    ) -> Result<Option<Master>, LaunchError> {
        let key = format!("r/{}/master", round.number);
        if round.node_rank == 0 {
            let value = format!("{} {}", self.advertised_host(), pick_port()?);
            self.backend
                .set_once(&key, value.as_bytes())
                .map_err(|e| self.lost(e))?;
        }
        loop {
            if let Some(signal) = signals.take() {
                // This node's workers never start, so the round cannot train: it ends as a
                // member leaving, which spends no restart.
                self.leave_before_start(round.number, signal);
                return Err(LaunchError::Interrupted { signal });
            }
            if let Some(raw) = self.get(&key)? {
                let text = String::from_utf8_lossy(&raw);
                let parsed = text
                    .split_once(' ')
                    .and_then(|(h, p)| Some((h.to_string(), p.parse().ok()?)));
                return match parsed {
                    Some((host, port)) => Ok(Some(Master { host, port })),
                    None => Err(self.error(format!("invalid workers' address {text:?}"))),
                };
            }
            self.next_poll = Instant::now();
            if self.poll(round).is_some() {
                return Ok(None);
            }
            std::thread::sleep(POLL);
        }
    }

    /// While the round runs: whether it ended (another node failed, died, left or asked to
    /// join), checked at most every [`POLL`]. Ends the round itself when it finds a dead
    /// member or a node waiting to join.
    pub(crate) fn poll(&mut self, round: &Round) -> Option<FailureCause> {
        if Instant::now() < self.next_poll {
            return None;
        }
        self.next_poll = Instant::now() + POLL;
        match self.check_round(round) {
            Ok(None) => None,
            Ok(Some(end)) => Some(FailureCause::OtherNode {
                description: end.describe(),
            }),
            Err(e) => Some(FailureCause::LostRendezvous {
                reason: e.to_string(),
            }),
        }
    }

    fn check_round(&mut self, round: &Round) -> Result<Option<RoundEnd>, LaunchError> {
        let r = round.number;
        if let Some(end) = self.end_of(r)? {
            return Ok(Some(end));
        }
        if let Some(Err(reason)) = self.job_over()? {
            return Ok(Some(RoundEnd::Failure(reason)));
        }
        let waiting = self
            .backend
            .add(&format!("r/{r}/waiting"), 0)
            .map_err(|e| self.lost(e))?;
        let finished = self
            .backend
            .add(&format!("r/{r}/finished"), 0)
            .map_err(|e| self.lost(e))?;
        // Once some node finished, the job is ending: a newcomer would only restart it.
        if waiting > 0 && finished == 0 && round.members.len() < self.settings.nodes.max {
            let end = RoundEnd::NodeJoined(format!(
                "{waiting} node(s) asked to join the {}-node job",
                round.members.len()
            ));
            return self.end_round(r, &end).map(Some);
        }
        let others: Vec<String> = round
            .members
            .iter()
            .filter(|id| **id != self.node_id)
            .cloned()
            .collect();
        let dead = self.backend.dead_nodes(&others).map_err(|e| self.lost(e))?;
        if !dead.is_empty() {
            let end = RoundEnd::Failure(format!(
                "node(s) {} sent no heartbeat for {:?} (dead or cut off)",
                dead.join(", "),
                self.settings.heartbeat_timeout
            ));
            return self.end_round(r, &end).map(Some);
        }
        Ok(None)
    }

    /// After this node's workers all succeeded: waits until every member's did (the job is
    /// complete) or the round ends otherwise.
    pub(crate) fn finish(
        &mut self,
        round: &Round,
        signals: &SignalGuard,
    ) -> Result<RoundEnd, LaunchError> {
        let r = round.number;
        self.backend
            .add(&format!("r/{r}/finished"), 1)
            .map_err(|e| self.lost(e))?;
        loop {
            if let Some(signal) = signals.take() {
                let why = format!(
                    "{} was interrupted by {} after its workers finished",
                    self.node_id,
                    crate::signal_names::signal_name(signal)
                );
                let _ = self.end_round(r, &RoundEnd::Failure(why));
                return Err(LaunchError::Interrupted { signal });
            }
            let finished = self
                .backend
                .add(&format!("r/{r}/finished"), 0)
                .map_err(|e| self.lost(e))?;
            if finished >= round.members.len() as i64 {
                let end = self.end_round(r, &RoundEnd::Completed)?;
                if end == RoundEnd::Completed {
                    self.backend
                        .set_once("complete", b"1")
                        .map_err(|e| self.lost(e))?;
                }
                return Ok(end);
            }
            if let Some(end) = self.check_round(round)? {
                return Ok(end);
            }
            std::thread::sleep(POLL);
        }
    }

    /// How `round` ended, once it has (waiting for it: a node that saw trouble ends it).
    pub(crate) fn wait_end(
        &mut self,
        round: &Round,
        signals: &SignalGuard,
    ) -> Result<RoundEnd, LaunchError> {
        loop {
            if let Some(signal) = signals.take() {
                return Err(LaunchError::Interrupted { signal });
            }
            if let Some(end) = self.check_round(round)? {
                return Ok(end);
            }
            std::thread::sleep(POLL);
        }
    }

    /// Publishes a failure of this node (the first end published wins).
    pub(crate) fn report_failure(&mut self, round: &Round, description: &str) {
        let end = RoundEnd::Failure(format!("{}: {description}", self.node_id));
        if let Err(e) = self.end_round(round.number, &end) {
            tracing::warn!(%e, "cannot report the failure to the other nodes");
        }
    }

    /// Whether a failure ending `round` leaves no restarts; gives up the job for every node
    /// if so.
    pub(crate) fn out_of_restarts(&mut self, round: &Round, end: &RoundEnd) -> bool {
        let RoundEnd::Failure(why) = end else {
            return false;
        };
        if round.restarts_before < self.max_restarts {
            return false;
        }
        let reason = format!(
            "round {} ended in a failure with no restarts left (--max-restarts {}): {why}",
            round.number, self.max_restarts
        );
        if let Err(e) = self.backend.set_once("abort", reason.as_bytes()) {
            tracing::warn!(%e, "cannot tell the other nodes to stop");
        }
        true
    }
}
