//! The sharded manifest: written by rank 0 into the staging directory after every shard is
//! durable, it names each shard's files (size, sha256) and where every tensor and every
//! parameter's optimizer state lives. Its presence inside a committed directory is what makes
//! the directory a sharded checkpoint.

use super::super::error::InvalidReason;
use super::super::manifest::{FileEntry, ReadFailure, read_file, read_manifest_file};
use super::super::state::StateFile;
use super::super::storage::naming::check_name;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The sharded manifest's file name inside a checkpoint directory.
pub const SHARDED_MANIFEST_FILE: &str = "sharded_manifest.json";
/// The sharded format this build writes and reads.
pub const SHARDED_FORMAT_VERSION: u32 = 1;

/// Rank `rank`'s model shard (safetensors, tensor names are module paths).
pub fn model_shard_file(rank: usize, world_size: usize) -> String {
    format!("model-{rank:05}-of-{world_size:05}.safetensors")
}

/// Rank `rank`'s optimizer shard (burn `BinBytesRecorder`, full precision, keyed by `ParamId`).
pub fn optimizer_shard_file(rank: usize, world_size: usize) -> String {
    format!("optimizer-{rank:05}-of-{world_size:05}.bin")
}

/// One rank's files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    /// The rank that wrote it.
    pub rank: usize,
    /// Its model tensors.
    pub model: FileEntry,
    /// Its optimizer state.
    pub optimizer: FileEntry,
    /// Its communication-hook state
    /// ([`comm_hook_state_file`](crate::checkpoint::comm_hook_state_file)), if it saved one;
    /// absent in manifests written before hook states were checkpointed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm_hook: Option<FileEntry>,
}

impl ShardEntry {
    /// Its files: model, optimizer, and the communication-hook state if any.
    pub fn files(&self) -> impl Iterator<Item = &FileEntry> {
        [&self.model, &self.optimizer]
            .into_iter()
            .chain(self.comm_hook.as_ref())
    }
}

/// One tensor of the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorEntry {
    /// The rank whose shard holds it.
    pub rank: usize,
    /// Safetensors dtype (`F32`...).
    pub dtype: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// burn's `ParamId` (the optimizer state is keyed by it).
    pub param_id: u64,
    /// Whether that rank's optimizer shard holds state for it (parameters that never had a
    /// gradient, buffers and frozen parameters have none).
    pub optimizer_state: bool,
}

/// The contents of [`SHARDED_MANIFEST_FILE`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardedManifest {
    /// [`SHARDED_FORMAT_VERSION`].
    pub format_version: u32,
    /// The checkpoint's directory name.
    pub name: String,
    /// The global step it was taken at.
    pub global_step: u64,
    /// The world size it was written with (one shard per rank).
    pub world_size: usize,
    /// The ddp-core version that wrote it.
    pub framework_version: String,
    /// The id of the run that wrote it, as in the rank-0 format's
    /// [`Manifest::run_id`](crate::checkpoint::Manifest::run_id); `None` in manifests written
    /// before run ids existed.
    #[serde(default)]
    pub run_id: Option<String>,
    /// Every rank's files, by rank.
    pub shards: Vec<ShardEntry>,
    /// Every tensor of the model, by module path.
    pub tensors: BTreeMap<String, TensorEntry>,
    /// Training state and run metadata, as the rank-0 checkpoint's `training_state.json`.
    pub(crate) state: StateFile,
}

impl ShardedManifest {
    /// Total size of the shard files.
    pub fn total_bytes(&self) -> u64 {
        self.shards
            .iter()
            .flat_map(ShardEntry::files)
            .map(|f| f.size)
            .sum()
    }

    /// The entry for file `name`, if it is one of the shards'.
    pub(super) fn file(&self, name: &str) -> Option<&FileEntry> {
        self.shards
            .iter()
            .flat_map(ShardEntry::files)
            .find(|f| f.name == name)
    }

    /// Module path to `ParamId`, as the rank-0 checkpoint's `param_ids.json`.
    pub(super) fn param_ids(&self) -> BTreeMap<String, u64> {
        self.tensors
            .iter()
            .map(|(path, t)| (path.clone(), t.param_id))
            .collect()
    }
}

/// Reads and parses the manifest of the checkpoint directory `dir` (not the shards).
pub(super) fn read_manifest(dir: &Path) -> Result<ShardedManifest, ReadFailure> {
    let manifest = read_manifest_file(
        dir,
        SHARDED_MANIFEST_FILE,
        SHARDED_FORMAT_VERSION,
        |m: &ShardedManifest| m.format_version,
    )?;
    if manifest.shards.len() != manifest.world_size
        || manifest.shards.iter().enumerate().any(|(r, s)| s.rank != r)
    {
        return Err(InvalidReason::BadManifest {
            file: SHARDED_MANIFEST_FILE.into(),
            error: format!(
                "{} shards listed for world size {}",
                manifest.shards.len(),
                manifest.world_size
            ),
        }
        .into());
    }
    Ok(manifest)
}

/// Reads shard file `name` of checkpoint directory `dir` and checks it against the manifest.
pub(super) fn read_verified(
    dir: &Path,
    manifest: &ShardedManifest,
    name: &str,
) -> Result<Vec<u8>, ReadFailure> {
    let entry = manifest
        .file(name)
        .ok_or_else(|| InvalidReason::NotInManifest { file: name.into() })?;
    let bytes = read_file(dir, name)?;
    entry.check(&bytes)?;
    Ok(bytes)
}

/// Verifies sharded checkpoint `name` of `dir`: what the storage layer's search and "never
/// backwards" check ask of this format. A checkpoint is valid when its manifest parses, names
/// the step its directory does (a copied or renamed checkpoint would resume as another step),
/// and every shard file (communication-hook states included) has the size and sha256 the
/// manifest lists.
pub(super) fn verify_checkpoint(dir: &Path, name: &str) -> Result<ShardedManifest, ReadFailure> {
    let path = dir.join(name);
    let manifest = read_manifest(&path)?;
    check_name(name, &manifest.name, manifest.global_step)?;
    verify_shards(&path, manifest)
}

/// Verifies every shard file of the checkpoint in `dir` (size and sha256) against `manifest`.
fn verify_shards(dir: &Path, manifest: ShardedManifest) -> Result<ShardedManifest, ReadFailure> {
    for shard in &manifest.shards {
        for file in shard.files() {
            read_verified(dir, &manifest, &file.name)?;
        }
    }
    Ok(manifest)
}
