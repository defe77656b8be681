//! Where burn's GPU backends keep compiled kernels and autotune results between runs, so that a
//! second run does not pay the first one's warm-up again.
//!
//! On burn's CUDA backend the first steps JIT-compile every kernel (cubecl to PTX) and, with
//! burn's `autotune` feature, time the candidates of each tunable kernel. cubecl 0.10 keeps the
//! autotune results between runs by default, but not the compiled kernels. `use_kernel_cache`
//! (feature `cuda`) turns both on, in one directory:
//!
//! 1. `DDP_KERNEL_CACHE=/path`: that directory (for a cluster: a shared filesystem, so that a
//!    node with the same GPU model and driver starts warm); `DDP_KERNEL_CACHE=off`: cubecl's own
//!    defaults, nothing set;
//! 2. otherwise `$XDG_CACHE_HOME/ddp-burn/cubecl`, or `$HOME/.cache/ddp-burn/cubecl`.
//!
//! A `cubecl.toml` (or a `[cubecl]` section of `burn.toml`) in the working directory or above
//! wins: cubecl reads it, and nothing here overrides it. cubecl writes both caches safely from
//! several processes at once (append-only files under a lock), so every rank can share one.

use std::path::{Path, PathBuf};

/// The environment variable that chooses the kernel cache's directory (`off`: none).
pub const KERNEL_CACHE_ENV: &str = "DDP_KERNEL_CACHE";

/// What `use_kernel_cache` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelCache {
    /// Compiled kernels and autotune results are kept in this directory.
    Directory(PathBuf),
    /// The user's own cubecl configuration file was found there and is left in charge.
    UserConfig(PathBuf),
    /// `DDP_KERNEL_CACHE=off` (or none of `DDP_KERNEL_CACHE`, `XDG_CACHE_HOME` and `HOME` is
    /// set): cubecl's defaults (autotune results kept, kernels compiled anew).
    Off,
    /// cubecl had already been configured in this process (a GPU tensor existed before the
    /// call): nothing changed. Call `use_kernel_cache` before creating the first tensor.
    AlreadyConfigured,
}

impl std::fmt::Display for KernelCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelCache::Directory(dir) => write!(f, "kernel cache: {}", dir.display()),
            KernelCache::UserConfig(file) => {
                write!(f, "kernel cache: as configured in {}", file.display())
            }
            KernelCache::Off => write!(f, "kernel cache: off ({KERNEL_CACHE_ENV}=off)"),
            KernelCache::AlreadyConfigured => {
                write!(f, "kernel cache: unchanged (cubecl was configured before)")
            }
        }
    }
}

impl KernelCache {
    /// What `use_kernel_cache` chooses in this process: from `DDP_KERNEL_CACHE`,
    /// `XDG_CACHE_HOME`, `HOME` and any cubecl configuration file above the working directory
    /// (the [module docs](self) give the order). Changes nothing.
    pub fn from_env() -> KernelCache {
        let here = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        if let Some(file) = user_config_from(&here) {
            return KernelCache::UserConfig(file);
        }
        match cache_dir_from(|name| std::env::var(name).ok()) {
            Err(off) => off,
            Ok(None) => KernelCache::Off,
            Ok(Some(dir)) => KernelCache::Directory(dir),
        }
    }
}

/// What the environment asks for: `Err(KernelCache::Off)` for `off`, the directory otherwise
/// (`None` when neither `DDP_KERNEL_CACHE`, `XDG_CACHE_HOME` nor `HOME` is set).
pub(crate) fn cache_dir_from(
    var: impl Fn(&str) -> Option<String>,
) -> Result<Option<PathBuf>, KernelCache> {
    let set = |name: &str| var(name).filter(|v| !v.is_empty());
    match set(KERNEL_CACHE_ENV) {
        Some(v) if v.eq_ignore_ascii_case("off") => Err(KernelCache::Off),
        Some(v) => Ok(Some(PathBuf::from(v))),
        None => Ok(set("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| set("HOME").map(|home| Path::new(&home).join(".cache")))
            .map(|base| base.join("ddp-burn").join("cubecl"))),
    }
}

/// The cubecl configuration file that cubecl itself would read, searching from `dir` upward
/// (`cubecl.toml`, `CubeCL.toml`, or a `burn.toml` / `Burn.toml` with a `[cubecl]` section).
pub(crate) fn user_config_from(dir: &Path) -> Option<PathBuf> {
    dir.ancestors().find_map(|d| {
        let own = ["cubecl.toml", "CubeCL.toml"]
            .iter()
            .map(|n| d.join(n))
            .find(|p| p.is_file());
        own.or_else(|| {
            ["burn.toml", "Burn.toml"]
                .iter()
                .map(|n| d.join(n))
                .find(|p| has_cubecl_section(p))
        })
    })
}

fn has_cubecl_section(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .map(|text| {
            text.lines()
                .any(|l| l.trim() == "[cubecl]" || l.trim().starts_with("[cubecl."))
        })
        .unwrap_or(false)
}

/// Keeps cubecl's compiled kernels (PTX) and autotune results in one directory, chosen as the
/// [module docs](self) say, so that a second run starts warm. Call it once per process before
/// the first GPU tensor exists (cubecl reads its configuration once); every example that trains
/// on a GPU calls it first.
///
/// # Errors
/// The directory cannot be created (what was tried is said).
#[cfg(feature = "cuda")]
pub fn use_kernel_cache() -> Result<KernelCache, crate::DdpError> {
    use cubecl::config::cache::CacheConfig;
    use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    let dir = match KernelCache::from_env() {
        KernelCache::Directory(dir) => dir,
        other => return Ok(other),
    };
    std::fs::create_dir_all(&dir).map_err(|e| {
        crate::DdpError::InvalidConfig(format!(
            "the GPU kernel cache directory {} cannot be created ({e}); set {KERNEL_CACHE_ENV} \
             to a writable directory, or {KERNEL_CACHE_ENV}=off",
            dir.display()
        ))
    })?;
    let mut state = CubeClRuntimeConfig::storage().lock();
    if state.is_some() {
        return Ok(KernelCache::AlreadyConfigured);
    }
    // cubecl's defaults and its environment variables (CUBECL_AUTOTUNE_LEVEL, ...), with both
    // caches in `dir`.
    let mut config = CubeClRuntimeConfig::default().override_from_env();
    config.compilation.cache = Some(CacheConfig::File(dir.clone()));
    config.autotune.cache = CacheConfig::File(dir.clone());
    *state = Some(std::sync::Arc::new(config));
    tracing::info!(dir = %dir.display(), "GPU kernels and autotune results are cached");
    Ok(KernelCache::Directory(dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn the_cache_directory_comes_from_the_variable_then_xdg_then_home() {
        let dir = |pairs| cache_dir_from(env(pairs));
        assert_eq!(
            dir(&[(KERNEL_CACHE_ENV, "/shared/k"), ("HOME", "/home/u")]),
            Ok(Some(PathBuf::from("/shared/k")))
        );
        assert_eq!(
            dir(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/home/u")]),
            Ok(Some(PathBuf::from("/x/ddp-burn/cubecl")))
        );
        assert_eq!(
            dir(&[("HOME", "/home/u")]),
            Ok(Some(PathBuf::from("/home/u/.cache/ddp-burn/cubecl")))
        );
        assert_eq!(dir(&[(KERNEL_CACHE_ENV, "OFF")]), Err(KernelCache::Off));
        assert_eq!(
            dir(&[(KERNEL_CACHE_ENV, ""), ("HOME", "/h")]),
            Ok(Some(PathBuf::from("/h/.cache/ddp-burn/cubecl")))
        );
        assert_eq!(dir(&[]), Ok(None));
    }

    #[test]
    fn a_users_cubecl_configuration_above_the_working_directory_is_found() {
        let root = tempfile::tempdir().unwrap();
        let deep = root.path().join("a/b");
        std::fs::create_dir_all(&deep).unwrap();
        assert_eq!(user_config_from(&deep), None);
        // A burn.toml without a [cubecl] section is not cubecl's configuration.
        std::fs::write(root.path().join("a/burn.toml"), "[other]\nx = 1\n").unwrap();
        assert_eq!(user_config_from(&deep), None);
        std::fs::write(
            root.path().join("a/burn.toml"),
            "[cubecl.autotune]\nlevel = \"minimal\"\n",
        )
        .unwrap();
        assert_eq!(
            user_config_from(&deep),
            Some(root.path().join("a/burn.toml"))
        );
        std::fs::write(deep.join("cubecl.toml"), "").unwrap();
        assert_eq!(user_config_from(&deep), Some(deep.join("cubecl.toml")));
    }
}
