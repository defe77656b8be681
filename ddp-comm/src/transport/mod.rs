//! Transports: how a process group's bytes move between ranks.
//!
//! - [`tcp`]: TCP connections made on demand (ring neighbours first) running ring algorithms;
//!   works within a host and across hosts.
//! - [`shm`]: shared memory between the ranks of one host (segments under `/dev/shm`, futex
//!   waits), used by [`hybrid`].
//! - [`hybrid`]: what a group actually runs when some of its ranks share a host: shared memory
//!   within each host, TCP between hosts, hierarchical all-reduce. [`connect`] decides which
//!   transport a group gets ([`TransportKind`], `DDP_TRANSPORT`).
//! - `mpi` (feature `mpi`): MPI's collectives, for jobs started by `mpirun` or `srun`.
//! - `aligned`: the byte buffers they reduce in place through typed views.
//!
//! Every transport implements [`Transport`], which works on byte buffers tagged by a
//! [`Fingerprint`]; the typed, user-facing API lives in [`crate::group`]. A transport is owned by
//! its group's communication thread, which calls it in issue order.

mod abort;
pub(crate) mod aligned;
pub(crate) mod hybrid;
#[cfg(feature = "mpi")]
pub(crate) mod mpi;
pub(crate) mod parts;
mod select;
pub(crate) mod shm;
pub(crate) mod tcp;

pub(crate) use abort::{AbortHandle, LiveStreams};
pub(crate) use hybrid::{ConnectSpec, Connected};
pub(crate) use parts::Parts;
pub(crate) use select::connect;

use crate::collective::Fingerprint;
use crate::error::{CommError, Result};
use crate::reduce_op::ReduceOp;
use std::fmt;
use std::str::FromStr;

/// Environment variable choosing the transport: `auto` (default), `shm`, `tcp` or `mpi`.
pub const TRANSPORT_ENV: &str = "DDP_TRANSPORT";

/// Which transport a process group uses between ranks that share a host.
///
/// Ranks on different hosts always talk TCP. Every rank of a group must ask for compatible
/// kinds: `auto` goes along with either, but `tcp` on one rank and `shm` on another is a
/// configuration error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum TransportKind {
    /// Shared memory between ranks on the same host where it can be set up, TCP otherwise.
    #[default]
    Auto,
    /// TCP everywhere (for comparison and debugging).
    Tcp,
    /// Shared memory between ranks on the same host; the group fails to form if it cannot be
    /// set up.
    Shm,
    /// MPI for every collective (feature `mpi`; jobs started by `mpirun` or `srun`, where each
    /// rank is its `MPI_COMM_WORLD` rank). Every rank of the group must ask for it.
    Mpi,
}

impl TransportKind {
    /// Reads [`TRANSPORT_ENV`] (`DDP_TRANSPORT`); unset or empty means [`TransportKind::Auto`].
    ///
    /// # Errors
    /// [`CommError::InvalidConfig`] when the value is not `auto`, `tcp`, `shm` or `mpi`.
    pub fn from_env() -> Result<TransportKind> {
        match crate::env::env_var(TRANSPORT_ENV)? {
            Some(v) if !v.trim().is_empty() => v.parse(),
            _ => Ok(TransportKind::Auto),
        }
    }

    /// The lowercase name: `auto`, `tcp`, `shm` or `mpi`.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Auto => "auto",
            TransportKind::Tcp => "tcp",
            TransportKind::Shm => "shm",
            TransportKind::Mpi => "mpi",
        }
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TransportKind {
    type Err = CommError;

    fn from_str(s: &str) -> Result<TransportKind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(TransportKind::Auto),
            "tcp" => Ok(TransportKind::Tcp),
            "shm" => Ok(TransportKind::Shm),
            "mpi" => Ok(TransportKind::Mpi),
            _ => Err(CommError::config(
                TRANSPORT_ENV,
                format!("'{s}' is not a transport (expected auto, tcp, shm or mpi)"),
            )),
        }
    }
}

/// The collectives a transport must provide, on byte buffers. Buffer lengths have been checked by
/// the caller against the fingerprint (`count` elements of `fp.dtype` per rank); ranks are group
/// ranks.
pub(crate) trait Transport: Send {
    fn all_reduce(&mut self, fp: &Fingerprint, buf: &mut [u8], op: ReduceOp) -> Result<()>;
    /// All-reduce of the concatenation of `parts`. The default flattens, reduces and splits;
    /// transports that can address the pieces directly skip those two copies.
    fn all_reduce_parts(
        &mut self,
        fp: &Fingerprint,
        parts: &mut Parts<'_, '_>,
        op: ReduceOp,
    ) -> Result<()> {
        parts.through_flat(|flat| self.all_reduce(fp, flat, op))
    }
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
    /// `input` and `output` hold `world` blocks of `input.len() / world` bytes: block `q` of
    /// `input` goes to rank `q`, block `q` of `output` comes from rank `q` (this rank's own block
    /// is copied across).
    fn all_to_all(&mut self, fp: &Fingerprint, input: &[u8], output: &mut [u8]) -> Result<()>;
    fn barrier(&mut self, fp: &Fingerprint) -> Result<()>;
    /// `fp.seq` is ignored: the transport numbers messages per peer.
    fn send(&mut self, fp: &Fingerprint, buf: &[u8], dst: usize) -> Result<()>;
    fn recv(&mut self, fp: &Fingerprint, buf: &mut [u8], src: usize) -> Result<()>;
    /// This rank rejected its arguments to the collective `fp` (the error is its own), for
    /// transports whose peers would otherwise wait for it without end: MPI's calls have no
    /// timeout, and the peers are already inside the fingerprint check. The others fail their
    /// peers through the failure report and closed connections, and do nothing here.
    fn refuse(&mut self, _fp: &Fingerprint) {}
    /// Closes every connection so peers blocked on this rank fail at once instead of timing out.
    fn abort(&mut self);
    /// A handle that does what [`Transport::abort`] does from another thread, while this
    /// transport may be blocked in a collective (which then fails promptly).
    ///
    /// # Errors
    /// Duplicating a socket failed (out of file descriptors).
    fn abort_handle(&self) -> Result<AbortHandle>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proptest_support::config;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(config())]

        /// Any text is a transport or a config error naming the variable.
        #[test]
        fn any_transport_name_parses_safely(text in "\\PC{0,12}") {
            match text.parse::<TransportKind>() {
                Ok(k) => prop_assert_eq!(k.name(), text.trim().to_ascii_lowercase()),
                Err(e) => prop_assert!(e.to_string().starts_with(TRANSPORT_ENV)),
            }
        }
    }
}
