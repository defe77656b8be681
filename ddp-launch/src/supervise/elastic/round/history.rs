//! The job's rounds so far, for the summary: read from the rendezvous, or this node's own
//! record of the rounds it took part in when the rendezvous is gone.

use super::{Round, RoundEnd, Rounds};
use crate::error::LaunchError;
use crate::round_summary::ElasticRound;
use crate::supervise::elastic::members::decode_members;

impl Rounds {
    /// Records how a round of this node ended (for the local history).
    pub(crate) fn record_end(&mut self, round: &Round, end: &RoundEnd) {
        if let Some(h) = self
            .local_history
            .iter_mut()
            .find(|h| h.round == round.number)
        {
            h.end = Some(end.describe());
            h.failure = matches!(end, RoundEnd::Failure(_));
        }
    }

    /// Every round of the job so far, read from the rendezvous (this node's own rounds if it
    /// is unreachable).
    pub(crate) fn history(&mut self) -> Vec<ElasticRound> {
        self.read_history()
            .unwrap_or_else(|_| self.local_history.clone())
    }

    fn read_history(&mut self) -> Result<Vec<ElasticRound>, LaunchError> {
        let current = self.current()?;
        let mut rounds = Vec::new();
        for r in 0..=current {
            let Some(indices) = self
                .get(&format!("r/{r}/closed"))?
                .and_then(|v| decode_members(&v))
            else {
                continue;
            };
            let mut nodes = Vec::with_capacity(indices.len());
            for i in indices {
                let id = self.get(&format!("r/{r}/node/{i}"))?;
                nodes.push(id.map_or_else(
                    || "?".to_string(),
                    |v| String::from_utf8_lossy(&v).into_owned(),
                ));
            }
            let end = self.end_of(r)?;
            rounds.push(ElasticRound {
                round: r,
                nodes,
                failure: matches!(end, Some(RoundEnd::Failure(_))),
                end: end.map(|e| e.describe()),
                left: Vec::new(),
            });
        }
        let next_members: Vec<Vec<String>> =
            rounds.iter().skip(1).map(|r| r.nodes.clone()).collect();
        for (round, next) in rounds.iter_mut().zip(next_members) {
            round.left = round
                .nodes
                .iter()
                .filter(|id| !next.contains(id))
                .cloned()
                .collect();
        }
        Ok(rounds)
    }
}
