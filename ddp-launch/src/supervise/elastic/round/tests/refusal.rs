//! A node whose settings or rendezvous protocol differ from the first node's is refused,
//! and the refusal names both.

use super::*;
use crate::rendezvous_protocol::PROTOCOL;

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
