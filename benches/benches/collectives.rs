//! Collective bandwidth on loopback, printed in the format of nccl-tests.
//!
//! ```text
//! cargo bench -p ddp-benches --bench collectives                      # all ops, world 2 and 4
//! cargo bench -p ddp-benches --bench collectives -- --world 2 --ops all_reduce --max-bytes 64M
//! cargo bench -p ddp-benches --bench collectives -- --transport shm,tcp --ops all_reduce
//! cargo bench -p ddp-benches --features mpi --bench collectives -- --transport shm,tcp,mpi
//! cargo bench -p ddp-benches --bench collectives -- --busy 2   # beside 2 CPU-bound threads
//! cargo bench -p ddp-benches --bench collectives -- --world 2 --ops all_reduce --transport shm,tcp \
//!     --csv docs/charts/data/allreduce_bandwidth.csv   # the guide's bandwidth chart
//! ```
//!
//! `--csv PATH` also writes every row (and the memcpy figures, as op `memcpy`) to `PATH`, with
//! a header naming the command, the date and the host: the data `docs/charts/draw.py` draws.
//!
//! `--transport` (`auto`, `shm`, `tcp`, `mpi`; comma separated to compare) sets `DDP_TRANSPORT`
//! for the ranks; every table says which backend the group reports.
//!
//! The bench launches itself once per rank (separate processes, as in a real job), each with
//! one communication thread; for `mpi` through `mpirun -np N` (feature `mpi`, Open MPI's
//! `mpirun` in `PATH`). For each size it runs warm-up iterations, then times a fixed number
//! of iterations between barriers; `time` is the slowest rank's mean, `algbw = bytes / time`,
//! `busbw = algbw * factor` (all_reduce `2(n-1)/n`, all_gather and reduce_scatter `(n-1)/n`,
//! broadcast 1), comparable to link bandwidth at any rank count. After timing, every size is
//! run once more on known data and `#wrong` counts the elements that differ from the
//! expectation, so a fast wrong answer shows.

use anyhow::{Context, Result, bail};
use clap::Parser;
use ddp_benches::parse_bytes;
use ddp_comm::{InitMethod, ProcessGroup, ProcessGroupConfig, ReduceOp, init_process_group};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser, Debug, Clone)]
#[command(about = "nccl-tests style collective benchmark over ddp-comm")]
struct Args {
    /// World sizes to run, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    world: Vec<usize>,
    /// Transports to compare, comma separated: auto, shm, tcp, mpi (sets DDP_TRANSPORT).
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    transport: Vec<String>,
    /// Collectives: all_reduce, broadcast, all_gather, reduce_scatter.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "all_reduce,broadcast,all_gather"
    )]
    ops: Vec<String>,
    /// Smallest message (bytes; K/M suffixes allowed).
    #[arg(long, default_value = "4K", value_parser = parse_bytes)]
    min_bytes: usize,
    /// Largest message.
    #[arg(long, default_value = "256M", value_parser = parse_bytes)]
    max_bytes: usize,
    /// Print one JSON line per row as well.
    #[arg(long)]
    json: bool,
    /// Also write the rows to this CSV file (replaced), for `docs/charts/draw.py`.
    #[arg(long, value_name = "PATH")]
    csv: Option<std::path::PathBuf>,
    /// Threads in this (launching) process that spin on the CPU for the whole run, standing in
    /// for other work on the host (a data loader, another job, a compile): how the collectives
    /// hold up when the ranks compete for CPUs. Compare with `--busy 0` in the same session.
    #[arg(long, default_value_t = 0)]
    busy: usize,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() -> Result<()> {
    if std::env::var("RANK").is_ok() {
        return worker();
    }
    if let Ok(rank) = std::env::var("OMPI_COMM_WORLD_RANK") {
        // A rank started by `mpirun` (see `run_world`): the group reads its rank from `RANK`.
        // SAFETY: no other thread exists yet.
        unsafe { std::env::set_var("RANK", rank) };
        return worker();
    }
    let args = Args::parse();
    println!("# ddp-comm collective benchmark (ranks on this host; TCP over loopback)");
    println!(
        "# host: {} cores; each rank: 1 process, 1 communication thread; {} busy threads beside them (--busy)",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        args.busy
    );
    let mut csv = args.csv.as_deref().map(csv_start).transpose()?;
    for &mib in &[1usize, 16, 64] {
        let gbps = memcpy_gbps(mib << 20);
        println!("# memcpy {mib:>3} MiB: {gbps:6.2} GB/s");
        if let Some(file) = csv.as_mut() {
            csv_row(file, "memcpy", "memcpy", 1, mib << 20, None, gbps, gbps, 0)?;
        }
    }
    drop(csv);
    let _busy = BusyThreads::start(args.busy);
    for transport in &args.transport {
        transport.parse::<ddp_comm::TransportKind>()?;
        for &n in &args.world {
            run_world(n, transport)?;
        }
    }
    Ok(())
}

/// Creates the CSV file with its header: what wrote it, when, and where (the date and host as
/// `date -u` and `uname -n` print them; neither is needed to read the rows).
fn csv_start(path: &std::path::Path) -> Result<std::fs::File> {
    use std::io::Write;
    let shell = |cmd: &str| {
        Command::new("sh")
            .args(["-c", cmd])
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let mut file = std::fs::File::create(path)
        .with_context(|| format!("creating --csv file {}", path.display()))?;
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    writeln!(
        file,
        "# source: cargo bench -p ddp-benches --bench collectives -- {}\n# date: {}\n# machine: {}, {} cores",
        args.join(" "),
        shell("date -u +%Y-%m-%dT%H:%M:%SZ"),
        shell("uname -n"),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    )?;
    writeln!(file, "op,backend,world,bytes,time_us,algbw,busbw,wrong")?;
    Ok(file)
}

/// Appends one row (`time_us` empty where there is none, as for memcpy).
#[allow(clippy::too_many_arguments)]
fn csv_row(
    file: &mut std::fs::File,
    op: &str,
    backend: &str,
    world: usize,
    bytes: usize,
    time_us: Option<f64>,
    algbw: f64,
    busbw: f64,
    wrong: i64,
) -> Result<()> {
    use std::io::Write;
    let time = time_us.map_or(String::new(), |t| format!("{t:.2}"));
    writeln!(
        file,
        "{op},{backend},{world},{bytes},{time},{algbw:.4},{busbw:.4},{wrong}"
    )?;
    Ok(())
}

fn memcpy_gbps(bytes: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src);
    let iters = (512 << 20) / bytes;
    let start = Instant::now();
    for _ in 0..iters {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    (bytes * iters) as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// `--busy`: threads that spin until dropped.
struct BusyThreads {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl BusyThreads {
    fn start(n: usize) -> BusyThreads {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = std::sync::Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                    }
                })
            })
            .collect();
        BusyThreads { stop, threads }
    }
}

impl Drop for BusyThreads {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn run_world(n: usize, transport: &str) -> Result<()> {
    let exe = std::env::current_exe()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if transport.trim() == "mpi" {
        return run_world_mpi(n, port, &args);
    }
    let mut children = Vec::new();
    for rank in 0..n {
        let child = Command::new(&exe)
            .args(&args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env(ddp_comm::TRANSPORT_ENV, transport)
            .stdout(if rank == 0 {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .with_context(|| format!("spawning rank {rank}"))?;
        children.push(child);
    }
    let mut failed = Vec::new();
    for (rank, mut c) in children.into_iter().enumerate() {
        let status = c.wait()?;
        if !status.success() {
            failed.push(format!("rank {rank}: {status}"));
        }
    }
    if !failed.is_empty() {
        bail!("benchmark ranks failed: {}", failed.join(", "));
    }
    Ok(())
}

/// The ranks as one `mpirun -np n` job (allowed as root, unbound, oversubscribed), which
/// forwards rank 0's output.
fn run_world_mpi(n: usize, port: u16, args: &[String]) -> Result<()> {
    let status = Command::new("mpirun")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args([
            "--oversubscribe",
            "--bind-to",
            "none",
            "-np",
            &n.to_string(),
        ])
        .args([
            "-x",
            &format!("WORLD_SIZE={n}"),
            "-x",
            "MASTER_ADDR=127.0.0.1",
        ])
        .args(["-x", &format!("MASTER_PORT={port}")])
        .args(["-x", &format!("{}=mpi", ddp_comm::TRANSPORT_ENV)])
        .arg(std::env::current_exe()?)
        .args(args)
        .status()
        .context("starting mpirun (Open MPI; Debian: apt-get install -y openmpi-bin)")?;
    if !status.success() {
        bail!("mpirun -np {n} failed: {status}");
    }
    Ok(())
}

fn worker() -> Result<()> {
    let args = Args::parse();
    let pg = init_process_group(&InitMethod::Env, ProcessGroupConfig::from_env()?)?;
    let n = pg.world_size();
    if pg.rank() == 0 {
        println!(
            "#\n# world size {n}: ranks 0..{n} on this host (separate processes); {}={} -> backend {}",
            ddp_comm::TRANSPORT_ENV,
            std::env::var(ddp_comm::TRANSPORT_ENV).unwrap_or_default(),
            pg.backend_name()
        );
        println!(
            "# {:>12} {:>12} {:>5} {:>6} {:>4} {:>10} {:>8} {:>8} {:>6}",
            "size(B)", "count", "type", "redop", "root", "time(us)", "algbw", "busbw", "#wrong"
        );
    }
    // Rank 0 appends its rows to the file the launching process created.
    let mut csv = match (&args.csv, pg.rank()) {
        (Some(path), 0) => Some(
            std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .with_context(|| format!("opening --csv file {}", path.display()))?,
        ),
        _ => None,
    };
    for op in &args.ops {
        let mut busbw_sum = 0.0;
        let mut rows = 0;
        let mut bytes = args.min_bytes;
        while bytes <= args.max_bytes {
            let row = measure(&pg, op, bytes)?;
            if pg.rank() == 0 {
                let (redop, root) = match op.as_str() {
                    "all_reduce" | "reduce_scatter" => ("sum", "-1"),
                    "broadcast" => ("none", "0"),
                    _ => ("none", "-1"),
                };
                println!(
                    "{:>14} {:>12} {:>5} {:>6} {:>4} {:>10.1} {:>8.3} {:>8.3} {:>6}   {op}",
                    bytes,
                    bytes / 4,
                    "float",
                    redop,
                    root,
                    row.time_us,
                    row.algbw,
                    row.busbw,
                    row.wrong
                );
                if let Some(file) = csv.as_mut() {
                    csv_row(
                        file,
                        op,
                        pg.backend_name(),
                        n,
                        bytes,
                        Some(row.time_us),
                        row.algbw,
                        row.busbw,
                        row.wrong,
                    )?;
                }
                if args.json {
                    println!(
                        "{{\"op\":\"{op}\",\"backend\":\"{}\",\"world\":{n},\"bytes\":{bytes},\"time_us\":{:.2},\"algbw\":{:.4},\"busbw\":{:.4},\"wrong\":{}}}",
                        pg.backend_name(),
                        row.time_us,
                        row.algbw,
                        row.busbw,
                        row.wrong
                    );
                }
            }
            busbw_sum += row.busbw;
            rows += 1;
            bytes *= 2;
        }
        if pg.rank() == 0 {
            println!(
                "# {op} ({}): avg bus bandwidth {:.3} GB/s over {rows} sizes\n#",
                pg.backend_name(),
                busbw_sum / rows as f64
            );
        }
    }
    Ok(())
}

struct Row {
    time_us: f64,
    algbw: f64,
    busbw: f64,
    wrong: i64,
}

/// Fixed iteration counts (the same on every rank): about 64 MiB moved per size, 3 to 1000 runs.
fn iterations(bytes: usize) -> usize {
    ((64usize << 20) / bytes).clamp(3, 1000)
}

fn measure(pg: &ProcessGroup, op: &str, bytes: usize) -> Result<Row> {
    let n = pg.world_size();
    let count = bytes / 4;
    let r = pg.rank();
    let iters = iterations(bytes);
    let mut buf = vec![1.0f32; count];
    let mut out = vec![0.0f32; count];
    let block = count / n;
    let run = |buf: &mut Vec<f32>, out: &mut Vec<f32>| -> Result<()> {
        match op {
            "all_reduce" => pg.all_reduce(buf, ReduceOp::Sum)?,
            "broadcast" => pg.broadcast(buf, 0)?,
            // size = total output, as in nccl-tests
            "all_gather" => pg.all_gather(&buf[..block], &mut out[..block * n])?,
            "reduce_scatter" => {
                pg.reduce_scatter(&buf[..block * n], &mut out[..block], ReduceOp::Sum)?
            }
            other => {
                bail!("unknown op '{other}' (all_reduce, broadcast, all_gather, reduce_scatter)")
            }
        }
        Ok(())
    };
    for _ in 0..(iters / 10).max(1) {
        run(&mut buf, &mut out)?;
    }
    pg.barrier()?;
    let start = Instant::now();
    for _ in 0..iters {
        run(&mut buf, &mut out)?;
    }
    let mut elapsed = [start.elapsed().as_secs_f64() / iters as f64];
    pg.all_reduce(&mut elapsed, ReduceOp::Max)?;
    let time = Duration::from_secs_f64(elapsed[0]);

    // Correctness on known data.
    buf.iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = ((i + r) % 7) as f32);
    run(&mut buf, &mut out)?;
    let wrong = match op {
        "all_reduce" => buf
            .iter()
            .enumerate()
            .filter(|(i, v)| **v != (0..n).map(|q| ((i + q) % 7) as f32).sum::<f32>())
            .count(),
        "broadcast" => buf
            .iter()
            .enumerate()
            .filter(|(i, v)| **v != (i % 7) as f32)
            .count(),
        "all_gather" => out[..block * n]
            .iter()
            .enumerate()
            .filter(|(i, v)| **v != ((i % block.max(1)) + i / block.max(1)) as f32 % 7.0)
            .count(),
        _ => out[..block]
            .iter()
            .enumerate()
            .filter(|(i, v)| {
                **v != (0..n)
                    .map(|q| ((r * block + i + q) % 7) as f32)
                    .sum::<f32>()
            })
            .count(),
    };
    let mut wrong = [wrong as i64];
    pg.all_reduce(&mut wrong, ReduceOp::Sum)?;
    let secs = time.as_secs_f64();
    let moved = match op {
        "all_gather" | "reduce_scatter" => block * n * 4,
        _ => bytes,
    };
    let algbw = moved as f64 / secs / 1e9;
    let factor = match op {
        "all_reduce" => 2.0 * (n as f64 - 1.0) / n as f64,
        "all_gather" | "reduce_scatter" => (n as f64 - 1.0) / n as f64,
        _ => 1.0,
    };
    Ok(Row {
        time_us: secs * 1e6,
        algbw,
        busbw: algbw * factor,
        wrong: wrong[0],
    })
}
