//! The round protocol over a [`RendezvousBackend`]: launchers join numbered rounds, each round
//! closes with its members (ranked in join order), runs until a node fails, leaves or asks to
//! join, and the survivors then form the next round.
//!
//! Keys (scoped to the job):
//! - `config`: the first launcher's settings; the others must match;
//! - `launch_id`: the first launcher's launch id, which every launcher's workers get;
//! - `current`: the open or running round; `complete` / `abort`: the job's end;
//! - `r/<n>/join` (counter), `r/<n>/node/<i>` (the i-th joiner's id), `r/<n>/closed` (member
//!   count, first writer wins), `r/<n>/restarts` (failed rounds before it), `r/<n>/master`
//!   (the workers' store, from node 0 of the round), `r/<n>/waiting` (nodes that want in),
//!   `r/<n>/finished` (nodes whose workers all succeeded), `r/<n>/end` (why it ended, first
//!   writer wins).
//!
//! A round closes once MAX nodes joined, or MIN did and the last call (`--rdzv-last-call`)
//! passed with no more. A launcher that finds the current round closed without it, waits: it
//! asks to join when the round has room (the members then end it and re-form), and joins the
//! next round when one opens.
//!
//! A launcher that dies or is interrupted after joining a round that has not closed yet stays
//! counted in it; the others find it dead by its heartbeats once the round runs, and re-form.

use super::backend::{BackendError, RendezvousBackend};
use crate::error::LaunchError;
use crate::plan::elastic_settings::ElasticSettings;
use crate::plan::node_count::RdzvBackend;
use crate::round_summary::ElasticRound;
use crate::signals::SignalGuard;
use crate::summary::FailureCause;
use std::time::{Duration, Instant};

/// How often a launcher reads the rendezvous while waiting or supervising.
const POLL: Duration = Duration::from_millis(100);

/// A round this node is a member of.
#[derive(Debug, Clone)]
pub(crate) struct Round {
    pub(crate) number: u32,
    /// This node's rank in the round (its join order).
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
    /// Every member's workers succeeded: the job is done.
    Completed,
}

impl RoundEnd {
    fn encode(&self) -> String {
        match self {
            RoundEnd::Failure(why) => format!("failure|{why}"),
            RoundEnd::NodeJoined(why) => format!("joined|{why}"),
            RoundEnd::Completed => "completed|every node's workers succeeded".into(),
        }
    }

    fn decode(raw: &[u8]) -> RoundEnd {
        let text = String::from_utf8_lossy(raw);
        match text.split_once('|') {
            Some(("joined", why)) => RoundEnd::NodeJoined(why.to_string()),
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
                "the first node runs with {} but this node with {config}: every node must use the same settings{}",
                String::from_utf8_lossy(&theirs),
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
                let members: usize = num(&members).unwrap_or(0);
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
    /// without this node (too many joined).
    fn wait_for_close(
        &mut self,
        r: u32,
        index: usize,
        signals: &SignalGuard,
    ) -> Result<Option<Round>, LaunchError> {
        let nodes = self.settings.nodes;
        let deadline = Instant::now() + self.join_timeout;
        let mut min_reached: Option<Instant> = None;
        loop {
            if let Some(signal) = signals.take() {
                return Err(LaunchError::Interrupted { signal });
            }
            if let Some(closed) = self.get(&format!("r/{r}/closed"))? {
                let count: usize = num(&closed).unwrap_or(0);
                if index > count {
                    tracing::info!(round = r, "the round closed without this node");
                    return Ok(None);
                }
                return self.read_round(r, index - 1, count, signals).map(Some);
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
            let close_at = if joined >= nodes.max {
                Some(nodes.max)
            } else if joined >= nodes.min {
                let since = *min_reached.get_or_insert_with(Instant::now);
                (since.elapsed() >= self.settings.last_call).then_some(joined)
            } else {
                None
            };
            if let Some(count) = close_at {
                self.backend
                    .set_once(&format!("r/{r}/closed"), count.to_string().as_bytes())
                    .map_err(|e| self.lost(e))?;
                continue;
            }
            // Once enough nodes joined, the last call closes the round: the join timeout is
            // for a round that cannot start.
            if Instant::now() >= deadline && joined < nodes.min {
                return Err(self.error(format!(
                    "only {joined} of at least {} nodes joined round {r} within {:?} (--join-timeout)",
                    nodes.min, self.join_timeout
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// The members of closed round `r` (their ids appear right after they joined).
    fn read_round(
        &mut self,
        r: u32,
        node_rank: usize,
        count: usize,
        signals: &SignalGuard,
    ) -> Result<Round, LaunchError> {
        let deadline = Instant::now() + self.join_timeout;
        let mut members = Vec::with_capacity(count);
        for i in 1..=count {
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
            let Some(count) = self.get(&format!("r/{r}/closed"))?.and_then(|v| num(&v)) else {
                continue;
            };
            let count: usize = count;
            let mut nodes = Vec::with_capacity(count);
            for i in 1..=count {
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
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    /// A rendezvous service in memory, shared by the test and the node under test.
    #[derive(Clone, Default)]
    struct Memory(Arc<Mutex<HashMap<String, Vec<u8>>>>);

    impl Memory {
        fn set(&self, key: &str, value: &str) {
            let mut map = self.0.lock().expect("lock");
            map.insert(key.into(), value.as_bytes().to_vec());
        }

        fn value(&self, key: &str) -> Option<String> {
            let map = self.0.lock().expect("lock");
            map.get(key)
                .map(|v| String::from_utf8_lossy(v).into_owned())
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

        fn dead_nodes(&mut self, _node_ids: &[String]) -> Result<Vec<String>, BackendError> {
            Ok(Vec::new())
        }

        fn advertised_host(&self) -> String {
            "127.0.0.1".into()
        }

        fn close(self: Box<Self>, _signals: &SignalGuard) {}
    }

    const CONFIG: &str = "--nnodes 1:2 --nproc-per-node 1 --max-restarts 0";

    /// A job whose round 0 runs with one node (`other:1`), of at most two.
    /// A job whose round 0 is open, nobody in it yet.
    fn new_job() -> Memory {
        let memory = Memory::default();
        for (key, value) in [
            ("config", CONFIG),
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
        for (key, value) in [
            ("r/0/join", "1"),
            ("r/0/node/1", "other:1"),
            ("r/0/closed", "1"),
        ] {
            memory.set(key, value);
        }
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
        let settings = ElasticSettings {
            nodes: NodeCount { min: 1, max: 2 },
            backend,
            endpoint: Endpoint {
                host: "127.0.0.1".into(),
                port: 2379,
            },
            job_id: "none".into(),
            last_call: Duration::from_secs(1),
            heartbeat_timeout: Duration::from_secs(60),
        };
        Rounds::new(
            Box::new(memory.clone()),
            settings,
            "late:2".into(),
            CONFIG,
            "mine",
            0,
            join_timeout,
        )
        .unwrap_or_else(|e| panic!("joining: {e}"))
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
                let deadline = Instant::now() + Duration::from_secs(300);
                while memory.value("r/0/waiting").is_none() {
                    assert!(Instant::now() < deadline, "the node never asked to join");
                    std::thread::sleep(Duration::from_millis(10));
                }
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
        let joined = with_signals(|s| rounds.join(s));
        match joined {
            Ok(Joined::Round(round)) => assert_eq!(round.members, ["late:2"]),
            Ok(_) => panic!("the job is not over"),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn round_ends_survive_the_store_and_say_what_happened() {
        for end in [
            RoundEnd::Failure("node a: rank 1 exited with code 1".into()),
            RoundEnd::NodeJoined("1 node(s) asked to join".into()),
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
