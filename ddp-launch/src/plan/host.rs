//! What the launcher knows about its host ([`HostInfo`]: cores, process limit, the few
//! variables it reads), and the thread-pool and allocator variables that follow from it for
//! every worker.

use crate::error::LaunchError;
use crate::plan::takeover::TAKEOVER_ENV;
use crate::plan::worker_count::process_limit;
use crate::worker::env::launcher_vars::{ALLOCATOR_ENV, LAUNCH_ID_ENV, WORKER_ENV};
use ddp_comm::TOKEN_ENV;
use std::collections::HashMap;

/// Thread-pool variables set per worker (to cores / local ranks) unless already set.
const THREAD_VARS: [&str; 2] = ["OMP_NUM_THREADS", "RAYON_NUM_THREADS"];

/// Variables that mean the user chose allocator settings (or another allocator) themselves.
pub(super) const ALLOCATOR_USER_VARS: [&str; 6] = [
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_ARENA_MAX",
    "GLIBC_TUNABLES",
    "LD_PRELOAD",
];

/// What the launcher knows about its host: core count and the few variables it consults.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostInfo {
    /// CPU cores available to the launcher.
    pub(crate) cores: usize,
    /// The user's process limit (`RLIMIT_NPROC`), where it applies to the launcher.
    pub(crate) process_limit: Option<u64>,
    /// Environment variables (only [`TOKEN_ENV`], [`LAUNCH_ID_ENV`], [`TAKEOVER_ENV`], the
    /// thread variables and the allocator variables are read).
    pub(crate) vars: HashMap<String, String>,
}

impl HostInfo {
    /// The current process's view.
    ///
    /// # Errors
    /// [`LaunchError::WorkerEnv`] naming a variable whose value is not valid UTF-8.
    pub(crate) fn current() -> Result<Self, LaunchError> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let vars = crate::worker::env::process_env::with_process_env(|lookup| {
            // LAUNCH_ID_ENV: a launch id already set is kept, so a wrapper (or a re-run that
            // should count as the same launch) can choose it; not inside another launch's
            // worker, whose id it is (this launch would share its log directory).
            let nested = lookup(WORKER_ENV).is_some();
            Ok([TOKEN_ENV, LAUNCH_ID_ENV, TAKEOVER_ENV]
                .into_iter()
                .filter(|&k| !(nested && k == LAUNCH_ID_ENV))
                .chain(THREAD_VARS)
                .chain(ALLOCATOR_USER_VARS)
                .filter_map(|k| lookup(k).map(|v| (k.to_string(), v)))
                .collect())
        })?;
        Ok(HostInfo {
            cores,
            process_limit: process_limit(),
            vars,
        })
    }

    pub(super) fn var(&self, key: &str) -> Option<&str> {
        self.vars
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// The thread-pool variables (cores per local rank, for each one not set) and, with glibc,
    /// the allocator defaults (unless the user tuned the allocator), for `nproc_per_node`
    /// workers.
    pub(super) fn thread_env(&self, nproc_per_node: usize) -> Vec<(String, String)> {
        let per_rank = (self.cores / nproc_per_node).max(1).to_string();
        let mut thread_env: Vec<(String, String)> = THREAD_VARS
            .iter()
            .filter(|k| self.var(k).is_none())
            .map(|k| (k.to_string(), per_rank.clone()))
            .collect();
        if cfg!(all(target_os = "linux", target_env = "gnu"))
            && ALLOCATOR_USER_VARS.iter().all(|k| self.var(k).is_none())
        {
            thread_env.extend(
                ALLOCATOR_ENV
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string())),
            );
        }
        thread_env
    }
}
