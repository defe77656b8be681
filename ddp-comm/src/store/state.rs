//! The store's data and what each request does to it.
//!
//! One map behind a mutex (every update is one short critical section, never held across an
//! `await`) and a generation counter on a `tokio::sync::watch` channel that every change bumps.
//! A waiting request subscribes to the channel *before* it looks at the map, so a change made
//! between its look and its sleep still wakes it: no wake-up can be missed.

use super::multi_get;
use super::protocol::{FrameWriter, Malformed, Request, Status};
use crate::deadline::deadline_after;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::sync::watch;

type Map = HashMap<Vec<u8>, Vec<u8>>;

/// The key-value map and its change notifications.
#[derive(Debug)]
pub(super) struct State {
    map: Mutex<Map>,
    changed: watch::Sender<u64>,
}

impl State {
    /// A map holding `entries` from the start.
    pub(super) fn with_entries(entries: Map) -> State {
        State {
            map: Mutex::new(entries),
            changed: watch::Sender::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Map> {
        // Every update is one insert or remove, so a poisoned lock still guards a whole map.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes every waiter so it looks at the map again.
    fn notify(&self) {
        self.changed.send_modify(|generation| *generation += 1);
    }

    /// Waits until `ready` gives a value or `timeout` passes (then `None`).
    async fn wait_for<R>(&self, timeout: Duration, ready: impl Fn(&Map) -> Option<R>) -> Option<R> {
        let deadline = tokio::time::Instant::from_std(deadline_after(timeout));
        // Subscribed before the first look: any change after it marks the channel changed.
        let mut changes = self.changed.subscribe();
        loop {
            if let Some(r) = ready(&self.lock()) {
                return Some(r);
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                // The deadline passed, or the sender is gone (never, while `self` lives).
                Ok(Err(_)) | Err(_) => return ready(&self.lock()),
            }
        }
    }

    /// Carries out one request and builds its reply; a reply whose size depends on the
    /// request (`MultiGet`) is refused with `TooLarge` rather than exceed `max_reply` bytes.
    ///
    /// # Errors
    /// [`Malformed`] when the body is not a request.
    pub(super) async fn handle(
        &self,
        body: &[u8],
        max_reply: usize,
    ) -> Result<FrameWriter, Malformed> {
        Ok(match Request::decode(body)? {
            Request::Set { key, value } => {
                self.lock().insert(key.to_vec(), value.to_vec());
                self.notify();
                ok()
            }
            Request::Get { key, timeout } => {
                match self.wait_for(timeout, |m| m.get(key).cloned()).await {
                    Some(v) => ok().bytes(&v),
                    None => FrameWriter::new(Status::Timeout as u8),
                }
            }
            Request::Add { key, delta } => {
                let new = {
                    let mut map = self.lock();
                    let current = map
                        .get(key)
                        .and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok())
                        .unwrap_or(0);
                    let new = current.wrapping_add(delta);
                    map.insert(key.to_vec(), new.to_string().into_bytes());
                    new
                };
                self.notify();
                ok().i64(new)
            }
            Request::Wait { keys, timeout } => {
                let all = |m: &Map| keys.iter().all(|k| m.contains_key(*k)).then_some(());
                if self.wait_for(timeout, all).await.is_some() {
                    ok()
                } else {
                    let map = self.lock();
                    let missing: Vec<String> = keys
                        .iter()
                        .filter(|k| !map.contains_key(**k))
                        .map(|k| String::from_utf8_lossy(k).into_owned())
                        .collect();
                    FrameWriter::new(Status::Timeout as u8).bytes(missing.join(", ").as_bytes())
                }
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                let result = {
                    let mut map = self.lock();
                    match map.get(key) {
                        None if expected.is_empty() => {
                            map.insert(key.to_vec(), desired.to_vec());
                            desired.to_vec()
                        }
                        None => expected.to_vec(),
                        Some(cur) if cur == expected => {
                            map.insert(key.to_vec(), desired.to_vec());
                            desired.to_vec()
                        }
                        Some(cur) => cur.clone(),
                    }
                };
                self.notify();
                ok().bytes(&result)
            }
            Request::Delete { key } => {
                let removed = self.lock().remove(key).is_some();
                ok().raw(&[removed as u8])
            }
            Request::NumKeys { prefix } => {
                let n = self.lock().keys().filter(|k| k.starts_with(prefix)).count();
                ok().u64(n as u64)
            }
            Request::Check { keys } => {
                let map = self.lock();
                let all = keys.iter().all(|k| map.contains_key(*k));
                ok().raw(&[all as u8])
            }
            Request::MultiGet { keys } => {
                let map = self.lock();
                let values = keys.iter().map(|k| map.get(*k).map(Vec::as_slice));
                multi_get::encode(values, max_reply)
            }
        })
    }
}

fn ok() -> FrameWriter {
    FrameWriter::new(Status::Ok as u8)
}
