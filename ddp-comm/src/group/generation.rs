//! Which init on its store a world group belongs to: its *generation*.
//!
//! A store can outlive a group: a test, or a user who destroys the group and creates a new one
//! over the same store (PyTorch's `destroy_process_group` then `init_process_group` over one
//! `TCPStore`). Every key an init writes (each rank's listening address, the shared-memory
//! hello and segment names, failure reports, the job nonce, the subgroups' keys) lives in its
//! generation's namespace, so a new init never reads an earlier one's: a dead listener's
//! address would make the rendezvous time out.
//!
//! - Generation 1 uses the store as it is: the keys every job has always had on its own fresh
//!   store (`pg/world/...`, `job/nonce`, `shm/job_id`).
//! - Generation `n > 1` puts all of them under `pg/gen/<n>/`, which no group's keys can reach
//!   (those are all under `pg/world`).
//!
//! # Agreement
//! Rank 0 leads: each of its inits opens the next generation (`pg/init/count`, then
//! `pg/init/begun/<n>`). Every other rank waits for a generation opened after the last one it
//! joined (`pg/init/joined/<rank>`) and joins the newest. Had every rank counted its own inits
//! instead, a rank whose init failed before it met the others (its peers never came) would
//! stay one generation ahead of them for good; following rank 0 heals at the next init.
//! When rank 0's init fails it marks that generation abandoned (`pg/init/abandoned/<n>`), so a
//! rank that arrives before rank 0 tries again waits for the next generation instead. Rank 0
//! records each generation's world size in its begun key: a rank whose world size differs (a
//! rank the world grew by, arriving before rank 0 begins the larger init) waits for the next
//! generation too, instead of joining one that has no place for it.
//! Every rank creates its world groups on a store in the same order, as c10d requires.

use crate::error::{CommError, Result};
use crate::store::{Store, positive_count};
use std::time::{Duration, Instant};

/// How many inits rank 0 has begun on the store.
const COUNT_KEY: &str = "pg/init/count";

/// Set by rank 0 as it begins generation `n` (to its world size, in decimal), for the other
/// ranks to wait on.
fn begun_key(n: u64) -> String {
    format!("pg/init/begun/{n}")
}

/// Set by rank 0 when its init of generation `n` failed: nobody may join it any more.
fn abandoned_key(n: u64) -> String {
    format!("pg/init/abandoned/{n}")
}

/// The last generation `rank` joined (decimal text).
fn joined_key(rank: usize) -> String {
    format!("pg/init/joined/{rank}")
}

/// One init's generation and the store namespace its keys live in.
#[derive(Debug)]
pub(crate) struct Generation {
    /// 1 for the first init on the store.
    pub(crate) number: u64,
    /// The store the init's keys go to (the store itself for generation 1).
    pub(crate) store: Store,
}

/// Agrees on the generation of this init of the world group with the other ranks (see the
/// [module docs](self)).
///
/// # Errors
/// Store failures; on ranks other than 0, [`CommError::Timeout`] naming rank 0 when it does not
/// begin a new init of a world of `world_size` within `timeout`.
pub(crate) fn join(
    store: &Store,
    rank: usize,
    world_size: usize,
    timeout: Duration,
) -> Result<Generation> {
    let number = if rank == 0 {
        open(store, world_size)?
    } else {
        follow(store, rank, world_size, timeout)?
    };
    tracing::debug!(
        rank,
        generation = number,
        "joining this store's init of the world group"
    );
    let store = if number == 1 {
        store.clone()
    } else {
        store.with_prefix(&format!("pg/gen/{number}/"))
    };
    Ok(Generation { number, store })
}

/// Rank 0's part: opens the next generation.
fn open(store: &Store, world_size: usize) -> Result<u64> {
    let n = count(store.add(COUNT_KEY, 1)?)?;
    if let Err(e) = store.set(&begun_key(n), world_size.to_string().as_bytes()) {
        // Counted but never begun: a rank that read the count must not wait for it.
        abandon(store, n);
        return Err(e);
    }
    Ok(n)
}

/// Another rank's part: waits for rank 0 to open a generation after the last one this rank
/// joined, and joins the newest, once it is one for this rank (an older one was abandoned by
/// rank 0, or is of another world size). All within one `timeout`.
fn follow(store: &Store, rank: usize, world_size: usize, timeout: Duration) -> Result<u64> {
    let deadline = Instant::now() + timeout;
    let joined = joined_key(rank);
    let last = match store.multi_get(&[joined.as_str()])?.pop().flatten() {
        Some(text) => parse_number(&joined, &text, "a generation number")?,
        None => 0,
    };
    wait_begun(store, last + 1, deadline, timeout)?;
    let mut n = count(store.add(COUNT_KEY, 0)?)?;
    loop {
        // Rank 0 counts a generation before it marks it begun: it may be between the two.
        n = begun_or_newer(store, n, deadline, timeout)?;
        // Rank 0 may have left the newest generation (its init failed) before opening the
        // next, or not have begun this init yet while the newest is an earlier world's.
        if open_to(store, n, world_size)? {
            break;
        }
        wait_begun(store, n + 1, deadline, timeout)?;
        n = count(store.add(COUNT_KEY, 0)?)?;
    }
    store.set(&joined, n.to_string().as_bytes())?;
    Ok(n)
}

/// Whether generation `n` (begun) is one a rank of a world of `world_size` may join: not
/// abandoned, and begun with that world size.
fn open_to(store: &Store, n: u64, world_size: usize) -> Result<bool> {
    if store.check(&[abandoned_key(n).as_str()])? {
        return Ok(false);
    }
    let key = begun_key(n);
    let begun = store.multi_get(&[key.as_str()])?.pop().flatten();
    match begun {
        Some(text) => Ok(parse_number(&key, &text, "a world size")? == world_size as u64),
        None => Ok(false),
    }
}

/// Waits for rank 0 to begin generation `next`, until `deadline` (of `timeout`, for the error).
fn wait_begun(store: &Store, next: u64, deadline: Instant, timeout: Duration) -> Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    store
        .wait(&[begun_key(next).as_str()], left)
        .map_err(|e| match e {
            CommError::StoreTimeout { .. } => not_begun(next, timeout),
            other => other,
        })
}

/// Waits until rank 0 marks generation `n` begun, or counts a newer one (it failed between
/// counting `n` and marking it); returns the generation to look at.
fn begun_or_newer(store: &Store, mut n: u64, deadline: Instant, timeout: Duration) -> Result<u64> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match store.wait(
            &[begun_key(n).as_str()],
            left.min(Duration::from_millis(200)),
        ) {
            Ok(()) => return Ok(n),
            Err(CommError::StoreTimeout { .. }) => {}
            Err(other) => return Err(other),
        }
        let newest = count(store.add(COUNT_KEY, 0)?)?;
        if newest > n {
            n = newest;
        } else if Instant::now() >= deadline {
            return Err(not_begun(n, timeout));
        }
    }
}

/// The timeout of a rank that waited for rank 0 to begin init `next`.
fn not_begun(next: u64, timeout: Duration) -> CommError {
    CommError::Timeout {
        op: "rendezvous".into(),
        peer: 0,
        timeout,
        detail: format!(
            " to begin init #{next} of the world group on this store, with this rank's world \
             size (every rank must create its world groups on a store in the same order, with \
             the same world size)"
        ),
    }
}

/// Rank 0's part when its init of generation `n` failed: marks it abandoned, so that a rank
/// arriving later waits for the next one instead of meeting nobody there. Best effort: the
/// store may be what failed.
pub(crate) fn abandon(store: &Store, n: u64) {
    if let Err(e) = store.set(&abandoned_key(n), b"abandoned") {
        tracing::debug!(generation = n, error = %e, "could not mark the failed init abandoned");
    }
}

/// The generation count the store returned, which rank 0 has bumped at least once.
fn count(value: i64) -> Result<u64> {
    positive_count(COUNT_KEY, value, "inits")
}

/// The decimal number `key` holds (`what` names it for the error).
fn parse_number(key: &str, text: &[u8], what: &str) -> Result<u64> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| CommError::StoreProtocol {
            op: "get",
            reason: format!(
                "{key} holds '{}', not {what}",
                String::from_utf8_lossy(text)
            ),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{StoreConfig, StoreServer};

    /// Generation 1 abandoned and generation 2 counted but not begun; 300 ms later rank 0 does
    /// `then` with its own connection. Returns what rank 1's follow joined, and `then`'s value.
    fn follow_while_rank_0<T: Send + 'static>(
        then: impl FnOnce(&Store) -> T + Send + 'static,
    ) -> (Result<u64>, T) {
        let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new()).expect("bind");
        let connect =
            || Store::connect(&server.local_addr().to_string(), StoreConfig::new()).expect("store");
        let store = connect();
        assert_eq!(open(&store, 2).expect("generation 1"), 1);
        abandon(&store, 1);
        store.add(COUNT_KEY, 1).expect("count generation 2");
        let rank0 = connect();
        let rank0 = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            then(&rank0)
        });
        let joined = follow(&store, 1, 2, Duration::from_secs(30));
        (joined, rank0.join().expect("rank 0 thread"))
    }

    /// Rank 0 retries after an abandoned init: it has counted generation 2 but not yet marked
    /// it begun when rank 1 reads the count. Rank 1 joins generation 2 once it is begun.
    #[test]
    fn a_follower_arriving_between_rank_0s_count_and_begun_joins_that_generation() {
        let (joined, ()) = follow_while_rank_0(|rank0| {
            rank0.set(&begun_key(2), b"2").expect("begin generation 2");
        });
        assert_eq!(joined.expect("joins generation 2"), 2);
    }

    /// Rank 0 counted generation 2 but never began it (its store write failed), then began
    /// generation 3: rank 1, which read the count at 2, joins generation 3.
    #[test]
    fn a_follower_moves_past_a_generation_counted_but_never_begun() {
        let (joined, opened) = follow_while_rank_0(|rank0| open(rank0, 2).expect("generation 3"));
        assert_eq!(opened, 3);
        assert_eq!(joined.expect("joins generation 3"), 3);
    }

    #[test]
    fn counts_and_generations_must_be_positive_numbers() {
        assert_eq!(count(3).ok(), Some(3));
        assert!(count(0).is_err());
        assert!(count(-1).is_err());
        assert_eq!(parse_number("k", b"12", "a number").ok(), Some(12));
        let e = parse_number("pg/init/joined/1", b"x", "a generation number").unwrap_err();
        assert!(
            e.to_string()
                .contains("pg/init/joined/1 holds 'x', not a generation number"),
            "{e}"
        );
    }
}
