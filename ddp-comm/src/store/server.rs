//! The store server: a key-value map behind a TCP listener, one thread per client.
//!
//! Rank 0 hosts it for the job. A connection must first complete the hello (`auth`: both sides
//! prove the job token); one that sends anything else, cannot prove the token, or later sends
//! a frame over the limit is disconnected and logged, and the others keep being served.
//!
//! Until a connection has proved the token it is *pending*: it must finish its hello within
//! [`StoreConfig::hello_timeout`] in total, and at most [`MAX_PENDING`] are kept; one more
//! pushes out the oldest (a real rank says hello within milliseconds, so the oldest pending
//! connection is the likeliest to be a stranger). Idle or dripping strangers therefore cannot
//! exhaust threads nor lock real ranks out.

use super::config::StoreConfig;
use super::protocol::{
    FrameWriter, Malformed, ReadFrameError, Request, Status, VERSION, read_frame,
};
use crate::auth::{self, Kind};
use crate::deadline::deadline_after;
use crate::error::{CommError, Result};
use std::collections::{HashMap, VecDeque};
use std::io::{self, ErrorKind};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most connections kept at once that have not proved the token yet.
pub(crate) const MAX_PENDING: usize = 64;
/// How often the accept loop checks for shutdown.
const ACCEPT_POLL: Duration = Duration::from_millis(50);

/// A running store server. Dropping it disconnects every client and joins every thread.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreServer")
            .field("addr", &self.addr)
            .field("clients", &self.shared.clients.load(Ordering::Relaxed))
            .finish()
    }
}

struct Shared {
    map: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    changed: Condvar,
    shutdown: AtomicBool,
    config: StoreConfig,
    /// Authenticated clients currently connected.
    clients: AtomicUsize,
    /// Every open connection, so shutdown can unblock their threads.
    conns: Mutex<Vec<(u64, TcpStream)>>,
    /// Connections still in their hello, oldest first (ids into `conns`).
    pending: Mutex<VecDeque<u64>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A handler thread that panicked cannot leave the map half-updated (each update is one
    // insert), so a poisoned lock is still safe to use.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl StoreServer {
    /// Binds `addr` (port 0 picks a free port) and starts serving.
    ///
    /// # Errors
    /// [`CommError::Bind`] when the address is in use or cannot be bound.
    pub fn bind(addr: impl Into<String>, config: StoreConfig) -> Result<StoreServer> {
        let addr = addr.into();
        let listener = TcpListener::bind(&addr).map_err(|source| CommError::Bind {
            addr: addr.clone(),
            source,
        })?;
        Self::from_listener(listener, config)
    }

    /// Serves on an already bound listener.
    ///
    /// # Errors
    /// A token longer than [`MAX_TOKEN_BYTES`](crate::MAX_TOKEN_BYTES); I/O errors configuring
    /// the listener or starting its thread.
    pub fn from_listener(listener: TcpListener, config: StoreConfig) -> Result<StoreServer> {
        crate::auth::check_token("store token", &config.token)?;
        let local = listener
            .local_addr()
            .map_err(|e| CommError::io("store: reading the listener's address", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| CommError::io("store: configuring the listener", e))?;
        let shared = Arc::new(Shared {
            map: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            shutdown: AtomicBool::new(false),
            config,
            clients: AtomicUsize::new(0),
            conns: Mutex::new(Vec::new()),
            pending: Mutex::new(VecDeque::new()),
            threads: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let accept_thread = std::thread::Builder::new()
            .name("ddp-store-accept".into())
            .spawn(move || accept_loop(listener, s))
            .map_err(|e| CommError::io("store: starting the accept thread", e))?;
        tracing::debug!(%local, "store server listening");
        Ok(StoreServer {
            addr: local,
            shared,
            accept_thread: Some(accept_thread),
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Number of authenticated clients currently connected.
    pub fn num_clients(&self) -> usize {
        self.shared.clients.load(Ordering::SeqCst)
    }

    /// Waits until at most `keep` clients remain connected, or `timeout` passes. Rank 0 calls
    /// this before shutting the store down, so slower ranks can finish their last store calls.
    pub fn wait_for_clients(&self, keep: usize, timeout: Duration) -> bool {
        let deadline = deadline_after(timeout);
        while self.num_clients() > keep {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        {
            // Under the map's lock: a handler between its check of `shutdown` and its wait on
            // the condition variable holds the lock, so it cannot miss this notification.
            let _map = lock(&self.shared.map);
            self.shared.shutdown.store(true, Ordering::SeqCst);
            self.shared.changed.notify_all();
        }
        // The accept thread first: once it is gone no connection can be added behind our back,
        // so shutting down every listed one below wakes every handler for good.
        if let Some(t) = self.accept_thread.take() {
            let _ = t.join();
        }
        for (_, c) in lock(&self.shared.conns).iter() {
            let _ = c.shutdown(Shutdown::Both);
        }
        let threads: Vec<_> = lock(&self.shared.threads).drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut next_id = 0u64;
    while !shared.shutdown.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, peer)) => {
                next_id += 1;
                let id = next_id;
                if let Err(e) = spawn_handler(&shared, stream, peer, id) {
                    tracing::warn!(%peer, error = %e, "store: could not serve a client");
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(error = %e, "store: accept failed");
                std::thread::sleep(ACCEPT_POLL);
            }
        }
        reap_finished(&shared);
    }
}

fn reap_finished(shared: &Shared) {
    let mut threads = lock(&shared.threads);
    let (done, running): (Vec<_>, Vec<_>) = threads.drain(..).partition(|t| t.is_finished());
    *threads = running;
    drop(threads);
    for t in done {
        let _ = t.join();
    }
}

fn spawn_handler(
    shared: &Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    id: u64,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    let deadline = deadline_after(shared.config.hello_timeout);
    lock(&shared.conns).push((id, stream.try_clone()?));
    admit_pending(shared, id);
    let s = shared.clone();
    let handle = std::thread::Builder::new()
        .name("ddp-store-client".into())
        .spawn(move || {
            serve_client(&s, stream, peer, id, deadline);
            lock(&s.conns).retain(|(cid, _)| *cid != id);
        })?;
    lock(&shared.threads).push(handle);
    Ok(())
}

/// Lists connection `id` as pending, pushing out the oldest pending one when there are
/// already [`MAX_PENDING`].
fn admit_pending(shared: &Shared, id: u64) {
    let evicted = {
        let mut pending = lock(&shared.pending);
        let evicted = if pending.len() >= MAX_PENDING {
            pending.pop_front()
        } else {
            None
        };
        pending.push_back(id);
        evicted
    };
    if let Some(old) = evicted {
        tracing::warn!(
            limit = MAX_PENDING,
            "store: too many connections without a hello; dropping the oldest"
        );
        if let Some((_, c)) = lock(&shared.conns).iter().find(|(cid, _)| *cid == old) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

fn serve_client(
    shared: &Shared,
    mut stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    deadline: Instant,
) {
    let trusted = authenticate(shared, &mut stream, peer, deadline);
    lock(&shared.pending).retain(|p| *p != id);
    if !trusted {
        let _ = stream.shutdown(Shutdown::Both);
        return;
    }
    // The hello's deadline no longer applies: requests wait as long as their own timeouts.
    let _ = stream.set_write_timeout(None);
    shared.clients.fetch_add(1, Ordering::SeqCst);
    loop {
        let body = match read_frame(&mut stream, shared.config.max_frame_bytes) {
            Ok(body) => body,
            Err(ReadFrameError::Io(_)) => break, // client left
            Err(ReadFrameError::TooLarge { len, max }) => {
                tracing::warn!(%peer, len, max, "store: frame over the limit, disconnecting client");
                break;
            }
        };
        if shared.shutdown.load(Ordering::SeqCst) {
            break;
        }
        let reply = match handle_request(shared, &body) {
            Ok(reply) => reply,
            Err(Malformed(what)) => {
                tracing::warn!(%peer, what, "store: malformed request, disconnecting client");
                let _ = FrameWriter::new(Status::BadRequest as u8)
                    .bytes(format!("malformed request: bad {what}").as_bytes())
                    .send(&mut stream);
                break;
            }
        };
        if reply.send(&mut stream).is_err() {
            break;
        }
    }
    shared.clients.fetch_sub(1, Ordering::SeqCst);
    let _ = stream.shutdown(Shutdown::Both);
}

/// Runs the hello (both sides prove the token) before `deadline`; returns whether the client
/// is in. Refusals are logged and, where it can still hear, told to the client.
fn authenticate(
    shared: &Shared,
    stream: &mut TcpStream,
    peer: SocketAddr,
    deadline: Instant,
) -> bool {
    let verified = match auth::respond(stream, &shared.config.token, Kind::Store, deadline) {
        Ok(v) => v,
        Err(reason) => {
            tracing::warn!(%peer, %reason, "store: rejected a connection");
            return false;
        }
    };
    let version = match verified.claims.as_slice() {
        [a, b] => Some(u16::from_le_bytes([*a, *b])),
        _ => None,
    };
    let verdict = if version == Some(VERSION) {
        Ok(())
    } else {
        Err(format!(
            "store protocol version {version:?}, the server speaks {VERSION}"
        ))
    };
    if let Err(reason) = &verdict {
        tracing::warn!(%peer, %reason, "store: rejected a client");
    }
    let answered = auth::answer(
        stream,
        verdict.as_ref().map(|_| ()).map_err(String::as_str),
        deadline,
    );
    let _ = stream.set_read_timeout(None);
    verdict.is_ok() && answered.is_ok()
}

fn ok() -> FrameWriter {
    FrameWriter::new(Status::Ok as u8)
}

fn handle_request(shared: &Shared, body: &[u8]) -> Result<FrameWriter, Malformed> {
    Ok(match Request::decode(body)? {
        Request::Set { key, value } => {
            lock(&shared.map).insert(key.to_vec(), value.to_vec());
            shared.changed.notify_all();
            ok()
        }
        Request::Get { key, timeout } => {
            let map = wait_until(shared, timeout, |m| m.contains_key(key));
            match map.get(key) {
                Some(v) => ok().bytes(v),
                None => FrameWriter::new(Status::Timeout as u8),
            }
        }
        Request::Add { key, delta } => {
            let mut map = lock(&shared.map);
            let current = map
                .get(key)
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok())
                .unwrap_or(0);
            let new = current.wrapping_add(delta);
            map.insert(key.to_vec(), new.to_string().into_bytes());
            drop(map);
            shared.changed.notify_all();
            ok().i64(new)
        }
        Request::Wait { keys, timeout } => {
            let map = wait_until(shared, timeout, |m| keys.iter().all(|k| m.contains_key(*k)));
            let missing: Vec<&[u8]> = keys
                .iter()
                .copied()
                .filter(|k| !map.contains_key(*k))
                .collect();
            if missing.is_empty() {
                ok()
            } else {
                let joined = missing
                    .iter()
                    .map(|k| String::from_utf8_lossy(k).into_owned())
                    .collect::<Vec<_>>()
                    .join(", ");
                FrameWriter::new(Status::Timeout as u8).bytes(joined.as_bytes())
            }
        }
        Request::CompareSet {
            key,
            expected,
            desired,
        } => {
            let mut map = lock(&shared.map);
            let current = map.get(key).cloned();
            let result = match current {
                None if expected.is_empty() => {
                    map.insert(key.to_vec(), desired.to_vec());
                    desired.to_vec()
                }
                None => expected.to_vec(),
                Some(cur) if cur == expected => {
                    map.insert(key.to_vec(), desired.to_vec());
                    desired.to_vec()
                }
                Some(cur) => cur,
            };
            drop(map);
            shared.changed.notify_all();
            ok().bytes(&result)
        }
        Request::Delete { key } => {
            let removed = lock(&shared.map).remove(key).is_some();
            ok().raw(&[removed as u8])
        }
        Request::NumKeys { prefix } => {
            let n = lock(&shared.map)
                .keys()
                .filter(|k| k.starts_with(prefix))
                .count();
            ok().u64(n as u64)
        }
        Request::Check { keys } => {
            let map = lock(&shared.map);
            let all = keys.iter().all(|k| map.contains_key(*k));
            ok().raw(&[all as u8])
        }
    })
}

/// Blocks on the condition variable until `ready` holds, the timeout passes, or shutdown.
fn wait_until(
    shared: &Shared,
    timeout: Duration,
    ready: impl Fn(&HashMap<Vec<u8>, Vec<u8>>) -> bool,
) -> MutexGuard<'_, HashMap<Vec<u8>, Vec<u8>>> {
    let deadline = deadline_after(timeout);
    let mut map = lock(&shared.map);
    while !ready(&map) && !shared.shutdown.load(Ordering::SeqCst) {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        map = shared
            .changed
            .wait_timeout(map, deadline - now)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
    map
}
