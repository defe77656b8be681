//! The sharded checkpointer's agreements: rank 0 doing a part alone and telling the others
//! how it went, and every rank learning whether all ranks succeeded, so that no rank goes on
//! while another failed and no rank waits forever for one that gave up.

use super::super::error::CheckpointError;
use super::super::sync::broadcast_bytes;
use super::error::ShardedCheckpointError;
use ddp_comm::{ProcessGroup, ReduceOp};

/// Runs `work` on rank 0 only; rank 0 gets its result (`Some`), the others `Ok(None)` or
/// [`CheckpointError::Rank0Failed`] carrying rank 0's message.
pub(super) fn on_rank0<T>(
    pg: &ProcessGroup,
    action: &'static str,
    work: impl FnOnce() -> Result<T, ShardedCheckpointError>,
) -> Result<Option<T>, ShardedCheckpointError> {
    let result = if pg.rank() == 0 { Some(work()) } else { None };
    let message = match &result {
        Some(Err(e)) => e.to_string().into_bytes(),
        _ => Vec::new(),
    };
    let mut failed = [i32::from(matches!(result, Some(Err(_))))];
    pg.broadcast(&mut failed, 0)
        .map_err(CheckpointError::comm("sharing rank 0's outcome"))?;
    if failed[0] != 0 {
        let message = broadcast_bytes(pg, message, 0, "sharing rank 0's error")?;
        if pg.rank() != 0 {
            return Err(CheckpointError::Rank0Failed {
                action,
                message: String::from_utf8_lossy(&message).into_owned(),
            }
            .into());
        }
    }
    result.transpose()
}

/// Every rank learns whether all succeeded: returns this rank's own error, or
/// [`CheckpointError::PeerFailed`] naming the highest failing rank, or the value.
pub(super) fn all_ok<T>(
    pg: &ProcessGroup,
    result: Result<T, ShardedCheckpointError>,
    action: &'static str,
) -> Result<T, ShardedCheckpointError> {
    let mut failed = [if result.is_err() {
        pg.rank() as i64 + 1
    } else {
        0
    }];
    pg.all_reduce(&mut failed, ReduceOp::Max)
        .map_err(CheckpointError::comm("agreeing that every rank succeeded"))?;
    match (result, failed[0]) {
        (Err(e), _) => Err(e),
        (Ok(v), 0) => Ok(v),
        (Ok(_), rank) => Err(CheckpointError::PeerFailed {
            rank: (rank - 1) as usize,
            action,
        }
        .into()),
    }
}
