//! A rank's mesh listener: accepts its peers' connections for the whole life of the transport,
//! so connections can be made whenever a collective first needs them.
//!
//! It runs a single-threaded tokio runtime on its own thread. Every accepted connection is a
//! task that must complete the hello (`auth`: both sides prove the job token, the initiator
//! claims its group and rank under its proof) within [`HELLO_TIMEOUT`] in total, however
//! slowly its bytes arrive; at most [`MAX_PENDING`] hellos run at once, one more pushes out
//! the oldest. A stranger (garbage, a wrong token, a replayed hello, another group, a rank
//! that is already connected) is refused, logged, and never reaches the transport, so it
//! neither delays nor gets blamed on a real rank. Admitted peers are handed over, as blocking
//! sockets, through a channel.

use crate::auth::{Kind, event_loop};
use crate::deadline::deadline_after;
use crate::error::{CommError, Result};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::AbortHandle;

/// How long, in total, an accepted connection gets to complete its hello.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Most hellos run at once.
pub(crate) const MAX_PENDING: usize = 64;
/// Pause after a failed accept (out of file descriptors, say).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Bytes of a mesh hello's claims: group rank, group size (u32 LE each), group id (u64 LE).
const CLAIMS_BYTES: usize = 16;

/// A peer whose hello was valid: its group rank and the connection (blocking mode).
#[derive(Debug)]
pub(crate) struct Arrival {
    pub(crate) group_rank: usize,
    pub(crate) stream: TcpStream,
    pub(crate) from: SocketAddr,
}

/// Who may connect: ranks of this group above ours, each once.
#[derive(Debug)]
pub(crate) struct Expect {
    pub(crate) token: Vec<u8>,
    pub(crate) group_id: u64,
    pub(crate) group_size: usize,
    pub(crate) group_rank: usize,
}

/// The running listener. Dropping it stops the event loop and closes every pending hello.
#[derive(Debug)]
pub(crate) struct Acceptor {
    addr: SocketAddr,
    arrived: mpsc::Receiver<Arrival>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Acceptor {
    /// Listens on an ephemeral port of `ip` and starts accepting.
    ///
    /// # Errors
    /// [`CommError::Bind`], or an I/O error starting the event loop.
    pub(crate) fn start(ip: IpAddr, expect: Expect) -> Result<Acceptor> {
        let listener = TcpListener::bind((ip, 0)).map_err(|source| CommError::Bind {
            addr: format!("{ip}:0"),
            source,
        })?;
        let ctx = |what: &str| format!("rendezvous: {what}");
        let addr = listener
            .local_addr()
            .map_err(|e| CommError::io(ctx("reading the listener's address"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| CommError::io(ctx("configuring the listener"), e))?;
        crate::connect::raise_backlog(&listener);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| CommError::io(ctx("starting the listener's event loop"), e))?;
        let listener = {
            let _in_runtime = runtime.enter();
            tokio::net::TcpListener::from_std(listener)
                .map_err(|e| CommError::io(ctx("registering the listener"), e))?
        };
        let (tx, arrived) = mpsc::channel();
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("ddp-comm-accept".into())
            .spawn(move || {
                runtime.block_on(accept_loop(listener, Arc::new(expect), tx, stopped));
                // Dropping the runtime drops every hello still running, closing its socket.
                drop(runtime);
            })
            .map_err(|e| CommError::io(ctx("starting the listener's thread"), e))?;
        Ok(Acceptor {
            addr,
            arrived,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address peers connect to.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The next admitted peer, waiting at most `wait`.
    pub(crate) fn next(&self, wait: Duration) -> Option<Arrival> {
        self.arrived.recv_timeout(wait).ok()
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What a connecting rank claims to be; covered by its proof of the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claims {
    pub(crate) group_rank: u32,
    pub(crate) group_size: u32,
    pub(crate) group_id: u64,
}

impl Claims {
    pub(crate) fn encode(&self) -> [u8; CLAIMS_BYTES] {
        let mut b = [0u8; CLAIMS_BYTES];
        b[0..4].copy_from_slice(&self.group_rank.to_le_bytes());
        b[4..8].copy_from_slice(&self.group_size.to_le_bytes());
        b[8..16].copy_from_slice(&self.group_id.to_le_bytes());
        b
    }

    /// `None` unless `b` is exactly one encoded [`Claims`].
    pub(crate) fn decode(b: &[u8]) -> Option<Claims> {
        let b: &[u8; CLAIMS_BYTES] = b.try_into().ok()?;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut id = [0u8; 8];
        id.copy_from_slice(&b[8..16]);
        Some(Claims {
            group_rank: u32_at(0),
            group_size: u32_at(4),
            group_id: u64::from_le_bytes(id),
        })
    }
}

/// Which group ranks have been admitted (each at most once), and the hellos still running.
#[derive(Debug)]
struct Book {
    admitted: Vec<bool>,
    pending: VecDeque<(u64, AbortHandle)>,
}

fn lock(b: &Mutex<Book>) -> std::sync::MutexGuard<'_, Book> {
    b.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    expect: Arc<Expect>,
    arrived: mpsc::Sender<Arrival>,
    mut stop: oneshot::Receiver<()>,
) {
    let book = Arc::new(Mutex::new(Book {
        admitted: vec![false; expect.group_size],
        pending: VecDeque::new(),
    }));
    let mut next_id = 0u64;
    loop {
        let accepted = tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, from) = match accepted {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(error = %e, "rendezvous: accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        next_id += 1;
        let id = next_id;
        let deadline = tokio::time::Instant::from_std(deadline_after(HELLO_TIMEOUT));
        let task = tokio::spawn(hello(
            stream,
            from,
            deadline,
            expect.clone(),
            book.clone(),
            id,
            arrived.clone(),
        ));
        // The task has not run yet (this loop has not yielded): it is listed before it can
        // take itself off the list.
        let evicted = {
            let mut b = lock(&book);
            b.pending.push_back((id, task.abort_handle()));
            if b.pending.len() > MAX_PENDING {
                b.pending.pop_front()
            } else {
                None
            }
        };
        if let Some((_, oldest)) = evicted {
            tracing::warn!(
                limit = MAX_PENDING,
                "rendezvous: too many hellos at once; dropping the oldest"
            );
            oldest.abort();
        }
    }
}

/// One connection's hello, before `deadline`; a valid peer goes to `arrived`.
async fn hello(
    mut stream: tokio::net::TcpStream,
    from: SocketAddr,
    deadline: tokio::time::Instant,
    expect: Arc<Expect>,
    book: Arc<Mutex<Book>>,
    id: u64,
    arrived: mpsc::Sender<Arrival>,
) {
    let outcome = tokio::time::timeout_at(deadline, admit(&mut stream, &expect, &book)).await;
    lock(&book).pending.retain(|(p, _)| *p != id);
    let group_rank = match outcome {
        Ok(Ok(r)) => r,
        Ok(Err(reason)) => {
            tracing::warn!(%from, %reason, "rendezvous: rejected a connection");
            return;
        }
        Err(_) => {
            tracing::warn!(%from, timeout = ?HELLO_TIMEOUT, "rendezvous: no complete hello before the deadline, dropping the connection");
            return;
        }
    };
    match stream.into_std().and_then(|s| {
        s.set_nonblocking(false)?;
        Ok(s)
    }) {
        Ok(stream) => {
            // The transport may be gone already (dropped while this hello ran): then the
            // connection just closes.
            let _ = arrived.send(Arrival {
                group_rank,
                stream,
                from,
            });
        }
        Err(e) => tracing::warn!(%from, error = %e, "rendezvous: could not take a connection"),
    }
}

/// Runs the hello and checks the claims; returns the peer's group rank, or why it was refused
/// (having told it).
async fn admit(
    stream: &mut tokio::net::TcpStream,
    expect: &Expect,
    book: &Mutex<Book>,
) -> std::result::Result<usize, String> {
    let verified = event_loop::respond(stream, &expect.token, Kind::Mesh).await?;
    let verdict = match Claims::decode(&verified.claims) {
        None => Err("malformed mesh claims".to_string()),
        Some(c) if c.group_id != expect.group_id || c.group_size as usize != expect.group_size => {
            Err("hello for another process group".to_string())
        }
        Some(c)
            if (c.group_rank as usize) <= expect.group_rank
                || c.group_rank as usize >= expect.group_size =>
        {
            Err(format!("unexpected group rank {}", c.group_rank))
        }
        Some(c) => {
            let r = c.group_rank as usize;
            let mut b = lock(book);
            if b.admitted[r] {
                Err(format!("group rank {r} is already connected"))
            } else {
                b.admitted[r] = true;
                Ok(r)
            }
        }
    };
    match verdict {
        Ok(r) => event_loop::answer(stream, Ok(())).await.map(|()| r),
        Err(reason) => {
            let _ = event_loop::answer(stream, Err(&reason)).await;
            Err(reason)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proptest_support::config;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(config())]

        /// Any claim bytes decode to nothing or to claims that encode back to them.
        #[test]
        fn claims_decode_safely(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Some(c) = Claims::decode(&bytes) {
                prop_assert_eq!(&c.encode()[..], &bytes[..]);
            }
        }

        #[test]
        fn claims_round_trip(group_rank in any::<u32>(), group_size in any::<u32>(), group_id in any::<u64>()) {
            let c = Claims { group_rank, group_size, group_id };
            prop_assert_eq!(Claims::decode(&c.encode()), Some(c));
        }
    }
}
