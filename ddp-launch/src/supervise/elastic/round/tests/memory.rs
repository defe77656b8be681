//! [`Memory`]: the rendezvous service of the round tests, in memory and shared by the test
//! and the nodes under test, with the hooks the tests need (dead nodes, a step of another node
//! just before a write).

use crate::signals::SignalGuard;
use crate::supervise::elastic::backend::{BackendError, RendezvousBackend};
use crate::supervise::elastic::round::num;
use crate::test_support::wait_until;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A rendezvous service in memory, shared by the test and the node under test; the
/// nodes of `.1` are dead (their heartbeats stopped).
#[derive(Clone, Default)]
pub(super) struct Memory(
    Arc<Mutex<HashMap<String, Vec<u8>>>>,
    Arc<Mutex<HashSet<String>>>,
    Arc<Mutex<Option<BeforeWrite>>>,
);

/// What runs once, just before a write of its key lands (`.2`): another node's steps in
/// between this one's.
type BeforeWrite = (String, Box<dyn FnOnce() + Send>);

impl Memory {
    /// Runs `then` once, just before the first compare-and-set of `key`.
    pub(super) fn before_write(&self, key: &str, then: impl FnOnce() + Send + 'static) {
        *self.2.lock().expect("lock") = Some((key.into(), Box::new(then)));
    }

    /// Stops the heartbeats of `node_id`.
    pub(super) fn kill(&self, node_id: &str) {
        self.1.lock().expect("lock").insert(node_id.into());
    }

    pub(super) fn set(&self, key: &str, value: &str) {
        let mut map = self.0.lock().expect("lock");
        map.insert(key.into(), value.as_bytes().to_vec());
    }

    pub(super) fn value(&self, key: &str) -> Option<String> {
        let map = self.0.lock().expect("lock");
        map.get(key)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// Another node's launcher joins round 0 as `node_id` (takes a join index, then writes
    /// its id there, as [`Rounds::join`] does); its index.
    pub(super) fn joined(&self, node_id: &str) -> i64 {
        let index = self.clone().add("r/0/join", 1).expect("join");
        self.set(&format!("r/0/node/{index}"), node_id);
        index
    }

    /// The joiner at `index` (`node_id`) withdraws from round 0, as [`Rounds::withdraw`]
    /// does.
    pub(super) fn withdrew(&self, index: i64, node_id: &str) {
        self.set(&format!("r/0/left/{index}"), node_id);
        self.clone().add("r/0/left", 1).expect("left");
    }

    /// Waits (at most 300 s) for another thread to write `key`; `never` says what did
    /// not happen.
    pub(super) fn wait_for(&self, key: &str, never: &str) {
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
