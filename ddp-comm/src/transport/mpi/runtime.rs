//! Starting MPI once per process and finishing it at exit.
//!
//! MPI may be initialised once per process and must be finalised before it exits (Open MPI's
//! `mpirun` reports a process that exits without `MPI_Finalize` as failed). Groups come and go,
//! so the first MPI group initialises MPI and an `atexit` handler finalises it.

use super::call::check;
use crate::error::{CommError, Result};
use mpi::ffi;
use std::os::raw::c_int;
use std::sync::OnceLock;

/// The outcome of the one initialisation attempt, shared by every later group.
static INIT: OnceLock<std::result::Result<(), String>> = OnceLock::new();

/// Initialises MPI with `MPI_THREAD_MULTIPLE` (each group runs its collectives on its own
/// communication thread, so several threads call MPI at once), unless the program already did;
/// registers the finaliser.
///
/// # Errors
/// [`CommError::InvalidConfig`] when MPI cannot start or offers less than
/// `MPI_THREAD_MULTIPLE`.
pub(super) fn ensure_initialized() -> Result<()> {
    INIT.get_or_init(initialize)
        .clone()
        .map_err(|reason| CommError::config(crate::transport::TRANSPORT_ENV, reason))
}

fn initialize() -> std::result::Result<(), String> {
    let mut already: c_int = 0;
    // SAFETY: MPI_Initialized may be called at any time, before MPI_Init included.
    check("MPI_Initialized", unsafe {
        ffi::MPI_Initialized(&mut already)
    })
    .map_err(|e| e.to_string())?;
    let mut provided: c_int = 0;
    if already != 0 {
        // SAFETY: MPI is initialised.
        check("MPI_Query_thread", unsafe {
            ffi::MPI_Query_thread(&mut provided)
        })
        .map_err(|e| e.to_string())?;
    } else {
        // SAFETY: argc/argv may be null since MPI-2; called once (guarded by INIT).
        let rc = unsafe {
            ffi::MPI_Init_thread(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                ffi::RSMPI_THREAD_MULTIPLE,
                &mut provided,
            )
        };
        check("MPI_Init_thread", rc).map_err(|e| format!("mpi: MPI did not start: {e}"))?;
        // SAFETY: registers a plain extern "C" function.
        if unsafe { libc::atexit(finalize_at_exit) } != 0 {
            tracing::warn!("could not register MPI_Finalize at exit");
        }
    }
    // SAFETY: reads a constant the MPI library exports.
    let multiple = unsafe { ffi::RSMPI_THREAD_MULTIPLE };
    if provided < multiple {
        return Err(format!(
            "mpi: the MPI library provides thread level {provided}, but ddp-comm calls MPI from \
             one communication thread per group and needs MPI_THREAD_MULTIPLE ({multiple}); \
             use an MPI built with thread support (Open MPI 4 and later are)"
        ));
    }
    Ok(())
}

/// Finalises MPI at process exit unless the program already did.
extern "C" fn finalize_at_exit() {
    if finalized() {
        return;
    }
    // SAFETY: MPI was initialised by this module (the handler is registered only then).
    let rc = unsafe { ffi::MPI_Finalize() };
    if let Err(e) = check("MPI_Finalize", rc) {
        tracing::warn!(error = %e, "MPI_Finalize failed");
    }
}

/// Whether MPI has been finalised (communicators must not be freed after that).
pub(super) fn finalized() -> bool {
    let mut done: c_int = 0;
    // SAFETY: MPI_Finalized may be called at any time.
    let rc = unsafe { ffi::MPI_Finalized(&mut done) };
    rc != 0 || done != 0
}
