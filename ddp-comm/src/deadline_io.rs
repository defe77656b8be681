//! Reading and writing a blocking socket against one total deadline.
//!
//! A per-read timeout does not bound a handshake: a peer that drips one byte just before each
//! timeout keeps the connection (and whatever waits on it) forever. These helpers re-arm the
//! socket's timeout with the time left before every call, and give up once the deadline has
//! passed, however the bytes arrive.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

fn time_left(deadline: Instant) -> io::Result<std::time::Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the deadline passed before the peer kept up",
        ));
    }
    Ok(left)
}

/// Fills `buf` from `stream` before `deadline`.
///
/// # Errors
/// [`io::ErrorKind::TimedOut`] at the deadline, [`io::ErrorKind::UnexpectedEof`] if the peer
/// closes first, or the socket's error.
pub(crate) fn read_exact_by(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> io::Result<()> {
    let mut pos = 0;
    while pos < buf.len() {
        stream.set_read_timeout(Some(time_left(deadline)?))?;
        match stream.read(&mut buf[pos..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => pos += n,
            Err(e) if retryable(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A socket timeout or interruption before the deadline: try again with the time left.
fn retryable(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// Writes all of `buf` to `stream` before `deadline` (a peer that does not read cannot hold us).
///
/// # Errors
/// [`io::ErrorKind::TimedOut`] at the deadline, or the socket's error.
pub(crate) fn write_all_by(
    stream: &mut TcpStream,
    buf: &[u8],
    deadline: Instant,
) -> io::Result<()> {
    let mut pos = 0;
    while pos < buf.len() {
        stream.set_write_timeout(Some(time_left(deadline)?))?;
        match stream.write(&buf[pos..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => pos += n,
            Err(e) if retryable(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::time::Duration;

    #[test]
    fn a_dripping_peer_is_cut_at_the_total_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let dripper = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).expect("connect");
            // 20 bytes/s for 10 s: never 100 bytes, and still connected long after the deadline.
            for _ in 0..200 {
                if s.write_all(&[1]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let (mut s, _) = listener.accept().expect("accept");
        let start = Instant::now();
        let mut buf = [0u8; 100];
        let e = read_exact_by(&mut s, &mut buf, start + Duration::from_millis(500))
            .expect_err("a peer sending 20 bytes/s cannot fill 100 bytes in 0.5 s");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        // Well before the dripper would end (10 s), with slack for a loaded machine.
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        drop(s);
        dripper.join().expect("dripper");
    }
}
