//! NCCL all-reduce on one GPU (world size 1), printed in the format of nccl-tests.
//!
//! ```text
//! cargo bench -p ddp-benches --features cuda --bench nccl_all_reduce
//! cargo bench -p ddp-benches --features cuda --bench nccl_all_reduce -- --max-bytes 64M --device 1
//! ```
//!
//! Two tables: `device` runs [`NcclBackend::all_reduce`] in place on a device buffer (the GPU
//! path DDP would use); `host` runs [`NcclBackend::all_reduce_host`] on a host buffer (copy to the
//! device, all-reduce, copy back and wait: the host-staged fallback). For each size it runs
//! warm-up iterations, then times a fixed number of iterations and synchronises the stream
//! before stopping the clock. `algbw = bytes / time`; `busbw = algbw * 2(n-1)/n`, which is 0 at
//! world size 1 (no data crosses a link), as in nccl-tests. After timing, each size runs once
//! more on known data and `#wrong` counts the elements that differ from the expectation.
//!
//! Without a CUDA driver, a GPU or libnccl it prints why and exits successfully.

use anyhow::{Context, Result, bail};
use clap::Parser;
use ddp_benches::parse_bytes;
use ddp_comm::cudarc::nccl::result::get_nccl_version;
use ddp_comm::{CommError, NcclBackend, NcclBackendConfig, ReduceOp};
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(
    about = "nccl-tests style all-reduce benchmark over ddp-comm's NcclBackend, world size 1"
)]
struct Args {
    /// Smallest message (bytes; K/M/G suffixes allowed).
    #[arg(long, default_value = "4K", value_parser = parse_bytes)]
    min_bytes: usize,
    /// Largest message.
    #[arg(long, default_value = "256M", value_parser = parse_bytes)]
    max_bytes: usize,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Path {
    Device,
    Host,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Device => "device",
            Path::Host => "host",
        }
    }
}

struct Row {
    time_us: f64,
    algbw: f64,
    busbw: f64,
    wrong: usize,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.min_bytes < 4 || args.min_bytes > args.max_bytes {
        bail!(
            "--min-bytes ({}) must be at least 4 and at most --max-bytes ({})",
            args.min_bytes,
            args.max_bytes
        );
    }
    let Some(group) = open_group(args.device)? else {
        return Ok(());
    };
    let n = group.world_size();
    let name = group.context().name().unwrap_or_else(|_| "unknown".into());
    let version = get_nccl_version().map_or_else(|_| "unknown".into(), |v| v.to_string());
    println!("# ddp-comm NcclBackend all-reduce benchmark: world size {n}, in place, float, sum");
    println!("# NCCL version code {version}; device buffers allocated on the group's stream");
    println!(
        "#  rank {:>2} pid {:>7} device {:>2} [{name}]",
        group.rank(),
        std::process::id(),
        group.device()
    );
    println!("# busbw = algbw * 2(n-1)/n: 0 at world size 1, where no data crosses a link");
    for path in [Path::Device, Path::Host] {
        println!("#\n# {} buffers", path.name());
        println!(
            "# {:>12} {:>12} {:>5} {:>6} {:>4} {:>10} {:>8} {:>8} {:>6}",
            "size(B)", "count", "type", "redop", "root", "time(us)", "algbw", "busbw", "#wrong"
        );
        let mut busbw_sum = 0.0;
        let mut algbw_sum = 0.0;
        let mut rows = 0;
        let mut bytes = args.min_bytes;
        while bytes <= args.max_bytes {
            let row = measure(&group, path, bytes)?;
            println!(
                "{:>14} {:>12} {:>5} {:>6} {:>4} {:>10.1} {:>8.3} {:>8.3} {:>6}   {}",
                bytes,
                bytes / 4,
                "float",
                "sum",
                "-1",
                row.time_us,
                row.algbw,
                row.busbw,
                row.wrong,
                path.name()
            );
            busbw_sum += row.busbw;
            algbw_sum += row.algbw;
            rows += 1;
            bytes *= 2;
        }
        println!(
            "# {}: avg bus bandwidth {:.3} GB/s, avg algbw {:.3} GB/s over {rows} sizes",
            path.name(),
            busbw_sum / rows as f64,
            algbw_sum / rows as f64
        );
    }
    Ok(())
}

/// A world-1 group on `device`, or `None` after saying why this machine cannot run NCCL.
fn open_group(device: usize) -> Result<Option<NcclBackend>> {
    if !ddp_comm::cuda_driver_present() {
        eprintln!(
            "skipping: no CUDA driver found (libcuda could not be loaded); the NCCL benchmark needs an NVIDIA GPU"
        );
        return Ok(None);
    }
    let (_server, store) = ddp_benches::local_store()?;
    match NcclBackend::new(
        &store,
        NcclBackendConfig::new(0, 1, device).with_name("bench"),
    ) {
        Ok(group) => Ok(Some(group)),
        Err(CommError::Nccl(e)) if e.is_unavailable() => {
            eprintln!("skipping: {e}");
            Ok(None)
        }
        Err(e) => Err(e).context("creating the NCCL group"),
    }
}

/// Fixed iteration counts: about 1 GiB moved per size, 5 to 1000 runs.
fn iterations(bytes: usize) -> usize {
    ((1usize << 30) / bytes).clamp(5, 1000)
}

fn measure(group: &NcclBackend, path: Path, bytes: usize) -> Result<Row> {
    let n = group.world_size();
    let count = bytes / 4;
    let iters = iterations(bytes);
    // Rank r contributes r + 1, so the sum is n(n+1)/2 on every rank. At world size 1 an
    // in-place sum leaves the values unchanged, so repeated runs keep them.
    let input = vec![(group.rank() + 1) as f32; count];
    let expected = (n * (n + 1) / 2) as f32;
    let stream = group.stream();
    let elapsed = match path {
        Path::Device => {
            let mut buf = stream.clone_htod(&input)?;
            for _ in 0..(iters / 10).max(1) {
                group.all_reduce(&mut buf, ReduceOp::Sum)?;
            }
            group.synchronize()?;
            let start = Instant::now();
            for _ in 0..iters {
                group.all_reduce(&mut buf, ReduceOp::Sum)?;
            }
            group.synchronize()?;
            start.elapsed()
        }
        Path::Host => {
            let mut buf = input.clone();
            for _ in 0..(iters / 10).max(1) {
                group.all_reduce_host(&mut buf, ReduceOp::Sum)?;
            }
            let start = Instant::now();
            for _ in 0..iters {
                group.all_reduce_host(&mut buf, ReduceOp::Sum)?;
            }
            start.elapsed()
        }
    };
    let time = elapsed.as_secs_f64() / iters as f64;
    let result = match path {
        Path::Device => {
            let mut buf = stream.clone_htod(&input)?;
            group.all_reduce(&mut buf, ReduceOp::Sum)?;
            let out = stream.clone_dtoh(&buf)?;
            stream.synchronize()?;
            out
        }
        Path::Host => {
            let mut buf = input;
            group.all_reduce_host(&mut buf, ReduceOp::Sum)?;
            buf
        }
    };
    let algbw = bytes as f64 / time / 1e9;
    Ok(Row {
        time_us: time * 1e6,
        algbw,
        busbw: algbw * 2.0 * (n - 1) as f64 / n as f64,
        wrong: result.iter().filter(|&&v| v != expected).count(),
    })
}
