//! [`CheckpointConfig`]: where checkpoints go, how many are kept, how they are read back.

use super::error::CheckpointError;
use super::manifest::sha256_hex;
use burn::config::Config;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Settings of a [`FullCheckpointer`](crate::checkpoint::FullCheckpointer) or a
/// [`ShardedCheckpointer`](crate::checkpoint::sharded::ShardedCheckpointer).
///
/// It is a burn [`Config`] like the other settings of this crate (`save`, `load`, JSON), with
/// a hand-written builder instead of the derive's: `new` takes any path (`&str`, `PathBuf`),
/// `with_keep_last(3)` takes the count rather than an `Option`, and
/// [`with_run_config`](Self::with_run_config) hashes a value, which can fail.
///
/// ```
/// # use ddp_core::checkpoint::CheckpointConfig;
/// # #[derive(serde::Serialize)] struct TrainConfig { lr: f64 }
/// let config = CheckpointConfig::new("runs/digits")
///     .with_keep_last(3)
///     .with_run_config(&TrainConfig { lr: 1e-3 })?;
/// assert_eq!(config.keep_last(), Some(3));
/// # Ok::<(), ddp_core::checkpoint::CheckpointError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointConfig {
    dir: PathBuf,
    keep_last: Option<usize>,
    shared_filesystem: bool,
    run_config_hash: Option<String>,
    strict_run_config: bool,
    /// Settings saved before the option existed load with the lock on.
    #[serde(default = "lock_on")]
    dir_lock: bool,
    /// Settings saved before the option existed load with the check on.
    #[serde(default = "lock_on")]
    other_ranks_checked: bool,
    /// Settings saved before the option existed load writable.
    #[serde(default)]
    read_only: bool,
}

fn lock_on() -> bool {
    true
}

impl CheckpointConfig {
    /// Checkpoints go into subdirectories of `dir` (on rank 0's machine), which is created if
    /// needed. Defaults: keep every checkpoint, rank 0 reads and broadcasts on resume, no run
    /// config hash.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CheckpointConfig {
            dir: dir.into(),
            keep_last: None,
            shared_filesystem: false,
            run_config_hash: None,
            strict_run_config: false,
            dir_lock: true,
            other_ranks_checked: true,
            read_only: false,
        }
    }

    /// Keeps only the newest `k` checkpoints (at least 1). Older ones are deleted only after a
    /// new checkpoint is complete and `latest` points to it.
    pub fn with_keep_last(mut self, k: usize) -> Self {
        self.keep_last = Some(k);
        self
    }

    /// Keeps every checkpoint (the default).
    pub fn with_keep_all(mut self) -> Self {
        self.keep_last = None;
        self
    }

    /// With `true`, every rank reads the checkpoint files itself on resume (the directory must
    /// be visible at the same path on every rank, e.g. a shared filesystem); rank 0 still picks
    /// the checkpoint. With `false` (the default) rank 0 reads the files and broadcasts them,
    /// so no shared filesystem is needed.
    pub fn with_shared_filesystem(mut self, shared: bool) -> Self {
        self.shared_filesystem = shared;
        self
    }

    /// Records a hash of `run_config` (a burn `Config` or any serde value) in every checkpoint
    /// and compares it on resume: a difference is a warning, or an error with
    /// [`with_strict_run_config`](Self::with_strict_run_config).
    ///
    /// # Errors
    /// [`CheckpointError::Json`] if the value does not serialise to JSON.
    pub fn with_run_config<T: Serialize + ?Sized>(
        mut self,
        run_config: &T,
    ) -> Result<Self, CheckpointError> {
        self.run_config_hash = Some(run_config_hash(run_config)?);
        Ok(self)
    }

    /// Makes a run-config hash mismatch on resume an error
    /// ([`CheckpointError::RunConfigMismatch`]) instead of a warning.
    pub fn with_strict_run_config(mut self, strict: bool) -> Self {
        self.strict_run_config = strict;
        self
    }

    /// With `false`, rank 0 does not lock the directory (`dir/lock`, one job per directory).
    /// Only for file systems without locks (a Lustre client mounted without `-o flock`, where
    /// opening a checkpointer fails with [`StorageError::LockUnsupported`]), and only when you
    /// make sure yourself that one job at a time writes the directory: two jobs on it delete
    /// each other's checkpoints.
    ///
    /// [`StorageError::LockUnsupported`]: crate::checkpoint::StorageError::LockUnsupported
    pub fn with_dir_lock(mut self, lock: bool) -> Self {
        self.dir_lock = lock;
        self
    }

    /// Whether rank 0 locks the directory (the default).
    pub fn dir_lock(&self) -> bool {
        self.dir_lock
    }

    /// With `false`, a resume does not compare the other ranks' own directories with rank
    /// 0's. The check (on by default) fails the load when another rank's directory holds a
    /// newer checkpoint than rank 0 would resume: after an elastic restart without a shared file
    /// system, rank 0 would otherwise resume older state, or start over.
    ///
    /// Every manifest records the id of the run that wrote it (drawn by the run's first save
    /// into a directory without an earlier checkpoint, kept by every save that continues it).
    /// A fresh start (`record_fresh_start`, `--fresh`) clears rank 0's directory only, and
    /// marks the runs whose checkpoints the other ranks' directories then hold as superseded
    /// (in every rank's directory): the check passes over those with a warning naming the
    /// directory, so a restart after `--fresh` is not refused for an older run's checkpoints
    /// left on another host. A newer checkpoint of the run rank 0 resumes, of a run no fresh
    /// start superseded, or without a run id (written before run ids existed) still fails the
    /// load, and so does resuming a superseded run's checkpoint
    /// ([`CheckpointError::SupersededCheckpoint`]: rank 0 back on a host still holding it). With
    /// the check off, none of this is looked at. Turn the check off when the
    /// ranks' directories are not shared and may hold other runs' checkpoints that no fresh
    /// start saw (a host that joined later).
    pub fn with_other_ranks_checked(mut self, checked: bool) -> Self {
        self.other_ranks_checked = checked;
        self
    }

    /// Whether a resume compares the other ranks' directories with rank 0's (the default).
    pub fn other_ranks_checked(&self) -> bool {
        self.other_ranks_checked
    }

    /// With `true`, the checkpointer only loads: nothing in the directory is created, locked,
    /// renamed or removed, so it works on a read-only mount, or on another job's checkpoints
    /// you evaluate while that job runs. The directory must exist. A checkpoint that fails
    /// verification is skipped, not set aside. Saves, `rewind_to` and `record_fresh_start`
    /// fail with [`CheckpointError::ReadOnly`].
    pub fn with_read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Whether the checkpointer only loads ([`with_read_only`](Self::with_read_only)).
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// [`CheckpointError::ReadOnly`] for `action` when the checkpointer only loads. Every
    /// rank has the same config, so every rank fails alike, before any collective.
    pub(crate) fn writable(&self, action: &'static str) -> Result<(), CheckpointError> {
        if self.read_only {
            return Err(CheckpointError::ReadOnly {
                action,
                dir: self.dir.clone(),
            });
        }
        Ok(())
    }

    /// The checkpoint root directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many checkpoints are kept (`None`: all).
    pub fn keep_last(&self) -> Option<usize> {
        self.keep_last
    }

    /// Whether every rank reads the files itself on resume.
    pub fn shared_filesystem(&self) -> bool {
        self.shared_filesystem
    }

    /// The run config's hash, if one was given.
    pub fn run_config_hash(&self) -> Option<&str> {
        self.run_config_hash.as_deref()
    }

    /// Whether a run-config mismatch is an error.
    pub fn strict_run_config(&self) -> bool {
        self.strict_run_config
    }

    /// Compares the hash a checkpoint `name` was saved with (`saved`) with this run's: a
    /// mismatch is [`CheckpointError::RunConfigMismatch`] when strict, a warning otherwise;
    /// nothing to compare when either is missing.
    pub(crate) fn check_run_config(
        &self,
        name: &str,
        saved: Option<&str>,
    ) -> Result<(), CheckpointError> {
        let (Some(current), Some(saved)) = (self.run_config_hash(), saved) else {
            return Ok(());
        };
        if current == saved {
            return Ok(());
        }
        if self.strict_run_config() {
            return Err(CheckpointError::RunConfigMismatch {
                name: name.to_string(),
                saved: saved.to_string(),
                current: current.to_string(),
            });
        }
        tracing::warn!(
            checkpoint = name,
            saved,
            current,
            "the run config changed since this checkpoint was saved"
        );
        Ok(())
    }

    pub(crate) fn validate(&self) -> Result<(), CheckpointError> {
        if self.keep_last == Some(0) {
            return Err(CheckpointError::InvalidConfig(
                "keep_last is 0; keep at least 1 checkpoint (or use with_keep_all)".into(),
            ));
        }
        if self.dir.as_os_str().is_empty() {
            return Err(CheckpointError::InvalidConfig(
                "the checkpoint directory is empty".into(),
            ));
        }
        Ok(())
    }
}

impl Config for CheckpointConfig {}

/// `sha256:<hex>` of `value`'s JSON. Maps are serialised with sorted keys (serde_json's
/// `Value`), so the hash does not depend on a `HashMap`'s iteration order.
///
/// # Errors
/// [`CheckpointError::Json`] if the value does not serialise to JSON.
pub fn run_config_hash<T: Serialize + ?Sized>(value: &T) -> Result<String, CheckpointError> {
    let json =
        serde_json::to_value(value).map_err(CheckpointError::json("serialising the run config"))?;
    let bytes = serde_json::to_vec(&sort_keys(json))
        .map_err(CheckpointError::json("serialising the run config"))?;
    Ok(format!("sha256:{}", sha256_hex(&bytes)))
}

/// Rebuilds objects with their keys in sorted order (also when serde_json keeps insertion
/// order because some crate enabled its `preserve_order` feature).
fn sort_keys(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sort_keys(v)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sort_keys).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn hash_ignores_map_order_and_sees_values() {
        let a: HashMap<&str, f64> = [("lr", 0.1), ("wd", 0.0), ("b", 1.0)].into_iter().collect();
        let b: HashMap<&str, f64> = [("b", 1.0), ("wd", 0.0), ("lr", 0.1)].into_iter().collect();
        let c: HashMap<&str, f64> = [("b", 1.0), ("wd", 0.0), ("lr", 0.2)].into_iter().collect();
        let (ha, hb, hc) = (
            run_config_hash(&a).unwrap(),
            run_config_hash(&b).unwrap(),
            run_config_hash(&c).unwrap(),
        );
        assert_eq!(ha, hb);
        assert_ne!(ha, hc);
        assert!(ha.starts_with("sha256:") && ha.len() == 7 + 64, "{ha}");
    }

    #[test]
    fn saves_and_loads_as_a_burn_config() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("checkpoint.json");
        let config = CheckpointConfig::new("runs/digits")
            .with_keep_last(3)
            .with_shared_filesystem(true)
            .with_run_config(&[1, 2])
            .expect("hash")
            .with_strict_run_config(true);
        config.save(&file).expect("save");
        assert_eq!(CheckpointConfig::load(&file).expect("load"), config);
    }

    #[test]
    fn keep_last_zero_is_rejected() {
        let err = CheckpointConfig::new("x")
            .with_keep_last(0)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("keep_last is 0"), "{err}");
    }
}
