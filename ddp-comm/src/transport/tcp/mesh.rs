//! Connecting every pair of ranks in a group: the full TCP mesh.
//!
//! Each rank listens on an ephemeral port of the interface it uses to reach the store, publishes
//! `addr/<group rank>` in the group's store namespace, connects to every lower rank and accepts
//! every higher one. Both ends prove the job token (the shared hello, `auth`), and the
//! connecting peer claims which group (its id, which includes the job's random nonce), size
//! and rank it is, under its proof; anything else on the port (garbage, a wrong token, an
//! oversized hello, another group) is answered with a rejection, logged, and ignored. The
//! listener is closed once the mesh is complete.
//!
//! Hellos are read concurrently, one thread each, against one total deadline per connection:
//! a stranger that connects and says nothing (or drips bytes) delays nobody, so the ranks that
//! do connect are never blamed for it. At most [`MAX_PENDING`] hellos are read at once; one
//! more pushes out the oldest. Strangers still talking when the mesh is complete are cut off.

use super::duplex::Conn;
use crate::auth::{self, HelloError, Kind};
use crate::deadline::deadline_after;
use crate::error::{CommError, Result};
use crate::store::Store;
use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Bytes of a mesh hello's claims: group rank, group size (u32 LE each), group id (u64 LE).
const CLAIMS_BYTES: usize = 16;
/// How long, in total, an accepted connection gets to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Most hellos read at once.
const MAX_PENDING: usize = 64;

/// What a rank needs to join a group's mesh.
#[derive(Debug)]
pub(crate) struct MeshSpec<'a> {
    /// The group's store namespace.
    pub(crate) store: &'a Store,
    /// Global rank of each group rank.
    pub(crate) ranks: &'a [usize],
    pub(crate) group_rank: usize,
    /// Hash of the job nonce and the group's name, so two groups' connections can never be
    /// mixed up, and strangers cannot guess it.
    pub(crate) group_id: u64,
    pub(crate) token: &'a [u8],
    pub(crate) timeout: Duration,
    /// Socket buffer size to request, if any.
    pub(crate) socket_buffer_bytes: Option<usize>,
}

/// Builds the mesh; returns one connection per group rank (`None` at our own index).
pub(crate) fn connect_mesh(spec: &MeshSpec<'_>) -> Result<Vec<Option<Conn>>> {
    let n = spec.ranks.len();
    let me = spec.group_rank;
    let deadline = deadline_after(spec.timeout);
    let mut conns: Vec<Option<Conn>> = (0..n).map(|_| None).collect();
    if n == 1 {
        return Ok(conns);
    }
    let ip = advertised_ip(spec.store)?;
    let listener = TcpListener::bind((ip, 0)).map_err(|source| CommError::Bind {
        addr: format!("{ip}:0"),
        source,
    })?;
    let addr = listener
        .local_addr()
        .map_err(|e| CommError::io("rendezvous: reading the listener's address", e))?;
    spec.store
        .set(&format!("addr/{me}"), addr.to_string().as_bytes())?;

    for (peer, slot) in conns.iter_mut().enumerate().take(me) {
        let stream = connect_peer(spec, peer, deadline)?;
        *slot = Some(finish(spec, stream, peer)?);
    }
    accept_peers(spec, &listener, &mut conns, deadline)?;
    tracing::debug!(rank = spec.ranks[me], peers = n - 1, %addr, "tcp mesh connected");
    Ok(conns)
}

/// The address this host uses to reach the store: reachable by every peer that reaches it too.
fn advertised_ip(store: &Store) -> Result<IpAddr> {
    Ok(store.local_addr()?.ip())
}

fn finish(spec: &MeshSpec<'_>, stream: TcpStream, peer: usize) -> Result<Conn> {
    let ctx = || {
        format!(
            "rendezvous: configuring the connection to rank {}",
            spec.ranks[peer]
        )
    };
    stream
        .set_nodelay(true)
        .map_err(|e| CommError::io(ctx(), e))?;
    if let Some(bytes) = spec.socket_buffer_bytes {
        set_buffer_sizes(&stream, bytes);
    }
    stream
        .set_read_timeout(None)
        .map_err(|e| CommError::io(ctx(), e))?;
    stream
        .set_nonblocking(true)
        .map_err(|e| CommError::io(ctx(), e))?;
    Ok(Conn {
        rank: spec.ranks[peer],
        stream,
    })
}

fn set_buffer_sizes(stream: &TcpStream, bytes: usize) {
    use std::os::fd::AsRawFd;
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        // SAFETY: valid fd, pointer to a c_int of the size passed.
        unsafe {
            libc::setsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
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
    fn of(spec: &MeshSpec<'_>) -> Claims {
        Claims {
            group_rank: spec.group_rank as u32,
            group_size: spec.ranks.len() as u32,
            group_id: spec.group_id,
        }
    }

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

fn connect_peer(spec: &MeshSpec<'_>, peer: usize, deadline: Instant) -> Result<TcpStream> {
    let global = spec.ranks[peer];
    let left = deadline.saturating_duration_since(Instant::now());
    let addr_text = spec.store.get_timeout(&format!("addr/{peer}"), left)?;
    let addr: SocketAddr =
        String::from_utf8_lossy(&addr_text)
            .parse()
            .map_err(|_| CommError::Protocol {
                from: "store".into(),
                reason: format!("address of rank {global} is not host:port"),
            })?;
    let mut last: io::Error;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(10))) {
            Ok(mut s) => {
                let claims = Claims::of(spec).encode();
                return match auth::initiate(&mut s, spec.token, Kind::Mesh, &claims, deadline) {
                    Ok(()) => Ok(s),
                    Err(HelloError::Refused(reason)) => Err(CommError::Unauthorized {
                        peer: format!("rank {global}"),
                        reason,
                    }),
                    Err(HelloError::Unproven) => Err(CommError::Unauthorized {
                        peer: format!("rank {global} at {addr}"),
                        reason: "it could not prove the job token (is DDP_JOB_TOKEN the same on \
                                 every rank?)"
                            .into(),
                    }),
                    Err(HelloError::Io(e)) => Err(CommError::io(
                        format!("rendezvous: greeting rank {global} at {addr}"),
                        e,
                    )),
                };
            }
            Err(e) => last = e,
        }
        if Instant::now() >= deadline {
            return Err(CommError::io(
                format!(
                    "rendezvous: could not connect to rank {global} at {addr} within {:?}",
                    spec.timeout
                ),
                last,
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A hello read on its own thread: the connection's id and where it came from, and the peer's
/// group rank and stream, or why it was refused.
type HelloOutcome = (u64, SocketAddr, Result<(usize, TcpStream), String>);

fn accept_peers(
    spec: &MeshSpec<'_>,
    listener: &TcpListener,
    conns: &mut [Option<Conn>],
    deadline: Instant,
) -> Result<()> {
    listener
        .set_nonblocking(true)
        .map_err(|e| CommError::io("rendezvous: configuring the listener", e))?;
    let mut pending: VecDeque<(u64, TcpStream)> = VecDeque::new();
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel::<HelloOutcome>();
        let outcome = accept_until_complete(
            spec,
            listener,
            conns,
            deadline,
            &mut pending,
            |id, from, stream| {
                let tx = tx.clone();
                let hello_deadline = deadline.min(deadline_after(HELLO_TIMEOUT));
                std::thread::Builder::new()
                    .name("ddp-comm-hello".into())
                    .spawn_scoped(scope, move || {
                        let _ = tx.send((id, from, read_hello(spec, stream, hello_deadline)));
                    })
                    .map(drop)
            },
            &rx,
        );
        // Whoever is still saying hello now is not a rank we need: cut them off so the scope
        // (which joins their threads) ends at once.
        for (_, s) in &pending {
            let _ = s.shutdown(Shutdown::Both);
        }
        outcome
    })
}

/// The accept loop: hands each new connection to `start_hello`, takes in the hellos that
/// finish, until every higher rank is connected or the deadline passes.
fn accept_until_complete(
    spec: &MeshSpec<'_>,
    listener: &TcpListener,
    conns: &mut [Option<Conn>],
    deadline: Instant,
    pending: &mut VecDeque<(u64, TcpStream)>,
    mut start_hello: impl FnMut(u64, SocketAddr, TcpStream) -> io::Result<()>,
    finished: &mpsc::Receiver<HelloOutcome>,
) -> Result<()> {
    let missing = |conns: &[Option<Conn>]| -> Vec<usize> {
        (spec.group_rank + 1..conns.len())
            .filter(|&p| conns[p].is_none())
            .collect()
    };
    let mut next_id = 0u64;
    loop {
        while let Ok(outcome) = finished.try_recv() {
            take(spec, conns, pending, outcome)?;
        }
        let waiting = missing(conns);
        if waiting.is_empty() {
            return Ok(());
        }
        match listener.accept() {
            Ok((stream, from)) => {
                next_id += 1;
                if pending.len() >= MAX_PENDING
                    && let Some((_, oldest)) = pending.pop_front()
                {
                    tracing::warn!(
                        limit = MAX_PENDING,
                        "rendezvous: too many hellos at once; dropping the oldest"
                    );
                    let _ = oldest.shutdown(Shutdown::Both);
                }
                let started = stream.try_clone().and_then(|handle| {
                    pending.push_back((next_id, handle));
                    start_hello(next_id, from, stream)
                });
                if let Err(e) = started {
                    pending.retain(|(p, _)| *p != next_id);
                    tracing::warn!(%from, error = %e, "rendezvous: could not read a hello");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let names: Vec<String> =
                        waiting.iter().map(|&p| spec.ranks[p].to_string()).collect();
                    return Err(CommError::Timeout {
                        op: "rendezvous".into(),
                        peer: spec.ranks[waiting[0]],
                        timeout: spec.timeout,
                        detail: format!(" (rank(s) {} never connected)", names.join(", ")),
                    });
                }
                // Wait for a hello to finish, or a moment before looking for new connections.
                if let Ok(outcome) = finished.recv_timeout(Duration::from_millis(5)) {
                    take(spec, conns, pending, outcome)?;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(CommError::io("rendezvous: accept", e)),
        }
    }
}

/// Takes in a finished hello: admits the peer or logs why it was refused.
fn take(
    spec: &MeshSpec<'_>,
    conns: &mut [Option<Conn>],
    pending: &mut VecDeque<(u64, TcpStream)>,
    (id, from, outcome): HelloOutcome,
) -> Result<()> {
    pending.retain(|(p, _)| *p != id);
    match outcome {
        Ok((peer, stream)) => admit(spec, conns, peer, stream, from),
        Err(reason) => {
            tracing::warn!(%from, %reason, "rendezvous: rejected a connection");
            Ok(())
        }
    }
}

/// Takes a peer whose hello was valid, unless its rank is already connected, and acknowledges.
fn admit(
    spec: &MeshSpec<'_>,
    conns: &mut [Option<Conn>],
    peer: usize,
    mut stream: TcpStream,
    from: SocketAddr,
) -> Result<()> {
    let ack_deadline = deadline_after(HELLO_TIMEOUT);
    if conns[peer].is_some() {
        let reason = format!("group rank {peer} is already connected");
        let _ = auth::answer(&mut stream, Err(&reason), ack_deadline);
        tracing::warn!(%from, %reason, "rendezvous: rejected a connection");
        return Ok(());
    }
    if let Err(e) = auth::answer(&mut stream, Ok(()), ack_deadline) {
        tracing::warn!(%from, error = %e, "rendezvous: could not acknowledge a hello");
        return Ok(());
    }
    conns[peer] = Some(finish(spec, stream, peer)?);
    Ok(())
}

/// Runs the accepting side of a hello before `deadline` and checks the claims; returns the
/// peer's group rank, or why it was refused (having told it). Whether the rank is already
/// connected is for the accept loop to say.
fn read_hello(
    spec: &MeshSpec<'_>,
    mut s: TcpStream,
    deadline: Instant,
) -> Result<(usize, TcpStream), String> {
    let _ = s.set_nonblocking(false);
    let verified = auth::respond(&mut s, spec.token, Kind::Mesh, deadline)?;
    let n = spec.ranks.len();
    let reason = match Claims::decode(&verified.claims) {
        None => "malformed mesh claims".to_string(),
        Some(c) if c.group_id != spec.group_id || c.group_size as usize != n => {
            "hello for another process group".to_string()
        }
        Some(c) if (c.group_rank as usize) <= spec.group_rank || c.group_rank as usize >= n => {
            format!("unexpected group rank {}", c.group_rank)
        }
        Some(c) => return Ok((c.group_rank as usize, s)),
    };
    let _ = auth::answer(&mut s, Err(&reason), deadline);
    Err(reason)
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
