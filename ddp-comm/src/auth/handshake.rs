//! Running the hello (see `hello`): [`initiate`] on the connecting side, over a blocking socket
//! against one total deadline; [`Responder`], the accepting side's steps, which the event loops
//! drive (`async_respond`), checking the peer's claims before the verdict (the mesh refuses a
//! rank that is already connected).

use super::hello::{
    self, CLIENT_HELLO_FIXED, ClientHello, Kind, NONCE_BYTES, PROOF_BYTES, Role, decode_challenge,
    decode_head, encode_challenge, encode_refusal, refusal_len,
};
use crate::deadline_io::{read_exact_by, write_all_by};
use std::io;
use std::net::TcpStream;
use std::time::Instant;

/// What the responder says when the initiator's proof is wrong.
pub(crate) const WRONG_TOKEN: &str =
    "wrong or missing job token (set DDP_JOB_TOKEN to the job's token on every rank)";

/// Why an initiated hello failed.
#[derive(Debug)]
pub(crate) enum HelloError {
    /// The socket failed or closed, or the deadline passed.
    Io(io::Error),
    /// The other side refused us and said why.
    Refused(String),
    /// The other side could not prove the job token: it holds another one, or is no ddp-comm
    /// peer at all.
    Unproven,
}

impl From<io::Error> for HelloError {
    fn from(e: io::Error) -> Self {
        HelloError::Io(e)
    }
}

/// The connecting side: says who it is (`claims`), checks the other side's proof, proves the
/// token, and waits for the verdict.
///
/// # Errors
/// See [`HelloError`].
pub(crate) fn initiate(
    s: &mut TcpStream,
    token: &[u8],
    kind: Kind,
    claims: &[u8],
    deadline: Instant,
) -> Result<(), HelloError> {
    let hello = ClientHello {
        kind,
        nonce: hello::nonce(),
        claims: claims.to_vec(),
    }
    .encode();
    write_all_by(s, &hello, deadline)?;
    if let Some(refusal) = read_status(s, deadline)? {
        return Err(HelloError::Refused(refusal));
    }
    let mut body = [0u8; NONCE_BYTES + PROOF_BYTES];
    read_exact_by(s, &mut body, deadline)?;
    let (responder_nonce, responder_proof) = decode_challenge(&body);
    let proven = hello::verify(
        token,
        Role::Responder,
        &hello,
        &responder_nonce,
        &responder_proof,
    );
    // Our proof goes out even when theirs failed, so their log says "wrong token" too. It
    // gives nothing away: it is bound to their nonce, which no other connection will use.
    let proof = hello::prove(token, Role::Initiator, &hello, &responder_nonce)
        .map_err(|e| HelloError::Io(io::Error::other(e)))?;
    write_all_by(s, &proof, deadline)?;
    let verdict = read_status(s, deadline)?;
    if !proven {
        return Err(HelloError::Unproven);
    }
    match verdict {
        Some(refusal) => Err(HelloError::Refused(refusal)),
        None => Ok(()),
    }
}

/// A hello whose initiator proved the token: what it claims to be (covered by its proof).
#[derive(Debug)]
pub(crate) struct Verified {
    pub(crate) claims: Vec<u8>,
}

/// The accepting side's steps as pure functions over the bytes read, so the blocking
/// `respond` (in the tests) and the store's async server run exactly the same checks.
#[derive(Debug)]
pub(crate) struct Responder<'t> {
    token: &'t [u8],
    kind: Kind,
    hello: Vec<u8>,
    nonce: [u8; NONCE_BYTES],
}

impl<'t> Responder<'t> {
    /// Bytes of the hello's fixed part, read first.
    pub(crate) const FIXED: usize = CLIENT_HELLO_FIXED;
    /// Bytes of the initiator's proof, read last.
    pub(crate) const PROOF: usize = PROOF_BYTES;

    pub(crate) fn new(token: &'t [u8], kind: Kind) -> Self {
        Responder {
            token,
            kind,
            hello: Vec::new(),
            nonce: hello::nonce(),
        }
    }

    /// Takes the hello's fixed part; returns how many claim bytes to read next.
    ///
    /// # Errors
    /// Why the hello is refused.
    pub(crate) fn head(&mut self, fixed: &[u8; CLIENT_HELLO_FIXED]) -> Result<usize, String> {
        let head = decode_head(fixed)?;
        if head.kind != self.kind {
            return Err(format!("a {:?} hello on a {:?} port", head.kind, self.kind));
        }
        self.hello = fixed.to_vec();
        Ok(head.claims_len)
    }

    /// Takes the claims; returns the challenge to send (our nonce and our proof).
    ///
    /// # Errors
    /// Why the hello is refused.
    pub(crate) fn claims(&mut self, claims: &[u8]) -> Result<Vec<u8>, String> {
        self.hello.extend_from_slice(claims);
        let proof = hello::prove(self.token, Role::Responder, &self.hello, &self.nonce)?;
        Ok(encode_challenge(&self.nonce, &proof))
    }

    /// Checks the initiator's proof.
    ///
    /// # Errors
    /// [`WRONG_TOKEN`] when it does not prove the token.
    pub(crate) fn proof(self, theirs: &[u8; PROOF_BYTES]) -> Result<Verified, String> {
        if !hello::verify(
            self.token,
            Role::Initiator,
            &self.hello,
            &self.nonce,
            theirs,
        ) {
            return Err(WRONG_TOKEN.into());
        }
        Ok(Verified {
            claims: self.hello[CLIENT_HELLO_FIXED..].to_vec(),
        })
    }
}

/// The verdict bytes: 0 admits, a refusal says why.
pub(crate) fn verdict_bytes(verdict: Result<(), &str>) -> Vec<u8> {
    match verdict {
        Ok(()) => vec![0],
        Err(reason) => encode_refusal(reason),
    }
}

/// The refusal bytes sent before a connection is dropped mid-hello.
pub(crate) fn refusal_bytes(reason: &str) -> Vec<u8> {
    encode_refusal(reason)
}

/// Reads a status byte: `None` for 0 (go on), the message for a refusal.
fn read_status(s: &mut TcpStream, deadline: Instant) -> Result<Option<String>, HelloError> {
    let mut status = [0u8; 1];
    read_exact_by(s, &mut status, deadline)?;
    match status[0] {
        0 => Ok(None),
        1 => {
            let mut len = [0u8; 2];
            read_exact_by(s, &mut len, deadline)?;
            let mut msg = vec![0u8; refusal_len(len)];
            read_exact_by(s, &mut msg, deadline)?;
            Ok(Some(String::from_utf8_lossy(&msg).into_owned()))
        }
        other => Err(HelloError::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not a ddp-comm peer (status byte {other})"),
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::time::Duration;

    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    /// The accepting side as the event loops run it (`async_respond`), on a blocking socket:
    /// the hello, then admission, before `deadline`; returns the verified claims.
    pub(super) fn respond(
        s: &mut TcpStream,
        token: &[u8],
        kind: Kind,
        deadline: Instant,
    ) -> Result<Vec<u8>, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let s = s.try_clone().map_err(|e| e.to_string())?;
        rt.block_on(async move {
            s.set_nonblocking(true).map_err(|e| e.to_string())?;
            let mut s = tokio::net::TcpStream::from_std(s).map_err(|e| e.to_string())?;
            let at = tokio::time::Instant::from_std(deadline);
            let run = async {
                let v = crate::auth::event_loop::respond(&mut s, token, kind).await?;
                crate::auth::event_loop::answer(&mut s, Ok(())).await?;
                Ok(v.claims)
            };
            tokio::time::timeout_at(at, run)
                .await
                .map_err(|_| "deadline".to_string())?
        })
    }

    /// Runs `respond` + `answer(Ok)` with `token` on one connection, returning its outcome.
    fn responder(
        token: &'static [u8],
    ) -> (
        std::net::SocketAddr,
        std::thread::JoinHandle<Result<Vec<u8>, String>>,
    ) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            respond(&mut s, token, Kind::Mesh, deadline())
        });
        (addr, t)
    }

    #[test]
    fn both_sides_prove_the_token() {
        let (addr, t) = responder(b"tok");
        let mut s = TcpStream::connect(addr).expect("connect");
        initiate(&mut s, b"tok", Kind::Mesh, b"me", deadline()).expect("same token");
        assert_eq!(t.join().expect("thread"), Ok(b"me".to_vec()));

        let (addr, t) = responder(b"tok");
        let mut s = TcpStream::connect(addr).expect("connect");
        let e = initiate(&mut s, b"other", Kind::Mesh, b"", deadline()).expect_err("wrong token");
        assert!(matches!(e, HelloError::Unproven), "{e:?}");
        assert_eq!(t.join().expect("thread"), Err(WRONG_TOKEN.to_string()));
    }

    #[test]
    fn a_responder_that_does_not_know_the_token_is_found_out() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        // It answers every hello with a made-up challenge and admits everyone.
        let fake = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            let mut hello = [0u8; CLIENT_HELLO_FIXED];
            s.read_exact(&mut hello).expect("hello");
            s.write_all(&encode_challenge(&[1; NONCE_BYTES], &[2; PROOF_BYTES]))
                .expect("challenge");
            let mut proof = [0u8; PROOF_BYTES];
            s.read_exact(&mut proof).expect("proof");
            s.write_all(&[0]).expect("verdict");
        });
        let mut s = TcpStream::connect(addr).expect("connect");
        let e = initiate(&mut s, b"tok", Kind::Mesh, b"", deadline()).expect_err("unproven");
        assert!(matches!(e, HelloError::Unproven), "{e:?}");
        fake.join().expect("fake");
    }

    mod properties {
        use super::super::*;
        use super::respond;
        use crate::proptest_support::config;
        use proptest::prelude::*;
        use std::io::Write;
        use std::net::{Shutdown, TcpListener};
        use std::time::Duration;

        /// Writes `data` in pieces of the given sizes to a fresh connection, then closes it;
        /// returns our end.
        fn peer_sending(
            data: Vec<u8>,
            splits: Vec<usize>,
        ) -> (TcpStream, std::thread::JoinHandle<()>) {
            let l = TcpListener::bind("127.0.0.1:0").expect("bind");
            let addr = l.local_addr().expect("addr");
            let writer = std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).expect("connect");
                let mut pos = 0;
                for n in splits.iter().cycle().take(data.len()) {
                    if pos >= data.len() {
                        break;
                    }
                    let end = (pos + n.max(&1)).min(data.len());
                    if s.write_all(&data[pos..end]).is_err() {
                        return;
                    }
                    pos = end;
                }
                let _ = s.write_all(&data[pos.min(data.len())..]);
                let _ = s.shutdown(Shutdown::Write);
                // Keep reading what the other side answers until it closes.
                let _ = std::io::copy(&mut s, &mut std::io::sink());
            });
            let (s, _) = l.accept().expect("accept");
            (s, writer)
        }

        /// Runs `side`, one end of the handshake, with a deadline 5 s away on our end of a
        /// connection whose peer sends `data` in pieces of `splits` bytes and then stops;
        /// returns what `side` returned, checking that it returned promptly once the peer
        /// stopped.
        fn against_peer_sending<T>(
            data: Vec<u8>,
            splits: Vec<usize>,
            side: impl FnOnce(&mut TcpStream, Instant) -> T,
        ) -> Result<T, TestCaseError> {
            let (mut s, writer) = peer_sending(data, splits);
            let start = Instant::now();
            let r = side(&mut s, Instant::now() + Duration::from_secs(5));
            prop_assert!(start.elapsed() < Duration::from_secs(3));
            drop(s);
            writer.join().expect("writer");
            Ok(r)
        }

        /// The piece sizes [`peer_sending`] writes in (0 means 1).
        fn piece_sizes() -> impl Strategy<Value = Vec<usize>> {
            proptest::collection::vec(0usize..20, 1..6)
        }

        fn hostile_bytes() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..200),
                // Plausible starts: the magic and version, then anything.
                proptest::collection::vec(any::<u8>(), 0..200).prop_map(|mut v| {
                    let mut b = b"DDPA\x01".to_vec();
                    b.append(&mut v);
                    b
                }),
                // A status byte 0 or 1, then anything (what an initiator reads).
                (0u8..2, proptest::collection::vec(any::<u8>(), 0..200)).prop_map(|(s, mut v)| {
                    v.insert(0, s);
                    v
                }),
            ]
        }

        proptest! {
            #![proptest_config(config())]

            /// A responder fed any bytes, split anyhow, refuses them (nobody can prove the token
            /// without it) and returns at once when the peer stops, never panicking.
            #[test]
            fn respond_refuses_any_bytes_promptly(data in hostile_bytes(), splits in piece_sizes()) {
                let r = against_peer_sending(data, splits, |s, deadline| {
                    respond(s, b"tok", Kind::Mesh, deadline)
                })?;
                prop_assert!(r.is_err());
            }

            /// An initiator talking to a peer that sends any bytes fails (or, never, succeeds)
            /// without panicking, reading at most a capped refusal.
            #[test]
            fn initiate_survives_any_answer(data in hostile_bytes(), splits in piece_sizes()) {
                let r = against_peer_sending(data, splits, |s, deadline| {
                    initiate(s, b"tok", Kind::Store, b"", deadline)
                })?;
                prop_assert!(r.is_err());
                if let Err(HelloError::Refused(msg)) = r {
                    prop_assert!(msg.len() <= 4 * super::super::hello::MAX_MESSAGE);
                }
            }
        }
    }
}
