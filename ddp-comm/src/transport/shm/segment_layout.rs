//! Where everything lives in a segment (see the [module docs](super) for the picture).

/// First 8 bytes of every segment.
pub(super) const MAGIC: [u8; 8] = *b"DDPSHM01";
/// Layout version; a segment of another version is refused.
pub(super) const VERSION: u32 = 1;
/// The segment header and every slot header take one page each.
pub(super) const PAGE: usize = 4096;
/// Bytes of the encoded header that identify the segment (the rest of its page holds the
/// futex words).
pub(super) const HEADER_BYTES: usize = 64;
/// Most staging buffers per slot (their fingerprints must fit the slot header).
pub(super) const MAX_NBUF: usize = 64;

/// Segment header offsets.
pub(super) const H_EPOCH: usize = 128;
pub(super) const H_WAITERS: usize = 192;

/// Slot header offsets, relative to the slot.
pub(super) const S_PID: usize = 0;
pub(super) const S_START: usize = 8;
pub(super) const S_STATE: usize = 64;
pub(super) const S_POSTED: usize = 128;
pub(super) const S_REDUCED: usize = 192;
pub(super) const S_CONSUMED: usize = 256;
pub(super) const S_FP: usize = 320;
/// Bytes per fingerprint record: seq, count, packed (kind, dtype, op, root), reserved.
pub(super) const FP_BYTES: usize = 32;

/// A slot's state word.
pub(super) const STATE_OPEN: u32 = 0;
pub(super) const STATE_CLOSED: u32 = 1;
pub(super) const STATE_ABORTED: u32 = 2;

/// The shape of a segment: how many slots, how many staging buffers each, how large.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    /// Ranks on the host (slots).
    pub(super) local: usize,
    /// Staging buffers per slot.
    pub(super) nbuf: usize,
    /// Bytes per staging buffer (a multiple of the page size).
    pub(super) chunk: usize,
}

impl Layout {
    pub(super) fn slot_bytes(&self) -> usize {
        PAGE + self.nbuf * self.chunk
    }
    pub(super) fn total_bytes(&self) -> usize {
        PAGE + self.local * self.slot_bytes()
    }
    pub(super) fn slot(&self, i: usize) -> usize {
        PAGE + i * self.slot_bytes()
    }
    /// Staging buffer `b` of slot `i`.
    pub(super) fn staging(&self, i: usize, b: usize) -> usize {
        self.slot(i) + PAGE + b * self.chunk
    }
    /// Fingerprint record of staging buffer `b` of slot `i`.
    pub(super) fn fp(&self, i: usize, b: usize) -> usize {
        self.slot(i) + S_FP + b * FP_BYTES
    }
    pub(super) fn valid(&self) -> bool {
        self.local >= 1
            && (1..=MAX_NBUF).contains(&self.nbuf)
            && self.chunk >= PAGE
            && self.chunk.is_multiple_of(PAGE)
            && self.chunk <= 1 << 30
            && self.local <= 4096
    }
}

/// What the header says about a segment and its creator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Header {
    pub(super) layout: Layout,
    /// Creator's process id and start time (clock ticks after boot), to tell a live creator
    /// from a dead one whose pid was reused.
    pub(super) pid: u32,
    pub(super) start: u64,
    /// Inode of the creator's pid namespace: its pid means nothing in another one.
    pub(super) pid_ns: u64,
}

impl Header {
    pub(super) fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut h = [0u8; HEADER_BYTES];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_ne_bytes());
        h[12..16].copy_from_slice(&(self.layout.local as u32).to_ne_bytes());
        h[16..20].copy_from_slice(&(self.layout.nbuf as u32).to_ne_bytes());
        h[24..32].copy_from_slice(&(self.layout.chunk as u64).to_ne_bytes());
        h[32..36].copy_from_slice(&self.pid.to_ne_bytes());
        h[40..48].copy_from_slice(&self.start.to_ne_bytes());
        h[48..56].copy_from_slice(&self.pid_ns.to_ne_bytes());
        h[56..64].copy_from_slice(&(self.layout.total_bytes() as u64).to_ne_bytes());
        h
    }

    /// Decodes a header; `None` for anything that is not a valid segment of this version.
    pub(super) fn decode(h: &[u8]) -> Option<Header> {
        let h: &[u8; HEADER_BYTES] = h.get(..HEADER_BYTES)?.try_into().ok()?;
        if h[0..8] != MAGIC {
            return None;
        }
        let u32_at = |i: usize| u32::from_ne_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[i..i + 8]);
            u64::from_ne_bytes(b)
        };
        if u32_at(8) != VERSION {
            return None;
        }
        let layout = Layout {
            local: u32_at(12) as usize,
            nbuf: u32_at(16) as usize,
            chunk: usize::try_from(u64_at(24)).ok()?,
        };
        if !layout.valid() || u64_at(56) != layout.total_bytes() as u64 {
            return None;
        }
        Some(Header {
            layout,
            pid: u32_at(32),
            start: u64_at(40),
            pid_ns: u64_at(48),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_garbage_is_refused() {
        let h = Header {
            layout: Layout {
                local: 3,
                nbuf: 2,
                chunk: 1 << 20,
            },
            pid: 42,
            start: 123456,
            pid_ns: 4026531836,
        };
        assert_eq!(Header::decode(&h.encode()), Some(h));
        assert_eq!(Header::decode(&[0u8; 64]), None);
        let mut bad = h.encode();
        bad[56] ^= 1; // total length disagrees with the layout
        assert_eq!(Header::decode(&bad), None);
    }

    #[test]
    fn slots_and_buffers_do_not_overlap_and_stay_aligned() {
        let l = Layout {
            local: 4,
            nbuf: 2,
            chunk: 8192,
        };
        assert_eq!(l.slot(0), PAGE);
        assert_eq!(l.staging(0, 0), 2 * PAGE);
        assert_eq!(l.staging(0, 1), 2 * PAGE + 8192);
        assert_eq!(l.slot(1), l.staging(0, 1) + 8192);
        assert_eq!(l.total_bytes(), l.slot(3) + l.slot_bytes());
        assert!(l.fp(0, MAX_NBUF - 1) + FP_BYTES <= l.slot(0) + PAGE);
        const { assert!(S_CONSUMED + 8 <= S_FP) };
    }

    mod properties {
        use super::super::*;
        use crate::proptest_support::config;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(config())]

            /// Any bytes (a segment another process wrote) decode to nothing or to a header
            /// whose layout is valid and agrees with its total size.
            #[test]
            fn any_segment_header_decodes_safely(bytes in proptest::collection::vec(any::<u8>(), 0..100)) {
                if let Some(h) = Header::decode(&bytes) {
                    prop_assert!(h.layout.valid());
                }
            }

            /// The same with a valid magic and version, so the layout checks are reached.
            #[test]
            fn plausible_headers_decode_safely(
                local in any::<u32>(),
                nbuf in any::<u32>(),
                chunk in any::<u64>(),
                total in any::<u64>(),
            ) {
                let mut h = [0u8; HEADER_BYTES];
                h[0..8].copy_from_slice(&MAGIC);
                h[8..12].copy_from_slice(&VERSION.to_ne_bytes());
                h[12..16].copy_from_slice(&local.to_ne_bytes());
                h[16..20].copy_from_slice(&nbuf.to_ne_bytes());
                h[24..32].copy_from_slice(&chunk.to_ne_bytes());
                h[56..64].copy_from_slice(&total.to_ne_bytes());
                if let Some(d) = Header::decode(&h) {
                    prop_assert!(d.layout.valid());
                    prop_assert_eq!(d.layout.total_bytes() as u64, total);
                }
            }

            #[test]
            fn valid_headers_round_trip(
                local in 1usize..=64,
                nbuf in 1usize..=MAX_NBUF,
                pages in 1usize..=256,
                pid in any::<u32>(),
                start in any::<u64>(),
                pid_ns in any::<u64>(),
            ) {
                let h = Header { layout: Layout { local, nbuf, chunk: pages * PAGE }, pid, start, pid_ns };
                prop_assert_eq!(Header::decode(&h.encode()), Some(h));
            }
        }
    }
}
