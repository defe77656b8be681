//! The membership bookkeeping of an elastic round (see [`super::round`]): which joiners of an
//! open round are live ([`Joiners`]), which members of a closed one withdrew, and the member
//! list `r/<n>/closed` holds (the members' join indices, comma-separated).

use super::backend::{BackendError, RendezvousBackend};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// The value of `r/<n>/closed`: the members' join indices (1-based), in join order.
pub(super) fn encode_members(indices: &[usize]) -> String {
    indices
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// [`encode_members`] read back; `None` if `raw` is no list of join indices.
pub(super) fn decode_members(raw: &[u8]) -> Option<Vec<usize>> {
    let text = String::from_utf8_lossy(raw);
    let members: Vec<usize> = text
        .trim()
        .split(',')
        .map(|i| i.trim().parse().ok().filter(|&i: &usize| i > 0))
        .collect::<Option<_>>()?;
    (!members.is_empty()).then_some(members)
}

/// What a launcher waiting for a round to close knows of its joiners (ids and withdrawals
/// never change once written, so each is read once).
#[derive(Default)]
pub(super) struct Joiners {
    /// Node ids by join index, once written.
    ids: HashMap<usize, String>,
    /// Joiners that have not written their id yet, and since when this node saw so.
    missing_since: HashMap<usize, Instant>,
    /// Joiners that withdrew (`r/<n>/left/<i>`).
    left: HashSet<usize>,
    /// Joiners already logged as gone.
    logged: HashSet<usize>,
}

/// The live joiners of an open round, as this node sees them now.
pub(super) struct Live {
    /// Join indices, in join order.
    pub(super) indices: Vec<usize>,
    /// Some joiner has not written its id yet (it just joined): wait before closing.
    pub(super) pending: bool,
    /// Joiners that are not counted: they withdrew, sent no heartbeat, or never wrote their id
    /// within the heartbeat timeout (pending joiners are not gone).
    pub(super) gone: usize,
}

impl Joiners {
    /// The live joiners of open round `r` (`joined` joined it, this node as `index`), read
    /// from `backend`: those that neither withdrew nor stopped sending heartbeats. A joiner
    /// that has not written its id is pending, and gone once it stays so for the heartbeat
    /// timeout (it died in between).
    pub(super) fn live(
        &mut self,
        backend: &mut dyn RendezvousBackend,
        r: u32,
        joined: usize,
        index: usize,
        heartbeat_timeout: Duration,
    ) -> Result<Live, BackendError> {
        let now = Instant::now();
        let mut pending = false;
        let mut gone = 0;
        for i in 1..=joined {
            if self.ids.contains_key(&i) {
                continue;
            }
            if let Some(id) = backend.get(&format!("r/{r}/node/{i}"))? {
                self.missing_since.remove(&i);
                self.ids
                    .insert(i, String::from_utf8_lossy(&id).into_owned());
            } else {
                let since = *self.missing_since.entry(i).or_insert(now);
                if now.duration_since(since) <= heartbeat_timeout {
                    pending = true;
                    continue;
                }
                gone += 1;
                if self.logged.insert(i) {
                    tracing::info!(
                        round = r,
                        index = i,
                        "a node joined the round but never wrote its id; not counting it"
                    );
                }
            }
        }
        // Each withdrawal bumps the counter after writing its key: look for the keys only
        // while some are unseen.
        let withdrawn = backend.add(&format!("r/{r}/left"), 0)?.max(0) as usize;
        if self.left.len() < withdrawn {
            for i in 1..=joined {
                if !self.left.contains(&i) && backend.get(&format!("r/{r}/left/{i}"))?.is_some() {
                    self.left.insert(i);
                }
            }
        }
        let others: Vec<String> = self
            .ids
            .iter()
            .filter(|(i, _)| **i != index && **i <= joined && !self.left.contains(i))
            .map(|(_, id)| id.clone())
            .collect();
        let dead: HashSet<String> = if others.is_empty() {
            HashSet::new()
        } else {
            backend.dead_nodes(&others)?.into_iter().collect()
        };
        let mut indices = Vec::with_capacity(joined);
        for i in 1..=joined {
            let Some(id) = self.ids.get(&i) else {
                continue;
            };
            let why = if self.left.contains(&i) {
                "withdrew"
            } else if i != index && dead.contains(id) {
                "sent no heartbeat"
            } else {
                indices.push(i);
                continue;
            };
            gone += 1;
            if self.logged.insert(i) {
                tracing::info!(
                    round = r,
                    node = %id,
                    "a node that joined the round {why} before it closed; not counting it"
                );
            }
        }
        Ok(Live {
            indices,
            pending,
            gone,
        })
    }
}

/// The id of the first of `members` (join indices of closed round `r`) that withdrew
/// (`r/<n>/left/<i>`), if any.
pub(super) fn withdrawn_member(
    backend: &mut dyn RendezvousBackend,
    r: u32,
    members: &[usize],
) -> Result<Option<String>, BackendError> {
    for &i in members {
        if let Some(id) = backend.get(&format!("r/{r}/left/{i}"))? {
            return Ok(Some(String::from_utf8_lossy(&id).into_owned()));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_lists_survive_the_store() {
        assert_eq!(encode_members(&[1, 3, 4]), "1,3,4");
        assert_eq!(decode_members(b"1,3,4"), Some(vec![1, 3, 4]));
        for bad in [&b""[..], b"0", b"1,,2", b"x"] {
            assert_eq!(decode_members(bad), None, "{bad:?}");
        }
    }
}
