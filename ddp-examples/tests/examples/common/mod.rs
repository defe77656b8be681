//! Helpers shared by the examples' process-level tests: a clean environment, reading
//! checkpoints, finding a launcher's workers.
#![allow(dead_code)] // each test file uses a different subset

pub mod job;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `bin` with launcher, Slurm and Open MPI variables removed, so the test runner's environment
/// cannot make it a worker or change its place in a job.
pub fn clean_command(bin: &str) -> Command {
    let mut cmd = Command::new(bin);
    // `vars_os`: `vars` panics on a variable that is not Unicode (and this runs in teardown).
    for (k, _) in std::env::vars_os() {
        let Some(k) = k.to_str().map(str::to_owned) else {
            continue;
        };
        if k.starts_with("DDP_")
            || k.starts_with("SLURM_")
            || k.starts_with("OMPI_")
            || k.starts_with("PMIX_")
            || k.starts_with("TORCHELASTIC_")
            || k.starts_with("MASTER_")
            || ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"].contains(&k.as_str())
        {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Runs `cmd` to the end: (success, stdout, stderr).
pub fn output(mut cmd: Command) -> (bool, String, String) {
    let out = cmd.output().expect("starting the example");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The number after `label` in `text`, e.g. `accuracy 98.61%`.
pub fn percent_after(text: &str, label: &str) -> f64 {
    let at = text
        .find(label)
        .unwrap_or_else(|| panic!("no '{label}' in:\n{text}"))
        + label.len();
    text[at..]
        .trim_start()
        .split('%')
        .next()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no percentage after '{label}' in:\n{text}"))
}

/// The checkpoint `<dir>/latest` names, if any.
pub fn latest(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join("latest"))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The step of a checkpoint name (`step-0000000090` gives 90).
pub fn step_of(name: &str) -> u64 {
    name.strip_prefix("step-")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("'{name}' is not a checkpoint name"))
}

/// One tensor of a safetensors file: dtype, shape, raw little-endian data.
pub type Tensor = (String, Vec<u64>, Vec<u8>);

/// The tensors of the latest checkpoint's `model.safetensors` in `dir`, by name (with the
/// checkpoint's name). Compared as tensors, not file bytes: burn writes the header's metadata
/// map in a different order each run.
pub fn latest_model(dir: &Path) -> (String, BTreeMap<String, Tensor>) {
    let name = latest(dir).unwrap_or_else(|| panic!("no latest checkpoint in {}", dir.display()));
    let path: PathBuf = dir.join(&name).join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (name, safetensors(&bytes))
}

/// Parses a safetensors file: an 8-byte little-endian header length, a JSON header naming each
/// tensor's dtype, shape and data range, then the data.
fn safetensors(bytes: &[u8]) -> BTreeMap<String, Tensor> {
    let len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + len]).expect("a JSON header");
    let data = &bytes[8 + len..];
    header
        .into_iter()
        .filter(|(name, _)| name != "__metadata__")
        .map(|(name, info)| {
            let dtype = info["dtype"].as_str().expect("dtype").to_string();
            let shape = info["shape"]
                .as_array()
                .expect("shape")
                .iter()
                .map(|d| d.as_u64().expect("dimension"))
                .collect();
            let range = info["data_offsets"].as_array().expect("data_offsets");
            let (from, to) = (
                range[0].as_u64().expect("offset") as usize,
                range[1].as_u64().expect("offset") as usize,
            );
            (name, (dtype, shape, data[from..to].to_vec()))
        })
        .collect()
}

pub use ddp_test_support::worker_pids;
