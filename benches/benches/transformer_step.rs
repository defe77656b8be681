//! DDP step time against plain burn training on the transformer example's model, world size 1.
//!
//! ```text
//! cargo bench -p ddp-benches --bench transformer_step
//! cargo bench -p ddp-benches --features cuda --bench transformer_step -- --backend cuda
//! ```
//!
//! Model: the `transformer` example's `TinyGpt` (d_model 256, 4 layers, 4 heads: 3.2M
//! parameters) on its sequence-reversal batches (32 sequences of 13 tokens), Adam. Plain steps
//! (forward, backward, `GradientsParams::from_grads`, Adam) and DDP steps (the same through a
//! world-1 `DistributedDataParallel`) are interleaved in rounds; every step ends with
//! `Backend::sync`, so GPU times include the work queued by the step. Times are medians; compare
//! the ratio within one run. The issue's goal on a GPU: DDP at most 1.05x plain.

use anyhow::Result;
use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use clap::Parser;
use ddp_benches::{median, world_of_one};
use ddp_core::TapBackend;
use ddp_core::{DdpConfig, DistributedDataParallel};
use ddp_examples::backend::BackendKind;
use ddp_examples::models::{GptShape, TinyGpt};
use ddp_examples::reverse::{ReverseBatch, ReverseBatcher, VOCAB, scored_positions, sequence};
use std::time::Instant;

const SEQ_LEN: usize = 6;
const BATCH: usize = 32;

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Measured steps per configuration (after one warm-up round).
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// The burn backend (`cuda` needs `--features cuda` and a GPU).
    #[arg(long, value_enum, default_value_t = BackendKind::Flex)]
    backend: BackendKind,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    ddp_examples::backend::check_available(args.backend)?;
    match args.backend {
        BackendKind::Flex => bench::<burn::backend::Autodiff<burn::backend::Flex>>(
            &args,
            Default::default(),
            "flex (CPU)",
        ),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => bench::<burn::backend::Autodiff<burn::backend::Cuda>>(
            &args,
            burn::backend::cuda::CudaDevice::new(0),
            "cuda (GPU 0)",
        ),
        #[cfg(not(feature = "cuda"))]
        BackendKind::Cuda => unreachable!("check_available refuses cuda without the feature"),
    }
}

fn batch<B: Backend>(step: usize, device: &B::Device) -> ReverseBatch<B> {
    use burn::data::dataloader::batcher::Batcher;
    let items: Vec<Vec<i64>> = (0..BATCH)
        .map(|i| sequence(7, (step * BATCH + i) as u64, SEQ_LEN))
        .collect();
    ReverseBatcher.batch(items, device)
}

/// The example's loss: cross-entropy on the positions that hold the reversed digits.
fn loss<B: Backend>(
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, burn::tensor::Int>,
) -> Tensor<B, 1> {
    let device = logits.device();
    let scored = scored_positions(SEQ_LEN);
    let logits = logits
        .slice([0..BATCH, scored.clone(), 0..VOCAB])
        .reshape([BATCH * SEQ_LEN, VOCAB]);
    let targets = targets.slice([0..BATCH, scored]).reshape([BATCH * SEQ_LEN]);
    CrossEntropyLossConfig::new()
        .init(&device)
        .forward(logits, targets)
}

fn bench<B: TapBackend>(args: &Args, device: B::Device, name: &str) -> Result<()>
where
    TinyGpt<B>: AutodiffModule<B>,
{
    let shape = GptShape {
        vocab: VOCAB,
        max_len: 2 * SEQ_LEN + 2,
        d_model: 256,
        heads: 4,
        layers: 4,
        boundaries: false,
    };
    B::seed(&device, 42);
    let (_server, pg) = world_of_one()?;
    let mut plain_model = TinyGpt::<B>::new(shape, &device);
    let mut plain_opt = AdamConfig::new().init::<B, TinyGpt<B>>();
    let mut ddp =
        DistributedDataParallel::new(TinyGpt::<B>::new(shape, &device), pg, DdpConfig::new())?;
    let mut ddp_opt = AdamConfig::new().init::<B, TinyGpt<B>>();
    let (mut plain, mut wrapped) = (Vec::new(), Vec::new());
    let rounds = 4;
    let per_round = args.steps.div_ceil(rounds);
    for round in 0..=rounds {
        for s in 0..per_round {
            let b = batch::<B>(round * per_round + s, &device);
            let t = Instant::now();
            let l = loss(plain_model.forward(b.inputs), b.targets);
            let grads = GradientsParams::from_grads(l.backward(), &plain_model);
            plain_model = plain_opt.step(0.002, plain_model, grads);
            B::sync(&device)?;
            if round > 0 {
                plain.push(t.elapsed());
            }
        }
        for s in 0..per_round {
            let b = batch::<B>(round * per_round + s, &device);
            let t = Instant::now();
            let logits = ddp.forward(|m| m.forward(b.inputs))?;
            let grads = ddp.backward(loss(logits, b.targets))?;
            ddp.optimizer_step(&mut ddp_opt, 0.002, grads);
            B::sync(&device)?;
            if round > 0 {
                wrapped.push(t.elapsed());
            }
        }
    }
    let (p, d) = (median(plain), median(wrapped));
    println!("# transformer step, world 1: TinyGpt d_model 256, 4 layers (3.2M parameters)");
    println!(
        "# backend {name}, batch {BATCH} x {} tokens, Adam, {} steps per row (median)",
        2 * SEQ_LEN + 1,
        rounds * per_round
    );
    println!("# {:<20} {:>10}", "configuration", "ms/step");
    println!("  {:<20} {:>10.2}", "plain burn", p.as_secs_f64() * 1e3);
    println!("  {:<20} {:>10.2}", "DDP (world 1)", d.as_secs_f64() * 1e3);
    println!(
        "  ratio DDP / plain: {:.3} (goal on a GPU: <= 1.05)",
        d.as_secs_f64() / p.as_secs_f64()
    );
    Ok(())
}
