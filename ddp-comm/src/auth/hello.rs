//! The hello's messages and proofs, as pure functions over bytes (the I/O is in `handshake`).
//!
//! ```text
//! initiator -> responder  ClientHello  "DDPA", version, kind, claims length (u16 LE),
//!                                      32-byte nonce Nc, claims (at most MAX_CLAIMS bytes)
//! responder -> initiator  Challenge    status 0, 32-byte nonce Ns, 32-byte proof Ps
//!                                      | status 1, message length (u16 LE), message
//! initiator -> responder  Proof        32-byte proof Pc
//! responder -> initiator  Verdict      status 0 | status 1, message length (u16 LE), message
//! ```
//!
//! `Ps = HMAC-SHA256(token, RESPONDER_LABEL || ClientHello || Ns)` and
//! `Pc = HMAC-SHA256(token, INITIATOR_LABEL || ClientHello || Ns)`: each side proves the token
//! over both fresh nonces without sending it, so a captured hello cannot be replayed (the other
//! side's nonce differs) and a proof for one role is useless in the other (the labels differ).
//! The claims (what the store protocol version is, or which group and rank a mesh peer is) are
//! inside the MAC, so nobody can alter them in flight.

use crate::u8_enum::u8_enum;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// First bytes of every hello.
pub(crate) const MAGIC: &[u8; 4] = b"DDPA";
/// Hello version; bump on any incompatible change.
pub(crate) const VERSION: u8 = 1;
/// Bytes of a nonce and of a proof.
pub(crate) const NONCE_BYTES: usize = 32;
pub(crate) const PROOF_BYTES: usize = 32;
/// Fixed part of a [`ClientHello`]: magic, version, kind, claims length, nonce.
pub(crate) const CLIENT_HELLO_FIXED: usize = 4 + 1 + 1 + 2 + NONCE_BYTES;
/// Longest claims a hello may carry.
pub(crate) const MAX_CLAIMS: usize = 64;
/// Longest refusal message read or sent.
pub(crate) const MAX_MESSAGE: usize = 1024;

const RESPONDER_LABEL: &[u8] = b"ddp-comm hello v1: responder proof";
const INITIATOR_LABEL: &[u8] = b"ddp-comm hello v1: initiator proof";

u8_enum! {
    /// What a connection is for; part of the MAC, so a store hello cannot open a mesh
    /// connection.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Kind {
        Store = 1,
        Mesh = 2,
    }
}

/// The initiator's first message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClientHello {
    pub(crate) kind: Kind,
    pub(crate) nonce: [u8; NONCE_BYTES],
    pub(crate) claims: Vec<u8>,
}

/// A [`ClientHello`]'s fixed part: what kind, and how many claim bytes follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HelloHead {
    pub(crate) kind: Kind,
    pub(crate) nonce: [u8; NONCE_BYTES],
    pub(crate) claims_len: usize,
}

impl ClientHello {
    /// The bytes on the wire (also the start of the MAC'd transcript).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(CLIENT_HELLO_FIXED + self.claims.len());
        b.extend_from_slice(MAGIC);
        b.push(VERSION);
        b.push(self.kind as u8);
        b.extend_from_slice(&(self.claims.len() as u16).to_le_bytes());
        b.extend_from_slice(&self.nonce);
        b.extend_from_slice(&self.claims);
        b
    }
}

/// Decodes a [`ClientHello`]'s fixed part; the reason says what is wrong.
pub(crate) fn decode_head(fixed: &[u8; CLIENT_HELLO_FIXED]) -> Result<HelloHead, String> {
    if &fixed[0..4] != MAGIC {
        return Err("not a ddp-comm hello (bad magic)".into());
    }
    if fixed[4] != VERSION {
        return Err(format!(
            "hello version {}, this side speaks {VERSION} (mixed ddp-comm versions?)",
            fixed[4]
        ));
    }
    let kind = Kind::from_u8(fixed[5]).ok_or_else(|| format!("unknown hello kind {}", fixed[5]))?;
    let claims_len = u16::from_le_bytes([fixed[6], fixed[7]]) as usize;
    if claims_len > MAX_CLAIMS {
        return Err(format!(
            "hello claims of {claims_len} bytes exceed {MAX_CLAIMS}"
        ));
    }
    let mut nonce = [0u8; NONCE_BYTES];
    nonce.copy_from_slice(&fixed[8..8 + NONCE_BYTES]);
    Ok(HelloHead {
        kind,
        nonce,
        claims_len,
    })
}

/// Decodes a whole [`ClientHello`] (fixed part and claims, nothing after). The handshake reads
/// the two parts separately, with [`decode_head`]; this is the same check on a whole buffer,
/// for tests.
#[cfg(test)]
pub(crate) fn decode_client_hello(bytes: &[u8]) -> Result<ClientHello, String> {
    let fixed: &[u8; CLIENT_HELLO_FIXED] = bytes
        .get(..CLIENT_HELLO_FIXED)
        .and_then(|f| f.try_into().ok())
        .ok_or("truncated hello")?;
    let head = decode_head(fixed)?;
    let claims = &bytes[CLIENT_HELLO_FIXED..];
    if claims.len() != head.claims_len {
        return Err(format!(
            "hello announces {} claim bytes but carries {}",
            head.claims_len,
            claims.len()
        ));
    }
    Ok(ClientHello {
        kind: head.kind,
        nonce: head.nonce,
        claims: claims.to_vec(),
    })
}

/// A status byte then, on refusal, a length-prefixed message: the challenge's and the
/// verdict's shape.
pub(crate) fn encode_refusal(message: &str) -> Vec<u8> {
    let msg = truncate(message.as_bytes(), MAX_MESSAGE);
    let mut b = Vec::with_capacity(3 + msg.len());
    b.push(1);
    b.extend_from_slice(&(msg.len() as u16).to_le_bytes());
    b.extend_from_slice(msg);
    b
}

/// The responder's challenge: status 0, its nonce and its proof.
pub(crate) fn encode_challenge(nonce: &[u8; NONCE_BYTES], proof: &[u8; PROOF_BYTES]) -> Vec<u8> {
    let mut b = Vec::with_capacity(1 + NONCE_BYTES + PROOF_BYTES);
    b.push(0);
    b.extend_from_slice(nonce);
    b.extend_from_slice(proof);
    b
}

/// The length of a refusal's message from its two length bytes, capped so a hostile peer
/// cannot make us read (or allocate) more than [`MAX_MESSAGE`].
pub(crate) fn refusal_len(len_bytes: [u8; 2]) -> usize {
    (u16::from_le_bytes(len_bytes) as usize).min(MAX_MESSAGE)
}

/// The challenge body after its status byte 0: nonce and proof.
pub(crate) fn decode_challenge(
    body: &[u8; NONCE_BYTES + PROOF_BYTES],
) -> ([u8; NONCE_BYTES], [u8; PROOF_BYTES]) {
    let mut nonce = [0u8; NONCE_BYTES];
    let mut proof = [0u8; PROOF_BYTES];
    nonce.copy_from_slice(&body[..NONCE_BYTES]);
    proof.copy_from_slice(&body[NONCE_BYTES..]);
    (nonce, proof)
}

/// Which side a proof is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Responder,
    Initiator,
}

/// The MAC of `role` over the transcript; `None` only if HMAC refused the key, which it never
/// does (any length is a valid HMAC key).
fn mac(token: &[u8], role: Role, hello: &[u8], responder_nonce: &[u8]) -> Option<Hmac<Sha256>> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(token).ok()?;
    m.update(match role {
        Role::Responder => RESPONDER_LABEL,
        Role::Initiator => INITIATOR_LABEL,
    });
    m.update(hello);
    m.update(responder_nonce);
    Some(m)
}

/// `role`'s proof of `token` over the encoded hello and the responder's nonce.
pub(crate) fn prove(
    token: &[u8],
    role: Role,
    hello: &[u8],
    responder_nonce: &[u8; NONCE_BYTES],
) -> Result<[u8; PROOF_BYTES], String> {
    let m =
        mac(token, role, hello, responder_nonce).ok_or("HMAC refused the job token as a key")?;
    Ok(m.finalize().into_bytes().into())
}

/// Whether `proof` is `role`'s proof of `token` (compared in constant time).
pub(crate) fn verify(
    token: &[u8],
    role: Role,
    hello: &[u8],
    responder_nonce: &[u8; NONCE_BYTES],
    proof: &[u8; PROOF_BYTES],
) -> bool {
    mac(token, role, hello, responder_nonce).is_some_and(|m| m.verify_slice(proof).is_ok())
}

/// The first `max` bytes of `b`.
fn truncate(b: &[u8], max: usize) -> &[u8] {
    &b[..b.len().min(max)]
}

/// A fresh random nonce (from the OS-seeded thread RNG).
pub(crate) fn nonce() -> [u8; NONCE_BYTES] {
    rand::random()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> ClientHello {
        ClientHello {
            kind: Kind::Mesh,
            nonce: [7; NONCE_BYTES],
            claims: vec![1, 2, 3],
        }
    }

    #[test]
    fn a_hello_round_trips_and_bad_ones_say_why() {
        let h = hello();
        assert_eq!(decode_client_hello(&h.encode()), Ok(h.clone()));
        let mut bad = h.encode();
        bad[0] = b'X';
        assert!(decode_client_hello(&bad).unwrap_err().contains("magic"));
        let mut bad = h.encode();
        bad[4] = 9;
        assert!(decode_client_hello(&bad).unwrap_err().contains("version"));
        let mut bad = h.encode();
        bad[6] = 200;
        assert!(decode_client_hello(&bad).unwrap_err().contains("exceed"));
        let bad = &h.encode()[..CLIENT_HELLO_FIXED + 1];
        assert!(decode_client_hello(bad).unwrap_err().contains("carries 1"));
    }

    #[test]
    fn proofs_bind_the_token_the_role_the_hello_and_the_nonce() {
        let h = hello().encode();
        let ns = [9; NONCE_BYTES];
        let p = prove(b"tok", Role::Initiator, &h, &ns).expect("a proof");
        assert!(verify(b"tok", Role::Initiator, &h, &ns, &p));
        assert!(!verify(b"tok2", Role::Initiator, &h, &ns, &p), "token");
        assert!(!verify(b"tok", Role::Responder, &h, &ns, &p), "role");
        assert!(
            !verify(b"tok", Role::Initiator, &h, &[8; NONCE_BYTES], &p),
            "nonce"
        );
        let mut other = hello();
        other.claims = vec![1, 2, 4];
        assert!(
            !verify(b"tok", Role::Initiator, &other.encode(), &ns, &p),
            "claims"
        );
    }

    mod properties {
        use super::super::*;
        use crate::proptest_support::config;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(config())]

            /// Any bytes decode to a hello or a reason, and a decoded hello's claims are within
            /// the limit.
            #[test]
            fn hello_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..160)) {
                if let Ok(h) = decode_client_hello(&bytes) {
                    prop_assert!(h.claims.len() <= MAX_CLAIMS);
                }
            }

            /// A valid-looking start with any kind, version and claims length.
            #[test]
            fn hello_heads_never_panic(
                version in any::<u8>(),
                kind in any::<u8>(),
                claims_len in any::<u16>(),
                nonce in any::<[u8; NONCE_BYTES]>(),
            ) {
                let mut fixed = [0u8; CLIENT_HELLO_FIXED];
                fixed[..4].copy_from_slice(MAGIC);
                fixed[4] = version;
                fixed[5] = kind;
                fixed[6..8].copy_from_slice(&claims_len.to_le_bytes());
                fixed[8..].copy_from_slice(&nonce);
                if let Ok(h) = decode_head(&fixed) {
                    prop_assert!(h.claims_len <= MAX_CLAIMS);
                    prop_assert_eq!(h.nonce, nonce);
                }
            }

            #[test]
            fn hellos_round_trip(
                mesh in any::<bool>(),
                nonce in any::<[u8; NONCE_BYTES]>(),
                claims in proptest::collection::vec(any::<u8>(), 0..=MAX_CLAIMS),
            ) {
                let kind = if mesh { Kind::Mesh } else { Kind::Store };
                let h = ClientHello { kind, nonce, claims };
                prop_assert_eq!(decode_client_hello(&h.encode()), Ok(h));
            }

            /// However long a refusal claims to be, at most `MAX_MESSAGE` bytes are read.
            #[test]
            fn refusals_are_capped(len in any::<[u8; 2]>(), message in ".{0,1100}") {
                prop_assert!(refusal_len(len) <= MAX_MESSAGE);
                let encoded = encode_refusal(&message);
                prop_assert!(encoded.len() <= 3 + MAX_MESSAGE);
                prop_assert_eq!(refusal_len([encoded[1], encoded[2]]), encoded.len() - 3);
            }
        }
    }
}
