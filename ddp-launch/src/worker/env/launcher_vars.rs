//! The variables a launcher (`ddp-run`, [`launch`](crate::launch)) sets in every worker's
//! environment: the contract between the two sides. The worker side reads them; the plan writes
//! them (and re-exports them at the crate root, where they have always been).

/// Environment variable that marks a process as a worker started by this launcher.
pub const WORKER_ENV: &str = "DDP_LAUNCH_WORKER";
/// Environment variable holding the restart count (0 on the first attempt).
pub const RESTART_COUNT_ENV: &str = "DDP_RESTART_COUNT";
/// Environment variable holding the elastic rendezvous round the workers belong to (elastic
/// jobs only; equal to [`RESTART_COUNT_ENV`] there, since every new round restarts them).
pub const RDZV_ROUND_ENV: &str = "DDP_RDZV_ROUND";
/// Environment variable naming this launch (the same on every attempt of it, different for
/// every launch): lets a worker tell checkpoints written by this launch from an older run's
/// (e.g. `--fresh` on a `--max-restarts` restart). Random per launch unless already set in the
/// launcher's environment (but not when that is another launch's worker, whose id it is);
/// every node of a multi-node job uses node 0's (elastic jobs: the first
/// launcher's to join), so all workers of a job see the same id.
pub const LAUNCH_ID_ENV: &str = "DDP_LAUNCH_ID";

/// glibc `malloc` settings every worker gets unless the user tunes the allocator already (either
/// variable here, `MALLOC_TOP_PAD_`, `MALLOC_ARENA_MAX`, `GLIBC_TUNABLES` or
/// `LD_PRELOAD` set).
///
/// burn's CPU backends allocate activations and gradients afresh every step, and LibTorch's
/// tensors come from `malloc` whatever Rust's global allocator is. With glibc's defaults, freed
/// multi-MiB buffers go back to the kernel (`munmap`, heap trimming) and the next step
/// page-faults them in again, zeroed: on the MLP of `ddp_step` (24 MiB of gradients) that is
/// about 15,000 faults per step and a third of the step time. Serving blocks up to 1 GiB from
/// the heap and keeping up to 1 GiB of freed heap mapped removes them (glibc 2.36 takes
/// thresholds above the 32 MiB that its own adaptive threshold stops at). The same values as
/// `ddp_core::cpu_fast_path::KEEP_BYTES`, which DDP sets in-process when nothing set these. The
/// same role as `OMP_NUM_THREADS` in torchrun: a default for the workers, overridden by setting
/// any of the variables (or preloading another allocator).
pub const ALLOCATOR_ENV: [(&str, &str); 2] = [
    ("MALLOC_MMAP_THRESHOLD_", "1073741824"),
    ("MALLOC_TRIM_THRESHOLD_", "1073741824"),
];
