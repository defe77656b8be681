//! The fingerprint of one collective call.

use crate::dtype::DataType;
use crate::reduce_op::ReduceOp;
use std::fmt;

/// Which collective (or point-to-point message) a frame belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
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
}

impl CollectiveKind {
    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        use CollectiveKind::*;
        Some(match v {
            1 => AllReduce,
            2 => Broadcast,
            3 => AllGather,
            4 => ReduceScatter,
            5 => Reduce,
            6 => Gather,
            7 => Scatter,
            8 => Barrier,
            9 => SendRecv,
            _ => return None,
        })
    }

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
/// and `gather`, the output of `reduce_scatter` and `scatter`). For point-to-point messages
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

    #[test]
    fn display_names_op_type_count_and_root() {
        let fp = Fingerprint::new(3, CollectiveKind::Broadcast, DataType::F32, 10).with_root(2);
        assert_eq!(fp.to_string(), "broadcast(f32 x 10, root 2)");
        let fp =
            Fingerprint::new(3, CollectiveKind::AllReduce, DataType::I64, 7).with_op(ReduceOp::Max);
        assert_eq!(fp.to_string(), "all_reduce(i64 x 7, max)");
        assert_eq!(fp.label(), "all_reduce #3");
    }
}
