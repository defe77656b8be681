//! Allocators compared by the step benches: each row is a fresh process whose global
//! allocator (and glibc malloc settings) are fixed at start-up, and minor page faults per step
//! show what each costs.

use anyhow::{Result, bail};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};

/// The environment variable that picks [`SwitchAllocator`]'s allocator in a process.
pub const ALLOCATOR_VAR: &str = "DDP_BENCH_ALLOCATOR";
const ALLOCATOR_VAR_C: &std::ffi::CStr = c"DDP_BENCH_ALLOCATOR";

/// The allocator rows a bench can measure: `glibc` (its defaults), `launcher` (glibc with
/// [`ddp_core::launcher::ALLOCATOR_ENV`], what `ddp-run` gives its workers), `hugetlb` (glibc
/// with transparent huge pages for its mmap'd chunks), `mimalloc`, and `jemalloc` when built
/// with the `jemalloc` feature.
pub const ALLOCATOR_NAMES: &str = "glibc, launcher, hugetlb, mimalloc or jemalloc";

/// A global allocator chosen once, at the process's first allocation, from
/// `DDP_BENCH_ALLOCATOR` (`mimalloc`, `jemalloc`, anything else: the system's), so one bench
/// binary compares allocators row by row. The choice never changes afterwards, so every block
/// is freed by the allocator that made it. Install it with `#[global_allocator]` in a bench.
#[derive(Debug)]
pub struct SwitchAllocator;

static CHOICE: AtomicU8 = AtomicU8::new(0);
const SYSTEM: u8 = 1;
const MIMALLOC: u8 = 2;
const JEMALLOC: u8 = 3;

fn choice() -> u8 {
    let c = CHOICE.load(Ordering::Relaxed);
    if c != 0 {
        return c;
    }
    // SAFETY: getenv reads the environment without allocating; the pointer it returns is
    // read at once, before anything could change the environment.
    let picked = unsafe {
        let value = libc::getenv(ALLOCATOR_VAR_C.as_ptr());
        if value.is_null() {
            SYSTEM
        } else {
            match std::ffi::CStr::from_ptr(value).to_bytes() {
                b"mimalloc" => MIMALLOC,
                b"jemalloc" => JEMALLOC,
                _ => SYSTEM,
            }
        }
    };
    CHOICE.store(picked, Ordering::Relaxed);
    picked
}

// SAFETY: every call is forwarded to one allocator, the same for the whole process.
unsafe impl GlobalAlloc for SwitchAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe {
            match choice() {
                MIMALLOC => mimalloc::MiMalloc.alloc(layout),
                #[cfg(feature = "jemalloc")]
                JEMALLOC => tikv_jemallocator::Jemalloc.alloc(layout),
                _ => System.alloc(layout),
            }
        }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe {
            match choice() {
                MIMALLOC => mimalloc::MiMalloc.alloc_zeroed(layout),
                #[cfg(feature = "jemalloc")]
                JEMALLOC => tikv_jemallocator::Jemalloc.alloc_zeroed(layout),
                _ => System.alloc_zeroed(layout),
            }
        }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was made by the same allocator (the choice never changes).
        unsafe {
            match choice() {
                MIMALLOC => mimalloc::MiMalloc.dealloc(ptr, layout),
                #[cfg(feature = "jemalloc")]
                JEMALLOC => tikv_jemallocator::Jemalloc.dealloc(ptr, layout),
                _ => System.dealloc(ptr, layout),
            }
        }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` was made by the same allocator (the choice never changes).
        unsafe {
            match choice() {
                MIMALLOC => mimalloc::MiMalloc.realloc(ptr, layout, new_size),
                #[cfg(feature = "jemalloc")]
                JEMALLOC => tikv_jemallocator::Jemalloc.realloc(ptr, layout, new_size),
                _ => System.realloc(ptr, layout, new_size),
            }
        }
    }
}

/// The environment of one allocator row: set these on the child process, after removing
/// [`ALLOCATOR_VAR`], `GLIBC_TUNABLES` and the keys of [`ddp_core::launcher::ALLOCATOR_ENV`]
/// (see [`allocator_env_removed`]).
///
/// # Errors
/// An unknown name, or `jemalloc` in a build without the `jemalloc` feature.
pub fn allocator_env(name: &str) -> Result<Vec<(String, String)>> {
    let own = |v: &str| vec![(ALLOCATOR_VAR.to_string(), v.to_string())];
    Ok(match name {
        "glibc" => vec![],
        "launcher" => ddp_core::launcher::ALLOCATOR_ENV
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        "hugetlb" => vec![(
            "GLIBC_TUNABLES".to_string(),
            "glibc.malloc.hugetlb=1".to_string(),
        )],
        "mimalloc" => own("mimalloc"),
        "jemalloc" if cfg!(feature = "jemalloc") => own("jemalloc"),
        "jemalloc" => bail!(
            "this bench was built without jemalloc: add `--features jemalloc` (its build needs make)"
        ),
        other => bail!("unknown allocator {other:?}: expected {ALLOCATOR_NAMES}"),
    })
}

/// The variables any allocator row may set, to remove from a child's inherited environment
/// before [`allocator_env`]'s are added.
pub fn allocator_env_removed() -> Vec<&'static str> {
    let mut keys = vec![ALLOCATOR_VAR, "GLIBC_TUNABLES"];
    keys.extend(ddp_core::launcher::ALLOCATOR_ENV.iter().map(|(k, _)| *k));
    keys
}

/// Minor page faults of this process so far: first touches of memory the allocator just got
/// from the kernel, the hidden cost of buffers that are freed and allocated again every step.
pub fn minor_faults() -> u64 {
    // SAFETY: getrusage writes into the zeroed struct we pass and reads nothing else.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage.ru_minflt as u64
    }
}
