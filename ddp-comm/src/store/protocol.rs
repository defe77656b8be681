//! The store's wire format after the hello (`auth`): length-prefixed frames of an opcode and
//! fields.
//!
//! Frame: `u32` little-endian body length, then the body. A request body is an opcode byte and
//! its fields; a response body is a status byte and its fields. Byte strings are a `u32` length
//! and the bytes; numbers are little-endian. Every length is checked against what is left of the
//! frame, and a frame is checked against the configured maximum before anything is allocated.

use crate::u8_enum::u8_enum;
use std::io::{self, Read};
use std::time::Duration;

/// Protocol version, carried in the hello's claims; bump on any incompatible change.
///
/// 3: `MultiGet` and the `TooLarge` status. A version-2 server would take opcode 10 for a
/// malformed request and drop the connection, so mixed versions are refused at the hello.
pub(crate) const VERSION: u16 = 3;

u8_enum! {
    /// Request opcodes.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Op {
        Set = 2,
        Get = 3,
        Add = 4,
        Wait = 5,
        CompareSet = 6,
        Delete = 7,
        NumKeys = 8,
        Check = 9,
        MultiGet = 10,
    }
}

u8_enum! {
    /// Response status bytes.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Status {
        Ok = 0,
        Timeout = 1,
        Unauthorized = 2,
        BadRequest = 3,
        /// The reply would exceed the frame limit: `u64` reply body length, `u64` limit.
        TooLarge = 4,
    }
}

/// Builds a frame body field by field.
#[derive(Debug, Default)]
pub(crate) struct FrameWriter {
    body: Vec<u8>,
}

impl FrameWriter {
    pub(crate) fn new(first: u8) -> Self {
        FrameWriter { body: vec![first] }
    }
    pub(crate) fn bytes(mut self, b: &[u8]) -> Self {
        self.body.extend_from_slice(&(b.len() as u32).to_le_bytes());
        self.body.extend_from_slice(b);
        self
    }
    pub(crate) fn u32(mut self, v: u32) -> Self {
        self.body.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u64(mut self, v: u64) -> Self {
        self.body.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn i64(mut self, v: i64) -> Self {
        self.body.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn raw(mut self, b: &[u8]) -> Self {
        self.body.extend_from_slice(b);
        self
    }
    /// The body alone (what the receiving side decodes), for tests.
    #[cfg(test)]
    pub(crate) fn frame_body(self) -> Vec<u8> {
        self.body
    }
    /// Length of the body so far.
    pub(crate) fn body_len(&self) -> usize {
        self.body.len()
    }
    /// The whole frame: length, then body.
    pub(crate) fn into_frame(self) -> Vec<u8> {
        let mut frame = Vec::with_capacity(4 + self.body.len());
        frame.extend_from_slice(&(self.body.len() as u32).to_le_bytes());
        frame.extend_from_slice(&self.body);
        frame
    }
}

/// Reads fields from a received body; every read is bounds-checked.
#[derive(Debug)]
pub(crate) struct FrameReader<'a> {
    body: &'a [u8],
}

/// A malformed field: what was being read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Malformed(pub(crate) &'static str);

impl<'a> FrameReader<'a> {
    pub(crate) fn new(body: &'a [u8]) -> Self {
        FrameReader { body }
    }
    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.body.len()
    }
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Malformed> {
        if self.body.len() < n {
            return Err(Malformed(what));
        }
        let (head, rest) = self.body.split_at(n);
        self.body = rest;
        Ok(head)
    }
    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, Malformed> {
        Ok(self.take(1, what)?[0])
    }
    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, Malformed> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, Malformed> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    pub(crate) fn i64(&mut self, what: &'static str) -> Result<i64, Malformed> {
        Ok(self.u64(what)? as i64)
    }
    pub(crate) fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], Malformed> {
        let n = self.u32(what)? as usize;
        self.take(n, what)
    }
}

/// A request as the server understands it, borrowing from the frame body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request<'a> {
    Set {
        key: &'a [u8],
        value: &'a [u8],
    },
    Get {
        key: &'a [u8],
        timeout: Duration,
    },
    Add {
        key: &'a [u8],
        delta: i64,
    },
    Wait {
        keys: Vec<&'a [u8]>,
        timeout: Duration,
    },
    CompareSet {
        key: &'a [u8],
        expected: &'a [u8],
        desired: &'a [u8],
    },
    Delete {
        key: &'a [u8],
    },
    NumKeys {
        prefix: &'a [u8],
    },
    Check {
        keys: Vec<&'a [u8]>,
    },
    MultiGet {
        keys: Vec<&'a [u8]>,
    },
}

impl<'a> Request<'a> {
    /// Decodes a request body (a pure function: any bytes give a request or [`Malformed`]).
    /// A key count is only believed as far as the body holds keys, so a lying count allocates
    /// nothing.
    pub(crate) fn decode(body: &'a [u8]) -> Result<Request<'a>, Malformed> {
        let mut r = FrameReader::new(body);
        let op = Op::from_u8(r.u8("opcode")?).ok_or(Malformed("opcode"))?;
        let keys = |r: &mut FrameReader<'a>| -> Result<Vec<&'a [u8]>, Malformed> {
            let n = r.u32("key count")? as usize;
            // Every key takes at least its 4-byte length, so the body bounds the count.
            if n > r.remaining() / 4 {
                return Err(Malformed("key count"));
            }
            (0..n).map(|_| r.bytes("key")).collect()
        };
        Ok(match op {
            Op::Set => Request::Set {
                key: r.bytes("key")?,
                value: r.bytes("value")?,
            },
            Op::Get => Request::Get {
                key: r.bytes("key")?,
                timeout: Duration::from_millis(r.u64("timeout")?),
            },
            Op::Add => Request::Add {
                key: r.bytes("key")?,
                delta: r.i64("delta")?,
            },
            Op::Wait => Request::Wait {
                keys: keys(&mut r)?,
                timeout: Duration::from_millis(r.u64("timeout")?),
            },
            Op::CompareSet => Request::CompareSet {
                key: r.bytes("key")?,
                expected: r.bytes("expected")?,
                desired: r.bytes("desired")?,
            },
            Op::Delete => Request::Delete {
                key: r.bytes("key")?,
            },
            Op::NumKeys => Request::NumKeys {
                prefix: r.bytes("prefix")?,
            },
            Op::Check => Request::Check {
                keys: keys(&mut r)?,
            },
            Op::MultiGet => Request::MultiGet {
                keys: keys(&mut r)?,
            },
        })
    }
}

/// Why a frame could not be read.
#[derive(Debug)]
pub(crate) enum ReadFrameError {
    /// The socket failed or closed.
    Io(io::Error),
    /// The announced length exceeds the limit; nothing was allocated.
    TooLarge { len: usize, max: usize },
}

/// The body length a frame header announces, refused (before anything is allocated) when it
/// is longer than `max`.
pub(crate) fn body_len(header: [u8; 4], max: usize) -> Result<usize, ReadFrameError> {
    let len = u32::from_le_bytes(header) as usize;
    if len > max {
        return Err(ReadFrameError::TooLarge { len, max });
    }
    Ok(len)
}

/// Reads one frame, refusing (before allocating) any body longer than `max`. The body's
/// buffer grows as its bytes arrive, never to the announced length up front: a peer that
/// announces a large frame and sends nothing costs nothing.
pub(crate) fn read_frame(r: &mut impl Read, max: usize) -> Result<Vec<u8>, ReadFrameError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(ReadFrameError::Io)?;
    let len = body_len(len, max)?;
    let mut body = Vec::new();
    r.take(len as u64)
        .read_to_end(&mut body)
        .map_err(ReadFrameError::Io)?;
    check_complete(&body, len)?;
    Ok(body)
}

/// Reads one frame from a tokio socket, like [`read_frame`]: refused before allocating when
/// over `max`, and the body's buffer grows only as its bytes arrive.
pub(crate) async fn read_frame_async(
    r: &mut (impl tokio::io::AsyncRead + Unpin),
    max: usize,
) -> Result<Vec<u8>, ReadFrameError> {
    use tokio::io::AsyncReadExt;
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await.map_err(ReadFrameError::Io)?;
    let len = body_len(len, max)?;
    let mut body = Vec::new();
    r.take(len as u64)
        .read_to_end(&mut body)
        .await
        .map_err(ReadFrameError::Io)?;
    check_complete(&body, len)?;
    Ok(body)
}

/// A body that ended before its announced length: the peer closed mid-frame.
fn check_complete(body: &[u8], len: usize) -> Result<(), ReadFrameError> {
    if body.len() < len {
        return Err(ReadFrameError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the frame ended after {} of its {len} bytes", body.len()),
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let buf = FrameWriter::new(Op::Set as u8)
            .bytes(b"key")
            .bytes(b"")
            .u64(7)
            .i64(-3)
            .into_frame();
        let body = read_frame(&mut buf.as_slice(), 1024).unwrap();
        let mut r = FrameReader::new(&body);
        assert_eq!(r.u8("op").unwrap(), Op::Set as u8);
        assert_eq!(r.bytes("k").unwrap(), b"key");
        assert_eq!(r.bytes("v").unwrap(), b"");
        assert_eq!(r.u64("n").unwrap(), 7);
        assert_eq!(r.i64("d").unwrap(), -3);
        assert!(r.u8("past end").is_err());
    }

    #[test]
    fn oversized_frame_is_refused_before_allocation() {
        let header = (u32::MAX).to_le_bytes();
        match read_frame(&mut header.as_slice(), 1 << 20) {
            Err(ReadFrameError::TooLarge { len, max }) => {
                assert_eq!(len, u32::MAX as usize);
                assert_eq!(max, 1 << 20);
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
    }

    #[test]
    fn multi_get_decodes_its_keys_and_refuses_a_lying_key_count() {
        let body = FrameWriter::new(Op::MultiGet as u8)
            .u32(3)
            .bytes(b"a")
            .bytes(b"")
            .bytes(b"a")
            .frame_body();
        assert_eq!(
            Request::decode(&body),
            Ok(Request::MultiGet {
                keys: vec![b"a", b"", b"a"]
            })
        );
        let none = FrameWriter::new(Op::MultiGet as u8).u32(0).frame_body();
        assert_eq!(
            Request::decode(&none),
            Ok(Request::MultiGet { keys: Vec::new() })
        );
        // Four billion keys announced, room for two: refused before any allocation.
        let lying = FrameWriter::new(Op::MultiGet as u8)
            .u32(u32::MAX)
            .bytes(b"")
            .bytes(b"")
            .frame_body();
        assert_eq!(Request::decode(&lying), Err(Malformed("key count")));
        // A count the body's size allows, but the second key runs past the end.
        let short = FrameWriter::new(Op::MultiGet as u8)
            .u32(3)
            .bytes(b"")
            .raw(&[5, 0, 0, 0, 0, 0, 0, 0])
            .frame_body();
        assert_eq!(Request::decode(&short), Err(Malformed("key")));
        assert_eq!(Op::from_u8(10), Some(Op::MultiGet));
        assert_eq!(Op::from_u8(11), None);
        assert_eq!(Status::from_u8(4), Some(Status::TooLarge));
    }

    #[test]
    fn field_length_beyond_body_is_malformed() {
        let body = [0xff, 0xff, 0, 0, 1, 2];
        assert!(FrameReader::new(&body).bytes("key").is_err());
    }

    mod properties {
        use super::super::*;
        use crate::proptest_support::{Chunked, config};
        use proptest::prelude::*;

        fn op() -> impl Strategy<Value = u8> {
            prop_oneof![0u8..12, any::<u8>()]
        }

        proptest! {
            #![proptest_config(config())]

            /// Any body decodes to a request or a `Malformed`, without panicking; a request's
            /// keys all lie inside the body.
            #[test]
            fn request_decode_never_panics(op in op(), rest in proptest::collection::vec(any::<u8>(), 0..256)) {
                let mut body = vec![op];
                body.extend_from_slice(&rest);
                if let Ok(
                    Request::Wait { keys, .. } | Request::Check { keys } | Request::MultiGet { keys },
                ) = Request::decode(&body)
                {
                    prop_assert!(keys.iter().map(|k| k.len() + 4).sum::<usize>() <= body.len());
                }
            }

            /// What the client encodes, the server decodes.
            #[test]
            fn requests_round_trip(
                key in proptest::collection::vec(any::<u8>(), 0..40),
                value in proptest::collection::vec(any::<u8>(), 0..40),
                ms in any::<u64>(),
                keys in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..8), 0..6),
            ) {
                let body = FrameWriter::new(Op::Set as u8).bytes(&key).bytes(&value).frame_body();
                prop_assert_eq!(Request::decode(&body), Ok(Request::Set { key: &key, value: &value }));
                let body = FrameWriter::new(Op::Get as u8).bytes(&key).u64(ms).frame_body();
                prop_assert_eq!(
                    Request::decode(&body),
                    Ok(Request::Get { key: &key, timeout: Duration::from_millis(ms) })
                );
                let mut w = FrameWriter::new(Op::Wait as u8).raw(&(keys.len() as u32).to_le_bytes());
                for k in &keys {
                    w = w.bytes(k);
                }
                let body = w.u64(ms).frame_body();
                let expected: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                prop_assert_eq!(
                    Request::decode(&body),
                    Ok(Request::Wait { keys: expected.clone(), timeout: Duration::from_millis(ms) })
                );
                let mut w = FrameWriter::new(Op::MultiGet as u8).u32(keys.len() as u32);
                for k in &keys {
                    w = w.bytes(k);
                }
                let body = w.frame_body();
                prop_assert_eq!(Request::decode(&body), Ok(Request::MultiGet { keys: expected }));
            }

            /// A `MultiGet` announcing more keys than follow (a lying count, up to
            /// `u32::MAX`) is `Malformed`, never a panic nor an allocation the body does not
            /// back.
            #[test]
            fn multi_get_with_a_lying_key_count_is_malformed(
                keys in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..8), 0..6),
                extra in prop_oneof![1u32..4, any::<u32>()],
            ) {
                let announced = (keys.len() as u32).saturating_add(extra);
                let mut w = FrameWriter::new(Op::MultiGet as u8).u32(announced);
                for k in &keys {
                    w = w.bytes(k);
                }
                let body = w.frame_body();
                prop_assert!(Request::decode(&body).is_err());
            }

            /// Any byte stream, split anyhow, gives a frame of at most `max` bytes, a
            /// `TooLarge` after reading only the 4-byte length (nothing allocated), or an I/O
            /// error; never a panic or a hang.
            #[test]
            fn read_frame_respects_its_limit_on_any_split(
                data in proptest::collection::vec(any::<u8>(), 0..600),
                splits in proptest::collection::vec(0usize..16, 0..8),
                max in 0usize..512,
            ) {
                let mut r = Chunked::new(data.clone(), splits);
                match read_frame(&mut r, max) {
                    Ok(body) => {
                        prop_assert!(body.len() <= max);
                        prop_assert_eq!(&body[..], &data[4..4 + body.len()]);
                    }
                    Err(ReadFrameError::TooLarge { len, .. }) => {
                        prop_assert!(len > max);
                        prop_assert_eq!(r.consumed(), 4);
                    }
                    Err(ReadFrameError::Io(_)) => {
                        // Only a stream that ends early fails.
                        let short = data.len() < 4
                            || data.len() < 4 + u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize;
                        prop_assert!(short);
                    }
                }
            }
        }
    }
}
