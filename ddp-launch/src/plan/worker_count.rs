//! The sanity bound on `--nproc-per-node`: torchrun starts whatever it is told, so a typo
//! (`--nproc-per-node 100000`) starts workers until the OS refuses, leaving a host full of
//! half-started ranks. The launcher refuses a count the OS cannot run (the process limit) and,
//! unless `--oversubscribe`, one far beyond the cores (more than [`MAX_PER_CORE`] per core:
//! a few workers per core is a normal test setup, dozens is a mistake).

use crate::error::LaunchError;

/// Most workers per CPU core without `--oversubscribe`.
pub(crate) const MAX_PER_CORE: usize = 32;

/// The soft `RLIMIT_NPROC` when it binds the launcher: not for root (the kernel does not
/// enforce it for privileged processes) and not when unlimited.
pub(crate) fn process_limit() -> Option<u64> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return None;
    }
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NPROC, &mut limit) } != 0 {
        return None;
    }
    (limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// What of the host bounds the worker count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostLimits {
    /// CPU cores available to the launcher.
    pub(crate) cores: usize,
    /// The user's process limit (`RLIMIT_NPROC`), where it applies.
    pub(crate) process_limit: Option<u64>,
}

/// Checks `nproc_per_node` against the host.
///
/// # Errors
/// [`LaunchError::TooManyWorkers`] saying which limit it exceeds and what to do.
pub(crate) fn check_worker_count(
    nproc_per_node: usize,
    oversubscribe: bool,
    host: &HostLimits,
) -> Result<(), LaunchError> {
    let too_many = |why: String| {
        Err(LaunchError::TooManyWorkers {
            nproc_per_node,
            why,
        })
    };
    if let Some(limit) = host.process_limit
        && nproc_per_node as u64 >= limit
    {
        return too_many(format!(
            "is not below this user's process limit of {limit} (`ulimit -u`), which counts the \
             launcher and every other process and thread of the user: the OS would refuse to \
             start the rest. Lower --nproc-per-node or raise the limit"
        ));
    }
    let cores = host.cores.max(1);
    let bound = cores.saturating_mul(MAX_PER_CORE);
    if nproc_per_node > bound && !oversubscribe {
        return too_many(format!(
            "is more than {MAX_PER_CORE} workers per CPU core ({cores} cores here: at most \
             {bound}); a typo? Use --nproc-per-node auto for one per core, or add \
             --oversubscribe if you really mean {nproc_per_node}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(cores: usize, process_limit: Option<u64>) -> HostLimits {
        HostLimits {
            cores,
            process_limit,
        }
    }

    #[test]
    fn a_typo_sized_count_is_refused_unless_oversubscribed() {
        let e = check_worker_count(100_000, false, &host(8, None))
            .expect_err("far too many")
            .to_string();
        assert!(
            e.starts_with("--nproc-per-node 100000 is more than 32 workers per CPU core (8 cores here: at most 256)"),
            "{e}"
        );
        assert!(e.contains("--oversubscribe"), "{e}");
        check_worker_count(256, false, &host(8, None)).expect("32 per core is fine");
        check_worker_count(100_000, true, &host(8, None)).expect("asked for");
    }

    #[test]
    fn the_process_limit_binds_even_when_oversubscribed() {
        let e = check_worker_count(200, true, &host(8, Some(200)))
            .expect_err("over the limit")
            .to_string();
        assert!(e.contains("process limit of 200 (`ulimit -u`)"), "{e}");
        check_worker_count(199, false, &host(8, Some(200))).expect("below the limit");
    }
}
