//! The choice of transport for a group: MPI when it asked for `mpi`, else TCP with shared
//! memory where ranks share a host. Kept apart from the [`Transport`](super::Transport) trait,
//! which every transport implements, so that the transports depend on the trait and this
//! choice depends on them, never the other way round.

#[cfg(not(feature = "mpi"))]
use super::TRANSPORT_ENV;
use super::TransportKind;
use super::hybrid::{self, ConnectSpec, Connected};
#[cfg(feature = "mpi")]
use super::mpi;
#[cfg(not(feature = "mpi"))]
use crate::error::CommError;
use crate::error::Result;

/// Connects a group with the transport it asked for: MPI for `mpi`, else TCP with shared
/// memory where ranks share a host ([`hybrid::connect`]).
pub(crate) fn connect(spec: &ConnectSpec<'_>) -> Result<Connected> {
    if spec.transport != TransportKind::Mpi {
        return hybrid::connect(spec);
    }
    #[cfg(feature = "mpi")]
    return mpi::connect(spec);
    #[cfg(not(feature = "mpi"))]
    Err(CommError::config(
        TRANSPORT_ENV,
        "mpi: this build has no MPI transport; build with the `mpi` feature of ddp-comm \
         (needs an MPI library and libclang, e.g. Debian's libopenmpi-dev and libclang-dev)",
    ))
}
