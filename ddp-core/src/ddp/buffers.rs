//! [`BufferSync`]: rank 0's buffers (batch-norm running statistics) reach every rank.
//!
//! PyTorch broadcasts buffers from rank 0 at the start of every forward. Here the broadcast
//! starts at the beginning of every backward, with the values this step's forward left on rank
//! 0 (burn's pending `RunningState` updates flushed first), and lands after backward: it
//! overlaps with backward, every rank starts the next forward from rank 0's buffers as in
//! PyTorch, and in between, after every step, all ranks hold the same buffers (so any rank can
//! evaluate or checkpoint). A forward that is not followed by a backward leaves the buffers
//! unsynchronised, and the next forward broadcasts them first.
//!
//! Only buffers travel: frozen parameters (`require_grad = false`) were made equal at
//! construction and nothing changes them.

use crate::engine::model_sync::{read_values, write_values};
use crate::engine::params::{ParamKind, ParamTable};
use crate::error::DdpError;
use burn::module::AutodiffModule;
use burn::tensor::backend::{AutodiffBackend, Backend};
use ddp_comm::{ProcessGroup, Work};

/// Which tensors are buffers, and whether every rank holds rank 0's values.
#[derive(Debug)]
pub(crate) struct BufferSync {
    select: Vec<bool>,
    /// The model has buffers.
    any: bool,
    /// `broadcast_buffers` is on, there are buffers and more than one rank.
    enabled: bool,
    /// Bytes rank 0 sends (each buffer's length prefix and bytes).
    wire_bytes: usize,
    in_sync: bool,
}

impl BufferSync {
    pub(crate) fn new<I: Backend>(
        table: &ParamTable<I>,
        broadcast_buffers: bool,
        world_size: usize,
    ) -> Self {
        let select: Vec<bool> = table
            .entries
            .iter()
            .map(|e| e.kind == ParamKind::Buffer)
            .collect();
        let wire_bytes = table
            .entries
            .iter()
            .filter(|e| e.kind == ParamKind::Buffer)
            .map(|e| 8 + e.numel() * e.dtype.size())
            .sum();
        BufferSync {
            any: select.iter().any(|&b| b),
            enabled: broadcast_buffers && world_size > 1 && select.iter().any(|&b| b),
            select,
            wire_bytes,
            // Construction broadcast the whole module.
            in_sync: true,
        }
    }

    /// A forward ran: it may have updated buffers.
    pub(crate) fn mark_updated(&mut self) {
        self.in_sync = false;
    }

    /// Every rank holds rank 0's buffers (after construction or `set_module`).
    pub(crate) fn mark_synced(&mut self) {
        self.in_sync = true;
    }

    pub(crate) fn needs_sync(&self) -> bool {
        self.enabled && !self.in_sync
    }

    /// Broadcasts rank 0's buffers and writes them into `module`, blocking.
    pub(crate) fn sync_now<B: AutodiffBackend, M: AutodiffModule<B>>(
        &mut self,
        pg: &ProcessGroup,
        module: M,
    ) -> Result<M, DdpError> {
        match self.start::<B, M>(pg, &module, 0)? {
            Some(pending) => self.finish::<B, M>(pending, module),
            None => Ok(module),
        }
    }

    /// Starts broadcasting `root`'s current buffers (rank 0, or the first rank still training
    /// when some have joined); `None` when there is nothing to send.
    pub(crate) fn start<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        pg: &ProcessGroup,
        module: &M,
        root: usize,
    ) -> Result<Option<PendingBuffers>, DdpError> {
        if !self.enabled {
            return Ok(None);
        }
        let bytes = if pg.rank() == root {
            read_values::<B, M>(module, &self.select, false)
        } else {
            vec![0; self.wire_bytes]
        };
        if bytes.len() != self.wire_bytes {
            return Err(DdpError::Internal(format!(
                "rank {root}'s buffers take {} bytes, expected {}",
                bytes.len(),
                self.wire_bytes
            )));
        }
        Ok(Some(PendingBuffers {
            work: pg.broadcast_async(bytes, root),
            root: pg.rank() == root,
        }))
    }

    /// Waits for the broadcast and writes rank 0's buffers into `module` (other ranks).
    pub(crate) fn finish<B: AutodiffBackend, M: AutodiffModule<B>>(
        &mut self,
        pending: PendingBuffers,
        module: M,
    ) -> Result<M, DdpError> {
        let bytes = pending
            .work
            .wait()
            .map_err(DdpError::comm("broadcasting buffers"))?;
        let module = if pending.root {
            module
        } else {
            write_values::<B, M>(module, &self.select, false, &bytes)?
        };
        self.in_sync = true;
        Ok(module)
    }
}

impl BufferSync {
    /// Where nothing is broadcast (one rank, or `broadcast_buffers` off): applies this step's
    /// pending running-state updates, so the module's buffers read current after every step at
    /// any world size.
    pub(crate) fn settle_local<B: AutodiffBackend, M: AutodiffModule<B>>(&self, module: &M) {
        if self.any {
            crate::engine::params::flush_running_states::<B, M>(module);
        }
    }
}

/// A buffer broadcast in flight.
pub(crate) struct PendingBuffers {
    work: Work<Vec<u8>>,
    root: bool,
}
