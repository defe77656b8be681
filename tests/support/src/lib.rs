//! Helpers shared by the tests that start this workspace's programs as processes (the
//! launcher's tests, the tests crate, ddp-train's restart test). No dependencies, so the
//! launcher's tests still build without burn.
#![warn(missing_docs)]

use std::process::Command;

/// Variable prefixes of the job environments the launcher reads (ddp-run, torchrun, Slurm,
/// Open MPI, PMIx).
const JOB_PREFIXES: [&str; 6] = [
    "DDP_",
    "SLURM_",
    "OMPI_",
    "PMIX_",
    "TORCHELASTIC_",
    "MASTER_",
];

/// Single variables of those environments, and the thread counts a launcher sets per worker.
const JOB_VARS: [&str; 7] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "OMP_NUM_THREADS",
    "RAYON_NUM_THREADS",
];

/// Whether `name` belongs to a job environment that could make a program a worker.
pub fn is_job_variable(name: &str) -> bool {
    JOB_PREFIXES.iter().any(|p| name.starts_with(p)) || JOB_VARS.contains(&name)
}

/// Removes every job variable the test runner has from `cmd`'s environment, so a program
/// started by a test is never a worker of some other job (run directly, our programs launch
/// themselves), and keeps its logs quiet (`RUST_LOG=warn`).
pub fn remove_job_env(cmd: &mut Command) -> &mut Command {
    // `vars_os`: `vars` panics on a variable that is not Unicode (and this can run in teardown).
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(is_job_variable) {
            cmd.env_remove(name);
        }
    }
    cmd.env("RUST_LOG", "warn")
}

/// The live children of `parent` whose environment contains `RANK=<rank>`: a launcher's worker.
pub fn worker_pids(parent: u32, rank: usize) -> Vec<i32> {
    let want = format!("RANK={rank}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // Fields after the parenthesised name: state, ppid, ...
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            ppid == Some(parent)
        })
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .unwrap_or_default()
                .split(|&b| b == 0)
                .any(|var| var == want.as_bytes())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_variables_of_every_launcher_are_recognised_and_others_kept() {
        for name in [
            "RANK",
            "MASTER_ADDR",
            "SLURM_PROCID",
            "OMPI_COMM_WORLD_RANK",
            "DDP_X",
        ] {
            assert!(is_job_variable(name), "{name}");
        }
        for name in ["PATH", "HOME", "CARGO", "RANKING", "RUST_LOG"] {
            assert!(!is_job_variable(name), "{name}");
        }
    }
}
