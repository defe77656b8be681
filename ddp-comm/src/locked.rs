//! Taking a value out of a shared `Mutex<Option<T>>` slot (a thread handle, a job sender, an
//! abort callback) whether or not a panic poisoned the lock.

use std::sync::{Mutex, PoisonError};

/// What `slot` holds, leaving `None`. Poisoning is ignored: an `Option` is whole either way,
/// and the callers are shutting down or failing, when a panic elsewhere must not stop them.
pub(crate) fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(PoisonError::into_inner).take()
}
