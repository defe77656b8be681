//! Which attempt a launcher that took a dead launcher's claim over joins.
//!
//! Node 0 records the attempt it begins in [`LATEST_KEY`]. If the dead launcher's workers had
//! succeeded in it (`attempt/<N>/finished/<rank>`: the launcher exited 0 once it had waited for the
//! others, and was started again by a supervisor that restarts whatever exits), this node's part of
//! the job is done: the newcomer says so and ends successfully, leaving the others' attempt alone.
//! If the other nodes are still forming that attempt (fewer than `--nnodes` joined it), the
//! newcomer joins it (and if the dead launcher had joined it already, the node stays counted once:
//! see [`begin`](super::Rendezvous::begin)). If it formed, the dead launcher's workers were part of
//! it, so it cannot succeed: the newcomer publishes its failure (the other nodes stop their workers
//! at once, as torchrun's agents restart theirs when a node arrives) and joins the next one,
//! counted as a restart like any other. With no restarts left, the job will not start another
//! attempt, so the newcomer stops with an error instead of waiting for one, and publishes nothing:
//! ending the attempt would not help, and should the holder have been only stalled, not dead, it
//! would stop a healthy job.

use super::Rendezvous;
use crate::error::LaunchError;
use std::time::Duration;

/// The attempt node 0 began last.
const LATEST_KEY: &str = "attempt/latest";

impl Rendezvous {
    /// On node 0, as it begins `attempt`: records it for a launcher rejoining the job.
    pub(super) fn record_latest(&self, attempt: u32) -> Result<(), LaunchError> {
        self.store
            .set(LATEST_KEY, attempt.to_string().as_bytes())
            .map_err(|e| self.lost(e))
    }

    /// The attempt node 0 began last (0 before it began one).
    fn latest(&self) -> Result<u32, LaunchError> {
        if !self.store.check(&[LATEST_KEY]).map_err(|e| self.lost(e))? {
            return Ok(0);
        }
        let text = self
            .store
            .get_timeout(LATEST_KEY, Duration::from_secs(5))
            .map_err(|e| self.lost(e))?;
        String::from_utf8_lossy(&text).parse().map_err(|_| {
            self.error(format!(
                "node 0 published an invalid attempt {:?}",
                String::from_utf8_lossy(&text)
            ))
        })
    }

    /// After taking the claim over from `dead` (its heartbeat stopped): the attempt this
    /// launcher joins, `None` if `dead` had finished this node's part of the job, or why it
    /// cannot rejoin the job.
    pub(super) fn rejoin(&self, dead: &str, max_restarts: u32) -> Result<Option<u32>, LaunchError> {
        let rank = self.node_rank;
        if self.aborted() {
            return Err(self.error(format!(
                "node {rank} cannot rejoin the job: another node stopped it"
            )));
        }
        let latest = self.latest()?;
        let count = |name: &str| {
            self.store
                .add(&Self::key(latest, name), 0)
                .map_err(|e| self.lost(e))
        };
        if self
            .store
            .check(&[Self::finished_key(latest, rank).as_str()])
            .map_err(|e| self.lost(e))?
        {
            // `dead` exited after its workers succeeded (it had waited for the others, or
            // stopped waiting): ending the attempt now would fail the other nodes' healthy
            // workers for nothing. (Once every node finished, this node's key is set too.)
            let job = if count("finished")? >= self.nnodes as i64 {
                "every node finished it: the job is done"
            } else {
                "the other nodes are still running theirs"
            };
            tracing::warn!(
                node_rank = rank,
                "node {rank}'s workers already succeeded in attempt {latest} (under launcher {dead}, whose place this one took), and {job}: nothing left for this launcher to do"
            );
            return Ok(None);
        }
        if count("joined")? < self.nnodes as i64 {
            tracing::info!(
                node_rank = rank,
                "rejoining the job at attempt {latest}, which the other nodes are forming"
            );
            return Ok(Some(latest));
        }
        let next = latest + 1;
        if next > max_restarts {
            // Ending the attempt would not bring this node back, and if the holder was only
            // stalled (not dead) it would stop a healthy job: leave the attempt alone.
            return Err(self.error(format!(
                "node {rank} cannot rejoin the job: it runs its last attempt ({latest}, \
                 --max-restarts {max_restarts}), so it will not restart for this node; this \
                 launcher leaves the other nodes' attempt alone (if launcher {dead} did die, \
                 their workers fail when they miss node {rank}'s)"
            )));
        }
        let why = format!(
            "node {rank}'s launcher {dead} stopped (its heartbeat did not move for {grace:?}), \
             and launcher {me} took its place",
            me = self.claimant,
            grace = self.takeover_grace,
        );
        self.report_failure(latest, &why, false);
        tracing::info!(
            node_rank = rank,
            "rejoining the job: attempt {latest} cannot go on without this node, so the nodes restart (restart {next} of {max_restarts})"
        );
        Ok(Some(next))
    }
}
