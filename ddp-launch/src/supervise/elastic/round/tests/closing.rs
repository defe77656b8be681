//! Closing a round: the last call, joiners that withdraw or die before the close, a round
//! short of its minimum, and a withdrawal that races the close.

use super::*;
use std::sync::{Arc, Mutex};

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

/// A member interrupted after its round closed, before it learnt where the workers meet (or
/// while it read the members), ends the round as a member leaving: the others re-form at
/// once and spend no restart, instead of finding it dead by its heartbeats (a failure).
#[test]
fn a_member_interrupted_before_its_round_starts_ends_it_as_a_member_leaving() {
    for while_reading_members in [false, true] {
        let memory = job_with_first_node();
        let round = join_round(&memory, "late:3");
        assert_eq!(round.node_rank, 1);
        let mut late = closing_node(&memory, "late:3", Duration::from_secs(600));
        let interrupted = with_signals(|s| {
            // SAFETY: the guard handles SIGTERM (it only sets a flag).
            unsafe { libc::raise(libc::SIGTERM) };
            if while_reading_members {
                // Member 9 never wrote its id: the read waits, and the signal ends it.
                late.read_round(0, 1, &[1, 9], s).map(|_| ())
            } else {
                // Node 0 (first:1) never publishes the address.
                late.master(&round, || Ok(0), s).map(|_| ())
            }
        });
        assert!(
            matches!(
                interrupted,
                Err(LaunchError::Interrupted {
                    signal: libc::SIGTERM
                })
            ),
            "{:?}",
            interrupted.err()
        );
        let end = memory
            .value("r/0/end")
            .map(|raw| RoundEnd::decode(raw.as_bytes()));
        assert!(
            matches!(&end, Some(RoundEnd::MemberLeft(why)) if why.contains("late:3 was interrupted by SIGTERM before round 0 started")),
            "while reading members: {while_reading_members}: {end:?}"
        );
    }
}
