//! Connecting every pair of ranks in a group: the full TCP mesh.
//!
//! Each rank listens on an ephemeral port of the interface it uses to reach the store, publishes
//! `addr/<group rank>` in the group's store namespace, connects to every lower rank and accepts
//! every higher one. A connecting peer proves the job token and says which group and rank it
//! is; anything else on the port (garbage, a wrong token, an oversized hello) is answered with a
//! rejection, logged, and ignored. The listener is closed once the mesh is complete.
//!
//! Hellos are read concurrently, one thread each, against one total deadline per connection:
//! a stranger that connects and says nothing (or drips bytes) delays nobody, so the ranks that
//! do connect are never blamed for it. At most [`MAX_PENDING`] hellos are read at once; one
//! more pushes out the oldest. Strangers still talking when the mesh is complete are cut off.

use super::duplex::Conn;
use crate::auth::{MAX_TOKEN_BYTES, constant_time_eq};
use crate::deadline::deadline_after;
use crate::deadline_io::{read_exact_by, write_all_by};
use crate::error::{CommError, Result};
use crate::store::Store;
use std::collections::VecDeque;
use std::io::{self, Read};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"DDPH";
const VERSION: u8 = 1;
/// magic, version, 3 reserved, group rank, group size, group id, token length.
const HELLO_FIXED: usize = 4 + 1 + 3 + 4 + 4 + 8 + 2;
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
    /// Hash of the group's name, so two groups' connections can never be mixed up.
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

fn hello(spec: &MeshSpec<'_>) -> Vec<u8> {
    let mut h = Vec::with_capacity(HELLO_FIXED + spec.token.len());
    h.extend_from_slice(MAGIC);
    h.push(VERSION);
    h.extend_from_slice(&[0; 3]);
    h.extend_from_slice(&(spec.group_rank as u32).to_le_bytes());
    h.extend_from_slice(&(spec.ranks.len() as u32).to_le_bytes());
    h.extend_from_slice(&spec.group_id.to_le_bytes());
    h.extend_from_slice(&(spec.token.len() as u16).to_le_bytes());
    h.extend_from_slice(spec.token);
    h
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
                let ctx = || format!("rendezvous: greeting rank {global} at {addr}");
                write_all_by(&mut s, &hello(spec), deadline)
                    .map_err(|e| CommError::io(ctx(), e))?;
                let mut status = [0u8; 1];
                read_exact_by(&mut s, &mut status, deadline)
                    .map_err(|e| CommError::io(ctx(), e))?;
                if status[0] != 0 {
                    let mut msg = Vec::new();
                    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                    let _ = (&mut s).take(1024).read_to_end(&mut msg);
                    return Err(CommError::Unauthorized {
                        peer: format!("rank {global}"),
                        reason: String::from_utf8_lossy(&msg).into_owned(),
                    });
                }
                return Ok(s);
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
        reject(&mut stream, &reason, ack_deadline);
        tracing::warn!(%from, %reason, "rendezvous: rejected a connection");
        return Ok(());
    }
    if let Err(e) = write_all_by(&mut stream, &[0], ack_deadline) {
        tracing::warn!(%from, error = %e, "rendezvous: could not acknowledge a hello");
        return Ok(());
    }
    conns[peer] = Some(finish(spec, stream, peer)?);
    Ok(())
}

/// Tells a refused peer why (best effort).
fn reject(s: &mut TcpStream, reason: &str, deadline: Instant) {
    let mut msg = vec![1u8];
    msg.extend_from_slice(reason.as_bytes());
    let _ = write_all_by(s, &msg, deadline);
}

/// Reads and validates a hello before `deadline`; on any problem answers with a rejection and
/// returns the reason. Whether the rank is already connected is for the accept loop to say.
fn read_hello(
    spec: &MeshSpec<'_>,
    mut s: TcpStream,
    deadline: Instant,
) -> Result<(usize, TcpStream), String> {
    let refuse = |s: &mut TcpStream, reason: String| -> String {
        reject(s, &reason, deadline);
        reason
    };
    let _ = s.set_nonblocking(false);
    let mut fixed = [0u8; HELLO_FIXED];
    if let Err(e) = read_exact_by(&mut s, &mut fixed, deadline) {
        return Err(format!("no complete hello: {e}"));
    }
    if &fixed[0..4] != MAGIC || fixed[4] != VERSION {
        return Err(refuse(
            &mut s,
            "not a ddp-comm hello (bad magic or version)".into(),
        ));
    }
    let u32_at = |i: usize| {
        u32::from_le_bytes([fixed[i], fixed[i + 1], fixed[i + 2], fixed[i + 3]]) as usize
    };
    let (peer, size) = (u32_at(8), u32_at(12));
    let mut gid = [0u8; 8];
    gid.copy_from_slice(&fixed[16..24]);
    let token_len = u16::from_le_bytes([fixed[24], fixed[25]]) as usize;
    if token_len > MAX_TOKEN_BYTES {
        return Err(refuse(
            &mut s,
            format!("token of {token_len} bytes exceeds {MAX_TOKEN_BYTES}"),
        ));
    }
    let mut token = vec![0u8; token_len];
    if let Err(e) = read_exact_by(&mut s, &mut token, deadline) {
        return Err(format!("truncated hello: {e}"));
    }
    let n = spec.ranks.len();
    let reason = if !constant_time_eq(&token, spec.token) {
        Some("wrong or missing job token (set DDP_JOB_TOKEN to the job's token)".to_string())
    } else if u64::from_le_bytes(gid) != spec.group_id || size != n {
        Some("hello for another process group".to_string())
    } else if peer <= spec.group_rank || peer >= n {
        Some(format!("unexpected group rank {peer}"))
    } else {
        None
    };
    match reason {
        Some(r) => Err(refuse(&mut s, r)),
        None => Ok((peer, s)),
    }
}
