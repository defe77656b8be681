//! A rank's mesh listener: accepts its peers' connections for the whole life of the transport,
//! so connections can be made whenever a collective first needs them.
//!
//! It runs a single-threaded tokio runtime on its own thread. Every accepted connection is a
//! task that must complete the hello (`auth`: both sides prove the job token, the initiator
//! claims its group and rank under its proof) within [`HELLO_TIMEOUT`] in total, however
//! slowly its bytes arrive; the hellos running at once are capped with a grace period
//! (`auth::pending`, the store's scheme), so a flood of idle connections is drained at a
//! bounded pace and cannot push a real rank out the moment it is accepted. A stranger (garbage, a wrong token, a replayed hello, another group, a rank
//! that is already connected) is refused, logged, and never reaches the transport, so it
//! neither delays nor gets blamed on a real rank. A rank is admitted only once the accepting
//! verdict has been written; admitted peers are handed over, as blocking sockets, through a
//! channel. Once the group is aborted (after a failure), a rank that connects is refused with
//! [`ABORTED_VERDICT`], so it fails at once instead of waiting for data that never comes.

use crate::auth::{HelloSlot, Kind, PendingHellos, StrangerLog, event_loop};
use crate::connect::EventLoop;
use crate::deadline::deadline_after;
use crate::error::{CommError, Result};
use crate::transport::LiveStreams;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::oneshot;

/// How long, in total, an accepted connection gets to complete its hello.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// The refusal a rank gets from a peer whose group was aborted: the connecting side recognises
/// it, and fails naming that peer as gone rather than as refusing the job token.
pub(crate) const ABORTED_VERDICT: &str = "its process group was aborted after a failure";
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
    /// The group's abort: once set, every rank that connects is refused.
    pub(crate) live: Arc<LiveStreams>,
}

/// The running listener. Dropping it stops the event loop and closes every pending hello.
#[derive(Debug)]
pub(crate) struct Acceptor {
    /// Kept for its drop, which stops and joins the loop; first, so that happens before
    /// `arrived` is dropped.
    _running: EventLoop,
    addr: SocketAddr,
    arrived: mpsc::Receiver<Arrival>,
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
        let (tx, arrived) = mpsc::channel();
        let (addr, running) =
            EventLoop::start(listener, "rendezvous", "ddp-comm-accept", |l, stop| {
                accept_loop(l, Arc::new(expect), tx, stop)
            })?;
        Ok(Acceptor {
            _running: running,
            addr,
            arrived,
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

/// Where a group rank stands with this listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seat {
    Free,
    /// Its hello passed and the accepting verdict is being written: a second hello for the
    /// same rank is refused meanwhile.
    Reserved,
    /// The verdict was written: the connection belongs to the transport.
    Admitted,
}

/// Where each group rank stands (each is admitted at most once).
type Book = Mutex<Vec<Seat>>;

fn lock(b: &Book) -> std::sync::MutexGuard<'_, Vec<Seat>> {
    b.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    expect: Arc<Expect>,
    arrived: mpsc::Sender<Arrival>,
    mut stop: oneshot::Receiver<()>,
) {
    let book: Arc<Book> = Arc::new(Mutex::new(vec![Seat::Free; expect.group_size]));
    let pending = PendingHellos::new("rendezvous");
    // At the cap, `accept` waits for a hello to end, or pushes out the oldest once it had its
    // grace.
    while let Ok((stream, from)) = pending.accept(&listener, &mut stop).await {
        let deadline = tokio::time::Instant::from_std(deadline_after(HELLO_TIMEOUT));
        let (expect, book, arrived) = (expect.clone(), book.clone(), arrived.clone());
        pending.spawn(move |slot| hello(stream, from, deadline, expect, book, slot, arrived));
    }
}

/// Rate-limits the warnings about strangers on every mesh port of this process.
static STRANGERS: StrangerLog = StrangerLog::new();

/// One connection's hello, before `deadline`; a valid peer goes to `arrived`.
async fn hello(
    mut stream: tokio::net::TcpStream,
    from: SocketAddr,
    deadline: tokio::time::Instant,
    expect: Arc<Expect>,
    book: Arc<Book>,
    slot: HelloSlot,
    arrived: mpsc::Sender<Arrival>,
) {
    let outcome = tokio::time::timeout_at(deadline, admit(&mut stream, &expect, &book)).await;
    drop(slot);
    let Some(group_rank) = STRANGERS.hello_outcome("rendezvous", from, HELLO_TIMEOUT, outcome)
    else {
        return;
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

/// Gives a reserved seat back unless it was admitted: when the verdict could not be written,
/// or the hello was dropped (deadline, pushed out) while writing it, the rank may connect
/// again.
struct Reservation<'a> {
    book: &'a Book,
    rank: usize,
    admitted: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut b = lock(self.book);
        b[self.rank] = if self.admitted {
            Seat::Admitted
        } else {
            Seat::Free
        };
    }
}

/// Runs the hello and checks the claims; returns the peer's group rank once the accepting
/// verdict has been written, or why it was refused (having told it).
async fn admit(
    stream: &mut tokio::net::TcpStream,
    expect: &Expect,
    book: &Book,
) -> std::result::Result<usize, String> {
    let verified = event_loop::respond(stream, &expect.token, Kind::Mesh).await?;
    let verdict = match Claims::decode(&verified.claims) {
        Some(_) if expect.live.aborted() => Err(ABORTED_VERDICT.to_string()),
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
            if b[r] != Seat::Free {
                Err(format!("group rank {r} is already connected"))
            } else {
                b[r] = Seat::Reserved;
                Ok(r)
            }
        }
    };
    match verdict {
        Ok(rank) => {
            let mut seat = Reservation {
                book,
                rank,
                admitted: false,
            };
            event_loop::answer(stream, Ok(())).await?;
            seat.admitted = true;
            Ok(rank)
        }
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

    /// A rank whose accepting verdict could not be written (the write failed, or the hello was
    /// dropped meanwhile) is not admitted: its seat is free again, so its retry can connect.
    #[test]
    fn a_seat_is_admitted_only_once_its_verdict_is_written() {
        let book: Book = Mutex::new(vec![Seat::Free; 3]);
        lock(&book)[1] = Seat::Reserved;
        drop(Reservation {
            book: &book,
            rank: 1,
            admitted: false,
        });
        assert_eq!(lock(&book)[1], Seat::Free, "verdict never written");
        lock(&book)[2] = Seat::Reserved;
        let mut seat = Reservation {
            book: &book,
            rank: 2,
            admitted: false,
        };
        assert_eq!(lock(&book)[2], Seat::Reserved, "not admitted while writing");
        seat.admitted = true;
        drop(seat);
        assert_eq!(lock(&book)[2], Seat::Admitted);
    }

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
