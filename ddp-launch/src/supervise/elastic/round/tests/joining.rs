//! Joining a job that is over: before this node ever saw it run (an error), or after (the
//! node ends with it).

use super::*;
use crate::round_summary::ElasticRound;

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
