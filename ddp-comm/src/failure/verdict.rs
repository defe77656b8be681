//! [`WatchdogFailure`]: what a watchdog found when it failed a group, and who is to blame.

use super::label::CollectiveLabel;
use super::progress::{PeerProgress, ranks_behind, ranks_finished};
use std::fmt;
use std::time::Duration;

/// The collective a watchdog failed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StuckWork {
    /// Its sequence number in the group (the first collective is 1).
    pub seq: u64,
    /// What it is.
    pub label: CollectiveLabel,
    /// Bytes it carries on this rank.
    pub bytes: usize,
    /// How long it had been in flight when the watchdog gave up.
    pub waited: Duration,
}

/// Why the watchdog failed the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchdogCause {
    /// An item was still incomplete after the timeout.
    Timeout(Duration),
    /// An error on this rank: an item's probe reported one (a CUDA error querying its event),
    /// or the caller did ([`Watchdog::fail`](crate::watchdog::Watchdog::fail), e.g. a failed enqueue).
    /// No peer is blamed for it.
    Failed(String),
    /// The communicator's async-error probe reported an error.
    AsyncError(String),
    /// Another rank's watchdog failed the group first; what it published
    /// (`watchdog/<group>/failed`: its own error, naming it and the cause).
    PeerFailed(String),
    /// The watchdog's own polling thread was inside one call (`inside`: a completion probe, a
    /// CUDA event query, or the async-error probe) for `waited`, longer than its
    /// [stall limit](crate::watchdog::WatchdogConfig::stall_limit): a hung driver or NCCL call
    /// on this rank, during which no timeout could fire. No peer is blamed for it.
    Stalled {
        /// What the polling thread was inside.
        inside: String,
        /// How long it had been there.
        waited: Duration,
    },
    /// While this rank waited on a collective, the heartbeat of `ranks` stood still for
    /// `silent_for` (at least the
    /// [silence limit](crate::watchdog::WatchdogConfig::silence_limit)): their processes died
    /// or froze (a kill, the OOM killer, a host down, a stop signal).
    PeerSilent {
        /// The silent ranks.
        ranks: Vec<usize>,
        /// How long the shortest-silent of them had been silent.
        silent_for: Duration,
    },
}

/// The error a [`Watchdog`](crate::watchdog::Watchdog) gives every waiter and every later call once it
/// has failed its group; reaches callers as [`CommError::Watchdog`](crate::CommError::Watchdog).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchdogFailure {
    /// The group's name.
    pub group: String,
    /// The rank that reports.
    pub rank: usize,
    /// Why it failed.
    pub cause: WatchdogCause,
    /// The collective the failure is about: the one that timed out or whose probe failed, the
    /// oldest in flight when the communicator or a peer failed; none for an error outside any
    /// collective ([`Watchdog::fail`](crate::watchdog::Watchdog::fail)).
    pub stuck: Option<StuckWork>,
    /// Every rank's progress, as far as the store told.
    pub peers: PeerProgress,
}

impl WatchdogFailure {
    /// The ranks that never issued the stuck collective (empty when none is known to be
    /// behind, when the peers' progress is unknown, and for a failure on this rank).
    pub fn ranks_behind(&self) -> Vec<usize> {
        match (&self.cause, &self.stuck, &self.peers) {
            (
                WatchdogCause::Failed(_)
                | WatchdogCause::PeerFailed(_)
                | WatchdogCause::Stalled { .. },
                _,
                _,
            ) => Vec::new(),
            (_, Some(stuck), PeerProgress::Known(peers)) => ranks_behind(peers, stuck.seq),
            _ => Vec::new(),
        }
    }
}

impl WatchdogFailure {
    /// What failed and why, without the peers' progress: what the first failing rank publishes
    /// for the others (`watchdog/<group>/failed`) before it aborts and reads the store.
    pub fn headline(&self) -> String {
        struct Headline<'a>(&'a WatchdogFailure);
        impl fmt::Display for Headline<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.write_headline(f)
            }
        }
        Headline(self).to_string()
    }

    fn write_headline(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "group '{}' rank {}: ", self.group, self.rank)?;
        match &self.stuck {
            Some(s) => {
                write!(f, "{} #{}", s.label.op, s.seq)?;
                if let Some(b) = s.label.bucket {
                    write!(f, " (bucket {b}, {} bytes)", s.bytes)?;
                } else {
                    write!(f, " ({} bytes)", s.bytes)?;
                }
                match &self.cause {
                    WatchdogCause::Timeout(t) => write!(
                        f,
                        " did not finish within the timeout of {t:?} (in flight for {:.1?})",
                        s.waited
                    )?,
                    WatchdogCause::Failed(why) => {
                        write!(f, " failed after {:.1?}: {why}", s.waited)?
                    }
                    WatchdogCause::AsyncError(why) => write!(
                        f,
                        " was in flight for {:.1?} when the communicator failed: {why}",
                        s.waited
                    )?,
                    WatchdogCause::PeerFailed(why) => write!(
                        f,
                        " was in flight for {:.1?} when another rank failed the group [{why}]",
                        s.waited
                    )?,
                    WatchdogCause::PeerSilent { ranks, silent_for } => write!(
                        f,
                        " was in flight for {:.1?} when rank(s) {ranks:?} had published no heartbeat for {silent_for:.1?}",
                        s.waited
                    )?,
                    WatchdogCause::Stalled { inside, waited } => write!(
                        f,
                        " was in flight for {:.1?} when the watchdog's call into {inside} had not returned after {waited:.1?} (a hung CUDA or NCCL call on this rank; no timeout can fire while it lasts)",
                        s.waited
                    )?,
                }
            }
            None => match &self.cause {
                WatchdogCause::AsyncError(why) => {
                    write!(f, "the communicator failed with nothing in flight: {why}")?
                }
                WatchdogCause::Failed(why) => write!(f, "failed: {why}")?,
                WatchdogCause::PeerFailed(why) => {
                    write!(f, "another rank failed the group [{why}]")?
                }
                WatchdogCause::Timeout(t) => write!(f, "timed out after {t:?}")?,
                WatchdogCause::PeerSilent { ranks, silent_for } => write!(
                    f,
                    "rank(s) {ranks:?} had published no heartbeat for {silent_for:.1?}"
                )?,
                WatchdogCause::Stalled { inside, waited } => write!(
                    f,
                    "the watchdog's call into {inside} had not returned after {waited:.1?} (a hung CUDA or NCCL call on this rank; no timeout can fire while it lasts)"
                )?,
            },
        }
        Ok(())
    }
}

impl fmt::Display for WatchdogFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_headline(f)?;
        write!(f, "; the communicator was aborted. ")?;
        if let WatchdogCause::PeerFailed(_) = &self.cause {
            write!(
                f,
                "The cause is that rank's (in brackets; its own error says more)."
            )?;
            // What this rank saw too: the ranks that never issued its oldest collective. The
            // first failing rank publishes its headline before it reads anyone's progress, so
            // a rank that learns of the failure from it may be the only one to name them.
            if let (Some(stuck), PeerProgress::Known(peers)) = (&self.stuck, &self.peers) {
                let behind = ranks_behind(peers, stuck.seq);
                if !behind.is_empty() {
                    write!(f, " ")?;
                    write_behind(f, "Behind on this rank's side", peers, &behind, stuck.seq)?;
                }
            }
            return Ok(());
        }
        if let WatchdogCause::Failed(_) | WatchdogCause::Stalled { .. } = &self.cause {
            // Peers that have not reached this rank's collectives are waiting for it, not
            // behind it: naming them would send the reader to the wrong logs.
            return write!(
                f,
                "The error arose on this rank; the other ranks are told through the store and abort too."
            );
        }
        if let WatchdogCause::PeerSilent { ranks, .. } = &self.cause {
            return write!(
                f,
                "Their processes died, froze or left the group (a kill, the OOM killer, a host down, a stop signal, or a rank that finished and destroyed its group while this one still issued collectives): check the hosts and logs of rank(s) {ranks:?}."
            );
        }
        let Some(stuck) = &self.stuck else {
            return write!(f, "Check the other ranks' logs.");
        };
        match &self.peers {
            PeerProgress::Unknown(why) => write!(
                f,
                "The other ranks' progress is unknown ({why}); check their logs."
            ),
            PeerProgress::Known(peers) => {
                let behind = ranks_behind(peers, stuck.seq);
                if !behind.is_empty() {
                    write_behind(f, "Behind", peers, &behind, stuck.seq)
                } else {
                    let finished = ranks_finished(peers, stuck.seq);
                    if finished.is_empty() {
                        write!(
                            f,
                            "Every rank issued #{} and none finished it: a network or NCCL failure (set NCCL_DEBUG=WARN)",
                            stuck.seq
                        )
                    } else {
                        write!(
                            f,
                            "Every rank issued #{}; rank(s) {finished:?} finished it and the others did not: a network or NCCL failure (set NCCL_DEBUG=WARN)",
                            stuck.seq
                        )
                    }
                }
            }
        }
    }
}

/// "`lead`: rank 1 (issued up to #5), ... never issued #7: ...".
fn write_behind(
    f: &mut fmt::Formatter<'_>,
    lead: &str,
    peers: &[super::progress::RankProgress],
    behind: &[usize],
    seq: u64,
) -> fmt::Result {
    write!(f, "{lead}: ")?;
    for (i, r) in behind.iter().enumerate() {
        let p = peers.iter().find(|p| p.rank == *r);
        let sep = if i == 0 { "" } else { ", " };
        match p.and_then(|p| p.issued) {
            Some(issued) => write!(f, "{sep}rank {r} (issued up to #{issued})")?,
            None => write!(f, "{sep}rank {r} (never issued a collective)")?,
        }
    }
    write!(
        f,
        " never issued #{seq}: they are stuck before it (compute, data loading, a different code path) or dead; check their logs"
    )
}

impl std::error::Error for WatchdogFailure {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::RankProgress;

    fn failure(peers: PeerProgress) -> WatchdogFailure {
        WatchdogFailure {
            group: "world".into(),
            rank: 0,
            cause: WatchdogCause::Timeout(Duration::from_secs(600)),
            stuck: Some(StuckWork {
                seq: 7,
                label: CollectiveLabel::new("all_reduce").with_bucket(2),
                bytes: 1024,
                waited: Duration::from_secs(600),
            }),
            peers,
        }
    }

    fn rank(rank: usize, issued: Option<u64>) -> RankProgress {
        RankProgress {
            rank,
            issued,
            completed: issued.map(|i| i.saturating_sub(1)),
        }
    }

    /// [`failure`] with every rank's progress known: rank `r` issued up to `issued[r]`.
    fn failure_with_issued(issued: &[Option<u64>]) -> WatchdogFailure {
        let peers = issued.iter().enumerate().map(|(r, &i)| rank(r, i));
        failure(PeerProgress::Known(peers.collect()))
    }

    fn assert_mentions(msg: &str, part: &str) {
        assert!(msg.contains(part), "{msg}");
    }

    #[test]
    fn should_say_which_ranks_never_published_or_are_behind() {
        let f = failure_with_issued(&[Some(7), Some(5), None]);
        assert_eq!(f.ranks_behind(), vec![1, 2]);
        let msg = f.to_string();
        assert!(
            msg.starts_with("group 'world' rank 0: all_reduce #7 (bucket 2, 1024 bytes) did not finish within the timeout of 600s"),
            "{msg}"
        );
        assert_mentions(
            &msg,
            "Behind: rank 1 (issued up to #5), rank 2 (never issued a collective) never issued #7",
        );
    }

    #[test]
    fn should_blame_no_peer_for_a_failure_on_this_rank() {
        let mut f = failure_with_issued(&[Some(7), Some(5)]);
        f.cause = WatchdogCause::Failed("CUDA_ERROR_ILLEGAL_ADDRESS".into());
        assert!(f.ranks_behind().is_empty());
        let msg = f.to_string();
        assert_mentions(&msg, "failed after 600.0s: CUDA_ERROR_ILLEGAL_ADDRESS");
        assert_mentions(&msg, "The error arose on this rank");
        assert!(!msg.contains("Behind"), "{msg}");
        f.stuck = None;
        assert!(
            f.to_string()
                .starts_with("group 'world' rank 0: failed: CUDA_ERROR_ILLEGAL_ADDRESS;"),
            "{f}"
        );
    }

    /// A rank that learns of the failure from the first failing rank's report (which names no
    /// rank behind: it is published before anyone's progress is read) still names the ranks
    /// that never issued its own oldest collective, without blaming them for the failure.
    #[test]
    fn should_name_the_ranks_behind_when_a_peer_failed_the_group_first() {
        let mut f = failure_with_issued(&[Some(7), Some(5), Some(7)]);
        f.rank = 2;
        f.cause = WatchdogCause::PeerFailed("group 'world' rank 0: all_reduce #7 timed out".into());
        assert!(f.ranks_behind().is_empty(), "the failure is rank 0's");
        let msg = f.to_string();
        assert_mentions(
            &msg,
            "when another rank failed the group [group 'world' rank 0",
        );
        assert_mentions(
            &msg,
            "Behind on this rank's side: rank 1 (issued up to #5) never issued #7",
        );
        f.peers = PeerProgress::Known(vec![rank(0, Some(7)), rank(1, Some(7))]);
        assert!(!f.to_string().contains("Behind"), "{f}");
    }

    #[test]
    fn should_say_when_the_peers_progress_is_unknown() {
        let f = failure(PeerProgress::Unknown(
            "the store did not answer within 900ms".into(),
        ));
        assert!(f.ranks_behind().is_empty());
        assert!(
            f.to_string()
                .contains("progress is unknown (the store did not answer within 900ms)"),
            "{f}"
        );
    }
}
