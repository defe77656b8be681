//! The round protocol's tests: they run [`Rounds`] against [`Memory`], a rendezvous service
//! in memory that a test can kill nodes in and step into between writes. This file holds the
//! jobs and nodes they share.

mod closing;
mod joining;
mod memory;
mod refusal;

use super::{Joined, Round, RoundEnd, Rounds};
use crate::error::LaunchError;
use crate::plan::elastic_settings::{ElasticSettings, Endpoint};
use crate::plan::node_count::{NodeCount, RdzvBackend};
use crate::rendezvous_protocol::with_protocol;
use crate::signals::SignalGuard;
use memory::Memory;
use std::time::Duration;

/// What shapes the tests' jobs (the settings every node must match, less the protocol).
const SHAPE: &str = "--nnodes 1:2 --nproc-per-node 1 --max-restarts 0";

fn config() -> String {
    with_protocol(SHAPE)
}

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

/// The round a node joined; fails the test if it found the job over or failed.
fn round_of(joined: Result<Joined, LaunchError>) -> Round {
    match joined {
        Ok(Joined::Round(round)) => round,
        Ok(Joined::JobOver(over)) => panic!("the job is over: {over:?}"),
        Err(e) => panic!("{e}"),
    }
}
