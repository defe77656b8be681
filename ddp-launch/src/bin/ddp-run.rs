//! `ddp-run`: start a data-parallel job, torchrun-style.
//!
//! ```text
//! ddp-run --nproc-per-node 2 -- ./train --epochs 3
//! ddp-run --nnodes 2 --node-rank 1 --nproc-per-node 4 --master-addr 10.0.0.1 --master-port 29500 -- ./train
//! ```
//! See `ddp_launch::launch` for the worker environment, failure handling and multi-node setup.

use clap::Parser;
use ddp_launch::{LaunchArgs, LaunchPlan};
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;

/// Start PROGRAM once per rank with the data-parallel worker environment (RANK, LOCAL_RANK,
/// WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), supervise the workers, and exit with their outcome.
#[derive(Parser, Debug)]
#[command(
    name = "ddp-run",
    version,
    after_help = "Examples:\n  ddp-run --nproc-per-node 2 -- ./train --epochs 3\n  \
                  ddp-run --nproc-per-node auto --max-restarts 3 --log-dir logs -- ./train\n  \
                  DDP_JOB_TOKEN=<shared secret> ddp-run --nnodes 2 --node-rank 0 --nproc-per-node 4 \
                  --master-addr 10.0.0.1 --master-port 29500 -- ./train\n\n\
                  Log verbosity: RUST_LOG (default: info for the launcher)."
)]
struct Cli {
    #[command(flatten)]
    launch: LaunchArgs,

    /// The program every worker runs (a path, or a name looked up in PATH), then its arguments
    #[arg(value_name = "PROGRAM", required = true, num_args = 1.., trailing_var_arg = true)]
    command: Vec<OsString>,
}

fn main() -> ExitCode {
    init_tracing();
    let cli = Cli::parse();
    let mut command = cli.command.into_iter();
    let Some(program) = command.next() else {
        // clap enforces `required`; keep a clear message rather than a panic anyway.
        note("ddp-run: error: no program given (usage: ddp-run [OPTIONS] -- PROGRAM [ARGS]...)");
        return ExitCode::from(2);
    };
    let result = LaunchPlan::new(&cli.launch, program, command).and_then(|plan| plan.run());
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            note(&format!("ddp-run: error: {e}"));
            ExitCode::from(e.exit_code())
        }
    }
}

/// `eprintln!` without its panic on a closed stderr (`ddp-run ... 2>&1 | head`): the exit code
/// must still be the job's.
fn note(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("ddp_launch=info,warn"));
    // A second subscriber cannot exist in a fresh binary; ignore the impossible error.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        // On by default, and it reports a failed write with `eprintln!`, which panics on a
        // closed stderr: a log line that cannot be written is dropped instead.
        .log_internal_errors(false)
        .try_init();
}
