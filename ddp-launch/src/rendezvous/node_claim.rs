//! Each launcher of a static multi-node job claims its `--node-rank` in the rendezvous, and a
//! launcher started again for a node whose launcher died takes the claim over.
//!
//! The join counts each node once (its launcher fills `attempt/<N>/joined/<rank>` with its id
//! before it adds to the count), but without a claim two launchers started with the same
//! `--node-rank` would both run that node's workers: the job would start with duplicate ranks
//! and hang until the workers' timeout. The second claimant is refused instead, through [`publish_refusal`](super::Rendezvous::publish_refusal), so every launcher
//! stops at once naming both (or, once the job runs, the second claimant stops alone).
//!
//! A launcher claims once, when it connects, under an id of its own: its restarts (later
//! attempts in the same process) keep the claim. While it holds the claim, its [`Heartbeat`]
//! adds to `node/<rank>/alive/<its id>` every [`BEAT`](super::heartbeat::BEAT) (a counter of its
//! own, so a displaced holder that beats on does not cover up its successor's death). A new
//! claimant for a held rank reads the holder's counter, waits its takeover grace
//! ([`takeover_grace`](crate::plan::takeover::takeover_grace): [`DEFAULT_GRACE`], or
//! [`TAKEOVER_ENV`]) by its own clock (the hosts'
//! clocks need not agree),
//! and reads it again: moved, the holder lives and the newcomer is refused as above; still, the
//! holder is gone (its launcher died, and its workers with it) and the newcomer takes the claim
//! over, with `compare_set` on the old holder's id so that of several newcomers exactly one
//! wins. A holder that was only stalled finds out when it next looks at its claim (before each
//! attempt, and on each pass of the wait for the other nodes) and stops without starting
//! workers. Like a torchrun agent started again for a crashed node, it then joins the attempt the
//! other nodes start next ([`rejoin`](super::rejoin)), which spends a restart.
//!
//! Node 0 hosts the store, so its launcher cannot be replaced: a new one finds `--master-port`
//! taken while the old one lives, and the job's store is gone with it once it died.
use super::Rendezvous;
use super::heartbeat::Heartbeat;
use crate::error::LaunchError;
use crate::launcher_id::claimant_id;
use crate::plan::takeover::{DEFAULT_GRACE, TAKEOVER_ENV};
use crate::signals::SignalGuard;
use std::time::{Duration, Instant};

/// How often a newcomer looks at the holder's counter while it waits.
const LOOK: Duration = Duration::from_millis(250);

/// The key holding node `rank`'s claimant.
pub(super) fn claim_key(rank: usize) -> String {
    format!("node/{rank}")
}

/// The counter `claimant` moves while it runs as node `rank`'s launcher. Each claimant has its
/// own: a holder that was displaced while it stalled, and beats on when it resumes, must not
/// move the counter its successor is judged by.
fn alive_key(rank: usize, claimant: &str) -> String {
    format!("node/{rank}/alive/{claimant}")
}

/// What a newcomer saw of the holder's heartbeat.
enum Holder {
    /// It moved: the holder runs.
    Alive,
    /// It did not move for the takeover grace.
    Gone,
}

impl Rendezvous {
    /// Claims this node's rank for this launcher (`compare_set`, so exactly one launcher wins
    /// a rank), taking it over from a holder whose heartbeat stopped; starts this launcher's
    /// heartbeat; after a takeover, picks the attempt to join. On a clash with a live holder,
    /// publishes the refusal for every launcher and returns it.
    pub(super) fn claim_node_rank(
        &mut self,
        max_restarts: u32,
        signals: &SignalGuard,
    ) -> Result<(), LaunchError> {
        let claimant = claimant_id();
        let key = claim_key(self.node_rank);
        let holder = self
            .store
            .compare_set(&key, b"", claimant.as_bytes())
            .map_err(|e| self.lost(e))?;
        let replaced = if holder == claimant.as_bytes() {
            None
        } else {
            match self.watch_holder(&holder, signals)? {
                Holder::Alive => return Err(self.refuse(&claimant)),
                Holder::Gone => {}
            }
            let now = self
                .store
                .compare_set(&key, &holder, claimant.as_bytes())
                .map_err(|e| self.lost(e))?;
            if now != claimant.as_bytes() {
                // Another newcomer took it first.
                return Err(self.refuse(&claimant));
            }
            let holder = String::from_utf8_lossy(&holder).into_owned();
            tracing::warn!(
                node_rank = self.node_rank,
                "launcher {holder}, which held --node-rank {}, did not move its heartbeat for {:?}: this launcher ({claimant}) takes its place",
                self.node_rank,
                self.takeover_grace
            );
            Some(holder)
        };
        self.heartbeat = Some(
            Heartbeat::start(self.store.clone(), alive_key(self.node_rank, &claimant))
                .map_err(|e| self.error(format!("cannot start the heartbeat thread: {e}")))?,
        );
        self.claimant = claimant;
        if let Some(holder) = replaced {
            self.first_attempt = self.rejoin(&holder, max_restarts)?;
        }
        Ok(())
    }

    /// Reads the holder's heartbeat, then watches it for the takeover grace by this host's clock: whether
    /// it moved. A signal stops the wait.
    fn watch_holder(&self, holder: &[u8], signals: &SignalGuard) -> Result<Holder, LaunchError> {
        let key = alive_key(self.node_rank, &String::from_utf8_lossy(holder));
        let first = self.store.add(&key, 0).map_err(|e| self.lost(e))?;
        tracing::info!(
            node_rank = self.node_rank,
            "--node-rank {} is held by launcher {}: waiting up to {:?} to see whether it still runs",
            self.node_rank,
            String::from_utf8_lossy(holder),
            self.takeover_grace
        );
        let deadline = Instant::now() + self.takeover_grace;
        loop {
            if let Some(signal) = signals.take() {
                return Err(LaunchError::Interrupted { signal });
            }
            std::thread::sleep(LOOK);
            if self.store.add(&key, 0).map_err(|e| self.lost(e))? != first {
                return Ok(Holder::Alive);
            }
            if Instant::now() >= deadline {
                return Ok(Holder::Gone);
            }
        }
    }

    /// Refuses `claimant`, naming the launcher that holds the rank now; publishes the refusal.
    fn refuse(&self, claimant: &str) -> LaunchError {
        let holder = self
            .store
            .get_timeout(&claim_key(self.node_rank), Duration::from_secs(5))
            .map(|h| String::from_utf8_lossy(&h).into_owned())
            .unwrap_or_else(|e| format!("(unreadable: {e})"));
        let refusal = format!(
            "node {rank} cannot join: --node-rank {rank} is already held by launcher {holder}, \
             and launcher {claimant} was started with it too: every launcher of the job needs \
             its own --node-rank (0..={last})",
            rank = self.node_rank,
            last = self.nnodes - 1,
        );
        let running = self.publish_refusal(&refusal);
        self.error(format!("{refusal}{running}"))
    }

    /// Before each attempt: whether this launcher still holds its claim. A launcher that stopped
    /// answering long enough (stopped by SIGSTOP, say) may find another one took its place.
    pub(super) fn check_claim(&self) -> Result<(), LaunchError> {
        let holder = self
            .store
            .get_timeout(&claim_key(self.node_rank), Duration::from_secs(5))
            .map_err(|e| self.lost(e))?;
        if holder == self.claimant.as_bytes() {
            return Ok(());
        }
        Err(self.error(format!(
            "this launcher ({}) no longer holds --node-rank {}: launcher {} took it over, as this \
             one's heartbeat did not move for that launcher's takeover grace ({TAKEOVER_ENV}, \
             {} s by default)",
            self.claimant,
            self.node_rank,
            String::from_utf8_lossy(&holder),
            DEFAULT_GRACE.as_secs()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::takeover::MIN_GRACE;
    use crate::rendezvous::heartbeat::BEAT;

    #[test]
    fn the_grace_period_spans_several_heartbeats() {
        assert!(MIN_GRACE >= 4 * BEAT, "{MIN_GRACE:?} vs {BEAT:?}");
        assert!(DEFAULT_GRACE >= MIN_GRACE);
        assert_ne!(claim_key(1), alive_key(1, "host:1:a"));
        assert_ne!(alive_key(1, "host:1:a"), alive_key(1, "host:2:b"));
    }
}
