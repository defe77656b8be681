//! Rendezvous at scale: how long 1,024 ranks take to meet through one store, and how many
//! sockets each rank of a real 16-process group holds.
//!
//! ```text
//! cargo bench -p ddp-benches --bench rendezvous_scale                     # 1024 ranks, world 16
//! cargo bench -p ddp-benches --bench rendezvous_scale -- --ranks 4096 --world 8 --repeat 3
//! ```
//!
//! Part 1 (`--ranks`): one store server (its event loop) and that many simulated ranks, each
//! a thread with its own store connection doing what a rank does at rendezvous: it proves the
//! job token, sets `addr/<rank>`, adds 1 to a counter (the rank that brings it to the total
//! sets `all-in`), waits for `all-in`, and gets both ring neighbours' addresses. `done` is the
//! time from the first connection attempt until every rank has its neighbours; the goal is
//! at most 2 s for 1,024 ranks on a 2-core machine.
//!
//! Part 2 (`--world`): that many real processes (this binary again) form a TCP process group
//! through `env://` (`InitMethod::Env`) and run an all-reduce whose result is checked; while
//! they wait, this process counts the sockets in each one's `/proc/<pid>/fd`. Rank 0 also hosts the
//! store, so its own server-side sockets (one per rank) are shown apart.

use anyhow::{Context, Result, bail};
use clap::Parser;
use ddp_comm::{
    InitMethod, ProcessGroupConfig, ReduceOp, Store, StoreConfig, StoreServer, TransportKind,
    init_process_group,
};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Barrier;
use std::time::{Duration, Instant};

#[derive(Parser, Debug, Clone)]
#[command(about = "Rendezvous time at scale and sockets per rank")]
struct Args {
    /// Simulated ranks meeting through one store (0 skips part 1).
    #[arg(long, default_value_t = 1024)]
    ranks: usize,
    /// Real processes in the group whose sockets are counted (0 skips part 2).
    #[arg(long, default_value_t = 16)]
    world: usize,
    /// How many times part 1 is run (each time with a fresh store).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

const TOKEN: &str = "rendezvous-scale-bench";
const TIMEOUT: Duration = Duration::from_secs(60);
/// Elements of the checked all-reduce in part 2.
const ELEMENTS: usize = 1 << 16;

fn main() -> Result<()> {
    if std::env::var("RANK").is_ok() {
        return worker();
    }
    let args = Args::parse();
    if args.ranks > 0 {
        println!(
            "# rendezvous of {} simulated ranks through one store",
            args.ranks
        );
        println!(
            "{:>8} {:>12} {:>12} {:>12}",
            "ranks", "connected", "done", "goal"
        );
        for _ in 0..args.repeat.max(1) {
            let (connected, done) = simulated_rendezvous(args.ranks)?;
            println!(
                "{:>8} {:>10.0}ms {:>10.0}ms {:>12}",
                args.ranks,
                connected.as_secs_f64() * 1e3,
                done.as_secs_f64() * 1e3,
                "<= 2000ms"
            );
        }
    }
    if args.world > 1 {
        sockets_per_rank(args.world)?;
    }
    Ok(())
}

/// Part 1; returns when the last rank connected and when the last one had its neighbours.
fn simulated_rendezvous(n: usize) -> Result<(Duration, Duration)> {
    let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new().with_token(TOKEN))?;
    let addr = server.local_addr().to_string();
    let config = StoreConfig::new().with_token(TOKEN).with_timeout(TIMEOUT);
    let start_line = Barrier::new(n + 1);
    let results: Vec<Result<(Duration, Duration)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let (addr, config, start_line) = (&addr, config.clone(), &start_line);
                std::thread::Builder::new()
                    .stack_size(256 << 10)
                    .spawn_scoped(s, move || {
                        start_line.wait();
                        one_rank(rank, n, addr, config)
                    })
                    .expect("spawning a simulated rank")
            })
            .collect();
        start_line.wait();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a simulated rank panicked"))
            })
            .collect()
    });
    let mut connected = Duration::ZERO;
    let mut done = Duration::ZERO;
    for r in results {
        let (c, d) = r?;
        connected = connected.max(c);
        done = done.max(d);
    }
    Ok((connected, done))
}

/// One simulated rank: what it does at rendezvous, timed from the common start.
fn one_rank(
    rank: usize,
    n: usize,
    addr: &str,
    config: StoreConfig,
) -> Result<(Duration, Duration)> {
    let start = Instant::now();
    let store = Store::connect(addr, config)?;
    let connected = start.elapsed();
    store.set(&format!("addr/{rank}"), made_up_addr(rank).as_bytes())?;
    if store.add("arrived", 1)? == n as i64 {
        store.set("all-in", b"1")?;
    }
    store.wait(&["all-in"], TIMEOUT)?;
    for peer in [(rank + n - 1) % n, (rank + 1) % n] {
        let a = store.get(&format!("addr/{peer}"))?;
        if a != made_up_addr(peer).as_bytes() {
            bail!("rank {rank} got a wrong address for rank {peer}");
        }
    }
    Ok((connected, start.elapsed()))
}

/// A made-up but distinct address for `rank`, as a real rank would publish its listener; a
/// peer checks what it reads against the same function.
fn made_up_addr(rank: usize) -> String {
    format!(
        "10.{}.{}.{}:{}",
        rank >> 16,
        (rank >> 8) & 255,
        rank & 255,
        29500
    )
}

/// Part 2: a real group of `n` processes; counts each one's sockets after an all-reduce.
fn sockets_per_rank(n: usize) -> Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let exe = std::env::current_exe()?;
    let mut children: Vec<Child> = (0..n)
        .map(|rank| {
            Command::new(&exe)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("DDP_JOB_TOKEN", TOKEN)
                .env(ddp_comm::TRANSPORT_ENV, TransportKind::Tcp.name())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .context("starting a rank")
        })
        .collect::<Result<_>>()?;
    // Each rank says "ready" once its all-reduce is checked, then waits for us.
    let mut ready = Vec::new();
    for (rank, child) in children.iter_mut().enumerate() {
        let out = child.stdout.take().context("rank stdout")?;
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line)?;
        if line.trim() != "ready" {
            bail!("rank {rank} did not finish its all-reduce: {line:?}");
        }
        ready.push(socket_count(child.id())?);
    }
    for child in &mut children {
        // Closing stdin lets the rank go on to its final barrier and exit.
        drop(child.stdin.take());
    }
    for (rank, child) in children.iter_mut().enumerate() {
        let status = child.wait()?;
        if !status.success() {
            bail!("rank {rank} exited with {status}");
        }
    }
    let others = &ready[1..];
    println!();
    println!("# sockets per rank in a {n}-process TCP group, after rendezvous and an all-reduce");
    println!(
        "{:>8} {:>10} {:>10} {:>10} {:>12} {:>14}",
        "world", "min", "max", "mean", "full mesh", "rank 0 (store)"
    );
    println!(
        "{:>8} {:>10} {:>10} {:>10.1} {:>12} {:>14}",
        n,
        others.iter().min().copied().unwrap_or(0),
        others.iter().max().copied().unwrap_or(0),
        others.iter().sum::<usize>() as f64 / others.len().max(1) as f64,
        n - 1,
        ready[0],
    );
    println!(
        "(min/max/mean over ranks 1..{n}; `full mesh` is the peer connections alone a full mesh would hold)"
    );
    Ok(())
}

/// Distinct sockets among a process's open file descriptors (`socket:[inode]` links; a socket
/// duplicated into several descriptors, as the abort handles do, counts once).
fn socket_count(pid: u32) -> Result<usize> {
    let dir = format!("/proc/{pid}/fd");
    let mut inodes = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
        if let Ok(target) = std::fs::read_link(entry?.path()) {
            let target = target.to_string_lossy().into_owned();
            if target.starts_with("socket:") {
                inodes.insert(target);
            }
        }
    }
    Ok(inodes.len())
}

/// A rank of part 2.
fn worker() -> Result<()> {
    let pg = init_process_group(&InitMethod::Env, ProcessGroupConfig::from_env()?)?;
    let (rank, n) = (pg.rank(), pg.world_size());
    let mut v = vec![rank as f32 + 1.0; ELEMENTS];
    pg.all_reduce(&mut v, ReduceOp::Sum)?;
    let expected = (n * (n + 1) / 2) as f32;
    if let Some(i) = v.iter().position(|&x| x != expected) {
        bail!("rank {rank}: element {i} is {} instead of {expected}", v[i]);
    }
    println!("ready");
    std::io::stdout().flush()?;
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    pg.barrier()?;
    Ok(())
}
