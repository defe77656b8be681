//! The rendezvous store: a small TCP key-value service that ranks use to find each other.
//!
//! - [`StoreServer`]: hosted by rank 0 (or by a launcher); one thread per client.
//! - [`Store`]: the client, with `set`, `get`, `add`, `wait`, `compare_set`, `delete`,
//!   `num_keys`, `check`, and [`Store::with_prefix`] namespaces.
//! - [`StoreConfig`]: timeout, job token, frame limit.
//!
//! # Security
//! A client proves the job token in its first frame; anyone else is disconnected. The token is
//! a guard against mixing jobs and stray connections, not encryption: run jobs on a trusted
//! network. A connection that has not proved the token gets a total deadline
//! ([`StoreConfig::hello_timeout`]) however slowly it sends, and at most
//! 64 such connections are kept at a time (a new one pushes out the oldest), so strangers
//! cannot hold the server's threads or keep real ranks out.
//!
//! # Timeouts
//! Every blocking call has a deadline; `get` and `wait` report the keys still missing.

mod client;
mod config;
mod protocol;
mod server;

pub use client::Store;
pub use config::{DEFAULT_HELLO_TIMEOUT, DEFAULT_MAX_FRAME_BYTES, DEFAULT_TIMEOUT, StoreConfig};
pub use server::StoreServer;
