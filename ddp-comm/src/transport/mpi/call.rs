//! Checking MPI return codes, and MPI's `int` counts.

use crate::error::{CommError, Result};
use mpi::ffi;
use std::os::raw::{c_char, c_int};

/// `Ok` for `MPI_SUCCESS` (0), else [`CommError::Mpi`] with MPI's own message for the code.
/// Communicators are set to return errors instead of aborting the job.
pub(super) fn check(op: &'static str, rc: c_int) -> Result<()> {
    if rc == 0 {
        return Ok(());
    }
    Err(CommError::Mpi {
        op,
        code: rc,
        message: error_string(rc),
    })
}

/// MPI's description of an error code.
fn error_string(code: c_int) -> String {
    // Larger than any MPI_MAX_ERROR_STRING in use (Open MPI: 256, MPICH: 1024).
    let mut buf = vec![0 as c_char; 4096];
    let mut len: c_int = 0;
    // SAFETY: `buf` holds at least MPI_MAX_ERROR_STRING characters.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr(), &mut len) };
    if rc != 0 {
        return "unknown MPI error".into();
    }
    let len = usize::try_from(len).unwrap_or(0).min(buf.len());
    let bytes: Vec<u8> = buf[..len].iter().map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `count` as MPI's `int`, or an error naming the collective: MPI counts elements in an `int`.
pub(super) fn count(op: &'static str, count: usize) -> Result<c_int> {
    c_int::try_from(count).map_err(|_| {
        CommError::arg(
            op,
            format!(
                "{count} elements per rank is more than MPI can address in one call ({}); \
                 split the buffer",
                c_int::MAX
            ),
        )
    })
}

/// The largest piece, in elements, that the chunked collectives hand to MPI at once.
pub(super) const CHUNK_ELEMENTS: usize = 1 << 28;
