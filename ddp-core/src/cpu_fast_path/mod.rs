//! The fast CPU path: what a rank on a CPU backend needs, set or said once per process.
//!
//! burn's CPU backends allocate activations and gradients afresh every step: with glibc's
//! default `malloc` settings the large buffers go back to the kernel and page-fault in again
//! each step (README, "CPU step time"). DDP, ZeRO and FSDP construction raise glibc's
//! thresholds ([`keep_freed_buffers`]), which is what reaches LibTorch's tensors. What a program
//! must choose itself, they say, once per process, with how to turn it on ([`advice`] decides,
//! from [`CpuFacts::detect`]'s facts): mimalloc as the global allocator, and burn-flex's AVX-512
//! matrix multiply, compiled in only with the `x86-v4` feature.

mod glibc_heap;

pub use glibc_heap::{HeapTuning, KEEP_BYTES, USER_SETTINGS, keep_freed_buffers, user_setting};
use std::sync::Once;

/// mimalloc, re-exported for [`use_fast_allocator!`](crate::use_fast_allocator).
pub use mimalloc::MiMalloc;

/// Sets mimalloc as the program's global allocator: burn's large per-step CPU buffers stay
/// mapped instead of page-faulting in every step. Write it once, at the top level of the
/// binary crate (a program has one global allocator; this macro is that declaration).
///
/// ```ignore
/// ddp_core::use_fast_allocator!();
/// ```
#[macro_export]
macro_rules! use_fast_allocator {
    () => {
        #[global_allocator]
        static DDP_CORE_FAST_ALLOCATOR: $crate::cpu_fast_path::MiMalloc =
            $crate::cpu_fast_path::MiMalloc;
    };
}

/// What the CPU and the build offer, as [`advice`] weighs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuFacts {
    /// The global allocator is mimalloc (whoever declared it).
    pub mimalloc: bool,
    /// The CPU runs AVX-512F instructions.
    pub cpu_avx512: bool,
    /// This binary was built with the `x86-v4` feature (burn-flex's AVX-512 kernels).
    pub built_x86_v4: bool,
}

impl CpuFacts {
    /// The facts of this process: mimalloc is the global allocator when a fresh heap
    /// allocation lies in mimalloc's heap region (true for [`use_fast_allocator!`] and for a
    /// program's own `#[global_allocator] static _: mimalloc::MiMalloc`).
    pub fn detect() -> Self {
        CpuFacts {
            mimalloc: global_allocator_is_mimalloc(),
            cpu_avx512: cpu_has_avx512(),
            built_x86_v4: cfg!(feature = "x86-v4"),
        }
    }
}

/// The advice for a rank with `facts`, one line per missing piece; empty when nothing is.
/// A pure function of the facts, so that every combination can be tested on any machine.
pub fn advice(facts: CpuFacts) -> Vec<String> {
    let mut lines = Vec::new();
    if !facts.mimalloc {
        lines.push(
            "the global allocator is not mimalloc: glibc's malloc serves burn's per-step CPU \
             buffers more slowly when a rank runs several threads; add \
             `ddp_core::use_fast_allocator!();` to your binary crate"
                .to_string(),
        );
    }
    if facts.cpu_avx512 && !facts.built_x86_v4 {
        lines.push(
            "this CPU has AVX-512, which this build leaves unused: `--features ddp-core/x86-v4` \
             turns on burn-flex's AVX-512 matrix multiply (the binary then needs an x86-64-v4 \
             CPU); time a step with and without it before keeping it: on an AMD EPYC it made \
             a matrix-multiply-bound step slower (the guide's performance chapter)"
                .to_string(),
        );
    }
    lines
}

/// Prepares the process for the fast CPU path, once, on a backend that may run on CPUs: glibc's
/// `malloc` keeps freed buffers ([`keep_freed_buffers`]; LibTorch allocates through it), and on
/// Flex and NdArray it says what is still missing ([`advice`]): as a `tracing` warning when a
/// subscriber is installed, otherwise on stderr.
pub(crate) fn prepare_once<D>(rank: usize) {
    static ONCE: Once = Once::new();
    if !may_run_on_cpu::<D>() {
        return;
    }
    ONCE.call_once(|| {
        match keep_freed_buffers() {
            HeapTuning::Raised => tracing::info!(
                rank,
                "fast CPU path: glibc malloc keeps freed blocks up to {} MiB in the heap \
                 (set MALLOC_TRIM_THRESHOLD_ to choose otherwise)",
                KEEP_BYTES >> 20
            ),
            HeapTuning::SetByEnvironment(name) => {
                tracing::info!(rank, "fast CPU path: glibc malloc as {name} sets it")
            }
            HeapTuning::Unavailable => {}
        }
        if !is_cpu_device::<D>() {
            return;
        }
        // A program without a `tracing` subscriber (the examples install none) would never see
        // a warning, so it goes to stderr then.
        let logged = tracing::dispatcher::has_been_set();
        for line in advice(CpuFacts::detect()) {
            if logged {
                tracing::warn!(rank, "fast CPU path: {line}");
            } else {
                eprintln!("ddp-core: rank {rank}: fast CPU path: {line}");
            }
        }
    });
}

/// Whether `D` is the device of one of burn's CPU-only backends (Flex, NdArray). A device type
/// that may be a GPU (LibTorch's, CUDA's) gets no advice: a false warning on a GPU run would
/// teach users to ignore it.
fn is_cpu_device<D>() -> bool {
    let name = std::any::type_name::<D>();
    name.ends_with("FlexDevice") || name.ends_with("NdArrayDevice")
}

/// Whether `D` is the device of a backend whose tensors may live in host memory: the CPU-only
/// ones and LibTorch (whose CPU tensors come from `malloc`; on its GPUs the setting only
/// concerns the little host memory a rank allocates).
fn may_run_on_cpu<D>() -> bool {
    is_cpu_device::<D>() || std::any::type_name::<D>().ends_with("LibTorchDevice")
}

fn global_allocator_is_mimalloc() -> bool {
    let probe = Box::new(0u64);
    let ptr: *const u64 = &*probe;
    // SAFETY: `mi_is_in_heap_region` only compares the address against mimalloc's segment map;
    // it never dereferences it, and is valid before mimalloc has allocated anything.
    unsafe { libmimalloc_sys::mi_is_in_heap_region(ptr.cast()) }
}

#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
fn cpu_has_avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

#[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
fn cpu_has_avx512() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(mimalloc: bool, cpu_avx512: bool, built_x86_v4: bool) -> CpuFacts {
        CpuFacts {
            mimalloc,
            cpu_avx512,
            built_x86_v4,
        }
    }

    #[test]
    fn nothing_missing_gives_no_advice() {
        assert!(advice(facts(true, true, true)).is_empty());
        assert!(advice(facts(true, false, false)).is_empty());
    }

    #[test]
    fn missing_allocator_names_the_macro() {
        let lines = advice(facts(false, false, false));
        assert_eq!(lines.len(), 1);
        assert!(lines[0].contains("use_fast_allocator!"), "{lines:?}");
    }

    #[test]
    fn avx512_cpu_without_x86_v4_names_the_feature() {
        let lines = advice(facts(true, true, false));
        assert_eq!(lines.len(), 1);
        assert!(lines[0].contains("x86-v4"), "{lines:?}");
        assert_eq!(advice(facts(false, true, false)).len(), 2);
    }

    #[test]
    fn only_cpu_backends_are_advised() {
        assert!(is_cpu_device::<burn::backend::flex::FlexDevice>());
        assert!(!is_cpu_device::<String>());
        assert!(may_run_on_cpu::<burn::backend::flex::FlexDevice>());
        assert!(!may_run_on_cpu::<String>());
    }

    #[test]
    fn a_glibc_test_binary_is_not_taken_for_mimalloc() {
        // This crate's unit-test binary declares no global allocator.
        assert!(!global_allocator_is_mimalloc());
    }
}
