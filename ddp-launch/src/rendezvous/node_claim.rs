//! Each launcher of a static multi-node job claims its `--node-rank` in the rendezvous.
//!
//! The join counts arrivals, so without a claim two launchers started with the same
//! `--node-rank` would make up the count between them: the job would start with duplicate ranks
//! (and a missing one) and hang until the workers' timeout. The second claimant is refused
//! instead, through [`publish_refusal`](super::Rendezvous::publish_refusal), so every launcher
//! stops at once naming both (or, once the job runs, the second claimant stops alone).
//!
//! A launcher claims once, when it connects, under an id of its own: its restarts (later
//! attempts in the same process) keep the claim. A new process for the same node (a launcher
//! started again while node 0 still runs the job) is refused too: it could not take its place
//! in the attempt under way anyway.

use super::Rendezvous;
use crate::error::LaunchError;
use crate::launcher_id::claimant_id;

impl Rendezvous {
    /// Claims this node's rank for this launcher (`compare_set`, so exactly one launcher wins
    /// a rank). On a clash, publishes the refusal for every launcher and returns it.
    pub(super) fn claim_node_rank(&self) -> Result<(), LaunchError> {
        let claimant = claimant_id();
        let claimant = claimant.as_str();
        let key = format!("node/{}", self.node_rank);
        let holder = self
            .store
            .compare_set(&key, b"", claimant.as_bytes())
            .map_err(|e| self.lost(e))?;
        if holder == claimant.as_bytes() {
            return Ok(());
        }
        let refusal = format!(
            "node {rank} cannot join: --node-rank {rank} is already held by launcher {holder}, \
             and launcher {claimant} was started with it too: every launcher of the job needs \
             its own --node-rank (0..={last})",
            rank = self.node_rank,
            holder = String::from_utf8_lossy(&holder),
            last = self.nnodes - 1,
        );
        let running = self.publish_refusal(&refusal);
        Err(self.error(format!("{refusal}{running}")))
    }
}
