//! The workspace's crates, read from the root `Cargo.toml`, and each crate's root files.

use std::fs;
use std::path::{Path, PathBuf};

/// The directory holding the `Cargo.toml` with `[workspace]`, above this test's package.
pub fn workspace_root() -> Result<PathBuf, String> {
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    loop {
        let manifest = dir.join("Cargo.toml");
        if fs::read_to_string(&manifest)
            .is_ok_and(|text| text.lines().any(|l| l.trim() == "[workspace]"))
        {
            return Ok(dir);
        }
        if !dir.pop() {
            return Err("no Cargo.toml with [workspace] above CARGO_MANIFEST_DIR".to_string());
        }
    }
}

/// The member directories (relative to `root`) listed in `[workspace] members`; a
/// trailing `/*` names every subdirectory with a `Cargo.toml`.
pub fn members(root: &Path) -> Result<Vec<String>, String> {
    let manifest =
        fs::read_to_string(root.join("Cargo.toml")).map_err(|e| format!("Cargo.toml: {e}"))?;
    let section = manifest
        .split("[workspace]")
        .nth(1)
        .ok_or("Cargo.toml: no [workspace]")?;
    let list = section
        .split_once("members")
        .and_then(|(_, rest)| rest.split_once('['))
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .ok_or("Cargo.toml: no `members = [...]` in [workspace]")?;
    let mut members = Vec::new();
    for entry in list.split('"').skip(1).step_by(2) {
        match entry.strip_suffix("/*") {
            Some(parent) => {
                let dirs = fs::read_dir(root.join(parent)).map_err(|e| format!("{parent}: {e}"))?;
                for dir in dirs.flatten() {
                    if dir.path().join("Cargo.toml").is_file() {
                        members.push(format!("{parent}/{}", dir.file_name().to_string_lossy()));
                    }
                }
            }
            None => members.push(entry.to_string()),
        }
    }
    members.sort();
    Ok(members)
}

/// The crate roots of a member, relative to `root`: `src/lib.rs`, `src/main.rs`,
/// `src/bin/*.rs` and `src/bin/*/main.rs` (each binary is a crate of its own).
pub fn crate_roots(root: &Path, member: &str) -> Vec<String> {
    let src = format!("{member}/src");
    let mut roots: Vec<String> = ["lib.rs", "main.rs"]
        .iter()
        .map(|file| format!("{src}/{file}"))
        .filter(|path| root.join(path).is_file())
        .collect();
    if let Ok(bins) = fs::read_dir(root.join(&src).join("bin")) {
        for entry in bins.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if path.is_dir() && path.join("main.rs").is_file() {
                roots.push(format!("{src}/bin/{name}/main.rs"));
            } else if name.ends_with(".rs") && path.is_file() {
                roots.push(format!("{src}/bin/{name}"));
            }
        }
    }
    roots.sort();
    roots
}
