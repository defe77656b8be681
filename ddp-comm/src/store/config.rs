//! Settings shared by the store server and its clients.

use std::time::Duration;

/// Default timeout for blocking store calls and for connecting.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Default largest frame the store accepts (keys and values are small; 64 MiB is generous).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 64 << 20;
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
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret: print only whether there is one.
        f.debug_struct("StoreConfig")
            .field("timeout", &self.timeout)
            .field(
                "token",
                &if self.token.is_empty() {
                    "<none>"
                } else {
                    "<set>"
                },
            )
            .field("max_frame_bytes", &self.max_frame_bytes)
            .field("hello_timeout", &self.hello_timeout)
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
        }
    }
}

impl StoreConfig {
    /// Defaults: 300 s timeout, no token, 64 MiB frames, 10 s for a hello.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the timeout for connecting and for blocking calls.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
    /// Sets the job token clients must present.
    pub fn with_token(mut self, token: impl AsRef<[u8]>) -> Self {
        self.token = token.as_ref().to_vec();
        self
    }
    /// Sets the largest accepted frame.
    pub fn with_max_frame_bytes(mut self, max: usize) -> Self {
        self.max_frame_bytes = max;
        self
    }
    /// Sets the total time a new connection gets to complete its hello (server side).
    pub fn with_hello_timeout(mut self, timeout: Duration) -> Self {
        self.hello_timeout = timeout;
        self
    }
}
