//! The store client: blocking request/response calls with timeouts and key prefixes.

use super::config::StoreConfig;
use super::multi_get;
use super::protocol::{
    FrameReader, FrameWriter, Malformed, Op, ReadFrameError, Status, VERSION, read_frame,
};
use crate::auth::{self, HelloError, Kind};
use crate::connect::{Attempt, retry_until};
use crate::deadline::deadline_after;
use crate::deadline_io::{read_exact_by, write_all_by};
use crate::error::{CommError, Result};
use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Pause between attempts to reach a store that does not listen yet.
const CONNECT_RETRY_PAUSE: Duration = Duration::from_millis(50);
/// Extra time the client allows the server beyond a call's own timeout.
const REPLY_MARGIN: Duration = Duration::from_secs(10);

/// A connection to a [`StoreServer`](super::StoreServer), cheap to clone (clones share the
/// connection and take turns on it).
///
/// Every key is prefixed by the store's namespace ([`Store::with_prefix`]), so process groups
/// and subgroups can share one server without their keys colliding.
#[derive(Clone)]
pub struct Store {
    conn: Arc<Mutex<TcpStream>>,
    addr: SocketAddr,
    prefix: String,
    config: StoreConfig,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("addr", &self.addr)
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl Store {
    /// Connects to the store at `addr` (`host:port`), retrying until `config.timeout` so ranks
    /// may start before rank 0, and proves the job token.
    ///
    /// # Errors
    /// [`CommError::StoreUnreachable`] when no connection succeeds in time,
    /// [`CommError::Unauthorized`] when the server rejects the token.
    pub fn connect(addr: &str, config: StoreConfig) -> Result<Store> {
        crate::deadline::check_timeout("store timeout", config.timeout)?;
        crate::auth::check_token("store token", &config.token)?;
        let deadline = deadline_after(config.timeout);
        // A server under a connection storm may push a slow hello out; that is retried like a
        // refused connection. A refusal or an unproven server is final.
        let mut fatal = None;
        let connected = retry_until(deadline, CONNECT_RETRY_PAUSE, || {
            let mut stream = try_connect(addr, deadline).map_err(Attempt::Retry)?;
            match hello(&mut stream, addr, &config.token, VERSION, deadline) {
                Ok(()) => Ok(stream),
                Err(CommError::Io { source, .. }) => Err(Attempt::Retry(source)),
                Err(e) => {
                    fatal = Some(e);
                    Err(Attempt::GiveUp(io::Error::other("refused")))
                }
            }
        });
        if let Some(e) = fatal {
            return Err(e);
        }
        let stream = connected.map_err(|source| CommError::StoreUnreachable {
            addr: addr.to_string(),
            timeout: config.timeout,
            source,
        })?;
        let addr_resolved = stream
            .peer_addr()
            .map_err(|e| CommError::io("store: reading the peer address", e))?;
        Ok(Store {
            conn: Arc::new(Mutex::new(stream)),
            addr: addr_resolved,
            prefix: String::new(),
            config,
        })
    }

    /// Opens a second, independent connection with the same namespace, for a thread that must
    /// not wait behind another thread's blocking call.
    pub fn duplicate(&self) -> Result<Store> {
        let mut s = Store::connect(&self.addr.to_string(), self.config.clone())?;
        s.prefix = self.prefix.clone();
        Ok(s)
    }

    /// A view of the same store whose keys all start with `prefix` (nested under this view's).
    pub fn with_prefix(&self, prefix: &str) -> Store {
        let mut s = self.clone();
        s.prefix = format!("{}{}", self.prefix, prefix);
        s
    }

    /// The server's address.
    pub fn server_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address of this end of the connection: the interface this host uses to reach the
    /// store, which is what peers should use to reach us.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.lock()
            .local_addr()
            .map_err(|e| CommError::io("store: reading the local address", e))
    }

    /// The timeout used for blocking calls.
    pub fn timeout(&self) -> Duration {
        self.config.timeout
    }

    /// Sets `key` to `value`, waking every waiter on it.
    ///
    /// # Errors
    /// [`CommError::StoreProtocol`] when the request would exceed the store's frame limit
    /// ([`StoreConfig::with_max_frame_bytes`], 4 MiB by default); the connection stays usable.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let req = FrameWriter::new(Op::Set as u8)
            .bytes(self.key(key).as_bytes())
            .bytes(value);
        self.call("set", req, None).map(drop)
    }

    /// Returns the value of `key`, waiting up to the store's timeout for it to be set.
    ///
    /// # Errors
    /// [`CommError::StoreTimeout`] naming the key if it is not set in time.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.get_timeout(key, self.config.timeout)
    }

    /// [`Store::get`] with an explicit timeout.
    pub fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let full = self.key(key);
        let req = FrameWriter::new(Op::Get as u8)
            .bytes(full.as_bytes())
            .u64(millis(timeout));
        let (status, body) = self.call("get", req, Some(timeout))?;
        match status {
            Status::Ok => Ok(FrameReader::new(&body)
                .bytes("value")
                .map_err(|_| protocol("get", "truncated value"))?
                .to_vec()),
            _ => Err(CommError::StoreTimeout {
                op: "get",
                keys: full,
                timeout,
            }),
        }
    }

    /// Atomically adds `delta` to the integer stored at `key` (missing counts as 0) and returns
    /// the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let req = FrameWriter::new(Op::Add as u8)
            .bytes(self.key(key).as_bytes())
            .i64(delta);
        let (_, body) = self.call("add", req, None)?;
        FrameReader::new(&body)
            .i64("value")
            .map_err(|_| protocol("add", "truncated value"))
    }

    /// Waits until every key is set.
    ///
    /// # Errors
    /// [`CommError::StoreTimeout`] naming the keys still missing at the deadline.
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let mut req = FrameWriter::new(Op::Wait as u8).raw(&(keys.len() as u32).to_le_bytes());
        for k in keys {
            req = req.bytes(self.key(k).as_bytes());
        }
        let req = req.u64(millis(timeout));
        let (status, body) = self.call("wait", req, Some(timeout))?;
        match status {
            Status::Ok => Ok(()),
            _ => Err(CommError::StoreTimeout {
                op: "wait",
                keys: FrameReader::new(&body)
                    .bytes("keys")
                    .map(|k| String::from_utf8_lossy(k).into_owned())
                    .unwrap_or_default(),
                timeout,
            }),
        }
    }

    /// Sets `key` to `desired` if its value equals `expected` (an empty `expected` matches a
    /// missing key), and returns the value after the call, as PyTorch's `compare_set` does.
    pub fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let req = FrameWriter::new(Op::CompareSet as u8)
            .bytes(self.key(key).as_bytes())
            .bytes(expected)
            .bytes(desired);
        let (_, body) = self.call("compare_set", req, None)?;
        Ok(FrameReader::new(&body)
            .bytes("value")
            .map_err(|_| protocol("compare_set", "truncated value"))?
            .to_vec())
    }

    /// Deletes `key`; returns whether it existed.
    pub fn delete(&self, key: &str) -> Result<bool> {
        let req = FrameWriter::new(Op::Delete as u8).bytes(self.key(key).as_bytes());
        let (_, body) = self.call("delete", req, None)?;
        Ok(body.first() == Some(&1))
    }

    /// Number of keys in this view's namespace.
    pub fn num_keys(&self) -> Result<u64> {
        let req = FrameWriter::new(Op::NumKeys as u8).bytes(self.prefix.as_bytes());
        let (_, body) = self.call("num_keys", req, None)?;
        FrameReader::new(&body)
            .u64("count")
            .map_err(|_| protocol("num_keys", "truncated count"))
    }

    /// Whether every key is set, without waiting.
    pub fn check(&self, keys: &[&str]) -> Result<bool> {
        let mut req = FrameWriter::new(Op::Check as u8).raw(&(keys.len() as u32).to_le_bytes());
        for k in keys {
            req = req.bytes(self.key(k).as_bytes());
        }
        let (_, body) = self.call("check", req, None)?;
        Ok(body.first() == Some(&1))
    }

    /// The values of `keys` in one round trip, in the order asked: `None` for a key that is
    /// not set. It never waits (unlike [`Store::get`]), and one request replaces a
    /// [`Store::check`] and a `get` per key, which matters when many ranks read many keys at
    /// once (the watchdog's failure report reads every rank's progress this way); it is
    /// PyTorch c10d's `multi_get`, without the wait.
    ///
    /// # Errors
    /// [`CommError::StoreProtocol`] when the request or the values would exceed the store's
    /// frame limit ([`StoreConfig::with_max_frame_bytes`]): read fewer keys at once. The
    /// connection stays usable after the store's refusal; a request over the server's own
    /// (smaller) limit makes the server drop the connection.
    pub fn multi_get(&self, keys: &[&str]) -> Result<Vec<Option<Vec<u8>>>> {
        const OP: &str = "multi_get";
        let count = u32::try_from(keys.len())
            .map_err(|_| protocol(OP, format!("{} keys in one request", keys.len())))?;
        let mut req = FrameWriter::new(Op::MultiGet as u8).u32(count);
        for k in keys {
            req = req.bytes(self.key(k).as_bytes());
        }
        if req.body_len() > self.config.max_frame_bytes {
            return Err(protocol(
                OP,
                format!(
                    "a request for {} keys is {} bytes, over the {} byte frame limit; read \
                     fewer keys at once",
                    keys.len(),
                    req.body_len(),
                    self.config.max_frame_bytes
                ),
            ));
        }
        let (_, body) = self.call(OP, req, None)?;
        multi_get::decode(&body, keys.len()).map_err(|Malformed(what)| {
            protocol(
                OP,
                format!("malformed reply to {} keys: bad {what}", keys.len()),
            )
        })
    }

    fn key(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TcpStream> {
        // The stream carries no invariant a panic could break mid-way except a half-sent
        // frame, after which the server drops us and the next call reports it.
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends one request and reads its reply; `wait` is the server-side wait included in it.
    fn call(
        &self,
        op: &'static str,
        req: FrameWriter,
        wait: Option<Duration>,
    ) -> Result<(Status, Vec<u8>)> {
        // Refused here, before a byte is sent: the server would drop the connection that every
        // clone of this store shares, and every later call would fail as if rank 0 had died.
        if req.body_len() > self.config.max_frame_bytes {
            return Err(protocol(
                op,
                format!(
                    "the request is {} bytes, over the store's {} byte frame limit \
                     (StoreConfig::with_max_frame_bytes, the same on the server and every \
                     client): keep large values out of the store (in a file, or sent with a \
                     collective), or raise the limit everywhere",
                    req.body_len(),
                    self.config.max_frame_bytes
                ),
            ));
        }
        let mut conn = self.lock();
        let reply_timeout = wait
            .unwrap_or(Duration::ZERO)
            .saturating_add(self.config.timeout.max(REPLY_MARGIN));
        conn.set_read_timeout(Some(reply_timeout))
            .map_err(|e| CommError::io(format!("store {op}"), e))?;
        // Any I/O error may leave part of a frame unread, and the next call would take it for
        // its reply: the connection is shut down, so later calls fail saying it was lost.
        let lost = |conn: &TcpStream, e: io::Error| {
            let _ = conn.shutdown(Shutdown::Both);
            CommError::io(
                format!(
                    "store {op}: lost the connection to the store at {} (did rank 0 exit?)",
                    self.addr
                ),
                e,
            )
        };
        // Within the reply's timeout too: a large request to a host that stopped reading
        // would otherwise block in the write for ever, once the socket buffers are full (the
        // connection has no write timeout after the hello, and a per-write one restarts with
        // every byte that gets through).
        if let Err(e) = write_all_by(&mut conn, &req.into_frame(), deadline_after(reply_timeout)) {
            return Err(lost(&conn, e));
        }
        let body = match read_frame(&mut *conn, self.config.max_frame_bytes) {
            Ok(b) => b,
            Err(ReadFrameError::Io(e)) => return Err(lost(&conn, e)),
            Err(ReadFrameError::TooLarge { len, max }) => {
                // Skip the reply without keeping it, so the next call reads its own; within
                // the reply's timeout in all, however slowly the bytes come.
                let deadline = deadline_after(reply_timeout);
                if let Err(e) = skip_by(&mut conn, len as u64, deadline) {
                    return Err(lost(&conn, e));
                }
                return Err(protocol(
                    op,
                    format!(
                        "reply of {len} bytes exceeds this client's {max} byte frame limit \
                         (is the store's limit larger?)"
                    ),
                ));
            }
        };
        let (&status, rest) = body
            .split_first()
            .ok_or_else(|| protocol(op, "empty reply"))?;
        let status = Status::from_u8(status).ok_or_else(|| protocol(op, "unknown status"))?;
        match status {
            Status::Ok | Status::Timeout => Ok((status, rest.to_vec())),
            Status::TooLarge => {
                let mut r = FrameReader::new(rest);
                let size = match (r.u64("size"), r.u64("limit")) {
                    (Ok(len), Ok(max)) => format!(" ({len} bytes, the limit is {max})"),
                    _ => String::new(),
                };
                Err(protocol(
                    op,
                    format!(
                        "the reply would exceed the store's frame limit{size}; read fewer keys \
                         at once"
                    ),
                ))
            }
            Status::Unauthorized | Status::BadRequest => {
                let msg = FrameReader::new(rest)
                    .bytes("message")
                    .map(|m| String::from_utf8_lossy(m).into_owned())
                    .unwrap_or_default();
                let kind = if status == Status::Unauthorized {
                    "unauthorized"
                } else {
                    "rejected"
                };
                Err(protocol(op, format!("{kind}: {msg}")))
            }
        }
    }
}

/// Reads and discards `len` bytes from `conn` before `deadline`.
fn skip_by(conn: &mut TcpStream, mut len: u64, deadline: Instant) -> io::Result<()> {
    let mut scratch = [0u8; 64 * 1024];
    while len > 0 {
        let n = scratch
            .len()
            .min(usize::try_from(len).unwrap_or(usize::MAX));
        read_exact_by(conn, &mut scratch[..n], deadline)?;
        len -= n as u64;
    }
    Ok(())
}

/// Runs the hello on a new connection: the server and this client prove the token to each
/// other (see `auth`), and the client claims to speak protocol `version`.
fn hello(
    stream: &mut TcpStream,
    addr: &str,
    token: &[u8],
    version: u16,
    deadline: Instant,
) -> Result<()> {
    let claims = version.to_le_bytes();
    let unauthorized = |reason: String| CommError::Unauthorized {
        peer: format!("store at {addr}"),
        reason,
    };
    match auth::initiate(stream, token, Kind::Store, &claims, deadline) {
        Ok(()) => {}
        Err(HelloError::Refused(reason)) => return Err(unauthorized(reason)),
        Err(HelloError::Unproven) => {
            return Err(unauthorized(
                "it could not prove the job token (is DDP_JOB_TOKEN the same on every rank, \
                 and is this a ddp-comm store?)"
                    .into(),
            ));
        }
        Err(HelloError::Io(e)) => {
            return Err(CommError::io(format!("store: hello with {addr}"), e));
        }
    }
    // The hello's deadline is over; each call sets its own.
    stream
        .set_write_timeout(None)
        .map_err(|e| CommError::io("store: configuring the connection", e))
}

fn protocol(op: &'static str, reason: impl Into<String>) -> CommError {
    CommError::StoreProtocol {
        op,
        reason: reason.into(),
    }
}

fn millis(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

fn try_connect(addr: &str, deadline: Instant) -> io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
    let mut last = io::Error::new(
        io::ErrorKind::NotFound,
        format!("{addr} resolved to no address"),
    );
    for a in addrs {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        match TcpStream::connect_timeout(&a, left.min(Duration::from_secs(5))) {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreServer;

    /// A rank built from another ddp-comm version is refused at the hello, told which
    /// versions differ and what to do.
    #[test]
    fn should_refuse_another_protocol_version_saying_to_rebuild_from_one_version() {
        let server =
            StoreServer::bind("127.0.0.1:0", StoreConfig::new().with_token("t")).expect("bind");
        let addr = server.local_addr().to_string();
        let mut stream = TcpStream::connect(&addr).expect("connect");
        let deadline = deadline_after(Duration::from_secs(5));
        let e = hello(&mut stream, &addr, b"t", VERSION - 1, deadline)
            .expect_err("an older version is refused")
            .to_string();
        let older = format!("version {}", VERSION - 1);
        assert!(e.contains(&older), "{e}");
        assert!(e.contains("same ddp-comm version"), "{e}");
        let mut stream = TcpStream::connect(&addr).expect("connect");
        hello(&mut stream, &addr, b"t", VERSION, deadline).expect("this version is admitted");
    }
}
