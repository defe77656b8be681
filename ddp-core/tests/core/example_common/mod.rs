//! Locating ddp-core's example programs (built by `cargo test`) and running them in a clean
//! environment, for the tests that run them as real processes.

use std::path::{Path, PathBuf};
use std::process::Command;

/// ddp-core's example `name` (built by `cargo test`, which builds examples); a missing or stale
/// build is a failure saying how to build it.
pub fn example_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/examples/<name>
    let path = exe
        .parent()
        .and_then(Path::parent)
        .map(|p| p.join("examples").join(name))
        .expect("target directory");
    let hint = "run `cargo test -p ddp-core` (which builds examples) or `cargo build -p ddp-core --examples`";
    let built = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{}: {e}: {hint}", path.display()));
    // `cargo test --test <name>` alone does not rebuild examples: refuse a stale one.
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("examples/{name}.rs"));
    if let Ok(edited) = std::fs::metadata(&source).and_then(|m| m.modified()) {
        assert!(
            edited <= built,
            "{} is older than its source: {hint}",
            path.display()
        );
    }
    path
}

/// ddp-core's example `name`, run directly (it launches itself) in a clean environment.
pub fn example(name: &str) -> Command {
    let mut cmd = Command::new(example_path(name));
    clean_env(&mut cmd);
    cmd
}

/// Removes launcher variables the test runner might have, so each test starts from a plain
/// environment, and keeps logs quiet.
fn clean_env(cmd: &mut Command) {
    // `vars_os`: `vars` panics on a variable that is not Unicode (and this runs in teardown).
    for (k, _) in std::env::vars_os() {
        let Some(k) = k.to_str().map(str::to_owned) else {
            continue;
        };
        if k.starts_with("DDP_")
            || k.starts_with("SLURM_")
            || k.starts_with("OMPI_")
            || k.starts_with("TORCHELASTIC_")
            || [
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "LOCAL_WORLD_SIZE",
                "GROUP_RANK",
                "MASTER_ADDR",
                "MASTER_PORT",
                "OMP_NUM_THREADS",
                "RAYON_NUM_THREADS",
            ]
            .contains(&k.as_str())
        {
            cmd.env_remove(k);
        }
    }
    cmd.env("RUST_LOG", "warn");
}
