//! The fingerprint of one collective call: what it is, the one word every transport carries
//! it in, and the mismatch error when two ranks disagree.

use crate::dtype::DataType;
use crate::error::CommError;
use crate::reduce_op::ReduceOp;
use crate::u8_enum::u8_enum;
use std::fmt;

u8_enum! {
    /// Which collective (or point-to-point message) a frame belongs to.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum CollectiveKind {
        AllReduce = 1,
        Broadcast = 2,
        AllGather = 3,
        ReduceScatter = 4,
        Reduce = 5,
        Gather = 6,
        Scatter = 7,
        Barrier = 8,
        SendRecv = 9,
        AllToAll = 10,
    }
}

impl CollectiveKind {
    pub(crate) fn name(self) -> &'static str {
        use CollectiveKind::*;
        match self {
            AllReduce => "all_reduce",
            Broadcast => "broadcast",
            AllGather => "all_gather",
            ReduceScatter => "reduce_scatter",
            Reduce => "reduce",
            Gather => "gather",
            Scatter => "scatter",
            Barrier => "barrier",
            SendRecv => "send/recv",
            AllToAll => "all_to_all",
        }
    }

    fn has_root(self) -> bool {
        use CollectiveKind::*;
        matches!(self, Broadcast | Reduce | Gather | Scatter)
    }
}

/// Everything two ranks must agree on for one collective.
///
/// `count` is the per-rank element count of the call's main buffer (the input of `all_gather`
/// and `gather`, the output of `reduce_scatter` and `scatter`, the whole input of `all_to_all`,
/// all of its chunks). For point-to-point messages
/// `seq` counts messages between the pair and `root` holds the tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    pub(crate) seq: u64,
    pub(crate) kind: CollectiveKind,
    pub(crate) dtype: DataType,
    pub(crate) op: Option<ReduceOp>,
    pub(crate) count: u64,
    pub(crate) root: u32,
}

impl Fingerprint {
    pub(crate) fn new(seq: u64, kind: CollectiveKind, dtype: DataType, count: usize) -> Self {
        Fingerprint {
            seq,
            kind,
            dtype,
            op: None,
            count: count as u64,
            root: 0,
        }
    }
    pub(crate) fn with_op(mut self, op: ReduceOp) -> Self {
        self.op = Some(op);
        self
    }
    pub(crate) fn with_root(mut self, root: usize) -> Self {
        self.root = root as u32;
        self
    }
    /// A short label for errors and traces: `all_reduce #12`.
    pub(crate) fn label(&self) -> String {
        format!("{} #{}", self.kind.name(), self.seq)
    }

    /// Kind, type, op and root in one word, the form every transport carries them in (with
    /// `seq` and `count` beside it): byte 0 the kind, byte 1 the type, byte 2 the op (0 for
    /// none), bytes 4..8 the root, little-endian.
    pub(crate) fn packed(&self) -> u64 {
        self.kind as u64
            | (self.dtype as u64) << 8
            | (self.op.map_or(0, |o| o as u64)) << 16
            | (self.root as u64) << 32
    }

    /// The fingerprint carried as `seq`, `count` and [`Fingerprint::packed`]; `None` when the
    /// kind, type or op is unknown (a peer of another version, or garbage).
    pub(crate) fn unpack(seq: u64, count: u64, packed: u64) -> Option<Fingerprint> {
        Some(Fingerprint {
            seq,
            kind: CollectiveKind::from_u8(packed as u8)?,
            dtype: DataType::from_u8((packed >> 8) as u8)?,
            op: match (packed >> 16) as u8 {
                0 => None,
                v => Some(ReduceOp::from_u8(v)?),
            },
            count,
            root: (packed >> 32) as u32,
        })
    }

    /// Checks that global rank `peer` runs the same collective as this rank (`my_rank`).
    ///
    /// # Errors
    /// [`CommError::Mismatch`] naming both ranks and both calls.
    pub(crate) fn expect_same(
        &self,
        theirs: &Fingerprint,
        my_rank: usize,
        peer: usize,
    ) -> Result<(), CommError> {
        if theirs == self {
            return Ok(());
        }
        let describe = |fp: &Fingerprint| format!("{} as collective #{}", fp, fp.seq);
        Err(CommError::Mismatch {
            seq: self.seq,
            rank: my_rank,
            ours: describe(self),
            peer,
            theirs: describe(theirs),
        })
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({} x {}", self.kind.name(), self.dtype, self.count)?;
        if let Some(op) = self.op {
            write!(f, ", {op}")?;
        }
        if self.kind == CollectiveKind::SendRecv {
            write!(f, ", tag {}", self.root)?;
        } else if self.kind.has_root() {
            write!(f, ", root {}", self.root)?;
        }
        write!(f, ")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proptest_support::{config, fingerprint, mutated};
    use proptest::prelude::*;

    /// Packed words: mostly a valid fingerprint's with a few bytes flipped (random words
    /// almost never decode, so they would test only the refusal).
    fn packed_word() -> impl Strategy<Value = u64> {
        fingerprint()
            .prop_flat_map(|fp| mutated(fp.packed().to_le_bytes().to_vec()))
            .prop_map(|b| {
                let mut w = [0u8; 8];
                w.copy_from_slice(&b);
                u64::from_le_bytes(w)
            })
    }

    proptest! {
        #![proptest_config(config())]

        /// Any word unpacks to nothing or to a fingerprint that packs back to it (the unused
        /// byte 3 aside), and it unpacks exactly when its kind, type and op are known.
        #[test]
        fn any_packed_word_unpacks_safely(seq in any::<u64>(), count in any::<u64>(), packed in packed_word()) {
            let b = packed.to_le_bytes();
            let known = CollectiveKind::from_u8(b[0]).is_some()
                && DataType::from_u8(b[1]).is_some()
                && (b[2] == 0 || ReduceOp::from_u8(b[2]).is_some());
            let unpacked = Fingerprint::unpack(seq, count, packed);
            prop_assert_eq!(unpacked.is_some(), known);
            if let Some(fp) = unpacked {
                prop_assert_eq!(fp.packed(), packed & !(0xff << 24));
                prop_assert_eq!((fp.seq, fp.count), (seq, count));
            }
        }
    }

    /// Fails if `packed_word()` goes back to random words: most must decode, some must not.
    #[test]
    fn the_packed_word_generator_mostly_decodes() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        let mut runner = TestRunner::deterministic();
        let decoded = (0..400)
            .filter(|_| {
                let w = packed_word()
                    .new_tree(&mut runner)
                    .expect("a word")
                    .current();
                Fingerprint::unpack(0, 0, w).is_some()
            })
            .count();
        assert!((100..400).contains(&decoded), "{decoded} of 400 decoded");
    }

    #[test]
    fn display_names_op_type_count_and_root() {
        let fp = Fingerprint::new(3, CollectiveKind::Broadcast, DataType::F32, 10).with_root(2);
        assert_eq!(fp.to_string(), "broadcast(f32 x 10, root 2)");
        let fp =
            Fingerprint::new(3, CollectiveKind::AllReduce, DataType::I64, 7).with_op(ReduceOp::Max);
        assert_eq!(fp.to_string(), "all_reduce(i64 x 7, max)");
        assert_eq!(fp.label(), "all_reduce #3");
        let fp = Fingerprint::new(4, CollectiveKind::AllToAll, DataType::BF16, 12);
        assert_eq!(fp.to_string(), "all_to_all(bf16 x 12)");
        assert_eq!(CollectiveKind::from_u8(10), Some(CollectiveKind::AllToAll));
    }
}
