//! The round protocol over a [`RendezvousBackend`]: launchers join numbered rounds, each round
//! closes with its live members (ranked in join order), runs until a node fails, leaves or
//! asks to join, and the survivors then form the next round.
//!
//! Which joiners count, and the member list `closed` holds, are [`super::members`]' part.
//!
//! Keys (scoped to the job):
//! - `config`: the first launcher's settings, with the launchers'
//!   [`PROTOCOL`](crate::rendezvous_protocol::PROTOCOL) version; the others must match;
//! - `launch_id`: the first launcher's launch id, which every launcher's workers get;
//! - `current`: the open or running round; `complete` / `abort`: the job's end;
//! - `r/<n>/join` (counter), `r/<n>/node/<i>` (the i-th joiner's id), `r/<n>/left/<i>` (set by
//!   the i-th joiner when it withdraws before the round closes) and `r/<n>/left` (counter of
//!   those), `r/<n>/closed` (the members' join indices in join order, comma-separated, first
//!   writer wins), `r/<n>/restarts` (failed rounds before it), `r/<n>/master` (the workers'
//!   store, from node 0 of the round), `r/<n>/waiting` (nodes that want in), `r/<n>/finished`
//!   (nodes whose workers all succeeded), `r/<n>/end` (why it ended, first writer wins).
//!
//! A round closes once MAX live nodes joined, or MIN did and the last call (`--rdzv-last-call`)
//! passed with no more; its members are the live joiners (the first MAX of them), and a node's
//! rank is its place among them. A launcher that finds the current round closed without it,
//! waits: it asks to join when the round has room (the members then end it and re-form), and
//! joins the next round when one opens.
//!
//! A joiner is live until it withdraws (a launcher interrupted while it waits for the round to
//! close writes `r/<n>/left/<i>`) or the waiting launchers find it dead by its heartbeats
//! (started before it joins); torchrun's dynamic rendezvous drops such participants too. When
//! the leavers leave fewer than MIN live nodes, the round does not close: it waits for more
//! (and its last call starts again once MIN are live), up to the join timeout. A launcher that
//! withdraws just as another closes the round with it is still a member: the round ends
//! ([`RoundEnd::MemberLeft`], which spends no restart), either by the withdrawer (which finds
//! the round closed after writing `left/<i>`) or by the nodes that find it closed (each reads
//! its members' `left/<i>` after `closed`), so one of them always sees the other. One that dies
//! too recently for its heartbeats to tell is a member too: the others find it dead by its
//! heartbeats once the round runs (a failure), and re-form.
//!
//! The files: [`end`] (how a round ended, as the store keeps it), [`joining`] (finding a round
//! to join, and opening the next one), [`closing`] (waiting for a joined round to close, or
//! withdrawing from it), [`running`] (the workers' address, and watching a running round end)
//! and [`history`] (the rounds so far, for the summary); this file holds [`Rounds`] and its
//! reads and writes of the job's keys.

mod closing;
mod end;
mod history;
mod joining;
mod running;
#[cfg(test)]
mod tests;

pub(crate) use end::RoundEnd;
pub(crate) use joining::Joined;

use super::backend::{BackendError, RendezvousBackend};
use crate::error::LaunchError;
use crate::plan::elastic_settings::ElasticSettings;
use crate::plan::node_count::RdzvBackend;
use crate::rendezvous_protocol::{protocol_mismatch, split_protocol};
use crate::round_summary::ElasticRound;
use crate::signals::SignalGuard;
use std::time::{Duration, Instant};

/// How often a launcher reads the rendezvous while waiting or supervising.
const POLL: Duration = Duration::from_millis(100);

/// Why a node whose settings are `mine` cannot join a job set up with `theirs`.
fn settings_refusal(theirs: &str, mine: &str) -> String {
    if let Some(versions) = protocol_mismatch(theirs) {
        return format!("{versions}; every node must use the same settings");
    }
    format!(
        "the first node runs with {} but this node with {}: every node must use the same settings",
        split_protocol(theirs).0,
        split_protocol(mine).0
    )
}

/// A round this node is a member of.
#[derive(Debug, Clone)]
pub(crate) struct Round {
    pub(crate) number: u32,
    /// This node's rank in the round (its place among the members, in join order).
    pub(crate) node_rank: usize,
    /// Node ids by node rank.
    pub(crate) members: Vec<String>,
    /// Rounds that ended in a failure before this one.
    pub(crate) restarts_before: u32,
}

/// This launcher's view of the job's rounds.
pub(crate) struct Rounds {
    backend: Box<dyn RendezvousBackend>,
    settings: ElasticSettings,
    node_id: String,
    max_restarts: u32,
    join_timeout: Duration,
    next_poll: Instant,
    /// The rounds this node took part in, for the summary if the rendezvous is lost.
    local_history: Vec<ElasticRound>,
    /// The job's launch id: the first launcher's.
    launch_id: String,
    /// Whether this node has seen the job unfinished: a round open to join, or closed and not
    /// ended. A node that never did finds a job that completed before it came (see
    /// [`Rounds::join`]).
    saw_job_running: bool,
}

fn num<T: std::str::FromStr>(raw: &[u8]) -> Option<T> {
    String::from_utf8_lossy(raw).trim().parse().ok()
}

impl Rounds {
    /// Checks that this node runs with the same settings as the first one (`settings` is what
    /// every node must agree on), adopts the first one's launch id (this node's `launch_id` if
    /// it is the first), and starts the heartbeat.
    pub(crate) fn new(
        mut backend: Box<dyn RendezvousBackend>,
        settings: ElasticSettings,
        node_id: String,
        config: &str,
        launch_id: &str,
        max_restarts: u32,
        join_timeout: Duration,
    ) -> Result<Rounds, LaunchError> {
        let theirs = backend.set_once("config", config.as_bytes());
        let mut rounds = Rounds {
            backend,
            settings,
            node_id,
            max_restarts,
            join_timeout,
            next_poll: Instant::now(),
            local_history: Vec::new(),
            launch_id: launch_id.to_string(),
            saw_job_running: false,
        };
        let theirs = theirs.map_err(|e| rounds.lost(e))?;
        if theirs != config.as_bytes() {
            return Err(rounds.error(format!(
                "{}{}",
                settings_refusal(&String::from_utf8_lossy(&theirs), config),
                rounds.stale_job_hint()
            )));
        }
        let first = rounds
            .backend
            .set_once("launch_id", launch_id.as_bytes())
            .map_err(|e| rounds.lost(e))?;
        rounds.launch_id = String::from_utf8_lossy(&first).into_owned();
        rounds
            .backend
            .set_once("current", b"0")
            .map_err(|e| rounds.lost(e))?;
        rounds
            .backend
            .set_once("r/0/restarts", b"0")
            .map_err(|e| rounds.lost(e))?;
        let id = rounds.node_id.clone();
        rounds
            .backend
            .start_heartbeat(&id)
            .map_err(|e| rounds.lost(e))?;
        Ok(rounds)
    }

    pub(crate) fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The job's launch id (the first launcher's), for this node's workers.
    pub(crate) fn launch_id(&self) -> &str {
        &self.launch_id
    }

    /// For a node that finds the job over or set up otherwise: with etcd, the state of a
    /// finished job stays, so a new job that reuses its `--rdzv-id` finds the old one.
    pub(crate) fn stale_job_hint(&self) -> String {
        match self.settings.backend {
            RdzvBackend::Etcd => format!(
                " (--rdzv-id {} names an earlier job in etcd, if it is not this one: give a new job a new --rdzv-id)",
                self.settings.job_id
            ),
            _ => String::new(),
        }
    }

    pub(crate) fn advertised_host(&self) -> String {
        self.backend.advertised_host()
    }

    fn error(&self, reason: impl Into<String>) -> LaunchError {
        self.settings.rendezvous_error(&self.node_id, reason.into())
    }

    fn lost(&self, e: BackendError) -> LaunchError {
        self.error(match self.settings.backend {
            RdzvBackend::Etcd => format!(
                "lost the rendezvous ({e}); with --rdzv-backend etcd every node must reach the etcd server at --rdzv-endpoint"
            ),
            _ => format!(
                "lost the rendezvous ({e}); with --rdzv-backend c10d it lives in the launcher that hosts --rdzv-endpoint, so when that node is gone the job cannot re-form"
            ),
        })
    }

    fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, LaunchError> {
        self.backend.get(key).map_err(|e| self.lost(e))
    }

    fn current(&mut self) -> Result<u32, LaunchError> {
        let raw = self.get("current")?.unwrap_or_default();
        num(&raw).ok_or_else(|| self.error(format!("invalid round number {raw:?} in the store")))
    }

    /// `Some(Ok)` when the job completed, `Some(Err(reason))` when it gave up.
    fn job_over(&mut self) -> Result<Option<Result<(), String>>, LaunchError> {
        if self.get("complete")?.is_some() {
            return Ok(Some(Ok(())));
        }
        Ok(self
            .get("abort")?
            .map(|r| Err(String::from_utf8_lossy(&r).into_owned())))
    }

    fn end_of(&mut self, round: u32) -> Result<Option<RoundEnd>, LaunchError> {
        Ok(self
            .get(&format!("r/{round}/end"))?
            .map(|r| RoundEnd::decode(&r)))
    }

    /// Ends `round` for `end` unless it ended already; returns how it ended.
    pub(crate) fn end_round(
        &mut self,
        round: u32,
        end: &RoundEnd,
    ) -> Result<RoundEnd, LaunchError> {
        let raw = self
            .backend
            .set_once(&format!("r/{round}/end"), end.encode().as_bytes())
            .map_err(|e| self.lost(e))?;
        Ok(RoundEnd::decode(&raw))
    }

    /// Leaves the rendezvous; a signal cuts short a wait for the others to leave.
    pub(crate) fn close(self, signals: &SignalGuard) {
        self.backend.close(signals);
    }
}
