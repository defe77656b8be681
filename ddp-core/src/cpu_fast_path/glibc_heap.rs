//! glibc's `malloc` set to keep freed buffers in the heap, for the allocations that Rust's
//! global allocator never sees.
//!
//! LibTorch allocates every tensor with the C library's `malloc`, so `use_fast_allocator!` does
//! not reach it. By default glibc maps each block of 128 KiB or more with `mmap` (a threshold
//! that adapts only up to 32 MiB) and returns the heap's free top beyond 128 KiB to the kernel,
//! so a training step's large buffers are unmapped when freed and fault in, page by page, the
//! next step. burn's linear layers on 3-D inputs allocate a `[batch, d_in, d_out]` gradient of
//! 32 MiB in the transformer bench: on LibTorch, raising the thresholds took its step from 771
//! to 509 ms (docs/guide/benchmarks.md, "Ours against PyTorch DDP on CPUs, per backend"). Raising both thresholds keeps those blocks in
//! the heap, as PyTorch's caching allocator keeps GPU memory: a rank's heap stays as large as its
//! largest step needed.

/// Blocks up to this size are served from the heap, and up to this much free memory stays at
/// its top (both of glibc's thresholds; `mallopt` takes an `int`).
pub const KEEP_BYTES: usize = 1 << 30;

/// What [`keep_freed_buffers`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeapTuning {
    /// Both thresholds are now [`KEEP_BYTES`].
    Raised,
    /// The environment sets glibc's `malloc` itself (the variable is named); left as it is.
    SetByEnvironment(&'static str),
    /// The C library is not glibc, or refused the setting: nothing changed.
    Unavailable,
}

/// The environment variables through which a user sets glibc's `malloc` thresholds; when one
/// is set, the user has chosen and [`keep_freed_buffers`] changes nothing.
pub const USER_SETTINGS: [&str; 3] = [
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "GLIBC_TUNABLES",
];

/// Which of [`USER_SETTINGS`] makes the choice the user's, looking them up with `var`.
/// `GLIBC_TUNABLES` counts only when it names a `glibc.malloc` tunable.
pub fn user_setting(var: impl Fn(&str) -> Option<String>) -> Option<&'static str> {
    USER_SETTINGS.into_iter().find(|name| match var(name) {
        Some(value) if *name == "GLIBC_TUNABLES" => value.contains("glibc.malloc."),
        Some(_) => true,
        None => false,
    })
}

/// Raises glibc's mmap and trim thresholds to [`KEEP_BYTES`], unless the environment sets
/// them ([`user_setting`]). Process-wide; later calls repeat the same setting.
pub fn keep_freed_buffers() -> HeapTuning {
    if let Some(name) = user_setting(|name| std::env::var(name).ok()) {
        return HeapTuning::SetByEnvironment(name);
    }
    raise_thresholds()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn raise_thresholds() -> HeapTuning {
    let keep = libc::c_int::try_from(KEEP_BYTES).unwrap_or(libc::c_int::MAX);
    // SAFETY: `mallopt` only stores the two settings in glibc's malloc state, under its lock.
    let set = unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, keep) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, keep) == 1
    };
    if set {
        HeapTuning::Raised
    } else {
        HeapTuning::Unavailable
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn raise_thresholds() -> HeapTuning {
    HeapTuning::Unavailable
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn a_users_malloc_variable_is_respected() {
        assert_eq!(user_setting(env(&[])), None);
        assert_eq!(
            user_setting(env(&[("MALLOC_TRIM_THRESHOLD_", "131072")])),
            Some("MALLOC_TRIM_THRESHOLD_")
        );
        assert_eq!(
            user_setting(env(&[("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")])),
            Some("GLIBC_TUNABLES")
        );
        // Tunables of other glibc parts leave malloc's choice to us.
        assert_eq!(
            user_setting(env(&[("GLIBC_TUNABLES", "glibc.cpu.hwcaps=-AVX2")])),
            None
        );
    }

    #[test]
    fn the_launcher_gives_workers_the_same_thresholds() {
        for (name, value) in ddp_launch::ALLOCATOR_ENV {
            assert_eq!(value.parse::<usize>(), Ok(KEEP_BYTES), "{name}");
        }
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn after_raising_a_64_mib_block_comes_from_the_heap() {
        if user_setting(|name| std::env::var(name).ok()).is_some() {
            return; // the environment chose; nothing to check
        }
        assert_eq!(keep_freed_buffers(), HeapTuning::Raised);
        // By default glibc maps a 64 MiB block (its adaptive threshold stops at 32 MiB), and
        // its mapped bytes grow by the block's size. Other tests of this binary may free mapped
        // blocks meanwhile, which only lowers the count.
        // SAFETY: mallinfo2 reads glibc's statistics; the block is freed at once.
        let grown = unsafe {
            let before = libc::mallinfo2().hblkhd as i128;
            let block = libc::malloc(64 << 20);
            assert!(!block.is_null());
            let after = libc::mallinfo2().hblkhd as i128;
            libc::free(block);
            after - before
        };
        assert!(grown < 64 << 20, "the block was mapped: {grown} bytes");
    }
}
