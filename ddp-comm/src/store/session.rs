//! One client connection on the store's event loop: the hello against its deadline, then
//! requests until the client leaves.

use super::config::StoreConfig;
use super::protocol::{FrameWriter, Malformed, ReadFrameError, Status, VERSION, read_frame_async};
use super::state::State;
use crate::auth::{Kind, StrangerLog, event_loop, warn_stranger};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Rate-limits the warnings about strangers on every store port of this process.
static STRANGERS: StrangerLog = StrangerLog::new();

/// What a connection task needs from the server.
#[derive(Debug)]
pub(super) struct Served {
    pub(super) state: State,
    pub(super) config: StoreConfig,
    /// Authenticated clients currently connected (at most `config.max_clients`).
    pub(super) clients: AtomicUsize,
    /// Connections refused at the hello (wrong token, garbage, too slow), for the owner to
    /// report (e.g. a launcher saying why a node never joined).
    pub(super) refused: AtomicUsize,
}

/// Holds one of the server's client slots for as long as it lives, however its task ends (even
/// when the event loop drops it at shutdown).
struct Slot<'a>(&'a AtomicUsize);

impl<'a> Slot<'a> {
    /// Takes a slot, or `None` when `max` clients are already served.
    fn take(n: &'a AtomicUsize, max: usize) -> Option<Self> {
        n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| {
            (c < max).then_some(c + 1)
        })
        .ok()
        .map(|_| Slot(n))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs the hello before `deadline`; `hello_done` is called when it ends, however it ends (the
/// server stops counting the connection as pending), then a trusted client's requests are
/// served until it leaves.
pub(super) async fn serve(
    served: Arc<Served>,
    mut stream: TcpStream,
    peer: SocketAddr,
    deadline: tokio::time::Instant,
    hello_done: impl FnOnce(),
) {
    let hello = tokio::time::timeout_at(deadline, authenticate(&served, &mut stream)).await;
    hello_done();
    let Some(_slot) = STRANGERS.hello_outcome("store", peer, served.config.hello_timeout, hello)
    else {
        served.refused.fetch_add(1, Ordering::SeqCst);
        return;
    };
    loop {
        let body = match read_frame_async(&mut stream, served.config.max_frame_bytes).await {
            Ok(body) => body,
            Err(ReadFrameError::Io(_)) => return, // client left
            Err(ReadFrameError::TooLarge { len, max }) => {
                warn_stranger!(STRANGERS, %peer, len, max, "store: frame over the limit, disconnecting client");
                return;
            }
        };
        let reply = match served
            .state
            .handle(&body, served.config.max_frame_bytes)
            .await
        {
            Ok(reply) => reply,
            Err(Malformed(what)) => {
                warn_stranger!(STRANGERS, %peer, what, "store: malformed request, disconnecting client");
                let refusal = FrameWriter::new(Status::BadRequest as u8)
                    .bytes(format!("malformed request: bad {what}").as_bytes());
                let _ = stream.write_all(&refusal.into_frame()).await;
                event_loop::close_gracefully(&mut stream).await;
                return;
            }
        };
        if stream.write_all(&reply.into_frame()).await.is_err() {
            return;
        }
    }
}

/// The hello (`auth`), the protocol version check, then a client slot; the client is told why
/// it is refused when it can still hear it. The slot is taken before the verdict is sent (so
/// an admitted client always has one) and given back if the verdict cannot be sent.
async fn authenticate<'s>(served: &'s Served, stream: &mut TcpStream) -> Result<Slot<'s>, String> {
    let verified = event_loop::respond(stream, &served.config.token, Kind::Store).await?;
    let version = match verified.claims.as_slice() {
        [a, b] => Some(u16::from_le_bytes([*a, *b])),
        _ => None,
    };
    if version != Some(VERSION) {
        let theirs = version.map_or_else(|| "unknown".to_string(), |v| v.to_string());
        let reason = format!(
            "the client speaks store protocol version {theirs} and the store (rank 0 or the \
             launcher) speaks {VERSION}: build every rank and the launcher from the same \
             ddp-comm version"
        );
        let _ = event_loop::answer(stream, Err(&reason)).await;
        return Err(reason);
    }
    let max = served.config.max_clients;
    let Some(slot) = Slot::take(&served.clients, max) else {
        let reason = format!(
            "the store already serves its limit of {max} clients (StoreConfig::max_clients); \
             try again later"
        );
        let _ = event_loop::answer(stream, Err(&reason)).await;
        return Err(reason);
    };
    event_loop::answer(stream, Ok(())).await.map(|()| slot)
}
