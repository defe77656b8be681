//! [`ElasticRound`]: one rendezvous round of an elastic job, as the summary lists it.

use std::fmt;

/// One round of an elastic job (`--nnodes MIN:MAX`): who was in it and why it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ElasticRound {
    /// The round number (0 for the first); the workers see it as `DDP_RDZV_ROUND` and
    /// `DDP_RESTART_COUNT`.
    pub round: u32,
    /// The nodes' launchers (`host:pid`), by node rank in the round.
    pub nodes: Vec<String>,
    /// Why it ended (`failure: ...`, `node joined: ...`, `member left: ...`, `completed: ...`);
    /// `None` while it runs or when unknown.
    pub end: Option<String>,
    /// Whether it ended in a failure (which counts against `--max-restarts`).
    pub failure: bool,
    /// Its nodes that are not in the next round (they died, hung or left): the failure's
    /// likely origin, when the first failure reported was a worker that lost its peers there.
    pub left: Vec<String>,
}

impl fmt::Display for ElasticRound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "round {}: {} node(s) [{}]: {}",
            self.round,
            self.nodes.len(),
            self.nodes.join(", "),
            self.end
                .as_deref()
                .unwrap_or("did not end (still running, or unknown)")
        )?;
        if !self.left.is_empty() {
            write!(f, "; not in the next round: {}", self.left.join(", "))?;
        }
        Ok(())
    }
}

/// The lines listing `rounds`, indented, for the launcher's reports.
pub(crate) fn rounds_lines(rounds: &[ElasticRound]) -> String {
    rounds.iter().map(|r| format!("    {r}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_names_its_nodes_and_why_it_ended() {
        let r = ElasticRound {
            round: 1,
            nodes: vec!["a:1".into(), "b:2".into()],
            end: Some("failure: node(s) b:2 sent no heartbeat for 3s".into()),
            failure: true,
            left: vec!["b:2".into()],
        };
        assert_eq!(
            rounds_lines(&[r]),
            "    round 1: 2 node(s) [a:1, b:2]: failure: node(s) b:2 sent no heartbeat for 3s; not in the next round: b:2\n"
        );
    }
}
