//! A rank for the multi-process ddp-comm tests. `comm_worker <scenario>`:
//!
//! - `collectives`: every collective on known data, checked; exits 0 when all match.
//! - `die`: all-reduces in a loop; the rank named by `DIE_RANK` SIGKILLs itself at iteration
//!   `DIE_AT`; the others print the error they get and exit 3.
//! - `init`: only joins the group and leaves (for configuration errors).
//! - `topology`: prints `backend <name>` and `groups <shared-memory groups>`, runs
//!   `collectives`, then all-reduces floats whose sum depends on the order of addition and
//!   prints `digest <hash of the result's bits>` (equal on every rank when results are bitwise
//!   identical).
//!
//! Errors are printed to stderr as `error: <message>` and end in exit code 2.

use anyhow::{Context, Result, ensure};
use ddp_comm::{InitMethod, ProcessGroup, ProcessGroupConfig, ReduceOp, init_process_group};

fn main() {
    let scenario = std::env::args().nth(1).unwrap_or_default();
    let result = ProcessGroupConfig::from_env()
        .and_then(|config| init_process_group(&InitMethod::Env, config))
        .context("init_process_group")
        .and_then(|pg| match scenario.as_str() {
            "collectives" => collectives(&pg),
            "die" => die(pg),
            "init" => Ok(()),
            "topology" => topology(&pg),
            other => anyhow::bail!("unknown scenario '{other}'"),
        });
    match result {
        Ok(()) => println!("ok"),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    }
}

fn collectives(pg: &ProcessGroup) -> Result<()> {
    let (r, n) = (pg.rank(), pg.world_size());
    for len in [0usize, 1, 13, 4 * n + 1, 1 << 20] {
        let mut v: Vec<f32> = (0..len).map(|i| ((i + r) % 5) as f32).collect();
        pg.all_reduce(&mut v, ReduceOp::Sum)?;
        let want: Vec<f32> = (0..len)
            .map(|i| (0..n).map(|q| ((i + q) % 5) as f32).sum())
            .collect();
        ensure!(v == want, "all_reduce sum len {len}");

        let mut m: Vec<i64> = (0..len).map(|i| (i * (r + 1)) as i64).collect();
        pg.all_reduce(&mut m, ReduceOp::Max)?;
        ensure!(
            m.iter().enumerate().all(|(i, x)| *x == (i * n) as i64),
            "all_reduce max len {len}"
        );

        let mut b: Vec<u8> = if r == n - 1 {
            (0..len).map(|i| i as u8).collect()
        } else {
            vec![0; len]
        };
        pg.broadcast(&mut b, n - 1)?;
        ensure!(
            b.iter().enumerate().all(|(i, x)| *x == i as u8),
            "broadcast len {len}"
        );

        let mut all = vec![0i32; len * n];
        pg.all_gather(&vec![r as i32; len], &mut all)?;
        ensure!(
            all.chunks(len.max(1))
                .enumerate()
                .all(|(q, c)| len == 0 || c.iter().all(|x| *x == q as i32)),
            "all_gather"
        );

        let whole: Vec<f64> = (0..len * n).map(|i| (i % 3) as f64).collect();
        let mut out = vec![0.0f64; len];
        pg.reduce_scatter(&whole, &mut out, ReduceOp::Avg)?;
        ensure!(
            out.iter()
                .enumerate()
                .all(|(i, x)| *x == ((r * len + i) % 3) as f64),
            "reduce_scatter avg"
        );
    }
    if n > 1 {
        let mut got = [0u32 as i32; 3];
        let send = pg.send_async(vec![r as i32; 3], (r + 1) % n, 1);
        pg.recv(&mut got, (r + n - 1) % n, 1)?;
        send.wait()?;
        ensure!(got == [((r + n - 1) % n) as i32; 3], "send/recv");
    }
    pg.barrier()?;
    Ok(())
}

fn die(pg: ProcessGroup) -> Result<()> {
    let die_rank: usize = std::env::var("DIE_RANK")?.parse()?;
    let die_at: usize = std::env::var("DIE_AT")?.parse()?;
    for step in 0..1_000_000 {
        if pg.rank() == die_rank && step == die_at {
            // SAFETY: raising a signal on our own process.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        let mut v = vec![1.0f32; 1 << 14];
        if let Err(e) = pg.all_reduce(&mut v, ReduceOp::Sum) {
            eprintln!("error at step {step}: {e}");
            // Drop the group before exiting: on rank 0 that keeps the store up until the other
            // ranks have read each other's failure reports (`process::exit` skips destructors).
            drop(pg);
            std::process::exit(3);
        }
    }
    Ok(())
}

fn topology(pg: &ProcessGroup) -> Result<()> {
    println!("backend {}", pg.backend_name());
    println!("groups {:?}", pg.shared_memory_groups());
    collectives(pg)?;
    let r = pg.rank() as f32;
    // 4 MB: several staging buffers' worth, so it streams in steps.
    let mut v: Vec<f32> = (0..1_000_003)
        .map(|i| (i as f32 * 0.37 + r).sin() * 1e-3 + 1.0)
        .collect();
    pg.all_reduce(&mut v, ReduceOp::Avg)?;
    let digest = v.iter().fold(0xcbf29ce484222325u64, |h, x| {
        (h ^ x.to_bits() as u64).wrapping_mul(0x100000001b3)
    });
    println!("digest {digest:016x}");
    pg.barrier()?;
    Ok(())
}
