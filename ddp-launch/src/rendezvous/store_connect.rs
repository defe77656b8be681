//! Connecting to a store that another launcher hosts, retrying while it starts: the static
//! rendezvous (node 0's store) and the elastic c10d backend (the first launcher's) both wait so.

use crate::error::LaunchError;
use crate::signals::SignalGuard;
use ddp_comm::{CommError, Store, StoreConfig};
use std::time::{Duration, Instant};

/// How long to wait between attempts.
const RETRY: Duration = Duration::from_millis(200);

/// Connects to the store at `addr`, retrying until `deadline`. A signal stops the wait
/// ([`LaunchError::Interrupted`]); a store that refuses the job token is an error at once
/// (`err` wraps the reason); at the deadline, `gave_up` says what the user should check.
pub(crate) fn connect_with_retry(
    addr: &str,
    config: &StoreConfig,
    deadline: Instant,
    signals: &SignalGuard,
    err: impl Fn(String) -> LaunchError,
    gave_up: impl Fn(&CommError) -> String,
) -> Result<Store, LaunchError> {
    loop {
        if let Some(signal) = signals.take() {
            return Err(LaunchError::Interrupted { signal });
        }
        match Store::connect(addr, config.clone()) {
            Ok(store) => return Ok(store),
            Err(e @ CommError::Unauthorized { .. }) => {
                return Err(err(format!(
                    "{e}: set the same {} on every node",
                    ddp_comm::TOKEN_ENV
                )));
            }
            Err(e) if Instant::now() >= deadline => return Err(err(gave_up(&e))),
            Err(_) => std::thread::sleep(RETRY),
        }
    }
}
