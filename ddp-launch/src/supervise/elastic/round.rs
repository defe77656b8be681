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

use super::backend::{BackendError, RendezvousBackend};
use super::members::{Joiners, decode_members, encode_members, withdrawn_member};
use crate::error::LaunchError;
use crate::plan::elastic_settings::ElasticSettings;
use crate::plan::node_count::RdzvBackend;
use crate::rendezvous_protocol::{protocol_mismatch, split_protocol};
use crate::round_summary::ElasticRound;
use crate::signals::SignalGuard;
use crate::summary::FailureCause;
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

/// Why a round ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RoundEnd {
    /// A node failed, died or left; counts against `--max-restarts`.
    Failure(String),
    /// A node asked to join; does not count.
    NodeJoined(String),
    /// A member left before the round started (it withdrew as the round closed with it); does
    /// not count: the round ran no training worth restarting.
    MemberLeft(String),
    /// Every member's workers succeeded: the job is done.
    Completed,
}

impl RoundEnd {
    fn encode(&self) -> String {
        match self {
            RoundEnd::Failure(why) => format!("failure|{why}"),
            RoundEnd::NodeJoined(why) => format!("joined|{why}"),
            RoundEnd::MemberLeft(why) => format!("left|{why}"),
            RoundEnd::Completed => "completed|every node's workers succeeded".into(),
        }
    }

    fn decode(raw: &[u8]) -> RoundEnd {
        let text = String::from_utf8_lossy(raw);
        match text.split_once('|') {
            Some(("joined", why)) => RoundEnd::NodeJoined(why.to_string()),
            Some(("left", why)) => RoundEnd::MemberLeft(why.to_string()),
            Some(("completed", _)) => RoundEnd::Completed,
            Some((_, why)) => RoundEnd::Failure(why.to_string()),
            None => RoundEnd::Failure(text.into_owned()),
        }
    }

    /// What the summary says.
    pub(crate) fn describe(&self) -> String {
        match self {
            RoundEnd::Failure(why) => format!("failure: {why}"),
            RoundEnd::NodeJoined(why) => format!("node joined: {why}"),
            RoundEnd::MemberLeft(why) => format!("member left: {why}"),
            RoundEnd::Completed => "completed: every node's workers succeeded".into(),
        }
    }
}

/// What joining gave this node.
pub(crate) enum Joined {
    Round(Round),
    /// The job completed (or gave up) while this node waited: `Ok` or the reason.
    JobOver(Result<(), String>),
}

/// Where the workers of a round meet.
pub(crate) struct Master {
    pub(crate) host: String,
    pub(crate) port: u16,
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
        LaunchError::ElasticRendezvous {
            node_id: self.node_id.clone(),
            endpoint: self.settings.endpoint.to_string(),
            reason: reason.into(),
        }
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
    fn advance(&mut self, r: u32, end: &RoundEnd) -> Result<(), LaunchError> {
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

    /// Waits for round `r`, joined as `index` (1-based), to close; `None` when it closed
    /// without this node (too many joined). Interrupted, this node withdraws from the round.
    fn wait_for_close(
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
    fn withdraw(&mut self, r: u32, index: usize, signal: i32) {
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
            let why = format!(
                "{id} was interrupted by {} before round {r} started",
                crate::signal_names::signal_name(signal)
            );
            if let Err(e) = self.end_round(r, &RoundEnd::MemberLeft(why)) {
                tracing::warn!(%e, "cannot tell the other nodes that this node leaves");
            }
        }
    }

    /// The members of closed round `r`, by their join indices (their ids appear right after
    /// they joined).
    fn read_round(
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

    /// Where the round's workers meet: node 0 of the round publishes `host:port`, the others
    /// wait for it. `None` when the round ended first (node 0 died before publishing).
    pub(crate) fn master(
        &mut self,
        round: &Round,
        pick_port: impl FnOnce() -> Result<u16, LaunchError>,
        signals: &SignalGuard,
    ) -> Result<Option<Master>, LaunchError> {
        let key = format!("r/{}/master", round.number);
        if round.node_rank == 0 {
            let value = format!("{} {}", self.advertised_host(), pick_port()?);
            self.backend
                .set_once(&key, value.as_bytes())
                .map_err(|e| self.lost(e))?;
        }
        loop {
            if let Some(signal) = signals.take() {
                return Err(LaunchError::Interrupted { signal });
            }
            if let Some(raw) = self.get(&key)? {
                let text = String::from_utf8_lossy(&raw);
                let parsed = text
                    .split_once(' ')
                    .and_then(|(h, p)| Some((h.to_string(), p.parse().ok()?)));
                return match parsed {
                    Some((host, port)) => Ok(Some(Master { host, port })),
                    None => Err(self.error(format!("invalid workers' address {text:?}"))),
                };
            }
            self.next_poll = Instant::now();
            if self.poll(round).is_some() {
                return Ok(None);
            }
            std::thread::sleep(POLL);
        }
    }

    /// While the round runs: whether it ended (another node failed, died, left or asked to
    /// join), checked at most every [`POLL`]. Ends the round itself when it finds a dead
    /// member or a node waiting to join.
    pub(crate) fn poll(&mut self, round: &Round) -> Option<FailureCause> {
        if Instant::now() < self.next_poll {
            return None;
        }
        self.next_poll = Instant::now() + POLL;
        match self.check_round(round) {
            Ok(None) => None,
            Ok(Some(end)) => Some(FailureCause::OtherNode {
                description: end.describe(),
            }),
            Err(e) => Some(FailureCause::LostRendezvous {
                reason: e.to_string(),
            }),
        }
    }

    fn check_round(&mut self, round: &Round) -> Result<Option<RoundEnd>, LaunchError> {
        let r = round.number;
        if let Some(end) = self.end_of(r)? {
            return Ok(Some(end));
        }
        if let Some(Err(reason)) = self.job_over()? {
            return Ok(Some(RoundEnd::Failure(reason)));
        }
        let waiting = self
            .backend
            .add(&format!("r/{r}/waiting"), 0)
            .map_err(|e| self.lost(e))?;
        let finished = self
            .backend
            .add(&format!("r/{r}/finished"), 0)
            .map_err(|e| self.lost(e))?;
        // Once some node finished, the job is ending: a newcomer would only restart it.
        if waiting > 0 && finished == 0 && round.members.len() < self.settings.nodes.max {
            let end = RoundEnd::NodeJoined(format!(
                "{waiting} node(s) asked to join the {}-node job",
                round.members.len()
            ));
            return self.end_round(r, &end).map(Some);
        }
        let others: Vec<String> = round
            .members
            .iter()
            .filter(|id| **id != self.node_id)
            .cloned()
            .collect();
        let dead = self.backend.dead_nodes(&others).map_err(|e| self.lost(e))?;
        if !dead.is_empty() {
            let end = RoundEnd::Failure(format!(
                "node(s) {} sent no heartbeat for {:?} (dead or cut off)",
                dead.join(", "),
                self.settings.heartbeat_timeout
            ));
            return self.end_round(r, &end).map(Some);
        }
        Ok(None)
    }

    /// After this node's workers all succeeded: waits until every member's did (the job is
    /// complete) or the round ends otherwise.
    pub(crate) fn finish(
        &mut self,
        round: &Round,
        signals: &SignalGuard,
    ) -> Result<RoundEnd, LaunchError> {
        let r = round.number;
        self.backend
            .add(&format!("r/{r}/finished"), 1)
            .map_err(|e| self.lost(e))?;
        loop {
            if let Some(signal) = signals.take() {
                let why = format!(
                    "{} was interrupted by {} after its workers finished",
                    self.node_id,
                    crate::signal_names::signal_name(signal)
                );
                let _ = self.end_round(r, &RoundEnd::Failure(why));
                return Err(LaunchError::Interrupted { signal });
            }
            let finished = self
                .backend
                .add(&format!("r/{r}/finished"), 0)
                .map_err(|e| self.lost(e))?;
            if finished >= round.members.len() as i64 {
                let end = self.end_round(r, &RoundEnd::Completed)?;
                if end == RoundEnd::Completed {
                    self.backend
                        .set_once("complete", b"1")
                        .map_err(|e| self.lost(e))?;
                }
                return Ok(end);
            }
            if let Some(end) = self.check_round(round)? {
                return Ok(end);
            }
            std::thread::sleep(POLL);
        }
    }

    /// How `round` ended, once it has (waiting for it: a node that saw trouble ends it).
    pub(crate) fn wait_end(
        &mut self,
        round: &Round,
        signals: &SignalGuard,
    ) -> Result<RoundEnd, LaunchError> {
        loop {
            if let Some(signal) = signals.take() {
                return Err(LaunchError::Interrupted { signal });
            }
            if let Some(end) = self.check_round(round)? {
                return Ok(end);
            }
            std::thread::sleep(POLL);
        }
    }

    /// Publishes a failure of this node (the first end published wins).
    pub(crate) fn report_failure(&mut self, round: &Round, description: &str) {
        let end = RoundEnd::Failure(format!("{}: {description}", self.node_id));
        if let Err(e) = self.end_round(round.number, &end) {
            tracing::warn!(%e, "cannot report the failure to the other nodes");
        }
    }

    /// Whether a failure ending `round` leaves no restarts; gives up the job for every node
    /// if so.
    pub(crate) fn out_of_restarts(&mut self, round: &Round, end: &RoundEnd) -> bool {
        let RoundEnd::Failure(why) = end else {
            return false;
        };
        if round.restarts_before < self.max_restarts {
            return false;
        }
        let reason = format!(
            "round {} ended in a failure with no restarts left (--max-restarts {}): {why}",
            round.number, self.max_restarts
        );
        if let Err(e) = self.backend.set_once("abort", reason.as_bytes()) {
            tracing::warn!(%e, "cannot tell the other nodes to stop");
        }
        true
    }

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

    /// Leaves the rendezvous; a signal cuts short a wait for the others to leave.
    pub(crate) fn close(self, signals: &SignalGuard) {
        self.backend.close(signals);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::elastic_settings::Endpoint;
    use crate::plan::node_count::NodeCount;
    use crate::rendezvous_protocol::{PROTOCOL, with_protocol};
    use crate::test_support::wait_until;
    use std::collections::{HashMap, HashSet};
    use std::sync::{Arc, Mutex};

    /// A rendezvous service in memory, shared by the test and the node under test; the
    /// nodes of `.1` are dead (their heartbeats stopped).
    #[derive(Clone, Default)]
    struct Memory(
        Arc<Mutex<HashMap<String, Vec<u8>>>>,
        Arc<Mutex<HashSet<String>>>,
        Arc<Mutex<Option<BeforeWrite>>>,
    );

    /// What runs once, just before a write of its key lands (`.2`): another node's steps in
    /// between this one's.
    type BeforeWrite = (String, Box<dyn FnOnce() + Send>);

    impl Memory {
        /// Runs `then` once, just before the first compare-and-set of `key`.
        fn before_write(&self, key: &str, then: impl FnOnce() + Send + 'static) {
            *self.2.lock().expect("lock") = Some((key.into(), Box::new(then)));
        }

        /// Stops the heartbeats of `node_id`.
        fn kill(&self, node_id: &str) {
            self.1.lock().expect("lock").insert(node_id.into());
        }

        fn set(&self, key: &str, value: &str) {
            let mut map = self.0.lock().expect("lock");
            map.insert(key.into(), value.as_bytes().to_vec());
        }

        fn value(&self, key: &str) -> Option<String> {
            let map = self.0.lock().expect("lock");
            map.get(key)
                .map(|v| String::from_utf8_lossy(v).into_owned())
        }

        /// Another node's launcher joins round 0 as `node_id` (takes a join index, then writes
        /// its id there, as [`Rounds::join`] does); its index.
        fn joined(&self, node_id: &str) -> i64 {
            let index = self.clone().add("r/0/join", 1).expect("join");
            self.set(&format!("r/0/node/{index}"), node_id);
            index
        }

        /// The joiner at `index` (`node_id`) withdraws from round 0, as [`Rounds::withdraw`]
        /// does.
        fn withdrew(&self, index: i64, node_id: &str) {
            self.set(&format!("r/0/left/{index}"), node_id);
            self.clone().add("r/0/left", 1).expect("left");
        }

        /// Waits (at most 300 s) for another thread to write `key`; `never` says what did
        /// not happen.
        fn wait_for(&self, key: &str, never: &str) {
            wait_until(Duration::from_secs(300), never, || {
                self.value(key).is_some()
            });
        }
    }

    impl RendezvousBackend for Memory {
        fn add(&mut self, key: &str, delta: i64) -> Result<i64, BackendError> {
            let mut map = self.0.lock().expect("lock");
            let value = map.get(key).and_then(|v| num::<i64>(v)).unwrap_or(0) + delta;
            map.insert(key.into(), value.to_string().into_bytes());
            Ok(value)
        }

        fn compare_set(
            &mut self,
            key: &str,
            expected: &[u8],
            desired: &[u8],
        ) -> Result<Vec<u8>, BackendError> {
            let hook = {
                let mut hook = self.2.lock().expect("lock");
                match hook.as_ref() {
                    Some((k, _)) if k == key => hook.take(),
                    _ => None,
                }
            };
            if let Some((_, then)) = hook {
                then();
            }
            let mut map = self.0.lock().expect("lock");
            if map.get(key).map_or(expected.is_empty(), |v| v == expected) {
                map.insert(key.into(), desired.to_vec());
            }
            Ok(map.get(key).cloned().unwrap_or_default())
        }

        fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, BackendError> {
            Ok(self.0.lock().expect("lock").get(key).cloned())
        }

        fn start_heartbeat(&mut self, _node_id: &str) -> Result<(), BackendError> {
            Ok(())
        }

        fn dead_nodes(&mut self, node_ids: &[String]) -> Result<Vec<String>, BackendError> {
            let dead = self.1.lock().expect("lock");
            Ok(node_ids
                .iter()
                .filter(|id| dead.contains(*id))
                .cloned()
                .collect())
        }

        fn advertised_host(&self) -> String {
            "127.0.0.1".into()
        }

        fn close(self: Box<Self>, _signals: &SignalGuard) {}
    }

    /// What shapes the tests' jobs (the settings every node must match, less the protocol).
    const SHAPE: &str = "--nnodes 1:2 --nproc-per-node 1 --max-restarts 0";

    fn config() -> String {
        with_protocol(SHAPE)
    }

    /// A job whose round 0 runs with one node (`other:1`), of at most two.
    /// A job whose round 0 is open, nobody in it yet.
    fn new_job() -> Memory {
        let memory = Memory::default();
        for (key, value) in [
            ("config", config().as_str()),
            ("launch_id", "earlier"),
            ("current", "0"),
            ("r/0/restarts", "0"),
        ] {
            memory.set(key, value);
        }
        memory
    }

    /// A job whose round 0 runs with another node.
    fn running_job() -> Memory {
        let memory = new_job();
        memory.joined("other:1");
        memory.set("r/0/closed", "1");
        memory
    }

    fn complete(memory: &Memory) {
        memory.set("r/0/end", &RoundEnd::Completed.encode());
        memory.set("complete", "1");
    }

    /// A node joining the job in `memory`.
    fn node(memory: &Memory, backend: RdzvBackend) -> Rounds {
        node_waiting(memory, backend, Duration::from_secs(600))
    }

    /// [`node`] with a `join_timeout` of its own.
    fn node_waiting(memory: &Memory, backend: RdzvBackend, join_timeout: Duration) -> Rounds {
        node_of(
            memory,
            "late:2",
            backend,
            NodeCount { min: 1, max: 2 },
            Duration::from_secs(1),
            join_timeout,
        )
    }

    /// Node `node_id` of a job of `nodes` nodes, with its own last call and join timeout.
    fn node_of(
        memory: &Memory,
        node_id: &str,
        backend: RdzvBackend,
        nodes: NodeCount,
        last_call: Duration,
        join_timeout: Duration,
    ) -> Rounds {
        let settings = settings(nodes, backend, last_call);
        joining(memory, node_id, settings, &config(), join_timeout)
            .unwrap_or_else(|e| panic!("joining: {e}"))
    }

    /// The elastic settings of the tests' nodes (job `none`, 60 s heartbeat timeout).
    fn settings(nodes: NodeCount, backend: RdzvBackend, last_call: Duration) -> ElasticSettings {
        ElasticSettings {
            nodes,
            backend,
            endpoint: Endpoint {
                host: "127.0.0.1".into(),
                port: 2379,
            },
            job_id: "none".into(),
            last_call,
            heartbeat_timeout: Duration::from_secs(60),
        }
    }

    /// Node `node_id` joining the job in `memory` with the settings `config`.
    fn joining(
        memory: &Memory,
        node_id: &str,
        settings: ElasticSettings,
        config: &str,
        join_timeout: Duration,
    ) -> Result<Rounds, LaunchError> {
        Rounds::new(
            Box::new(memory.clone()),
            settings,
            node_id.into(),
            config,
            "mine",
            0,
            join_timeout,
        )
    }

    fn with_signals<T>(f: impl FnOnce(&SignalGuard) -> T) -> T {
        let _lock = crate::signals::TEST_GUARD_LOCK
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let signals = SignalGuard::install().expect("signals");
        f(&signals)
    }

    /// Running the same command again against the same etcd (the default job id `none`) finds
    /// the earlier job completed: an error saying so, not a success that ran nothing.
    #[test]
    fn a_node_that_finds_its_job_id_completed_before_it_came_fails() {
        for backend in [RdzvBackend::Etcd, RdzvBackend::C10d] {
            let memory = running_job();
            complete(&memory);
            let mut rounds = node(&memory, backend);
            let err = match with_signals(|s| rounds.join(s)) {
                Err(e) => e,
                Ok(_) => panic!("{backend}: joined a completed job"),
            };
            assert_eq!(err.exit_code(), 1, "{err}");
            let text = err.to_string();
            assert!(
                text.contains("job id 'none' already completed before this node joined"),
                "{text}"
            );
            if backend == RdzvBackend::Etcd {
                assert!(text.contains("pass a new --rdzv-id"), "{text}");
            }
        }
        // The node that completed the last round died before it marked the job complete: the
        // newcomer marks it, and fails the same way.
        let memory = running_job();
        memory.set("r/0/end", &RoundEnd::Completed.encode());
        let mut rounds = node(&memory, RdzvBackend::Etcd);
        let err = with_signals(|s| rounds.join(s)).err().expect("an error");
        assert!(err.to_string().contains("already completed"), "{err}");
        assert_eq!(memory.value("complete").as_deref(), Some("1"));
    }

    /// A node that waited for a place while the job ran, and then saw it complete, ends
    /// successfully as before; so does a node that took part in a round of the job.
    #[test]
    fn a_node_that_saw_the_job_run_ends_with_it() {
        let memory = running_job();
        let mut rounds = node(&memory, RdzvBackend::Etcd);
        let completer = {
            let memory = memory.clone();
            std::thread::spawn(move || {
                // The node asked to join the running round: it saw the job unfinished.
                memory.wait_for("r/0/waiting", "the node never asked to join");
                complete(&memory);
            })
        };
        let joined = with_signals(|s| rounds.join(s));
        completer.join().expect("completer");
        assert!(
            matches!(joined, Ok(Joined::JobOver(Ok(())))),
            "{:?}",
            joined.err()
        );

        let memory = running_job();
        let mut rounds = node(&memory, RdzvBackend::Etcd);
        rounds.local_history.push(ElasticRound {
            round: 0,
            nodes: vec!["late:2".into()],
            end: None,
            failure: false,
            left: Vec::new(),
        });
        complete(&memory);
        let joined = with_signals(|s| rounds.join(s));
        assert!(
            matches!(joined, Ok(Joined::JobOver(Ok(())))),
            "{:?}",
            joined.err()
        );
    }

    /// A join timeout shorter than the last call: once the minimum joined, the last call
    /// closes the round; the timeout no longer fails the node ("only 1 of at least 1").
    #[test]
    fn a_round_with_its_minimum_waits_out_the_last_call_past_the_join_timeout() {
        let memory = new_job();
        let mut rounds = node_waiting(&memory, RdzvBackend::C10d, Duration::from_millis(100));
        let round = round_of(with_signals(|s| rounds.join(s)));
        assert_eq!(round.members, ["late:2"]);
    }

    /// A job of 2 to 3 nodes whose round 0 has `first:1` in it (alive throughout).
    fn job_with_first_node() -> Memory {
        let memory = new_job();
        memory.joined("first:1");
        memory
    }

    const TWO_TO_THREE: NodeCount = NodeCount { min: 2, max: 3 };

    /// A node of a 2-to-3-node job that closes its round after a last call of 1 s.
    fn closing_node(memory: &Memory, node_id: &str, join_timeout: Duration) -> Rounds {
        node_of(
            memory,
            node_id,
            RdzvBackend::C10d,
            TWO_TO_THREE,
            Duration::from_secs(1),
            join_timeout,
        )
    }

    /// Joins round 0 as `node_id` and waits for it to close; the round it got.
    fn join_round(memory: &Memory, node_id: &str) -> Round {
        let mut rounds = closing_node(memory, node_id, Duration::from_secs(600));
        round_of(with_signals(|s| rounds.join(s)))
    }

    /// The round a node joined; fails the test if it found the job over or failed.
    fn round_of(joined: Result<Joined, LaunchError>) -> Round {
        match joined {
            Ok(Joined::Round(round)) => round,
            Ok(Joined::JobOver(over)) => panic!("the job is over: {over:?}"),
            Err(e) => panic!("{e}"),
        }
    }

    /// `round` closed with `members`, this node at `node_rank`, and the store records the
    /// close (the members' join indices, `closed`).
    fn assert_closed(
        memory: &Memory,
        round: &Round,
        members: [&str; 2],
        node_rank: usize,
        closed: &str,
    ) {
        assert_eq!(round.members, members);
        assert_eq!(round.node_rank, node_rank);
        assert_eq!(memory.value("r/0/closed").as_deref(), Some(closed));
    }

    /// A launcher interrupted (SIGTERM) while the round waits out its last call withdraws: the
    /// round closes without it, with the others ranked densely, and runs.
    #[test]
    fn a_node_interrupted_during_the_last_call_is_not_a_member() {
        let memory = job_with_first_node();
        // The leaver's own last call never ends: the signal comes first.
        let mut leaver = node_of(
            &memory,
            "leaver:2",
            RdzvBackend::C10d,
            TWO_TO_THREE,
            Duration::from_secs(600),
            Duration::from_secs(600),
        );
        let interrupted = with_signals(|s| {
            let raiser = {
                let memory = memory.clone();
                std::thread::spawn(move || {
                    memory.wait_for("r/0/node/2", "the leaver never joined");
                    // SAFETY: the test's guard handles SIGTERM (it only sets a flag).
                    unsafe { libc::raise(libc::SIGTERM) };
                })
            };
            let joined = leaver.join(s);
            raiser.join().expect("raiser");
            joined
        });
        assert!(
            matches!(
                interrupted,
                Err(LaunchError::Interrupted {
                    signal: libc::SIGTERM
                })
            ),
            "{:?}",
            interrupted.as_ref().err()
        );
        assert_eq!(memory.value("r/0/left/2").as_deref(), Some("leaver:2"));
        assert_eq!(memory.value("r/0/closed"), None);

        let round = join_round(&memory, "late:3");
        assert_closed(&memory, &round, ["first:1", "late:3"], 1, "1,3");
        assert_eq!(memory.value("r/0/end"), None, "the round runs");
        // Every launcher reads the same members, the history too.
        let mut first = closing_node(&memory, "first:1", Duration::from_secs(600));
        let read = with_signals(|s| first.read_round(0, 0, &[1, 3], s)).expect("read");
        assert_eq!(read.members, round.members);
        let history = first.history();
        assert_eq!(history[0].nodes, ["first:1", "late:3"]);
    }

    /// A launcher that joined and died silently during the last call (its heartbeats
    /// stopped) is not a member of the round that closes.
    #[test]
    fn a_node_dead_during_the_last_call_is_not_a_member() {
        let memory = job_with_first_node();
        memory.joined("dead:2");
        memory.kill("dead:2");
        let round = join_round(&memory, "late:3");
        assert_closed(&memory, &round, ["first:1", "late:3"], 1, "1,3");
    }

    /// With the leaver gone, fewer than MIN live nodes remain: the round does not close, and
    /// closes once another node joins.
    #[test]
    fn a_round_short_of_its_minimum_after_a_leaver_waits_for_another_node() {
        let memory = new_job();
        let gone = memory.joined("gone:1");
        memory.withdrew(gone, "gone:1");
        let joiner = {
            let memory = memory.clone();
            std::thread::spawn(move || {
                memory.wait_for("r/0/node/2", "the node never joined");
                // Longer than the last call: a round closing with 2 joined would close by now.
                std::thread::sleep(Duration::from_secs(2));
                let closed = memory.value("r/0/closed");
                memory.joined("third:3");
                closed
            })
        };
        let round = join_round(&memory, "late:2");
        let closed_early = joiner.join().expect("joiner");
        assert_eq!(closed_early, None, "closed with a leaver");
        assert_closed(&memory, &round, ["late:2", "third:3"], 0, "2,3");
    }

    /// ... and fails at the join timeout if no other node comes, saying why: of the joiners,
    /// the dead and the withdrawn are gone, one that has not written its id yet is not.
    #[test]
    fn a_round_short_of_its_minimum_after_a_leaver_fails_at_the_join_timeout() {
        let memory = new_job();
        memory.joined("dead:1");
        memory.kill("dead:1");
        let gone = memory.joined("gone:2");
        memory.withdrew(gone, "gone:2");
        // Joiner 3 bumped the counter and has not written its id (within the heartbeat
        // timeout): pending, neither live nor gone.
        memory.set("r/0/join", "3");
        let mut rounds = closing_node(&memory, "late:4", Duration::from_secs(2));
        let err = match with_signals(|s| rounds.join(s)) {
            Err(e) => e,
            Ok(_) => panic!("joined a round short of its minimum"),
        };
        let text = err.to_string();
        assert!(
            text.contains("only 1 of at least 2 nodes joined round 0")
                && text.contains("(4 joined, 2 of them left or sent no heartbeat while it waited)"),
            "{text}"
        );
        assert_eq!(memory.value("r/0/closed"), None);
    }

    /// A launcher that withdraws just after the round closed with it ends the round, so that
    /// the others re-form at once instead of waiting for its heartbeats to stop; no worker ran,
    /// so no restart is spent (with `--max-restarts 0` a failure would end the job).
    #[test]
    fn a_member_that_withdraws_after_the_round_closed_ends_it() {
        let memory = job_with_first_node();
        memory.joined("leaver:2");
        memory.set("r/0/closed", "1,2");
        let mut leaver = closing_node(&memory, "leaver:2", Duration::from_secs(600));
        leaver.withdraw(0, 2, libc::SIGINT);
        let end = memory.value("r/0/end").expect("the round ended");
        assert_eq!(
            end,
            "left|leaver:2 was interrupted by SIGINT before round 0 started"
        );
        assert_next_round_without_a_restart(&memory);
    }

    /// Round 0 ended and round 1 opened with no restart spent, the job not given up (its
    /// nodes have `--max-restarts 0`).
    fn assert_next_round_without_a_restart(memory: &Memory) {
        let end = RoundEnd::decode(memory.value("r/0/end").expect("ended").as_bytes());
        let mut first = closing_node(memory, "first:1", Duration::from_secs(600));
        first.advance(0, &end).expect("advance");
        assert_eq!(memory.value("abort"), None, "the job gave up");
        assert_eq!(memory.value("current").as_deref(), Some("1"));
        assert_eq!(memory.value("r/1/restarts").as_deref(), Some("0"));
        let round = Round {
            number: 0,
            node_rank: 0,
            members: vec!["first:1".into()],
            restarts_before: 0,
        };
        assert!(!first.out_of_restarts(&round, &end), "{end:?}");
    }

    /// A withdrawal races the close: the closer read the joiners (the leaver live), the
    /// leaver then withdrew and found the round still open, and the close landed with the
    /// leaver in it. The closer reads the members' withdrawals after its close, finds the
    /// leaver's, and ends the round (a member left, no restart spent); it forms the next
    /// round without the leaver.
    #[test]
    fn a_withdrawal_racing_the_close_ends_the_round_without_spending_a_restart() {
        let memory = job_with_first_node();
        memory.joined("leaver:2");
        let mut leaver = closing_node(&memory, "leaver:2", Duration::from_secs(600));
        let leaver_saw = Arc::new(Mutex::new(None));
        {
            let memory = memory.clone();
            let leaver_saw = Arc::clone(&leaver_saw);
            memory.clone().before_write("r/0/closed", move || {
                leaver.withdraw(0, 2, libc::SIGTERM);
                *leaver_saw.lock().expect("lock") =
                    Some((memory.value("r/0/closed"), memory.value("r/0/end")));
            });
        }
        // A 1-to-3-node job: with three live joiners, the closer closes at once.
        let mut closer = node_of(
            &memory,
            "late:3",
            RdzvBackend::C10d,
            NodeCount { min: 1, max: 3 },
            Duration::from_secs(1),
            Duration::from_secs(600),
        );
        let joined = with_signals(|s| closer.join(s));
        assert_eq!(
            *leaver_saw.lock().expect("lock"),
            Some((None, None)),
            "the leaver withdrew before the close landed, and saw the round open"
        );
        assert_eq!(memory.value("r/0/left/2").as_deref(), Some("leaver:2"));
        assert_eq!(
            memory.value("r/0/closed").as_deref(),
            Some("1,2,3"),
            "the close missed the withdrawal"
        );
        assert_eq!(
            memory.value("r/0/end").as_deref(),
            Some("left|leaver:2 withdrew from round 0 as it closed, before it started")
        );
        let round = round_of(joined);
        assert_eq!(round.number, 1, "ran the round with the leaver in it");
        assert_eq!(round.members, ["late:3"]);
        assert_eq!(round.restarts_before, 0);
        assert_eq!(memory.value("abort"), None);
        assert_eq!(memory.value("r/1/restarts").as_deref(), Some("0"));
    }

    /// Joins the job in `memory` with the settings `config`; the refusal.
    fn refused_with(memory: &Memory, config: &str) -> String {
        let settings = settings(
            NodeCount { min: 1, max: 2 },
            RdzvBackend::C10d,
            Duration::from_secs(1),
        );
        match joining(memory, "late:2", settings, config, Duration::from_secs(600)) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("joined a job set up with other settings"),
        }
    }

    /// A job set up by a launcher from before the protocol was versioned (whose `config` has
    /// no version, and whose `closed` is a count) refuses this one, naming both versions; so
    /// does a job of another version. Other settings of the same version: the settings named.
    #[test]
    fn a_node_of_another_rendezvous_protocol_is_refused_naming_the_versions() {
        let memory = new_job();
        memory.set("config", SHAPE);
        let text = refused_with(&memory, &config());
        assert!(
            text.contains(&format!(
                "the first node's launcher speaks rendezvous protocol 1 (a ddp-launch from before the versions were recorded), this one rendezvous protocol {PROTOCOL}"
            )) && text.contains("every node must use the same settings"),
            "{text}"
        );

        let memory = new_job();
        memory.set("config", &format!("{SHAPE} (rendezvous protocol 99)"));
        let text = refused_with(&memory, &config());
        assert!(
            text.contains(&format!(
                "speaks rendezvous protocol 99, this one rendezvous protocol {PROTOCOL}:"
            )),
            "{text}"
        );

        let memory = new_job();
        let other = with_protocol("--nnodes 1:2 --nproc-per-node 1 --max-restarts 2");
        let text = refused_with(&memory, &other);
        assert!(
            text.contains(&format!(
                "the first node runs with {SHAPE} but this node with --nnodes 1:2 --nproc-per-node 1 --max-restarts 2: every node must use the same settings"
            )),
            "{text}"
        );
    }

    #[test]
    fn round_ends_survive_the_store_and_say_what_happened() {
        for end in [
            RoundEnd::Failure("node a: rank 1 exited with code 1".into()),
            RoundEnd::NodeJoined("1 node(s) asked to join".into()),
            RoundEnd::MemberLeft("a:1 was interrupted by SIGTERM before round 0 started".into()),
            RoundEnd::Completed,
        ] {
            assert_eq!(RoundEnd::decode(end.encode().as_bytes()), end);
        }
        assert!(
            RoundEnd::Failure("x | y".into())
                .describe()
                .starts_with("failure: x | y")
        );
    }
}
