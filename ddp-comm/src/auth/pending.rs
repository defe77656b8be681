//! The hellos an event loop is running, capped with a grace period: shared by the store server
//! and a rank's mesh listener, so strangers get the same treatment on both ports.
//!
//! At most [`MAX_PENDING`] hellos run at once. With that many running, the accept loop stops
//! accepting (new connections wait in the listen backlog) until one ends, or pushes out the
//! oldest once it has run [`PENDING_GRACE`]. A real peer says hello within milliseconds, so
//! the oldest pending connection is the likeliest to be a stranger, and every connection,
//! real or not, gets its grace: a flood of idle connections is drained at a bounded pace and
//! cannot push a real peer out the moment it is accepted (a real peer pushed out anyway simply
//! connects again).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, oneshot};
use tokio::task::AbortHandle;
use tokio::time::Instant;

/// Most connections kept at once that have not completed their hello.
pub(crate) const MAX_PENDING: usize = 64;
/// How long a hello may run before, with [`MAX_PENDING`] running, it is pushed out to make
/// room.
pub(crate) const PENDING_GRACE: Duration = Duration::from_millis(50);
/// How long the accept loop pauses after a failed accept (out of file descriptors, say).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Connections still in their hello, oldest first: id, when accepted, the task.
#[derive(Debug, Default)]
struct List {
    tasks: VecDeque<(u64, Instant, AbortHandle)>,
    next_id: u64,
}

#[derive(Debug)]
struct Shared {
    list: Mutex<List>,
    freed: Notify,
    /// Names the listener in logs ("store", "rendezvous").
    what: &'static str,
    /// Rate-limits the warnings about connections pushed out.
    pushed_out: super::StrangerLog,
}

fn lock(s: &Shared) -> MutexGuard<'_, List> {
    s.list.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The running hellos of one listener.
#[derive(Debug, Clone)]
pub(crate) struct PendingHellos {
    shared: Arc<Shared>,
}

/// Held by a hello's task: dropping it (the hello ended, however it ended, or its task was
/// dropped) takes the connection off the list and frees its slot.
#[derive(Debug)]
pub(crate) struct HelloSlot {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for HelloSlot {
    fn drop(&mut self) {
        lock(&self.shared).tasks.retain(|(t, _, _)| *t != self.id);
        self.shared.freed.notify_one();
    }
}

/// Why [`PendingHellos::room`] returned without room: the listener is stopping.
#[derive(Debug)]
pub(crate) struct Stopped;

impl PendingHellos {
    /// An empty list; `what` names the listener in logs.
    pub(crate) fn new(what: &'static str) -> Self {
        PendingHellos {
            shared: Arc::new(Shared {
                list: Mutex::new(List::default()),
                freed: Notify::new(),
                what,
                pushed_out: super::StrangerLog::new(),
            }),
        }
    }

    /// Waits until another hello may start: at the cap, until one ends or the oldest has had
    /// its grace (then it is pushed out).
    ///
    /// # Errors
    /// [`Stopped`] when `stop` fires first.
    pub(crate) async fn room(&self, stop: &mut oneshot::Receiver<()>) -> Result<(), Stopped> {
        loop {
            let oldest = {
                let l = lock(&self.shared);
                (l.tasks.len() >= MAX_PENDING)
                    .then(|| l.tasks.front().map(|(_, since, _)| *since))
                    .flatten()
            };
            let Some(since) = oldest else { return Ok(()) };
            tokio::select! {
                _ = &mut *stop => return Err(Stopped),
                _ = self.shared.freed.notified() => {}
                _ = tokio::time::sleep_until(since + PENDING_GRACE) => {
                    if let Some((_, _, task)) = lock(&self.shared).tasks.pop_front() {
                        super::warn_stranger!(
                            self.shared.pushed_out,
                            limit = MAX_PENDING,
                            listener = self.shared.what,
                            "too many connections without a hello; dropping the oldest"
                        );
                        task.abort();
                    }
                }
            }
        }
    }

    /// The next connection once another hello may start (see [`room`](Self::room)); a failed
    /// accept is logged and retried after a pause.
    ///
    /// # Errors
    /// [`Stopped`] when `stop` fires first.
    pub(crate) async fn accept(
        &self,
        listener: &TcpListener,
        stop: &mut oneshot::Receiver<()>,
    ) -> Result<(TcpStream, SocketAddr), Stopped> {
        loop {
            self.room(stop).await?;
            let accepted = tokio::select! {
                _ = &mut *stop => return Err(Stopped),
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok(conn) => return Ok(conn),
                Err(e) => {
                    tracing::warn!(error = %e, listener = self.shared.what, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    }

    /// Spawns a hello's task on the current runtime and lists it; `hello` gets the slot to
    /// hold for as long as the hello runs.
    pub(crate) fn spawn<F>(&self, hello: impl FnOnce(HelloSlot) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let id = {
            let mut l = lock(&self.shared);
            l.next_id += 1;
            l.next_id
        };
        let slot = HelloSlot {
            shared: self.shared.clone(),
            id,
        };
        let task = tokio::spawn(hello(slot));
        // Listed before the task can run (the caller has not yielded), so it cannot take
        // itself off the list before it is on it. A task that already finished is aborted
        // harmlessly if ever pushed out.
        lock(&self.shared)
            .tasks
            .push_back((id, Instant::now(), task.abort_handle()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hello that ends frees its slot without pushing anyone out; at the cap the oldest is
    /// the one pushed out.
    #[test]
    fn the_oldest_hello_gets_its_grace_and_ended_ones_free_their_slot() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let pending = PendingHellos::new("test");
            let (_keep, mut stop) = oneshot::channel::<()>();
            let (end_tx, end_rx) = oneshot::channel::<()>();
            let mut end_rx = Some(end_rx);
            let (aborted_tx, mut aborted_rx) = tokio::sync::mpsc::unbounded_channel::<usize>();
            for i in 0..MAX_PENDING {
                let rx = if i == 1 { end_rx.take() } else { None };
                let aborted = aborted_tx.clone();
                pending.room(&mut stop).await.expect("room below the cap");
                pending.spawn(move |slot| async move {
                    // Reports its abort when dropped unfinished.
                    struct OnDrop(usize, tokio::sync::mpsc::UnboundedSender<usize>, bool);
                    impl Drop for OnDrop {
                        fn drop(&mut self) {
                            if !self.2 {
                                let _ = self.1.send(self.0);
                            }
                        }
                    }
                    let mut guard = OnDrop(i, aborted, false);
                    match rx {
                        Some(rx) => {
                            let _ = rx.await;
                            guard.2 = true;
                        }
                        None => std::future::pending::<()>().await,
                    }
                    drop(slot);
                });
            }
            tokio::task::yield_now().await;
            // Hello 1 ends: room at once, nobody pushed out.
            end_tx.send(()).expect("end");
            pending.room(&mut stop).await.expect("room");
            assert!(aborted_rx.try_recv().is_err(), "nobody may be pushed out");
            pending.spawn(|slot| async move {
                std::future::pending::<()>().await;
                drop(slot);
            });
            // At the cap again: the oldest (hello 0) is the one pushed out.
            pending.room(&mut stop).await.expect("room");
            tokio::task::yield_now().await;
            assert_eq!(aborted_rx.recv().await, Some(0));
        });
    }
}
