//! The engine under every TCP collective: one step sends a frame to one peer while receiving a
//! frame from another (or the same) peer, on non-blocking sockets driven by `poll(2)`.
//!
//! Sending and receiving at once is what makes a ring run at link speed in both directions; the
//! receive side streams through a [`Step`], which either copies into place, reduces through a
//! small cache-resident scratch buffer as bytes arrive, or forwards them (broadcast relay). Every
//! wait is bounded by the collective's deadline, and a closed or stalled peer becomes an error
//! naming its rank.

use super::frame::{self, HEADER_BYTES};
use crate::collective::Fingerprint;
use crate::dtype::DataType;
use crate::error::{CommError, Result};
use crate::reduce_op::{ReduceOp, combine_bytes};
use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// A connection to one peer, identified by its global rank.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) rank: usize,
    pub(crate) stream: TcpStream,
}

/// The deadline and identity of the collective a step belongs to.
#[derive(Debug)]
pub(crate) struct Ctx<'a> {
    pub(crate) fp: &'a Fingerprint,
    pub(crate) my_rank: usize,
    pub(crate) deadline: Instant,
    pub(crate) timeout: Duration,
}

/// Where one step's payload comes from and goes to.
pub(crate) trait Step {
    /// Bytes that may be sent now (empty while waiting for received data to forward).
    fn tx_ready(&self) -> &[u8];
    /// Marks `n` bytes of [`Step::tx_ready`] as sent.
    fn tx_advance(&mut self, n: usize);
    /// Payload bytes still to send.
    fn tx_left(&self) -> usize;
    /// Where the next received bytes go; non-empty while [`Step::rx_left`] is non-zero.
    fn rx_space(&mut self) -> &mut [u8];
    /// Accepts `n` bytes just written into [`Step::rx_space`].
    fn rx_commit(&mut self, n: usize);
    /// Payload bytes still to receive.
    fn rx_left(&self) -> usize;
}

/// How received bytes are consumed.
#[derive(Debug)]
pub(crate) enum Sink<'a> {
    /// Nothing is received.
    None,
    /// Copied straight into place.
    Copy { buf: &'a mut [u8], pos: usize },
    /// Combined into `dst` with `op`, staged through `scratch` (whole elements at a time).
    Reduce {
        dst: &'a mut [u8],
        done: usize,
        scratch: &'a mut [u8],
        fill: usize,
        dtype: DataType,
        op: ReduceOp,
    },
}

impl<'a> Sink<'a> {
    pub(crate) fn copy(buf: &'a mut [u8]) -> Self {
        Sink::Copy { buf, pos: 0 }
    }
    pub(crate) fn reduce(
        dst: &'a mut [u8],
        scratch: &'a mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Self {
        Sink::Reduce {
            dst,
            done: 0,
            scratch,
            fill: 0,
            dtype,
            op,
        }
    }
}

/// Send one buffer, receive into a [`Sink`]: the step of ring, gather, scatter and p2p.
#[derive(Debug)]
pub(crate) struct Exchange<'a> {
    tx: &'a [u8],
    sent: usize,
    rx: Sink<'a>,
}

impl<'a> Exchange<'a> {
    pub(crate) fn new(tx: &'a [u8], rx: Sink<'a>) -> Self {
        Exchange { tx, sent: 0, rx }
    }
}

impl Step for Exchange<'_> {
    fn tx_ready(&self) -> &[u8] {
        &self.tx[self.sent..]
    }
    fn tx_advance(&mut self, n: usize) {
        self.sent += n;
    }
    fn tx_left(&self) -> usize {
        self.tx.len() - self.sent
    }
    fn rx_space(&mut self) -> &mut [u8] {
        match &mut self.rx {
            Sink::None => &mut [],
            Sink::Copy { buf, pos } => &mut buf[*pos..],
            Sink::Reduce {
                dst,
                done,
                scratch,
                fill,
                ..
            } => {
                let left = dst.len() - *done - *fill;
                let room = (scratch.len() - *fill).min(left);
                &mut scratch[*fill..*fill + room]
            }
        }
    }
    fn rx_commit(&mut self, n: usize) {
        match &mut self.rx {
            Sink::None => {}
            Sink::Copy { pos, .. } => *pos += n,
            Sink::Reduce {
                dst,
                done,
                scratch,
                fill,
                dtype,
                op,
            } => {
                *fill += n;
                let whole = *fill - *fill % dtype.size_bytes();
                if whole > 0 {
                    combine_bytes(
                        *dtype,
                        *op,
                        &mut dst[*done..*done + whole],
                        &scratch[..whole],
                    );
                    *done += whole;
                    scratch.copy_within(whole..*fill, 0);
                    *fill -= whole;
                }
            }
        }
    }
    fn rx_left(&self) -> usize {
        match &self.rx {
            Sink::None => 0,
            Sink::Copy { buf, pos } => buf.len() - pos,
            Sink::Reduce {
                dst, done, fill, ..
            } => dst.len() - done - fill,
        }
    }
}

/// Receive into a buffer and forward what has arrived: a link in a pipelined broadcast chain.
/// The root has everything from the start; the last link forwards nothing.
#[derive(Debug)]
pub(crate) struct Relay<'a> {
    buf: &'a mut [u8],
    received: usize,
    sent: usize,
    forward: bool,
}

impl<'a> Relay<'a> {
    pub(crate) fn new(buf: &'a mut [u8], receive: bool, forward: bool) -> Self {
        let received = if receive { 0 } else { buf.len() };
        Relay {
            buf,
            received,
            sent: 0,
            forward,
        }
    }
}

impl Step for Relay<'_> {
    fn tx_ready(&self) -> &[u8] {
        if self.forward {
            &self.buf[self.sent..self.received]
        } else {
            &[]
        }
    }
    fn tx_advance(&mut self, n: usize) {
        self.sent += n;
    }
    fn tx_left(&self) -> usize {
        if self.forward {
            self.buf.len() - self.sent
        } else {
            0
        }
    }
    fn rx_space(&mut self) -> &mut [u8] {
        &mut self.buf[self.received..]
    }
    fn rx_commit(&mut self, n: usize) {
        self.received += n;
    }
    fn rx_left(&self) -> usize {
        self.buf.len() - self.received
    }
}

enum Io {
    Done(usize),
    WouldBlock,
}

fn send_some(conn: &Conn, buf: &[u8]) -> io::Result<Io> {
    nonblocking(|| {
        // SAFETY: `buf` is a valid readable slice for its length; MSG_NOSIGNAL turns a write to a
        // closed socket into EPIPE instead of killing the process with SIGPIPE.
        unsafe {
            libc::send(
                conn.stream.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        }
    })
}

fn recv_some(conn: &Conn, buf: &mut [u8]) -> io::Result<Io> {
    nonblocking(|| {
        // SAFETY: `buf` is a valid writable slice for its length.
        unsafe {
            libc::recv(
                conn.stream.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
            )
        }
    })
}

/// Runs one non-blocking socket call (`send` or `recv`, which report alike): the bytes it
/// moved, [`Io::WouldBlock`] when the socket is not ready, or its error; retried when a signal
/// interrupts it.
fn nonblocking(mut call: impl FnMut() -> isize) -> io::Result<Io> {
    loop {
        let n = call();
        if n >= 0 {
            return Ok(Io::Done(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return Ok(Io::WouldBlock),
            io::ErrorKind::Interrupted => continue,
            _ => return Err(e),
        }
    }
}

fn is_disconnect(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::UnexpectedEof
            | io::ErrorKind::NotConnected
    )
}

fn closed(ctx: &Ctx<'_>, peer: usize) -> CommError {
    CommError::PeerClosed {
        op: ctx.fp.label(),
        peer,
        detail: String::new(),
    }
}

fn io_err(ctx: &Ctx<'_>, what: &str, peer: usize, e: io::Error) -> CommError {
    if is_disconnect(&e) {
        closed(ctx, peer)
    } else {
        CommError::io(format!("{}: {what} rank {peer}", ctx.fp.label()), e)
    }
}

/// Runs one step: sends a header and `step`'s payload to `tx` while receiving a header (checked
/// against the fingerprint and the expected length) and the payload from `rx`.
pub(crate) fn run_step(
    ctx: &Ctx<'_>,
    tx: Option<&Conn>,
    rx: Option<&Conn>,
    step: &mut dyn Step,
) -> Result<()> {
    let tx_header = frame::encode(ctx.fp, step.tx_left());
    let rx_expected = step.rx_left();
    let mut header_sent = if tx.is_some() { 0 } else { HEADER_BYTES };
    let mut rx_header = [0u8; HEADER_BYTES];
    let mut header_got = if rx.is_some() { 0 } else { HEADER_BYTES };
    let mut header_checked = rx.is_none();

    loop {
        let tx_pending = tx.is_some() && (header_sent < HEADER_BYTES || step.tx_left() > 0);
        let rx_pending = rx.is_some() && (header_got < HEADER_BYTES || step.rx_left() > 0);
        if !tx_pending && !rx_pending {
            return Ok(());
        }
        let mut progressed = false;

        if let (true, Some(c)) = (tx_pending, tx) {
            if header_sent < HEADER_BYTES {
                match send_some(c, &tx_header[header_sent..])
                    .map_err(|e| io_err(ctx, "sending to", c.rank, e))?
                {
                    Io::Done(n) => {
                        header_sent += n;
                        progressed = true;
                    }
                    Io::WouldBlock => {}
                }
            }
            while header_sent == HEADER_BYTES && !step.tx_ready().is_empty() {
                match send_some(c, step.tx_ready())
                    .map_err(|e| io_err(ctx, "sending to", c.rank, e))?
                {
                    Io::Done(n) => {
                        step.tx_advance(n);
                        progressed = true;
                    }
                    Io::WouldBlock => break,
                }
            }
        }

        if let (true, Some(c)) = (rx_pending, rx) {
            if header_got < HEADER_BYTES {
                match recv_some(c, &mut rx_header[header_got..])
                    .map_err(|e| io_err(ctx, "receiving from", c.rank, e))?
                {
                    Io::Done(0) => return Err(closed(ctx, c.rank)),
                    Io::Done(n) => {
                        header_got += n;
                        progressed = true;
                    }
                    Io::WouldBlock => {}
                }
                if header_got == HEADER_BYTES {
                    frame::check(&rx_header, ctx.fp, rx_expected, ctx.my_rank, c.rank)?;
                    header_checked = true;
                }
            }
            while header_checked && step.rx_left() > 0 {
                match recv_some(c, step.rx_space())
                    .map_err(|e| io_err(ctx, "receiving from", c.rank, e))?
                {
                    Io::Done(0) => return Err(closed(ctx, c.rank)),
                    Io::Done(n) => {
                        step.rx_commit(n);
                        progressed = true;
                    }
                    Io::WouldBlock => break,
                }
            }
        }

        if !progressed {
            let want_tx = tx_pending && (header_sent < HEADER_BYTES || !step.tx_ready().is_empty());
            wait_ready(ctx, tx.filter(|_| want_tx), rx.filter(|_| rx_pending))?;
        }
    }
}

/// Blocks in `poll(2)` until a socket is writable/readable or the deadline passes.
fn wait_ready(ctx: &Ctx<'_>, tx: Option<&Conn>, rx: Option<&Conn>) -> Result<()> {
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(2);
    let mut add = |c: &Conn, events: libc::c_short| {
        let fd = c.stream.as_raw_fd();
        match fds.iter_mut().find(|p| p.fd == fd) {
            Some(p) => p.events |= events,
            None => fds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            }),
        }
    };
    if let Some(c) = tx {
        add(c, libc::POLLOUT);
    }
    if let Some(c) = rx {
        add(c, libc::POLLIN);
    }
    // Blame the peer we are receiving from first: a stalled sender is the usual culprit.
    let blame = rx.or(tx).map_or(ctx.my_rank, |c| c.rank);
    if fds.is_empty() {
        // Nothing to wait for yet something is pending: a relay waiting on itself. Cannot happen
        // with the steps in this crate; report it rather than spin.
        return Err(CommError::Protocol {
            from: format!("rank {}", ctx.my_rank),
            reason: format!("{}: step stalled with nothing to wait for", ctx.fp.label()),
        });
    }
    loop {
        let now = Instant::now();
        if now >= ctx.deadline {
            return Err(CommError::Timeout {
                op: ctx.fp.label(),
                peer: blame,
                timeout: ctx.timeout,
                detail: String::new(),
            });
        }
        let wait_ms = (ctx.deadline - now).as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait_ms) };
        if rc > 0 {
            return Ok(());
        }
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(CommError::io(format!("{}: poll", ctx.fp.label()), e));
            }
        }
    }
}
