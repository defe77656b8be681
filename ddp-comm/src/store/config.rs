//! Settings shared by the store server and its clients.

use crate::auth::redacted_token;
use crate::setters::setters;
use std::time::Duration;

/// Default timeout for blocking store calls and for connecting.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Default largest frame the store accepts: 4 MiB. What ranks keep there is small (addresses,
/// NCCL ids, progress counters, failure reports, a `multi_get` of 1024 progress records), so
/// this is generous while keeping what one client can make the server buffer small; raise it
/// with [`StoreConfig::with_max_frame_bytes`] to keep larger values.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 4 << 20;
/// Default most authenticated clients served at once: 16384, room for a 4096-rank job whose
/// ranks each hold a few store connections (the group's, an address lookup, the watchdog's).
pub const DEFAULT_MAX_CLIENTS: usize = 16384;
/// Default time a new connection gets, in total, to complete its hello.
pub const DEFAULT_HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Store settings, written in burn's config style:
/// `StoreConfig::new().with_timeout(Duration::from_secs(30)).with_token("secret")`.
#[derive(Clone)]
pub struct StoreConfig {
    /// Timeout for connecting and for every blocking call (`get`, `wait`).
    pub timeout: Duration,
    /// Shared job token; the server rejects clients that present another one.
    pub token: Vec<u8>,
    /// Largest frame accepted; a longer one closes the connection without allocating it.
    pub max_frame_bytes: usize,
    /// Server side: total time a new connection gets to complete its hello, however slowly
    /// its bytes arrive; it is dropped at this deadline.
    pub hello_timeout: Duration,
    /// Server side: most authenticated clients served at once; one more is refused at its
    /// hello, so even token holders cannot exhaust the server's sockets and memory.
    pub max_clients: usize,
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret: print only whether there is one.
        f.debug_struct("StoreConfig")
            .field("timeout", &self.timeout)
            .field("token", &redacted_token(&self.token))
            .field("max_frame_bytes", &self.max_frame_bytes)
            .field("hello_timeout", &self.hello_timeout)
            .field("max_clients", &self.max_clients)
            .finish()
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            timeout: DEFAULT_TIMEOUT,
            token: Vec::new(),
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            hello_timeout: DEFAULT_HELLO_TIMEOUT,
            max_clients: DEFAULT_MAX_CLIENTS,
        }
    }
}

impl StoreConfig {
    /// Defaults: 300 s timeout, no token, 4 MiB frames, 10 s for a hello, 16384 clients.
    pub fn new() -> Self {
        Self::default()
    }
    setters! {
        /// Sets the timeout for connecting and for blocking calls.
        pub fn with_timeout(timeout: Duration) => timeout;
        /// Sets the job token clients must present.
        pub fn with_token(token: impl AsRef<[u8]>) => token = token.as_ref().to_vec();
        /// Sets the largest accepted frame.
        pub fn with_max_frame_bytes(max: usize) => max_frame_bytes;
        /// Sets the total time a new connection gets to complete its hello (server side).
        pub fn with_hello_timeout(timeout: Duration) => hello_timeout;
        /// Sets the most authenticated clients served at once (server side).
        pub fn with_max_clients(max: usize) => max_clients;
    }
}
