//! What the launcher's unit tests share: a loopback store to talk to, and a bounded wait for
//! what another thread or process does.

use ddp_comm::{Store, StoreConfig, StoreServer};
use std::time::{Duration, Instant};

/// A store server on a free loopback port, and the settings its clients connect with (a test
/// token; a timeout long enough for a loaded machine).
pub(crate) fn loopback_store() -> (StoreServer, StoreConfig) {
    let config = StoreConfig::new()
        .with_token(b"unit-test-token")
        .with_timeout(Duration::from_secs(60));
    let server = StoreServer::bind("127.0.0.1:0", config.clone()).expect("server");
    (server, config)
}

/// A client of [`loopback_store`]'s `server`.
pub(crate) fn connect(server: &StoreServer, config: StoreConfig) -> Store {
    Store::connect(&server.local_addr().to_string(), config).expect("client")
}

/// Polls `done` until it holds; fails the test with `never` once `within` has passed, so that
/// a broken test fails instead of hanging.
pub(crate) fn wait_until(within: Duration, never: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{never}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
