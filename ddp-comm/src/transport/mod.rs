//! Transports: how a process group's bytes move between ranks.
//!
//! - [`tcp`]: a full mesh of TCP connections running ring algorithms; works within a host and
//!   across hosts.
//!
//! Every transport implements [`Transport`], which works on byte buffers tagged by a
//! [`Fingerprint`]; the typed, user-facing API lives in [`crate::group`]. A transport is owned by
//! its group's communication thread, which calls it in issue order.

pub(crate) mod tcp;

use crate::collective::Fingerprint;
use crate::error::Result;
use crate::reduce_op::ReduceOp;

/// The collectives a transport must provide, on byte buffers. Buffer lengths have been checked by
/// the caller against the fingerprint (`count` elements of `fp.dtype` per rank); ranks are group
/// ranks.
pub(crate) trait Transport: Send {
    fn all_reduce(&mut self, fp: &Fingerprint, buf: &mut [u8], op: ReduceOp) -> Result<()>;
    fn broadcast(&mut self, fp: &Fingerprint, buf: &mut [u8], root: usize) -> Result<()>;
    /// `output` holds `world * input.len()` bytes, rank `r`'s input at block `r`.
    fn all_gather(&mut self, fp: &Fingerprint, input: &[u8], output: &mut [u8]) -> Result<()>;
    /// `input` holds `world * output.len()` bytes; rank `r` gets the reduction of block `r`.
    fn reduce_scatter(
        &mut self,
        fp: &Fingerprint,
        input: &[u8],
        output: &mut [u8],
        op: ReduceOp,
    ) -> Result<()>;
    /// The result lands in `buf` on `root`; other ranks' `buf` is left unchanged.
    fn reduce(&mut self, fp: &Fingerprint, buf: &mut [u8], root: usize, op: ReduceOp)
    -> Result<()>;
    /// `output` is `Some` (of `world * input.len()` bytes) on `root` only.
    fn gather(
        &mut self,
        fp: &Fingerprint,
        input: &[u8],
        output: Option<&mut [u8]>,
        root: usize,
    ) -> Result<()>;
    /// `input` is `Some` (of `world * output.len()` bytes) on `root` only.
    fn scatter(
        &mut self,
        fp: &Fingerprint,
        input: Option<&[u8]>,
        output: &mut [u8],
        root: usize,
    ) -> Result<()>;
    fn barrier(&mut self, fp: &Fingerprint) -> Result<()>;
    /// `fp.seq` is ignored: the transport numbers messages per peer.
    fn send(&mut self, fp: &Fingerprint, buf: &[u8], dst: usize) -> Result<()>;
    fn recv(&mut self, fp: &Fingerprint, buf: &mut [u8], src: usize) -> Result<()>;
    /// Closes every connection so peers blocked on this rank fail at once instead of timing out.
    fn abort(&mut self);
}
