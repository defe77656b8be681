//! The store's wire format after the hello (`auth`): length-prefixed frames of an opcode and
//! fields.
//!
//! Frame: `u32` little-endian body length, then the body. A request body is an opcode byte and
//! its fields; a response body is a status byte and its fields. Byte strings are a `u32` length
//! and the bytes; numbers are little-endian. Every length is checked against what is left of the
//! frame, and a frame is checked against the configured maximum before anything is allocated.

use std::io::{self, Read, Write};

/// Protocol version, carried in the hello's claims; bump on any incompatible change.
pub(crate) const VERSION: u16 = 2;

/// Request opcodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Op {
    Set = 2,
    Get = 3,
    Add = 4,
    Wait = 5,
    CompareSet = 6,
    Delete = 7,
    NumKeys = 8,
    Check = 9,
}

impl Op {
    pub(crate) fn from_u8(v: u8) -> Option<Op> {
        Some(match v {
            2 => Op::Set,
            3 => Op::Get,
            4 => Op::Add,
            5 => Op::Wait,
            6 => Op::CompareSet,
            7 => Op::Delete,
            8 => Op::NumKeys,
            9 => Op::Check,
            _ => return None,
        })
    }
}

/// Response status bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Status {
    Ok = 0,
    Timeout = 1,
    Unauthorized = 2,
    BadRequest = 3,
}

impl Status {
    pub(crate) fn from_u8(v: u8) -> Option<Status> {
        Some(match v {
            0 => Status::Ok,
            1 => Status::Timeout,
            2 => Status::Unauthorized,
            3 => Status::BadRequest,
            _ => return None,
        })
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
    /// Writes length and body in one call.
    pub(crate) fn send(self, w: &mut impl Write) -> io::Result<()> {
        let mut frame = Vec::with_capacity(4 + self.body.len());
        frame.extend_from_slice(&(self.body.len() as u32).to_le_bytes());
        frame.extend_from_slice(&self.body);
        w.write_all(&frame)?;
        w.flush()
    }
}

/// Reads fields from a received body; every read is bounds-checked.
#[derive(Debug)]
pub(crate) struct FrameReader<'a> {
    body: &'a [u8],
}

/// A malformed field: what was being read.
#[derive(Debug)]
pub(crate) struct Malformed(pub(crate) &'static str);

impl<'a> FrameReader<'a> {
    pub(crate) fn new(body: &'a [u8]) -> Self {
        FrameReader { body }
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

/// Why a frame could not be read.
#[derive(Debug)]
pub(crate) enum ReadFrameError {
    /// The socket failed or closed.
    Io(io::Error),
    /// The announced length exceeds the limit; nothing was allocated.
    TooLarge { len: usize, max: usize },
}

/// Reads one frame, refusing (before allocating) any body longer than `max`.
pub(crate) fn read_frame(r: &mut impl Read, max: usize) -> Result<Vec<u8>, ReadFrameError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(ReadFrameError::Io)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(ReadFrameError::TooLarge { len, max });
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(ReadFrameError::Io)?;
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let mut buf = Vec::new();
        FrameWriter::new(Op::Set as u8)
            .bytes(b"key")
            .bytes(b"")
            .u64(7)
            .i64(-3)
            .send(&mut buf)
            .unwrap();
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
    fn field_length_beyond_body_is_malformed() {
        let body = [0xff, 0xff, 0, 0, 1, 2];
        assert!(FrameReader::new(&body).bytes("key").is_err());
    }
}
