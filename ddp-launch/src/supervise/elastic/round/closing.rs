//! Waiting for a joined round to close: the last call, the joiners that withdrew or died
//! while it ran (see [`members`](crate::supervise::elastic::members)), a withdrawal that races
//! the close, and reading the members of the closed round.

use super::{POLL, Round, RoundEnd, Rounds, num};
use crate::error::LaunchError;
use crate::signals::SignalGuard;
use crate::supervise::elastic::members::{
    Joiners, decode_members, encode_members, withdrawn_member,
};
use std::time::Instant;

impl Rounds {
    /// Waits for round `r`, joined as `index` (1-based), to close; `None` when it closed
    /// without this node (too many joined). Interrupted, this node withdraws from the round.
    pub(super) fn wait_for_close(
        &mut self,
        r: u32,
        index: usize,
        signals: &SignalGuard,
    ) -> Result<Option<Round>, LaunchError> {
        let nodes = self.settings.nodes;
        let deadline = Instant::now() + self.join_timeout;
        let mut min_reached: Option<Instant> = None;
        let mut joiners = Joiners::default();
        loop {
            if let Some(signal) = signals.take() {
                self.withdraw(r, index, signal);
                return Err(LaunchError::Interrupted { signal });
            }
            if let Some(closed) = self.get(&format!("r/{r}/closed"))? {
                let members = decode_members(&closed).ok_or_else(|| {
                    self.error(format!(
                        "invalid members {:?} of round {r} in the store",
                        String::from_utf8_lossy(&closed)
                    ))
                })?;
                if let Some(end) = self.end_if_a_member_left(r, &members)? {
                    tracing::info!(
                        round = r,
                        end = %end.describe(),
                        "the round ended before it started; joining the next"
                    );
                    return Ok(None);
                }
                let Some(node_rank) = members.iter().position(|&i| i == index) else {
                    tracing::info!(round = r, "the round closed without this node");
                    return Ok(None);
                };
                return self.read_round(r, node_rank, &members, signals).map(Some);
            }
            if let Some(over) = self.job_over()? {
                return Err(self.error(match over {
                    Ok(()) => "the job completed while this node waited to join".to_string(),
                    Err(reason) => reason,
                }));
            }
            let joined = self
                .backend
                .add(&format!("r/{r}/join"), 0)
                .map_err(|e| self.lost(e))?
                .max(0) as usize;
            let live = joiners
                .live(
                    &mut *self.backend,
                    r,
                    joined,
                    index,
                    self.settings.heartbeat_timeout,
                )
                .map_err(|e| self.lost(e))?;
            if live.indices.len() >= nodes.min {
                min_reached.get_or_insert_with(Instant::now);
            } else if min_reached.take().is_some() {
                tracing::info!(
                    round = r,
                    live = live.indices.len(),
                    "fewer live nodes than the minimum now; the round waits for more"
                );
            }
            let last_call_over =
                min_reached.is_some_and(|since| since.elapsed() >= self.settings.last_call);
            if !live.pending && (live.indices.len() >= nodes.max || last_call_over) {
                let members = &live.indices[..live.indices.len().min(nodes.max)];
                self.backend
                    .set_once(&format!("r/{r}/closed"), encode_members(members).as_bytes())
                    .map_err(|e| self.lost(e))?;
                continue;
            }
            // Once enough nodes joined, the last call closes the round: the join timeout is
            // for a round that cannot start.
            if Instant::now() >= deadline && live.indices.len() < nodes.min {
                // The round never closed; joiners still writing their ids are not gone.
                let gone = if live.gone > 0 {
                    format!(
                        " ({joined} joined, {} of them left or sent no heartbeat while it waited)",
                        live.gone
                    )
                } else {
                    String::new()
                };
                return Err(self.error(format!(
                    "only {} of at least {} nodes joined round {r} within {:?} (--join-timeout){gone}",
                    live.indices.len(),
                    nodes.min,
                    self.join_timeout
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Ends round `r`, closed with `members` (join indices), if one of them withdrew (the
    /// withdrawal raced the close: the closer read the joiners before the withdrawal, the
    /// withdrawer read `closed` before the close); returns how the round ended then. Every
    /// node that finds the round closed asks, so at least one finds the withdrawal: the
    /// withdrawer writes its key before it reads `closed`, the others read the keys after
    /// `closed` is written.
    fn end_if_a_member_left(
        &mut self,
        r: u32,
        members: &[usize],
    ) -> Result<Option<RoundEnd>, LaunchError> {
        let left = withdrawn_member(&mut *self.backend, r, members).map_err(|e| self.lost(e))?;
        let Some(id) = left else {
            return Ok(None);
        };
        let why = format!("{id} withdrew from round {r} as it closed, before it started");
        self.end_round(r, &RoundEnd::MemberLeft(why)).map(Some)
    }

    /// Takes this node (joined as `index`) out of round `r`, which it stops waiting for
    /// (interrupted by `signal`), so that the round closes without it. If the round closed
    /// with this node already, ends it (a member left: no restart is spent), so that the
    /// others re-form at once. Best effort: the others find this node dead by its heartbeats
    /// otherwise.
    pub(super) fn withdraw(&mut self, r: u32, index: usize, signal: i32) {
        let id = self.node_id.clone();
        let withdrawn = self
            .backend
            .set_once(&format!("r/{r}/left/{index}"), id.as_bytes())
            .and_then(|_| self.backend.add(&format!("r/{r}/left"), 1));
        if let Err(e) = withdrawn {
            tracing::warn!(%e, round = r, "cannot tell the other nodes that this node leaves");
            return;
        }
        tracing::info!(round = r, index, "withdrew from the round before it closed");
        let closed = match self.backend.get(&format!("r/{r}/closed")) {
            Ok(closed) => closed.and_then(|raw| decode_members(&raw)),
            Err(e) => {
                tracing::warn!(%e, round = r, "cannot tell whether the round closed with this node");
                return;
            }
        };
        if closed.is_some_and(|members| members.contains(&index)) {
            self.leave_before_start(r, signal);
        }
    }

    /// Ends round `r`, closed with this node in it, before it started (interrupted by
    /// `signal` before its workers did): a member left, which spends no restart, so that the
    /// others re-form at once instead of finding this node dead by its heartbeats and spending
    /// a restart on it. Best effort, as [`withdraw`](Self::withdraw).
    pub(super) fn leave_before_start(&mut self, r: u32, signal: i32) {
        let why = format!(
            "{} was interrupted by {} before round {r} started",
            self.node_id,
            crate::signal_names::signal_name(signal)
        );
        if let Err(e) = self.end_round(r, &RoundEnd::MemberLeft(why)) {
            tracing::warn!(%e, "cannot tell the other nodes that this node leaves");
        }
    }

    /// The members of closed round `r`, by their join indices (their ids appear right after
    /// they joined).
    pub(super) fn read_round(
        &mut self,
        r: u32,
        node_rank: usize,
        indices: &[usize],
        signals: &SignalGuard,
    ) -> Result<Round, LaunchError> {
        let deadline = Instant::now() + self.join_timeout;
        let mut members = Vec::with_capacity(indices.len());
        for &i in indices {
            loop {
                if let Some(id) = self.get(&format!("r/{r}/node/{i}"))? {
                    members.push(String::from_utf8_lossy(&id).into_owned());
                    break;
                }
                if let Some(signal) = signals.take() {
                    self.leave_before_start(r, signal);
                    return Err(LaunchError::Interrupted { signal });
                }
                if Instant::now() >= deadline {
                    return Err(self.error(format!("member {i} of round {r} never wrote its id")));
                }
                std::thread::sleep(POLL);
            }
        }
        let restarts_before = self
            .get(&format!("r/{r}/restarts"))?
            .and_then(|v| num(&v))
            .unwrap_or(0);
        Ok(Round {
            number: r,
            node_rank,
            members,
            restarts_before,
        })
    }
}
