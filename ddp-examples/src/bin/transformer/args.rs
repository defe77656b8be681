//! The transformer's command line: what to train, how to shard it, and the combinations that
//! are refused before any worker starts.

use anyhow::{Result, bail};
use burn::tensor::FloatDType;
use clap::{Parser, ValueEnum};
use ddp_core::launcher::LaunchArgs;
use ddp_examples::backend::{BackendKind, CollectivesArg};
use ddp_examples::models::GptShape;
use ddp_examples::reverse::VOCAB;

#[derive(Parser, Debug, Clone)]
#[command(
    about = "Train a small transformer to reverse sequences on several processes with ddp-burn"
)]
pub(crate) struct Args {
    #[command(flatten)]
    pub(crate) launch: LaunchArgs,
    /// Passes over the training set.
    #[arg(long, default_value_t = 2)]
    pub(crate) epochs: usize,
    /// Batch size per rank.
    #[arg(long, default_value_t = 32)]
    pub(crate) batch_size: usize,
    /// Adam learning rate.
    #[arg(long, default_value_t = 0.002)]
    pub(crate) lr: f64,
    /// Seed of the data, the shuffle and the initial weights.
    #[arg(long, default_value_t = 42)]
    pub(crate) seed: u64,
    /// Digits per sequence.
    #[arg(long, default_value_t = 6)]
    pub(crate) seq_len: usize,
    /// Training sequences.
    #[arg(long, default_value_t = 2048)]
    pub(crate) train_size: usize,
    /// Test sequences.
    #[arg(long, default_value_t = 512)]
    pub(crate) test_size: usize,
    /// Width of the residual stream (256 with 4 layers: 3.2M parameters).
    #[arg(long, default_value_t = 256)]
    pub(crate) d_model: usize,
    /// Transformer layers.
    #[arg(long, default_value_t = 4)]
    pub(crate) layers: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    pub(crate) heads: usize,
    /// Mark a layer boundary before each layer, so gradients leave during backward.
    #[arg(long)]
    pub(crate) boundaries: bool,
    /// Turn DDP's automatic overlap off (`DdpConfig::automatic_overlap`, on by default: taps
    /// anchored at depths learned on the first step, so gradients leave during backward with
    /// no marks in the model); taps then fire at the end of backward unless `--boundaries`.
    #[arg(long)]
    pub(crate) no_automatic_overlap: bool,
    /// Shard the training state across the ranks with `ZeroRedundancyOptimizer`: `zero1`
    /// Adam's state (ZeRO stage 1), `zero2` Adam's state and the averaged gradients (stage 2).
    /// `full` shards the parameters too (`ddp_core::fsdp`, one unit per layer; it writes no
    /// checkpoints).
    #[arg(long, value_enum, value_name = "WHAT")]
    pub(crate) shard: Option<Shard>,
    /// Same as `--shard zero1` (the older spelling).
    #[arg(long, conflicts_with = "shard")]
    pub(crate) zero: bool,
    /// Write a Chrome trace of the first steps here (rank 0).
    #[arg(long)]
    pub(crate) timeline: Option<String>,
    /// Average gradients with the PowerSGD communication hook of this rank (for slow links;
    /// exact averaging for the first 10 steps).
    #[arg(long, value_name = "RANK")]
    pub(crate) powersgd: Option<usize>,
    /// Where checkpoints go.
    #[arg(long, default_value = "runs/transformer")]
    pub(crate) checkpoint_dir: String,
    /// Ignore existing checkpoints and start over (on the launch's first attempt only:
    /// --max-restarts restarts resume this run's checkpoints).
    #[arg(long)]
    pub(crate) fresh: bool,
    /// Which burn backend to train on.
    #[arg(long, value_enum, default_value_t = BackendKind::Flex)]
    pub(crate) backend: BackendKind,
    /// Which collectives reduce the gradient buckets, and ZeRO-2's and FSDP's collectives (NCCL
    /// needs `--backend cuda`).
    #[arg(long, value_enum, default_value_t = CollectivesArg::Auto)]
    pub(crate) collectives: CollectivesArg,
    /// Run the model's forward and backward in this dtype, the f32 parameters staying the
    /// master weights, with dynamic loss scaling (`ddp_core::amp`).
    #[arg(long, value_enum, value_name = "DTYPE")]
    pub(crate) mixed_precision: Option<MixedPrecision>,
    /// The loss scale of a fresh `--mixed-precision` run (a resumed run continues with the
    /// checkpoint's).
    #[arg(long, default_value_t = 65536.0)]
    pub(crate) loss_scale: f32,
    /// Finite steps in a row after which the loss scale doubles.
    #[arg(long, default_value_t = 2000)]
    pub(crate) loss_scale_growth_interval: u64,
}

impl Args {
    /// The model's shape.
    pub(crate) fn gpt_shape(&self) -> GptShape {
        GptShape {
            vocab: VOCAB,
            max_len: 2 * self.seq_len + 2,
            d_model: self.d_model,
            heads: self.heads,
            layers: self.layers,
            boundaries: self.boundaries,
        }
    }

    /// `--shard`, or `zero1` for `--zero`.
    pub(crate) fn shard(&self) -> Option<Shard> {
        self.shard.or(self.zero.then_some(Shard::Zero1))
    }

    /// Refuses combinations that cannot run, before any worker starts.
    pub(crate) fn check(&self) -> Result<()> {
        match self.shard() {
            Some(Shard::Full) => {
                let unsupported = [
                    (self.powersgd.is_some(), "--powersgd"),
                    (self.boundaries, "--boundaries"),
                    (self.mixed_precision.is_some(), "--mixed-precision"),
                    (self.timeline.is_some(), "--timeline"),
                ];
                match unsupported.iter().find(|(set, _)| *set) {
                    Some((_, flag)) => bail!(
                        "--shard full (fully sharded parameters) trains without DDP, so {flag} \
                         (a DDP feature) does not apply: drop it, or use --shard zero1|zero2"
                    ),
                    None => Ok(()),
                }
            }
            Some(Shard::Zero2) if self.powersgd.is_some() => bail!(
                "--shard zero2 averages the gradients itself (a reduce-scatter in the optimizer \
                 step), so it cannot be combined with --powersgd, which replaces DDP's \
                 averaging: use --shard zero1 with --powersgd"
            ),
            _ => Ok(()),
        }
    }
}

/// `--shard zero1|zero2|full`: how much of the training state is sharded across the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Shard {
    /// Adam's state (ZeRO stage 1).
    Zero1,
    /// Adam's state and the averaged gradients (ZeRO stage 2).
    Zero2,
    /// Parameters too (fully sharded, `ddp_core::fsdp`): each rank keeps `1/world` of every
    /// layer between steps. Sharded checkpoints in `<checkpoint-dir>/sharded`, resumable at
    /// any number of ranks.
    Full,
}

impl Shard {
    pub(crate) fn name(shard: Option<Self>) -> &'static str {
        match shard {
            None => "off",
            Some(Shard::Zero1) => "zero1",
            Some(Shard::Zero2) => "zero2",
            Some(Shard::Full) => "full",
        }
    }
}

/// `--mixed-precision bf16|f16`: the dtype of the autocast forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum MixedPrecision {
    /// bfloat16: f32's range, 8 bits of mantissa.
    Bf16,
    /// IEEE half: 11 bits of mantissa, overflows above 65504 (loss scaling backs off).
    F16,
}

impl MixedPrecision {
    pub(crate) fn dtype(self) -> FloatDType {
        match self {
            MixedPrecision::Bf16 => FloatDType::BF16,
            MixedPrecision::F16 => FloatDType::F16,
        }
    }
}

/// The settings whose change makes an old checkpoint suspicious (hashed into each checkpoint).
#[derive(serde::Serialize)]
pub(crate) struct RunConfig {
    batch_size: usize,
    lr: f64,
    seed: u64,
    seq_len: usize,
    train_size: usize,
    d_model: usize,
    layers: usize,
    heads: usize,
}

impl RunConfig {
    pub(crate) fn of(args: &Args) -> Self {
        RunConfig {
            batch_size: args.batch_size,
            lr: args.lr,
            seed: args.seed,
            seq_len: args.seq_len,
            train_size: args.train_size,
            d_model: args.d_model,
            layers: args.layers,
            heads: args.heads,
        }
    }
}
