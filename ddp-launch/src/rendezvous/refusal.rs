//! A node that cannot join says why, and the nodes still forming the job stop with that reason.
//!
//! A refusal (settings that differ from node 0's, a `--node-rank` already held) stops every
//! launcher while the job forms, instead of leaving them to wait out `--join-timeout` for a node
//! that will never come. Once every node has joined, the job runs with the right nodes, and a
//! launcher started by mistake then (a duplicate, or one started again with other settings) must
//! stop alone: a refusal it published would otherwise stop the running job at its next restart.
//! So the first node to see the job formed fills [`REFUSED_KEY`] with [`FORMED`]; the key is
//! set once (`compare_set`), so either a refusal came first and the job stops, or the job formed
//! first and later refusals are only their launchers' own errors. The last of those is kept in
//! [`LATE_REFUSAL_KEY`], for a node that then waits in vain for a node to join (its launcher
//! died, and the one started again for it was refused, say for other settings) to quote when it
//! gives up. (A launcher started again with the same settings takes the dead one's place: see
//! [`node_claim`](super::node_claim).)

use super::Rendezvous;
use crate::error::LaunchError;
use std::time::Duration;

/// Where the first refusal, or [`FORMED`], is kept.
const REFUSED_KEY: &str = "refused";
/// [`REFUSED_KEY`]'s value once every node joined: no refusal text starts with a NUL.
const FORMED: &[u8] = b"\0formed";
/// The last refusal published after the job formed; it stops nobody.
const LATE_REFUSAL_KEY: &str = "refused/late";

impl Rendezvous {
    /// Publishes why this node does not join, unless the job already runs. Returns the words
    /// to add to this launcher's own error: empty, or why the running job goes on without it.
    pub(super) fn publish_refusal(&self, refusal: &str) -> &'static str {
        match self.store.compare_set(REFUSED_KEY, b"", refusal.as_bytes()) {
            Ok(held) if held == FORMED => {
                if let Err(e) = self.store.set(LATE_REFUSAL_KEY, refusal.as_bytes()) {
                    tracing::debug!(%e, "cannot record the refusal for the job's nodes");
                }
                "; the job formed before this launcher came, so this refusal does not stop it"
            }
            Ok(_) => "",
            Err(e) => {
                tracing::warn!(%e, "cannot tell the other nodes why this node does not join");
                ""
            }
        }
    }

    /// Records that every node joined: refusals from now on stop only their own launcher.
    /// A refusal that raced the last join is overwritten: the nodes that joined are the job's.
    pub(super) fn mark_formed(&self) {
        match self.store.compare_set(REFUSED_KEY, b"", FORMED) {
            Ok(held) if held == FORMED => {}
            Ok(late) => {
                let late = String::from_utf8_lossy(&late);
                tracing::warn!(refusal = %late, "a launcher was refused as the job formed; the nodes that joined go on");
                if let Err(e) = self.store.set(REFUSED_KEY, FORMED) {
                    tracing::debug!(%e, "cannot record that the job formed");
                }
            }
            Err(e) => tracing::debug!(%e, "cannot record that the job formed"),
        }
    }

    /// The words a node adds when it gives up waiting for the others: the last refusal
    /// published after the job formed, if any (empty otherwise).
    pub(super) fn late_refusal(&self) -> String {
        if !matches!(self.store.check(&[LATE_REFUSAL_KEY]), Ok(true)) {
            return String::new();
        }
        match self
            .store
            .get_timeout(LATE_REFUSAL_KEY, Duration::from_secs(5))
        {
            Ok(text) => format!(
                "; meanwhile a launcher was refused: {}",
                String::from_utf8_lossy(&text)
            ),
            Err(_) => String::new(),
        }
    }

    /// The reason a node published for not joining while the job formed, if one did: it is
    /// reported at once (the host sees it as it happens) and ends the wait. Not once every node
    /// joined `joined_key` (a refusal that raced the last join does not stop the job).
    pub(super) fn refused(&self, joined_key: &str) -> Option<LaunchError> {
        match self.store.check(&[REFUSED_KEY]) {
            Ok(true) => {}
            Ok(false) | Err(_) => return None,
        }
        let reason = match self.store.get_timeout(REFUSED_KEY, Duration::from_secs(5)) {
            Ok(v) if v == FORMED => return None,
            Ok(v) => String::from_utf8_lossy(&v).into_owned(),
            Err(e) => format!("a node refused to join (its reason is unreadable: {e})"),
        };
        if matches!(self.store.add(joined_key, 0), Ok(n) if n >= self.nnodes as i64) {
            return None;
        }
        tracing::error!(%reason, "a node refused to join the rendezvous; stopping");
        Some(self.error(reason))
    }
}
