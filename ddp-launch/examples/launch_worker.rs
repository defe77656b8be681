//! Test program for the launcher's integration tests (`ddp-launch/tests/launch/`): a training
//! binary built on `ddp_launch::launch`, whose behaviour is chosen by `--mode`. It also shows the
//! intended shape of a real program: own flags plus flattened `LaunchArgs`, an `anyhow`
//! training function, `main` returning `LaunchError`.
//!
//! ```text
//! cargo run -p ddp-launch --example launch_worker -- --nproc-per-node 2 --mode env
//! ```

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use ddp_comm::ReduceOp;
use ddp_launch::{LaunchArgs, LaunchError, WorkerContext};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Mode {
    /// Print the worker environment, then all-reduce the ranks and check the sum.
    Env,
    /// Rank 1 kills itself with SIGKILL at a random step; rank 0 ignores SIGTERM, starts a
    /// grandchild, and sleeps after the failure (so only SIGKILL from the launcher stops it).
    KillRank1,
    /// Rank 1 prints a few lines and fails with an error message; the others sleep.
    FailMessage,
    /// Rank 1 fails on the first attempt only; every rank records its MASTER_PORT per attempt.
    FailOnce,
    /// Every rank fails on every attempt.
    FailAlways,
    /// Rank 0 fails with an error (a checkpoint it cannot write) while the others wait for it
    /// in an all_reduce, so they fail because of it.
    FailRank0,
    /// Write the pid file, print READY, sleep until killed.
    Sleep,
    /// Print many lines on stdout and stderr, then succeed.
    Chatty,
    /// All-reduce in a loop forever, printing `step <n>` (the test stops a rank with SIGSTOP).
    Loop,
    /// Elastic jobs: write `round<R>-rank<K>.world` (world size, node rank, pid, launcher pid)
    /// and `round<R>-rank<K>.launch` (`DDP_LAUNCH_ID`) to --pid-dir,
    /// then all-reduce in a loop until the file `stop` appears there (rank 0 looks, every rank
    /// learns it from the all-reduce, so all stop at the same step), then succeed.
    Elastic,
}

#[derive(Debug, Parser)]
struct Args {
    /// What to do.
    #[arg(long, value_enum, default_value = "env")]
    mode: Mode,
    /// Directory for pid files and per-attempt records.
    #[arg(long)]
    pid_dir: Option<PathBuf>,
    /// Lines per stream in chatty mode.
    #[arg(long, default_value_t = 20_000)]
    lines: usize,
    /// Ignore SIGTERM (only SIGKILL stops the worker then).
    #[arg(long)]
    ignore_sigterm: bool,
    #[command(flatten)]
    launch: LaunchArgs,
}

fn main() -> Result<(), LaunchError> {
    let args = Args::parse();
    ddp_launch::launch(&args.launch, |ctx| train(ctx, &args))
}

fn train(ctx: WorkerContext, args: &Args) -> anyhow::Result<()> {
    if args.ignore_sigterm {
        // SAFETY: ignoring a signal is always sound.
        unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
    }
    if let Some(dir) = &args.pid_dir {
        let name = format!("rank{}-attempt{}", ctx.rank(), ctx.restart_count());
        write_pid(dir, &name, std::process::id())?;
    }
    match args.mode {
        Mode::Env => env(&ctx),
        Mode::KillRank1 => kill_rank1(&ctx, args),
        Mode::FailMessage => {
            // Every rank has written its pid file before anyone fails.
            ctx.process_group().barrier()?;
            if ctx.rank() == 1 {
                println!("loading shard 3");
                eprintln!("warning: shard 3 looks truncated");
                bail!("simulated data loader failure at step 3");
            }
            sleep_forever()
        }
        Mode::FailOnce => {
            let dir = args.pid_dir.as_deref().context("--pid-dir is required")?;
            let record = format!("attempt{}-rank{}.port", ctx.restart_count(), ctx.rank());
            std::fs::write(
                dir.join(record),
                std::env::var("MASTER_PORT").unwrap_or_default(),
            )?;
            let sum = all_reduce_ranks(&ctx)?;
            if ctx.rank() == 1 && ctx.restart_count() == 0 {
                bail!("rank 1 fails on the first attempt");
            }
            println!("RESTARTED_OK attempt={} sum={sum}", ctx.restart_count());
            Ok(())
        }
        Mode::FailAlways => {
            ctx.process_group().barrier()?;
            bail!("failing on attempt {}", ctx.restart_count())
        }
        Mode::FailRank0 => {
            ctx.process_group().barrier()?;
            if ctx.rank() == 0 {
                bail!("simulated checkpoint failure: checkpoint dir is read-only");
            }
            all_reduce_ranks(&ctx)?;
            sleep_forever()
        }
        Mode::Sleep => {
            println!("READY");
            sleep_forever()
        }
        Mode::Chatty => chatty(&ctx, args.lines),
        Mode::Loop => loop_forever(&ctx),
        Mode::Elastic => elastic(&ctx, args),
    }
}

fn env(ctx: &WorkerContext) -> anyhow::Result<()> {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| "<unset>".into());
    println!(
        "ENV rank={} local_rank={} world_size={} local_world_size={} group_rank={} master_addr={} master_port={} \
         restart={} torchelastic_restart={} token_len={} omp={} rayon={} worker={} ctx_rank={} ctx_local_rank={} \
         ctx_world_size={} ctx_device={} ctx_restart={} launch_id={} launcher={:?}",
        var("RANK"),
        var("LOCAL_RANK"),
        var("WORLD_SIZE"),
        var("LOCAL_WORLD_SIZE"),
        var("GROUP_RANK"),
        var("MASTER_ADDR"),
        var("MASTER_PORT"),
        var("DDP_RESTART_COUNT"),
        var("TORCHELASTIC_RESTART_COUNT"),
        std::env::var("DDP_JOB_TOKEN").map(|t| t.len()).unwrap_or(0),
        var("OMP_NUM_THREADS"),
        var("RAYON_NUM_THREADS"),
        var("DDP_LAUNCH_WORKER"),
        ctx.rank(),
        ctx.local_rank(),
        ctx.world_size(),
        ctx.device_index(),
        ctx.restart_count(),
        var("DDP_LAUNCH_ID"),
        ctx.launcher(),
    );
    let sum = all_reduce_ranks(ctx)?;
    println!("ALLREDUCE rank={} sum={sum}", ctx.rank());
    Ok(())
}

/// All-reduces `rank + 1` over a 1000-element buffer and checks every element.
fn all_reduce_ranks(ctx: &WorkerContext) -> anyhow::Result<f64> {
    let mut buf = vec![(ctx.rank() + 1) as f64; 1000];
    ctx.process_group().all_reduce(&mut buf, ReduceOp::Sum)?;
    let n = ctx.world_size() as f64;
    let expected = n * (n + 1.0) / 2.0;
    if buf.iter().any(|&x| x != expected) {
        bail!("all_reduce gave {} instead of {expected}", buf[0]);
    }
    Ok(expected)
}

fn kill_rank1(ctx: &WorkerContext, args: &Args) -> anyhow::Result<()> {
    let dir = args.pid_dir.as_deref().context("--pid-dir is required")?;
    if ctx.rank() == 0 {
        // SAFETY: ignoring a signal is always sound.
        unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
        let grandchild = std::process::Command::new("sleep").arg("1000").spawn()?;
        write_pid(dir, "grandchild", grandchild.id())?;
    }
    let kill_at = 2 + rand_step();
    for step in 0.. {
        if ctx.rank() == 1 && step == kill_at {
            println!("rank 1 kills itself at step {step}");
            // SAFETY: signalling ourselves.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let mut x = [1.0f32];
        if let Err(e) = ctx.process_group().all_reduce(&mut x, ReduceOp::Sum) {
            eprintln!("rank {} lost its peers: {e}", ctx.rank());
            if ctx.rank() == 0 {
                sleep_forever();
            }
            return Err(e.into());
        }
        println!("step {step}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn loop_forever(ctx: &WorkerContext) -> anyhow::Result<()> {
    for step in 0u64.. {
        let mut x = [1.0f32; 256];
        ctx.process_group()
            .all_reduce(&mut x, ReduceOp::Sum)
            .with_context(|| format!("rank {} at step {step}", ctx.rank()))?;
        if ctx.rank() == 0 && step % 50 == 0 {
            println!("step {step}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

fn elastic(ctx: &WorkerContext, args: &Args) -> anyhow::Result<()> {
    let dir = args.pid_dir.as_deref().context("--pid-dir is required")?;
    let round = std::env::var("DDP_RDZV_ROUND").context("DDP_RDZV_ROUND is not set")?;
    // SAFETY: getppid cannot fail.
    let launcher = unsafe { libc::getppid() };
    let record = format!(
        "{} {} {} {launcher}",
        ctx.world_size(),
        std::env::var("GROUP_RANK").unwrap_or_default(),
        std::process::id()
    );
    let launch_id = std::env::var("DDP_LAUNCH_ID").unwrap_or_default();
    for (ext, text) in [("launch", launch_id), ("world", record)] {
        let name = format!("round{round}-rank{}.{ext}", ctx.rank());
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, dir.join(name))?;
    }
    for step in 0u64.. {
        let stop = ctx.rank() == 0 && dir.join("stop").exists();
        let mut flag = [f32::from(u8::from(stop))];
        ctx.process_group()
            .all_reduce(&mut flag, ReduceOp::Max)
            .with_context(|| format!("rank {} at step {step}", ctx.rank()))?;
        if flag[0] > 0.0 {
            println!(
                "ELASTIC_DONE round={round} rank={} steps={step}",
                ctx.rank()
            );
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A pseudo-random step in 0..5 (from the clock: no extra dependency needed).
fn rand_step() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    u64::from(nanos % 5)
}

fn chatty(ctx: &WorkerContext, lines: usize) -> anyhow::Result<()> {
    let rank = ctx.rank();
    let err = std::thread::spawn(move || {
        for i in 0..lines {
            eprintln!("chatty stderr {i} from rank {rank}");
        }
    });
    for i in 0..lines {
        println!("chatty stdout {i} from rank {rank}");
    }
    err.join()
        .map_err(|_| anyhow::anyhow!("stderr thread panicked"))?;
    Ok(())
}

fn sleep_forever() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(1000));
    }
}

/// Writes `pid` to `dir/name.pid` atomically, so a reader never sees a partial file.
fn write_pid(dir: &Path, name: &str, pid: u32) -> anyhow::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, pid.to_string())?;
    std::fs::rename(&tmp, dir.join(format!("{name}.pid")))?;
    Ok(())
}
