//! Benchmarks for ddp-burn (see `benches/`), and the few helpers they share.

use anyhow::{Context, Result, bail};
use burn::module::Module;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor, TensorData};
use ddp_core::{
    comm::{ProcessGroup, ProcessGroupConfig, Store, StoreConfig, StoreServer},
    layer_boundary,
};
use std::time::Duration;

pub mod allocator;
pub mod shape;
pub mod workloads;

/// Samples per rank in the DDP step benches.
pub const BATCH: usize = 64;

/// The DDP step benches' model: MLP 1024-2048-2048-10 (6.3M parameters, 24 MiB of f32
/// gradients).
#[derive(Module, Debug)]
pub struct BenchMlp<B: Backend> {
    l1: Linear<B>,
    l2: Linear<B>,
    l3: Linear<B>,
    act: Relu,
}

impl<B: Backend> BenchMlp<B> {
    /// A new model with burn's default initialisation.
    pub fn new(device: &B::Device) -> Self {
        BenchMlp {
            l1: LinearConfig::new(1024, 2048).init(device),
            l2: LinearConfig::new(2048, 2048).init(device),
            l3: LinearConfig::new(2048, 10).init(device),
            act: Relu::new(),
        }
    }

    /// Class scores; `marked` puts a layer boundary after each hidden layer.
    pub fn forward(&self, x: Tensor<B, 2>, marked: bool) -> Tensor<B, 2> {
        let mark = |t: Tensor<B, 2>| if marked { layer_boundary(t) } else { t };
        let x = mark(self.act.forward(self.l1.forward(x)));
        let x = mark(self.act.forward(self.l2.forward(x)));
        self.l3.forward(x)
    }
}

/// A random batch of [`BATCH`] inputs and labels for [`BenchMlp`].
pub fn bench_batch<B: Backend>(device: &B::Device) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    let x = Tensor::<B, 2>::random([BATCH, 1024], Distribution::Normal(0.0, 1.0), device);
    (x, class_labels(BATCH, device))
}

/// The targets of the benches' random classification batches: classes 0 to 9 in turn, `n` of
/// them (random inputs need no meaningful labels, only the 10 classes a step's loss spans).
pub fn class_labels<B: Backend>(n: usize, device: &B::Device) -> Tensor<B, 1, Int> {
    let labels: Vec<i64> = (0..n as i64).map(|i| i % 10).collect();
    Tensor::from_data(TensorData::new(labels, [n]), device)
}

/// Parses a byte size such as `4096`, `4K`, `64M` or `1G` (powers of 1024).
///
/// # Errors
/// A message naming the value when it is not such a size.
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let (num, mult) = match s.trim().to_ascii_uppercase() {
        t if t.ends_with('K') => (t[..t.len() - 1].to_string(), 1usize << 10),
        t if t.ends_with('M') => (t[..t.len() - 1].to_string(), 1 << 20),
        t if t.ends_with('G') => (t[..t.len() - 1].to_string(), 1 << 30),
        t => (t, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("'{s}' is not a byte size like 4K or 64M"))
}

/// Runs this bench binary again as ranks 0 and 1 of a 2-process group on loopback (with `env`
/// added), forwarding its arguments; rank 0's stdout is shown. Waits for both.
///
/// # Errors
/// A rank cannot start or fails.
pub fn run_two_ranks(env: &[(&str, &str)]) -> Result<()> {
    let exe = std::env::current_exe()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let forwarded: Vec<String> = std::env::args().skip(1).collect();
    let children: Vec<_> = (0..2)
        .map(|rank| {
            std::process::Command::new(&exe)
                .args(&forwarded)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .envs(env.iter().copied())
                .stdout(if rank == 0 {
                    std::process::Stdio::inherit()
                } else {
                    std::process::Stdio::null()
                })
                .spawn()
                .with_context(|| format!("spawning rank {rank}"))
        })
        .collect::<Result<_>>()?;
    let mut failed = false;
    for mut c in children {
        failed |= !c.wait()?.success();
    }
    if failed {
        bail!("a rank of the 2-process run failed");
    }
    Ok(())
}

/// The median of `v` (zero when empty).
pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// The median of `v` (zero when empty).
pub fn median_f64(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Rounds below which no distribution-free 95% interval of a median exists.
pub const MIN_ROUNDS_FOR_INTERVAL: usize = 6;

/// The median of per-round ratios and its distribution-free 95% confidence interval as text
/// (the order statistics `n/2 -+ 0.98 sqrt(n)` of the sorted ratios, so no model of the
/// machine's noise is needed); `-` under [`MIN_ROUNDS_FOR_INTERVAL`] rounds. An interval that
/// reaches 1.00 or below means no slowdown is measurable at this many rounds.
pub fn median_ratio(mut ratios: Vec<f64>) -> (f64, String) {
    ratios.sort_by(|a, b| a.total_cmp(b));
    let n = ratios.len();
    let median = ratios.get(n / 2).copied().unwrap_or(0.0);
    if n < MIN_ROUNDS_FOR_INTERVAL {
        return (median, "-".to_string());
    }
    let half_width = 0.98 * (n as f64).sqrt();
    let lo = (n as f64 / 2.0 - half_width).floor().max(0.0) as usize;
    let hi = ((n as f64 / 2.0 + half_width).ceil() as usize).min(n - 1);
    (median, format!("{:.3}-{:.3}", ratios[lo], ratios[hi]))
}

/// A store served by this process on a free loopback port, and a client of it. Keep the server
/// alive as long as the store is used.
///
/// # Errors
/// Binding or connecting fails.
pub fn local_store() -> Result<(StoreServer, Store)> {
    let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new())?;
    let store = Store::connect(&server.local_addr().to_string(), StoreConfig::new())?;
    Ok((server, store))
}

/// A process group of this process alone (world size 1), with the server of its store.
///
/// # Errors
/// As [`local_store`], or the group cannot form.
pub fn world_of_one() -> Result<(StoreServer, ProcessGroup)> {
    let (server, store) = local_store()?;
    let pg = ProcessGroup::with_store(store, ProcessGroupConfig::new(0, 1))?;
    Ok((server, pg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_with_binary_suffixes_and_reject_garbage() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("4k"), Ok(4096));
        assert_eq!(parse_bytes("64M"), Ok(64 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("M").is_err());
    }

    #[test]
    fn median_of_durations() {
        let ms = Duration::from_millis;
        assert_eq!(median(vec![ms(3), ms(1), ms(2)]), ms(2));
        assert_eq!(median(Vec::new()), Duration::ZERO);
    }
}
