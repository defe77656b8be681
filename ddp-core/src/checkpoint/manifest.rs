//! The manifest: the last file written into a checkpoint, listing every other file with its
//! size and sha256. A checkpoint is valid only if every listed file matches.

use super::comm_hook_files::parse_comm_hook_state_file;
use super::error::{CheckpointError, InvalidReason};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The manifest's file name inside a checkpoint directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The model, in safetensors format; tensor names are module paths (`fc1.weight`).
pub const MODEL_FILE: &str = "model.safetensors";
/// The optimizer state, burn's `BinBytesRecorder` with full precision.
pub const OPTIMIZER_FILE: &str = "optimizer.bin";
/// The training state and run metadata, JSON.
pub const STATE_FILE: &str = "training_state.json";
/// Module path to burn `ParamId`, JSON: the optimizer state is keyed by `ParamId`, so a
/// restored module takes the saved ids.
pub const PARAM_IDS_FILE: &str = "param_ids.json";
/// The files every checkpoint holds besides the manifest.
pub const CHECKPOINT_FILES: [&str; 4] = [MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, PARAM_IDS_FILE];
/// The manifest format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// File name inside the checkpoint directory.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Lowercase hex sha256 of the contents.
    pub sha256: String,
}

impl FileEntry {
    /// The entry describing `bytes` stored as `name`.
    pub fn of(name: &str, bytes: &[u8]) -> Self {
        FileEntry {
            name: name.to_string(),
            size: bytes.len() as u64,
            sha256: sha256_hex(bytes),
        }
    }

    /// Checks that `bytes` are this file's: its size, then its sha256. The one check of a
    /// listed file, in either checkpoint format.
    pub(crate) fn check(&self, bytes: &[u8]) -> Result<(), InvalidReason> {
        if bytes.len() as u64 != self.size {
            return Err(InvalidReason::SizeMismatch {
                file: self.name.clone(),
                expected: self.size,
                found: bytes.len() as u64,
            });
        }
        let found = sha256_hex(bytes);
        if found != self.sha256 {
            return Err(InvalidReason::HashMismatch {
                file: self.name.clone(),
                expected: self.sha256.clone(),
                found,
            });
        }
        Ok(())
    }
}

/// The contents of `manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Checkpoint format version ([`FORMAT_VERSION`]).
    pub format_version: u32,
    /// The checkpoint's directory name.
    pub name: String,
    /// The global step it was taken at.
    pub global_step: u64,
    /// The ddp-core version that wrote it.
    pub framework_version: String,
    /// The id of the run that wrote it: drawn by the run's first save into a directory without
    /// an earlier checkpoint, kept by every later save that continues it (see
    /// [`CheckpointConfig::with_other_ranks_checked`](super::CheckpointConfig::with_other_ranks_checked)).
    /// `None` in manifests written before run ids existed (they load as before).
    #[serde(default)]
    pub run_id: Option<String>,
    /// Every other file of the checkpoint.
    pub files: Vec<FileEntry>,
}

impl Manifest {
    /// The entry for `name`, if listed.
    pub fn file(&self, name: &str) -> Option<&FileEntry> {
        self.files.iter().find(|f| f.name == name)
    }

    /// Total size of the listed files.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// Checks `bytes` against the entry for `name`.
    pub fn verify(&self, name: &str, bytes: &[u8]) -> Result<(), InvalidReason> {
        self.file(name)
            .ok_or_else(|| InvalidReason::NotInManifest { file: name.into() })?
            .check(bytes)
    }
}

/// Lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A checkpoint's files, read and verified.
#[derive(Debug, Clone)]
pub(crate) struct VerifiedFiles {
    pub(crate) manifest: Manifest,
    pub(crate) files: BTreeMap<String, Vec<u8>>,
}

impl VerifiedFiles {
    /// The bytes of one of [`CHECKPOINT_FILES`] (present after verification), or of a
    /// communication-hook state file read (empty when absent).
    pub(crate) fn get(&self, name: &str) -> &[u8] {
        self.files.get(name).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The world size the manifest's communication-hook state files were written by, if it
    /// lists any.
    pub(crate) fn hook_states_world(&self) -> Option<usize> {
        self.manifest
            .files
            .iter()
            .find_map(|f| parse_comm_hook_state_file(&f.name))
            .map(|(_, world)| world)
    }
}

/// Why a checkpoint could not be read: it is corrupt or incomplete (a reader may fall back to
/// an older one), or the filesystem failed, or another version wrote it (it must not: a
/// transient EIO or ESTALE, or a job restarted on an older build, would otherwise make a good
/// checkpoint look bad and move the run backwards).
#[derive(Debug)]
pub(crate) enum ReadFailure {
    /// Genuinely invalid: bad checksum or size, an unreadable manifest, missing by design
    /// (incomplete).
    Invalid(InvalidReason),
    /// Intact, but written by another version: another manifest format, or a training state
    /// that passed its hash check and still does not parse.
    /// [`InvalidReason::UnsupportedFormat`] or [`InvalidReason::BadState`].
    Incompatible(InvalidReason),
    /// Any other I/O error reading `path`.
    Io {
        /// The file or directory being read.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl From<InvalidReason> for ReadFailure {
    fn from(reason: InvalidReason) -> Self {
        ReadFailure::Invalid(reason)
    }
}

impl ReadFailure {
    /// The error a load of checkpoint `name` in `dir` fails with.
    pub(crate) fn into_error(self, name: &str, dir: &Path) -> CheckpointError {
        match self {
            ReadFailure::Invalid(reason) => CheckpointError::Invalid {
                name: name.to_string(),
                dir: dir.to_path_buf(),
                reason,
            },
            ReadFailure::Incompatible(reason) => CheckpointError::Incompatible {
                name: name.to_string(),
                dir: dir.to_path_buf(),
                reason: Box::new(reason),
            },
            ReadFailure::Io { path, source } => CheckpointError::ReadCheckpoint {
                name: name.to_string(),
                path,
                source,
            },
        }
    }
}

/// Which of a checkpoint's per-rank communication-hook state files a read loads (they are as
/// large as the gradients: a rank that reads for itself reads only its own).
#[derive(Debug, Clone, Copy)]
pub(crate) enum HookStateFiles {
    /// Every rank's: to verify the whole checkpoint (rank 0), or to send each rank its own.
    All,
    /// Only rank `rank`'s of a world of `world` ranks (none if saved at another size).
    OfRank { rank: usize, world: usize },
}

impl HookStateFiles {
    fn wants(self, file: &str) -> bool {
        match (self, parse_comm_hook_state_file(file)) {
            (_, None) => false,
            (HookStateFiles::All, Some(_)) => true,
            (HookStateFiles::OfRank { rank, world }, Some(of)) => of == (rank, world),
        }
    }
}

/// Reads the manifest of the checkpoint in `dir`, every file it must hold and the
/// communication-hook state files it lists that `hook_states` asks for, checking sizes and
/// hashes.
pub(crate) fn read_verified(
    dir: &Path,
    hook_states: HookStateFiles,
) -> Result<VerifiedFiles, ReadFailure> {
    let manifest: Manifest =
        read_manifest_file(dir, MANIFEST_FILE, FORMAT_VERSION, |m: &Manifest| {
            m.format_version
        })?;
    let mut files = BTreeMap::new();
    for name in CHECKPOINT_FILES {
        if manifest.file(name).is_none() {
            return Err(InvalidReason::NotInManifest { file: name.into() }.into());
        }
        let bytes = read_file(dir, name)?;
        manifest.verify(name, &bytes)?;
        files.insert(name.to_string(), bytes);
    }
    for entry in manifest.files.iter().filter(|f| hook_states.wants(&f.name)) {
        let bytes = read_file(dir, &entry.name)?;
        entry.check(&bytes)?;
        files.insert(entry.name.clone(), bytes);
    }
    Ok(VerifiedFiles { manifest, files })
}

/// Reads and parses manifest `file` of the checkpoint directory `dir`, of either format: the
/// directory must exist, the manifest must be there, parse, and be of format `supported`
/// (`format_version` reads it from the manifest).
pub(crate) fn read_manifest_file<T: DeserializeOwned>(
    dir: &Path,
    file: &str,
    supported: u32,
    format_version: impl FnOnce(&T) -> u32,
) -> Result<T, ReadFailure> {
    let missing_dir = || -> ReadFailure {
        InvalidReason::MissingDir {
            path: dir.display().to_string(),
        }
        .into()
    };
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(missing_dir()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(missing_dir()),
        Err(source) => {
            return Err(ReadFailure::Io {
                path: dir.to_path_buf(),
                source,
            });
        }
    }
    let bytes = read_file(dir, file).map_err(|e| match e {
        ReadFailure::Invalid(InvalidReason::MissingFile { file }) => {
            InvalidReason::MissingManifest { file }.into()
        }
        other => other,
    })?;
    // The version first, from the two fields every format keeps: a newer format's manifest
    // may not parse as this one's, and must still read as a version, not as corruption.
    if let Ok(probe) = serde_json::from_slice::<VersionProbe>(&bytes)
        && probe.format_version != supported
    {
        return Err(ReadFailure::Incompatible(
            InvalidReason::UnsupportedFormat {
                file: file.into(),
                found: probe.format_version,
                supported,
                written_by: probe.framework_version.unwrap_or_else(|| "unknown".into()),
            },
        ));
    }
    let manifest: T = serde_json::from_slice(&bytes).map_err(|e| InvalidReason::BadManifest {
        file: file.into(),
        error: e.to_string(),
    })?;
    debug_assert_eq!(format_version(&manifest), supported);
    Ok(manifest)
}

/// What every manifest format is expected to keep: its version, and the version of ddp-core
/// that wrote it.
#[derive(Deserialize)]
struct VersionProbe {
    format_version: u32,
    #[serde(default)]
    framework_version: Option<String>,
}

/// Reads file `name` of the checkpoint in `dir`. Only a missing file is a property of the
/// checkpoint (it was never completed); every other error is the filesystem's.
pub(crate) fn read_file(dir: &Path, name: &str) -> Result<Vec<u8>, ReadFailure> {
    let path = dir.join(name);
    super::crash_point::read_file(&path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => InvalidReason::MissingFile { file: name.into() }.into(),
        _ => ReadFailure::Io { path, source },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_abc() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn verify_names_the_file() {
        let m = Manifest {
            format_version: FORMAT_VERSION,
            name: "step-1".into(),
            global_step: 1,
            framework_version: "0".into(),
            run_id: None,
            files: vec![FileEntry::of("a.bin", b"hello")],
        };
        assert_eq!(m.verify("a.bin", b"hello"), Ok(()));
        let short = m.verify("a.bin", b"hell").unwrap_err();
        assert!(
            short
                .to_string()
                .contains("a.bin has 4 bytes, the manifest says 5"),
            "{short}"
        );
        let altered = m.verify("a.bin", b"jello").unwrap_err();
        assert!(matches!(altered, InvalidReason::HashMismatch { ref file, .. } if file == "a.bin"));
    }

    #[test]
    fn a_manifest_without_a_run_id_reads_as_none() {
        let old = r#"{"format_version":1,"name":"step-1","global_step":1,
            "framework_version":"0.1.0","files":[]}"#;
        let m: Manifest = serde_json::from_str(old).expect("an old manifest parses");
        assert_eq!(m.run_id, None);
        let mut new = m.clone();
        new.run_id = Some("0123".into());
        let json = serde_json::to_string(&new).expect("serialise");
        assert_eq!(serde_json::from_str::<Manifest>(&json).expect("parse"), new);
    }
}
