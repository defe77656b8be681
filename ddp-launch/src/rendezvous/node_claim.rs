//! Each launcher of a static multi-node job claims its `--node-rank` in the rendezvous.
//!
//! The join counts arrivals, so without a claim two launchers started with the same
//! `--node-rank` would make up the count between them: the job would start with duplicate ranks
//! (and a missing one) and hang until the workers' timeout. The second claimant is refused
//! instead, through [`REFUSED_KEY`](super::REFUSED_KEY), so every launcher stops at once naming
//! both.
//!
//! A launcher claims once, when it connects, under an id of its own: its restarts (later
//! attempts in the same process) keep the claim. A new process for the same node (a launcher
//! started again while node 0 still runs the job) is refused too: it could not take its place
//! in the attempt under way anyway.

use super::{REFUSED_KEY, Rendezvous};
use crate::error::LaunchError;

/// `host:pid`: unique among the launchers running now.
pub(crate) fn host_pid() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let host = if ok {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "localhost".to_string()
    };
    format!("{host}:{}", std::process::id())
}

/// `host:pid:nonce`: the nonce tells apart two launchers whose pids match (two hosts of the
/// same name, or a pid reused).
pub(crate) fn claimant_id() -> String {
    format!("{}:{:08x}", host_pid(), rand::random::<u32>())
}

impl Rendezvous {
    /// Claims this node's rank for `claimant` (`compare_set`, so exactly one launcher wins a
    /// rank; claiming again with the same id succeeds). On a clash, publishes the refusal for
    /// every launcher and returns it.
    pub(super) fn claim_node_rank(&self, claimant: &str) -> Result<(), LaunchError> {
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
        if let Err(e) = self.store.compare_set(REFUSED_KEY, b"", refusal.as_bytes()) {
            tracing::warn!(%e, "cannot tell the other nodes that this node does not join");
        }
        Err(self.error(refusal))
    }
}
