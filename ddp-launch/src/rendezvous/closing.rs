//! Leaving a static multi-node job: node 0, which hosts the rendezvous, keeps serving it while
//! other nodes still run, then waits (at most [`CLOSE_WAIT`]) for their launchers to leave so
//! they can read the outcome; a signal ends either wait at once.

use super::{POLL, Rendezvous};
use crate::rendezvous::finish::node_list;
use crate::signal_names::signal_name;
use crate::signals::SignalGuard;
use ddp_comm::StoreServer;
use std::time::{Duration, Instant};

/// How long node 0 keeps the rendezvous up for the others to read the outcome.
const CLOSE_WAIT: Duration = Duration::from_secs(30);
/// How often a waiting launcher that hosts the rendezvous looks at who is still connected.
const CLIENTS_POLL: Duration = Duration::from_millis(50);

/// How a wait for the other launchers to disconnect from a hosted store ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientsLeft {
    /// At most the clients to keep remain.
    Left,
    /// The time limit passed first.
    TimedOut,
    /// This signal arrived first.
    Interrupted(i32),
}

/// Waits until at most `keep` clients remain connected to `server`, `timeout` passes, or
/// `interrupted` returns a signal (checked as often as the clients).
pub(crate) fn wait_for_clients_to_leave(
    server: &StoreServer,
    keep: usize,
    timeout: Duration,
    mut interrupted: impl FnMut() -> Option<i32>,
) -> ClientsLeft {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(sig) = interrupted() {
            return ClientsLeft::Interrupted(sig);
        }
        if server.num_clients() <= keep {
            return ClientsLeft::Left;
        }
        if Instant::now() >= deadline {
            return ClientsLeft::TimedOut;
        }
        std::thread::sleep(CLIENTS_POLL);
    }
}

impl Rendezvous {
    /// On node 0 once its workers of the last attempt succeeded: keeps serving the rendezvous
    /// while some node has neither finished nor failed and other launchers are connected, so
    /// their healthy workers are not stopped for a lost rendezvous. A signal ends the wait
    /// (returned).
    fn serve_running_nodes(&self, server: &StoreServer, signals: &SignalGuard) -> Option<i32> {
        let attempt = self.finished?;
        let failed = Self::key(attempt, "failed");
        let mut said: Option<Vec<usize>> = None;
        loop {
            if let Some(sig) = signals.take() {
                return Some(sig);
            }
            // This launcher's own connection is one of the clients.
            if server.num_clients() <= 1 {
                return None;
            }
            let running = match (
                self.store.check(&[failed.as_str()]),
                self.unfinished(attempt),
            ) {
                (Ok(false), Ok(running)) if !running.is_empty() => running,
                _ => return None,
            };
            if said.as_ref() != Some(&running) {
                tracing::info!(
                    "this node hosts the rendezvous and {} still running attempt {attempt}: serving it until they finish or fail (a signal stops this now, and stops their workers)",
                    match running.len() {
                        1 => format!("{} is", node_list(&running)),
                        _ => format!("{} are", node_list(&running)),
                    }
                );
                said = Some(running);
            }
            std::thread::sleep(POLL);
        }
    }

    /// Leaves the job. Node 0 first keeps the rendezvous up while other nodes still run the
    /// attempt its own workers finished (see [`serve_running_nodes`](Self::serve_running_nodes)),
    /// then until the others have disconnected (at most 30 s), so they can read the outcome.
    /// A signal ends either wait at once.
    pub(crate) fn close(self, signals: &SignalGuard) {
        let interrupted = match &self.server {
            Some(server) => self.serve_running_nodes(server, signals),
            None => None,
        };
        let Rendezvous {
            store,
            server,
            heartbeat,
            ..
        } = self;
        // The heartbeat shares the connection: it goes first, so the connection closes.
        drop(heartbeat);
        drop(store);
        let Some(server) = server else { return };
        let left = match interrupted {
            Some(sig) => ClientsLeft::Interrupted(sig),
            None => {
                let clients = server.num_clients();
                if clients > 0 {
                    tracing::info!(
                        clients,
                        "this node hosts the rendezvous: waiting (at most {CLOSE_WAIT:?}) for the other nodes' launchers to leave"
                    );
                }
                wait_for_clients_to_leave(&server, 0, CLOSE_WAIT, || signals.take())
            }
        };
        match left {
            ClientsLeft::Left => {}
            ClientsLeft::TimedOut => tracing::warn!(
                "other nodes still connected to the rendezvous after {CLOSE_WAIT:?}; closing it"
            ),
            ClientsLeft::Interrupted(sig) => tracing::info!(
                "interrupted by {} while the other nodes' launchers were connected; closing the rendezvous now",
                signal_name(sig)
            ),
        }
        drop(server);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{connect, loopback_store, wait_until};

    /// Closing a hosted rendezvous waits for the other launchers to leave, but a signal ends
    /// the wait at once (it used to be swallowed for up to 30 s).
    #[test]
    fn a_signal_ends_the_wait_for_connected_launchers() {
        let (server, config) = loopback_store();
        assert_eq!(
            wait_for_clients_to_leave(&server, 0, Duration::from_secs(600), || None),
            ClientsLeft::Left
        );
        let client = connect(&server, config);
        wait_until(Duration::from_secs(120), "the client never counted", || {
            server.num_clients() > 0
        });
        assert_eq!(
            wait_for_clients_to_leave(&server, 0, Duration::from_millis(100), || None),
            ClientsLeft::TimedOut
        );
        let mut checks = 0;
        let left = wait_for_clients_to_leave(&server, 0, Duration::from_secs(600), || {
            checks += 1;
            (checks > 2).then_some(libc::SIGINT)
        });
        assert_eq!(left, ClientsLeft::Interrupted(libc::SIGINT));
        drop(client);
        assert_eq!(
            wait_for_clients_to_leave(&server, 0, Duration::from_secs(120), || None),
            ClientsLeft::Left
        );
    }
}
