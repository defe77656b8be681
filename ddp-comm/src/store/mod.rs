//! The rendezvous store: a small TCP key-value service that ranks use to find each other.
//!
//! This module keeps the store's defaults; its types are at the crate root.
//!
//! - [`StoreServer`]: hosted by rank 0 (or by a launcher); one event loop (a tokio runtime on
//!   its own thread) serves every client.
//! - [`Store`]: the client, with `set`, `get`, `add`, `wait`, `compare_set`, `delete`,
//!   `num_keys`, `check`, `multi_get` (many keys in one round trip, without waiting), and
//!   [`Store::with_prefix`] namespaces.
//! - [`StoreConfig`]: timeout, job token, frame limit, client limit.
//!
//! # Security
//! Every connection starts with a hello in which client and server prove the job token to each
//! other without sending it (HMAC-SHA256 over fresh nonces from both sides, see `auth`), so a
//! recorded session cannot be replayed and a rank never trusts a server that cannot prove the
//! token; anyone else is disconnected. This guards against mixing jobs and against strangers,
//! but is not encryption: the data itself travels in the clear, so run jobs on a trusted
//! network. A connection that has not proved the token gets a total deadline
//! ([`StoreConfig::hello_timeout`]) however slowly it sends, and at most
//! 64 such connections are kept at a time (a new one pushes out the oldest), so strangers
//! cannot exhaust the server or keep real ranks out. Token holders are bounded too: a frame's
//! body is read as its bytes arrive (a header announcing a large frame costs nothing until the
//! bytes come), frames are limited ([`StoreConfig::max_frame_bytes`], 4 MiB by default) and at
//! most [`StoreConfig::max_clients`] authenticated clients are served at once.
//!
//! # Timeouts
//! Every blocking call has a deadline; `get` and `wait` report the keys still missing.

pub(crate) mod client;
pub(crate) mod config;
mod multi_get;
mod protocol;
pub(crate) mod server;
mod session;
mod state;

use crate::error::{CommError, Result};

pub(crate) use client::Store;
pub(crate) use config::StoreConfig;
pub use config::{
    DEFAULT_HELLO_TIMEOUT, DEFAULT_MAX_CLIENTS, DEFAULT_MAX_FRAME_BYTES, DEFAULT_TIMEOUT,
};
pub(crate) use server::StoreServer;

/// The value a counter `key` holds after [`Store::add`], checked to be a positive count of
/// `what` (every caller has added at least once, so zero or less means another writer).
///
/// # Errors
/// [`CommError::StoreProtocol`] naming `key` and its value otherwise.
pub(crate) fn positive_count(key: &str, value: i64, what: &str) -> Result<u64> {
    u64::try_from(value)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| CommError::StoreProtocol {
            op: "add",
            reason: format!("{key} is {value}, not a count of {what}"),
        })
}
