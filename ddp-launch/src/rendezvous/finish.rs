//! The exit barrier of a static multi-node job: once this node's workers all succeeded, it
//! waits for every node to say the same (or one to fail), and names the nodes it did not hear
//! from when the wait cannot end so.

use super::Rendezvous;
use crate::error::LaunchError;
use crate::signals::SignalGuard;
use crate::summary::FailureCause;
use ddp_comm::CommError;
use std::time::{Duration, Instant};

/// `"node 1"`, `"nodes 1, 3"`.
pub(super) fn node_list(nodes: &[usize]) -> String {
    let list: Vec<String> = nodes.iter().map(ToString::to_string).collect();
    match nodes.len() {
        1 => format!("node {}", list[0]),
        _ => format!("nodes {}", list.join(", ")),
    }
}

impl Rendezvous {
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
    pub(super) fn finished_key(attempt: u32, node_rank: usize) -> String {
        Self::key(attempt, &format!("finished/{node_rank}"))
    }

    /// The nodes that have not reported their workers of `attempt` all succeeded.
    pub(super) fn unfinished(&self, attempt: u32) -> Result<Vec<usize>, CommError> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lists_read_naturally() {
        assert_eq!(node_list(&[1]), "node 1");
        assert_eq!(node_list(&[1, 3]), "nodes 1, 3");
    }
}
