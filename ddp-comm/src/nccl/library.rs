//! Checks that the CUDA driver and NCCL can be loaded, before anything calls into them.
//!
//! cudarc loads both libraries on first use and panics when one is missing; these checks turn
//! that into an [`NcclError`] that says what to install.

use crate::error::NcclError;
use crate::error::Result;
use cudarc::driver::{CudaContext, sys::CUresult};
use std::ffi::CStr;

/// The number of CUDA devices this process can see (0 when the driver finds none).
///
/// # Errors
/// [`NcclError::DriverNotFound`] when the driver library cannot be loaded; a driver error when
/// it cannot be initialised.
pub fn cuda_device_count() -> Result<usize> {
    require_driver()?;
    match CudaContext::device_count() {
        Ok(n) => Ok(usize::try_from(n).unwrap_or(0)),
        // cuInit itself reports "no device" on machines with a driver but no GPU.
        Err(e) if e.0 == CUresult::CUDA_ERROR_NO_DEVICE => Ok(0),
        Err(e) => Err(NcclError::cuda("counting devices", 0)(e).into()),
    }
}

/// Checks that NCCL can run on CUDA device `device` of this process (driver, libnccl, the
/// device) and returns the device's UUID, which names the physical GPU whatever
/// `CUDA_VISIBLE_DEVICES` made its ordinal: ranks can tell whether they would share a GPU,
/// which NCCL refuses.
///
/// # Errors
/// [`NcclError::DriverNotFound`], [`NcclError::LibraryNotFound`], [`NcclError::NoSuchDevice`],
/// or a driver error reading the UUID.
pub fn nccl_device_uuid(device: usize) -> Result<[u8; 16]> {
    require_driver()?;
    require_nccl()?;
    let count = cuda_device_count()?;
    if device >= count {
        return Err(NcclError::NoSuchDevice { device, count }.into());
    }
    let ordinal = i32::try_from(device).unwrap_or(i32::MAX);
    let uuid = cudarc::driver::result::device::get(ordinal)
        .and_then(cudarc::driver::result::device::get_uuid)
        .map_err(NcclError::cuda("reading the device's UUID", device))?;
    Ok(uuid.bytes.map(|b| b as u8))
}

/// Fails with [`NcclError::DriverNotFound`] unless libcuda can be loaded.
pub(crate) fn require_driver() -> Result<()> {
    if crate::cuda_driver_present() {
        Ok(())
    } else {
        Err(NcclError::DriverNotFound.into())
    }
}

/// Fails with [`NcclError::LibraryNotFound`] unless libnccl can be loaded.
pub(crate) fn require_nccl() -> Result<()> {
    // SAFETY: this only tries to dlopen libnccl (running its initialisers, which is why the
    // function is unsafe) and reports whether that worked; no NCCL function is called.
    if unsafe { cudarc::nccl::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(NcclError::LibraryNotFound {
            candidates: cudarc::get_lib_name_candidates("nccl").join(", "),
        }
        .into())
    }
}

/// NCCL's description of its most recent error, formatted as `": <message>"`, or empty.
pub(crate) fn last_error_detail() -> String {
    // Old NCCL versions lack the symbol, and cudarc panics on a missing symbol: treat that as
    // "no message" rather than failing while reporting another failure.
    let message = std::panic::catch_unwind(|| {
        // SAFETY: ncclGetLastError accepts a null communicator (the argument is unused) and
        // returns a pointer to a NUL-terminated string owned by NCCL, or null.
        let ptr = unsafe { cudarc::nccl::sys::ncclGetLastError(std::ptr::null_mut()) };
        if ptr.is_null() {
            String::new()
        } else {
            // SAFETY: non-null pointers from ncclGetLastError point to a NUL-terminated string
            // that stays valid until the next NCCL call on this thread; we copy it at once.
            unsafe { CStr::from_ptr(ptr) }
                .to_string_lossy()
                .trim()
                .to_string()
        }
    })
    .unwrap_or_default();
    if message.is_empty() {
        message
    } else {
        format!(": {message}")
    }
}
