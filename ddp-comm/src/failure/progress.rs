//! How a rank's progress travels through the store, and what the peers' progress says about a
//! stuck collective.

/// The store namespace of one run of `group`'s watchdog: `watchdog/<group>/` for the first run
/// on a store, `watchdog@<n>/<group>/` for the `n`-th, so that a watchdog started again under
/// the same name never reads an earlier run's progress or failure (no first run's key starts
/// with `watchdog@`).
pub(crate) fn scope(group: &str, generation: u64) -> String {
    if generation <= 1 {
        format!("watchdog/{group}/")
    } else {
        format!("watchdog@{generation}/{group}/")
    }
}

/// The store counter of `rank`'s runs of `group`'s watchdog (its generations).
pub(crate) fn starts_key(group: &str, rank: usize) -> String {
    format!("watchdog@starts/{group}/{rank}")
}

/// The store key of `rank`'s progress in a run's [`scope`].
pub(crate) fn key(scope: &str, rank: usize) -> String {
    format!("{scope}{rank}")
}

/// The store key where the first rank whose watchdog failed a run's [`scope`] says why.
pub(crate) fn failed_key(scope: &str) -> String {
    format!("{scope}failed")
}

/// Last issued and last completed sequence numbers (0: none yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Progress {
    pub(crate) issued: u64,
    pub(crate) completed: u64,
}

impl Progress {
    /// The value stored under [`key`]: `"<issued> <completed>"`, readable with any store tool.
    pub(crate) fn encode(self) -> Vec<u8> {
        format!("{} {}", self.issued, self.completed).into_bytes()
    }

    /// Parses [`Progress::encode`]'s output; `None` for anything else.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Progress> {
        let text = std::str::from_utf8(bytes).ok()?;
        let (issued, completed) = text.split_once(' ')?;
        Some(Progress {
            issued: issued.parse().ok()?,
            completed: completed.parse().ok()?,
        })
    }
}

/// One rank's progress as it published it in the store (`None`: it never published).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankProgress {
    /// The rank.
    pub rank: usize,
    /// Its last issued sequence number.
    pub issued: Option<u64>,
    /// Its last completed sequence number.
    pub completed: Option<u64>,
}

/// What the store said about every rank's progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerProgress {
    /// Every rank's entry, in rank order.
    Known(Vec<RankProgress>),
    /// The store could not be read in time; why.
    Unknown(String),
}

/// The ranks that never issued collective `seq`: their published `issued` is below it, or
/// they never published (counted as having issued nothing).
pub(crate) fn ranks_behind(peers: &[RankProgress], seq: u64) -> Vec<usize> {
    peers
        .iter()
        .filter(|p| p.issued.unwrap_or(0) < seq)
        .map(|p| p.rank)
        .collect()
}

/// The ranks whose published progress says they finished collective `seq`.
pub(crate) fn ranks_finished(peers: &[RankProgress], seq: u64) -> Vec<usize> {
    peers
        .iter()
        .filter(|p| p.completed.unwrap_or(0) >= seq)
        .map(|p| p.rank)
        .collect()
}

/// Replaces this rank's published entry by what it knows locally (fresher than the store).
pub(crate) fn with_own(peers: PeerProgress, rank: usize, own: Progress) -> PeerProgress {
    match peers {
        PeerProgress::Known(mut list) => {
            for p in &mut list {
                if p.rank == rank {
                    p.issued = Some(own.issued);
                    p.completed = Some(own.completed);
                }
            }
            PeerProgress::Known(list)
        }
        unknown => unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rank: usize, issued: Option<u64>, completed: Option<u64>) -> RankProgress {
        RankProgress {
            rank,
            issued,
            completed,
        }
    }

    #[test]
    fn should_round_trip_progress_and_reject_other_values() {
        let p = Progress {
            issued: 12,
            completed: 9,
        };
        assert_eq!(Progress::decode(&p.encode()), Some(p));
        assert_eq!(p.encode(), b"12 9");
        assert_eq!(Progress::decode(b"12"), None);
        assert_eq!(Progress::decode(b"a b"), None);
        assert_eq!(Progress::decode(&[0xff, b' ', b'1']), None);
    }

    #[test]
    fn should_count_a_rank_that_never_published_as_behind() {
        let peers = [
            rank(0, Some(7), Some(6)),
            rank(1, Some(5), Some(5)),
            rank(2, None, None),
            rank(3, Some(8), Some(7)),
        ];
        assert_eq!(ranks_behind(&peers, 7), vec![1, 2]);
        assert_eq!(ranks_finished(&peers, 7), vec![3]);
        assert_eq!(key(&scope("world", 1), 3), "watchdog/world/3");
        assert_eq!(failed_key(&scope("world", 1)), "watchdog/world/failed");
        assert_eq!(key(&scope("world", 2), 3), "watchdog@2/world/3");
        assert_eq!(failed_key(&scope("a/b", 7)), "watchdog@7/a/b/failed");
    }
}
