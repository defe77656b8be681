//! A group's TCP connections, made on demand instead of as a full mesh.
//!
//! Each rank listens on an ephemeral port of the interface it uses to reach the store (see
//! `acceptor`, which keeps accepting for the transport's whole life) and publishes
//! `addr/<group rank>` in the group's store namespace. A connection between two ranks is made
//! the first time a collective needs it: the higher rank connects, the lower one accepts. The
//! ring collectives need only the two neighbours, which are connected while the group forms,
//! so a rank of a large group holds a handful of sockets, not one per peer (gloo's and
//! PyTorch's experience: the O(n^2) full mesh is what makes 1k-rank jobs slow to start).
//!
//! Every connection starts with the shared hello (`auth`): both ends prove the job token, and
//! the connecting rank claims its group (the id includes the job's random nonce), size and
//! rank under its proof. Handshakes have total deadlines; a rank that never connects is named
//! in the timeout.
//!
//! A peer that is gone before its connection is made fails the collective at once, not at the
//! timeout: one that reported a failure (`failure/<rank>`, which a rank waiting for it reads
//! in the background, see `failure_watch`), one whose group was aborted (its listener refuses us with
//! `acceptor::ABORTED_VERDICT`), and one whose listener is closed (its group was dropped or its
//! process ended: the connection is refused). A higher rank whose process died without a word
//! is found only at the timeout, or by the watchdog's heartbeats.

use super::acceptor::{ABORTED_VERDICT, Acceptor, Arrival, Claims, Expect};
use super::duplex::Conn;
use super::failure_watch::FailureWatch;
use crate::auth::{self, HelloError, Kind};
use crate::deadline::deadline_after;
use crate::error::{CommError, Result};
use crate::store::Store;
use crate::transport::LiveStreams;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a rank waiting for a connection checks whether its group was aborted.
const ABORT_POLL: Duration = Duration::from_millis(20);
/// Pause between connection attempts to a rank that is slow to accept.
const RETRY_PAUSE: Duration = Duration::from_millis(20);
/// The longest one connection attempt may take before the next (after checking for an
/// abort): a peer that drops our SYNs would otherwise hold an attempt for the whole timeout,
/// out of the abort's reach (the socket exists only once connected).
const CONNECT_ATTEMPT: Duration = Duration::from_secs(1);

/// What a rank needs to join a group's connections.
#[derive(Debug)]
pub(crate) struct MeshSpec<'a> {
    /// The group's store namespace, where a failed rank publishes `failure/<rank>`.
    pub(crate) store: &'a Store,
    /// Where, under `store`, the ranks publish their addresses: "" for a group's own mesh,
    /// another prefix for a second mesh of the same group (the hybrid transport's host
    /// leaders).
    pub(crate) addr_prefix: &'a str,
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

/// A rank's connections to the other ranks of its group, made as they are first needed.
#[derive(Debug)]
pub(crate) struct Mesh {
    ranks: Vec<usize>,
    me: usize,
    group_id: u64,
    token: Vec<u8>,
    timeout: Duration,
    socket_buffer_bytes: Option<usize>,
    /// The addresses' namespace (shares the group's store connection): used while the group
    /// forms, when nobody else can be blocked on it.
    store: Store,
    /// A connection of its own for looking up addresses later, opened on first use, so a
    /// user thread blocked on the group's store cannot hold up a collective.
    lookup: Option<Store>,
    /// The peers' failure reports, read once the group has formed (none exist before).
    failures: Option<FailureWatch>,
    conns: Vec<Option<Conn>>,
    acceptor: Option<Acceptor>,
    live: Arc<LiveStreams>,
}

impl Mesh {
    /// Starts listening, publishes the address, and connects the ring neighbours.
    ///
    /// # Errors
    /// A neighbour that does not connect or cannot be reached in time, or refuses us.
    pub(crate) fn start(spec: &MeshSpec<'_>) -> Result<Mesh> {
        let n = spec.ranks.len();
        let me = spec.group_rank;
        let mut mesh = Mesh {
            ranks: spec.ranks.to_vec(),
            me,
            group_id: spec.group_id,
            token: spec.token.to_vec(),
            timeout: spec.timeout,
            socket_buffer_bytes: spec.socket_buffer_bytes,
            store: spec.store.with_prefix(spec.addr_prefix),
            lookup: None,
            failures: None,
            conns: (0..n).map(|_| None).collect(),
            acceptor: None,
            live: Arc::new(LiveStreams::default()),
        };
        if n == 1 {
            return Ok(mesh);
        }
        let acceptor = Acceptor::start(
            advertised_ip(spec.store)?,
            Expect {
                token: spec.token.to_vec(),
                group_id: spec.group_id,
                group_size: n,
                group_rank: me,
                live: mesh.live.clone(),
            },
        )?;
        let addr = acceptor.addr();
        mesh.store
            .set(&format!("addr/{me}"), addr.to_string().as_bytes())?;
        mesh.acceptor = Some(acceptor);
        let ring = mesh.ring_neighbours();
        mesh.ensure(&ring, "rendezvous", deadline_after(mesh.timeout))?;
        mesh.failures = Some(FailureWatch::new(spec.store.clone()));
        tracing::debug!(rank = spec.ranks[me], %addr, "tcp ring neighbours connected");
        Ok(mesh)
    }

    /// Group size.
    pub(crate) fn n(&self) -> usize {
        self.ranks.len()
    }

    /// The left and right neighbours in the ring (one rank when the group has two).
    fn ring_neighbours(&self) -> Vec<usize> {
        let n = self.n();
        let mut v = vec![(self.me + n - 1) % n, (self.me + 1) % n];
        v.dedup();
        v.retain(|&p| p != self.me);
        v
    }

    /// Connects every rank of `peers` that is not connected yet: to lower ranks we connect,
    /// from higher ranks we wait (taking in whoever else arrives meanwhile). `op` names what
    /// needed them, for errors; `deadline` is the collective's own, so that connecting counts
    /// against its one timeout.
    ///
    /// # Errors
    /// A peer not connected before the deadline (named), unreachable, or refusing us.
    pub(crate) fn ensure(&mut self, peers: &[usize], op: &str, deadline: Instant) -> Result<()> {
        for &p in peers {
            if p < self.me && self.conns[p].is_none() {
                let stream = self.connect_peer(p, op, deadline)?;
                self.take(p, stream)?;
            }
        }
        self.await_higher(peers, op, deadline)
    }

    /// The connection to `peer`, which [`Mesh::ensure`] has made.
    pub(crate) fn conn(&self, peer: usize) -> &Conn {
        // Collectives ensure their peers first; asking for another one is a bug here.
        self.conns[peer].as_ref().unwrap_or_else(|| {
            panic!(
                "tcp transport: rank {} asked for a connection to group rank {peer} it never made",
                self.me
            )
        })
    }

    /// Every connection made so far.
    pub(crate) fn conns(&self) -> impl Iterator<Item = &Conn> {
        self.conns.iter().flatten()
    }

    /// What aborts these connections, present and future.
    pub(crate) fn live(&self) -> Arc<LiveStreams> {
        self.live.clone()
    }

    /// Waits until every higher rank of `peers` has connected to us.
    fn await_higher(&mut self, peers: &[usize], op: &str, deadline: Instant) -> Result<()> {
        loop {
            let waiting: Vec<usize> = peers
                .iter()
                .copied()
                .filter(|&p| p > self.me && self.conns[p].is_none())
                .collect();
            let Some(&first) = waiting.first() else {
                return Ok(());
            };
            if self.live.aborted() {
                return Err(CommError::Aborted(format!(
                    "{op}: aborted while waiting for rank {} to connect",
                    self.ranks[first]
                )));
            }
            let reported = (self.failures.as_mut()).and_then(|f| f.reported(&waiting, &self.ranks));
            if let Some(failed) = reported {
                return Err(self.gone(op, failed, "reported a failure before it connected"));
            }
            let now = Instant::now();
            if now >= deadline {
                let names: Vec<String> =
                    waiting.iter().map(|&p| self.ranks[p].to_string()).collect();
                return Err(CommError::Timeout {
                    op: op.to_string(),
                    peer: self.ranks[first],
                    timeout: self.timeout,
                    detail: format!(" (rank(s) {} never connected)", names.join(", ")),
                });
            }
            let Some(acceptor) = &self.acceptor else {
                return Ok(());
            };
            if let Some(Arrival {
                group_rank,
                stream,
                from,
            }) = acceptor.next((deadline - now).min(ABORT_POLL))
            {
                tracing::debug!(%from, peer = self.ranks[group_rank], "tcp: rank connected");
                self.register(group_rank, &stream)?;
                self.take(group_rank, stream)?;
            }
        }
    }

    /// Registers a connection to `peer` with the abort: from now on an abort shuts it down.
    fn register(&self, peer: usize, stream: &TcpStream) -> Result<()> {
        self.live.add(stream).map_err(|e| {
            CommError::io(
                format!(
                    "rendezvous: registering the connection to rank {} for abort",
                    self.ranks[peer]
                ),
                e,
            )
        })
    }

    /// Configures a connection whose hello succeeded, and which [`Mesh::register`] has
    /// registered, and keeps it.
    fn take(&mut self, peer: usize, stream: TcpStream) -> Result<()> {
        let ctx = || {
            format!(
                "rendezvous: configuring the connection to rank {}",
                self.ranks[peer]
            )
        };
        stream
            .set_nodelay(true)
            .map_err(|e| CommError::io(ctx(), e))?;
        if let Some(bytes) = self.socket_buffer_bytes {
            set_buffer_sizes(&stream, bytes);
        }
        stream
            .set_read_timeout(None)
            .and_then(|()| stream.set_write_timeout(None))
            .and_then(|()| stream.set_nonblocking(true))
            .map_err(|e| CommError::io(ctx(), e))?;
        self.conns[peer] = Some(Conn {
            rank: self.ranks[peer],
            stream,
        });
        Ok(())
    }

    /// The store to look `addr/<peer>` up in: the group's own while it forms (ring
    /// neighbours), a connection of our own afterwards.
    fn lookup_store(&mut self, peer: usize) -> Result<&Store> {
        if self.ring_neighbours().contains(&peer) {
            return Ok(&self.store);
        }
        if self.lookup.is_none() {
            self.lookup = Some(self.store.duplicate()?);
        }
        Ok(self.lookup.as_ref().unwrap_or(&self.store))
    }

    /// The error for a collective whose `peer` (a group rank) is gone, as `reason` says. The
    /// communication thread appends what that peer reported.
    fn gone(&self, op: &str, peer: usize, reason: impl Into<String>) -> CommError {
        CommError::PeerGone {
            op: op.to_string(),
            peer: self.ranks[peer],
            reason: reason.into(),
            detail: String::new(),
        }
    }

    /// Connects to `peer` (a lower rank) and says the hello, retrying connections dropped
    /// before the verdict until `deadline`. The socket is registered with the abort before the
    /// hello, and each connection attempt is short, so an abort ends this within about a
    /// second, whatever the peer does.
    fn connect_peer(&mut self, peer: usize, op: &str, deadline: Instant) -> Result<TcpStream> {
        let global = self.ranks[peer];
        let left = deadline.saturating_duration_since(Instant::now());
        let addr_text = self
            .lookup_store(peer)?
            .get_timeout(&format!("addr/{peer}"), left)?;
        let addr: SocketAddr =
            String::from_utf8_lossy(&addr_text)
                .parse()
                .map_err(|_| CommError::Protocol {
                    from: "store".into(),
                    reason: format!("address of rank {global} is not host:port"),
                })?;
        let claims = Claims {
            group_rank: self.me as u32,
            group_size: self.n() as u32,
            group_id: self.group_id,
        }
        .encode();
        // A connection dropped before its verdict (the listener pushed it out of a flood of
        // strangers' connections, say) is tried again until the deadline: only a refusal or a
        // peer that cannot prove the token is final.
        let mut dropped = 0usize;
        let aborted = || {
            CommError::Aborted(format!(
                "{op}: aborted while connecting to rank {global} at {addr}"
            ))
        };
        loop {
            let connected = connect_retrying(addr, deadline, &self.live);
            if self.live.aborted() {
                return Err(aborted());
            }
            let mut s = connected.map_err(|e| {
                if e.kind() == io::ErrorKind::ConnectionRefused {
                    return self.gone(
                        op,
                        peer,
                        format!(
                            "refused the connection at {addr}: it is no longer listening (its \
                             process group was dropped or its process ended), or a firewall \
                             rejects connections to that port{}",
                            loopback_hint(addr)
                        ),
                    );
                }
                CommError::io(
                    format!(
                        "rendezvous: could not connect to rank {global} at {addr} within {:?}{}",
                        self.timeout,
                        loopback_hint(addr)
                    ),
                    e,
                )
            })?;
            // Before the hello, which a frozen peer could stretch to the deadline: an abort
            // shuts the socket down and so ends it.
            self.register(peer, &s)?;
            let hello = auth::initiate(&mut s, &self.token, Kind::Mesh, &claims, deadline);
            if hello.is_err() {
                self.live.remove(&s);
                if self.live.aborted() {
                    return Err(aborted());
                }
            }
            match hello {
                Ok(()) => return Ok(s),
                Err(HelloError::Refused(reason)) if reason == ABORTED_VERDICT => {
                    return Err(self.gone(op, peer, format!("refused us: {reason}")));
                }
                Err(HelloError::Refused(reason)) => {
                    return Err(CommError::Unauthorized {
                        peer: format!("rank {global}"),
                        reason,
                    });
                }
                Err(HelloError::Unproven) => {
                    return Err(CommError::Unauthorized {
                        peer: format!("rank {global} at {addr}"),
                        reason: "it could not prove the job token (is DDP_JOB_TOKEN the same on \
                                 every rank?)"
                            .into(),
                    });
                }
                Err(HelloError::Io(e)) if Instant::now() < deadline => {
                    dropped += 1;
                    tracing::debug!(
                        peer = global,
                        %addr,
                        attempt = dropped,
                        error = %e,
                        "rendezvous: connection dropped before the verdict; connecting again"
                    );
                    std::thread::sleep(RETRY_PAUSE);
                }
                Err(HelloError::Io(e)) => {
                    return Err(CommError::io(
                        format!(
                            "rendezvous: greeting rank {global} at {addr} ({} attempt(s) dropped \
                             before the verdict)",
                            dropped + 1
                        ),
                        e,
                    ));
                }
            }
        }
    }
}

/// The address this host uses to reach the store: reachable by every peer that reaches it too.
fn advertised_ip(store: &Store) -> Result<IpAddr> {
    Ok(store.local_addr()?.ip())
}

/// Connects to `addr`, retrying until `deadline` (the peer may be slow to accept) unless the
/// group is aborted meanwhile, in attempts of at most [`CONNECT_ATTEMPT`] so that an abort is
/// seen while a peer drops our SYNs. A refused connection is final: a rank publishes its
/// address only once it listens, and listens as long as its group lives.
fn connect_retrying(
    addr: SocketAddr,
    deadline: Instant,
    live: &LiveStreams,
) -> io::Result<TcpStream> {
    crate::connect::retry_until(deadline, RETRY_PAUSE, || {
        if live.aborted() {
            return Err(crate::connect::Attempt::GiveUp(io::Error::other(
                "the group was aborted",
            )));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        TcpStream::connect_timeout(
            &addr,
            left.min(CONNECT_ATTEMPT).max(Duration::from_millis(10)),
        )
        .map_err(|e| match e.kind() {
            io::ErrorKind::ConnectionRefused => crate::connect::Attempt::GiveUp(e),
            _ => crate::connect::Attempt::Retry(e),
        })
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

/// Why a peer's loopback address may be unreachable: it is on another host, whose name
/// resolves to loopback there (Debian's 127.0.1.1), so it listens where only its host reaches.
fn loopback_hint(addr: SocketAddr) -> &'static str {
    if addr.ip().is_loopback() {
        " (a loopback address: if that rank runs on another host, it reached the store through \
         loopback there; set MASTER_ADDR to an address every host reaches, or fix that host's \
         /etc/hosts, which on Debian and Ubuntu maps the host's name to 127.0.1.1)"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::loopback_hint;

    #[test]
    fn only_a_loopback_address_gets_the_etc_hosts_hint() {
        let debian: std::net::SocketAddr =
            "127.0.1.1:29500".parse().unwrap_or_else(|e| panic!("{e}"));
        assert!(loopback_hint(debian).contains("127.0.1.1"));
        let lan: std::net::SocketAddr = "10.0.0.7:29500".parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(loopback_hint(lan), "");
    }
}
