//! Running this crate's programs that launch themselves in a clean environment, so the test
//! runner's variables cannot make them workers.

use std::process::Command;

/// The program at `path` (one of this crate's binaries), in a clean environment: run directly,
/// it launches itself.
pub fn program(path: &str) -> Command {
    let mut cmd = Command::new(path);
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
