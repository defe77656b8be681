//! Joining the job's rounds: [`Rounds::join`] finds the next round this node can be part of
//! (asking into a running round that has room, and waiting for the next), and
//! [`Rounds::advance`] opens the round after one that ended, or ends the job.

use super::{POLL, Round, RoundEnd, Rounds, num};
use crate::error::LaunchError;
use crate::plan::node_count::RdzvBackend;
use crate::round_summary::ElasticRound;
use crate::signals::SignalGuard;
use crate::supervise::elastic::members::decode_members;

/// What joining gave this node.
pub(crate) enum Joined {
    Round(Round),
    /// The job completed (or gave up) while this node waited: `Ok` or the reason.
    JobOver(Result<(), String>),
}

impl Rounds {
    /// Joins the next round this node can be part of, waiting for it to close.
    ///
    /// A node that finds the job completed before it ever saw it unfinished (took part in no
    /// round, and never found one open or running) fails: the job ran before it came, so its
    /// job id names an earlier job (with etcd, whose keys outlive the job, the usual cause is
    /// running the same command again with the default `--rdzv-id none`). A node that saw the
    /// job unfinished and then finds it completed (it waited for a place) gets
    /// [`Joined::JobOver`] with `Ok`.
    pub(crate) fn join(&mut self, signals: &SignalGuard) -> Result<Joined, LaunchError> {
        let mut asked_in: Option<u32> = None;
        loop {
            if let Some(signal) = signals.take() {
                return Err(LaunchError::Interrupted { signal });
            }
            if let Some(over) = self.job_over()? {
                if over.is_ok() && !self.saw_job_running && self.local_history.is_empty() {
                    return Err(self.completed_before_joining());
                }
                return Ok(Joined::JobOver(over));
            }
            let r = self.current()?;
            if let Some(members) = self.get(&format!("r/{r}/closed"))? {
                let members = decode_members(&members).map_or(0, |m| m.len());
                if let Some(end) = self.end_of(r)? {
                    self.advance(r, &end)?;
                    continue;
                }
                self.saw_job_running = true;
                if members < self.settings.nodes.max && asked_in != Some(r) {
                    tracing::info!(round = r, "round running without this node; asking to join");
                    self.backend
                        .add(&format!("r/{r}/waiting"), 1)
                        .map_err(|e| self.lost(e))?;
                    asked_in = Some(r);
                }
                std::thread::sleep(POLL);
                continue;
            }
            self.saw_job_running = true;
            let index = self
                .backend
                .add(&format!("r/{r}/join"), 1)
                .map_err(|e| self.lost(e))?;
            let id = self.node_id.clone();
            self.backend
                .set_once(&format!("r/{r}/node/{index}"), id.as_bytes())
                .map_err(|e| self.lost(e))?;
            tracing::info!(round = r, index, "joined a rendezvous round");
            if let Some(round) = self.wait_for_close(r, index as usize, signals)? {
                self.local_history.push(ElasticRound {
                    round: round.number,
                    nodes: round.members.clone(),
                    end: None,
                    failure: false,
                    left: Vec::new(),
                });
                return Ok(Joined::Round(round));
            }
            // Too late for round r: wait for the next (asking in if there is room).
        }
    }

    /// The error of a node that found the job completed before it ever saw it running.
    fn completed_before_joining(&self) -> LaunchError {
        let job = &self.settings.job_id;
        self.error(match self.settings.backend {
            RdzvBackend::Etcd => format!(
                "job id '{job}' already completed before this node joined (a job's state stays in etcd after it ends), so this node ran nothing: to run a job again, pass a new --rdzv-id"
            ),
            _ => format!(
                "job id '{job}' already completed before this node joined (its hosting launcher is shutting down), so this node ran nothing: to run a job again, start its nodes anew (with a new --rdzv-id if the old launchers are still running)"
            ),
        })
    }

    /// Opens the round after `r`, which ended with `end`; or gives up the job when a failure
    /// leaves no restarts.
    pub(super) fn advance(&mut self, r: u32, end: &RoundEnd) -> Result<(), LaunchError> {
        let before: u32 = self
            .get(&format!("r/{r}/restarts"))?
            .and_then(|v| num(&v))
            .unwrap_or(0);
        let after = before + u32::from(matches!(end, RoundEnd::Failure(_)));
        match end {
            RoundEnd::Completed => {
                self.backend
                    .set_once("complete", b"1")
                    .map_err(|e| self.lost(e))?;
                return Ok(());
            }
            RoundEnd::Failure(why) if after > self.max_restarts => {
                let reason = format!(
                    "round {r} ended in a failure with no restarts left (--max-restarts {}): {why}",
                    self.max_restarts
                );
                self.backend
                    .set_once("abort", reason.as_bytes())
                    .map_err(|e| self.lost(e))?;
                return Ok(());
            }
            _ => {}
        }
        let next = r + 1;
        self.backend
            .set_once(&format!("r/{next}/restarts"), after.to_string().as_bytes())
            .map_err(|e| self.lost(e))?;
        self.backend
            .compare_set(
                "current",
                r.to_string().as_bytes(),
                next.to_string().as_bytes(),
            )
            .map_err(|e| self.lost(e))?;
        Ok(())
    }
}
