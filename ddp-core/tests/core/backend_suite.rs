// The tests of a burn backend, written once: `ndarray_backend.rs` and `tch_backend.rs` include
// this file after defining `N` (the `Autodiff` backend under test) and `BACKEND` (its name, for
// messages). Not a module of its own (`include!`d): the backends are features, each compiled
// only when on.

use crate::common::{GLOBAL_BATCH, HIDDEN, Mlp, flat_params, max_scaled_diff, run_ranks};
use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::{AdamConfig, GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use ddp_core::checkpoint::{CheckpointConfig, FullCheckpointer, LoadOutcome, TrainingState};
use ddp_core::fsdp::{FsdpConfig, FullyShardedDataParallel, ShardedParams};
use ddp_core::zero::ZeroRedundancyOptimizer;
use ddp_core::{DdpConfig, DistributedDataParallel, comm::ProcessGroup};


const STEPS: usize = 4;
const SEED: u64 = 0x0d_a7;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opt {
    Sgd,
    Adam,
}

impl Opt {
    fn lr(self) -> f64 {
        match self {
            Opt::Sgd => 0.1,
            Opt::Adam => 0.01,
        }
    }
}

/// How the ranks hold the optimizer state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Plain,
    Zero1,
    Zero2,
}

fn batch<Bk: Backend>(indices: &[usize], device: &Bk::Device) -> (Tensor<Bk, 2>, Tensor<Bk, 2>) {
    crate::common::batch_on::<Bk>(indices, device)
}

/// Global step `step`'s samples; rank `r` of `world` takes every `world`-th from `r`, as
/// DistributedSampler does without shuffling. `None`: the whole global batch.
fn indices(step: usize, world: usize, rank: Option<usize>) -> Vec<usize> {
    let all = step * GLOBAL_BATCH..(step + 1) * GLOBAL_BATCH;
    match rank {
        None => all.collect(),
        Some(r) => all.skip(r).step_by(world).collect(),
    }
}

/// Rank 0 starts from the seeded weights; the others from their own, which DDP must overwrite.
fn model(rank: usize) -> Mlp<N> {
    Mlp::seeded(&Default::default(), HIDDEN, SEED + rank as u64)
}

/// One process, the global batch, plain burn.
fn reference(opt: Opt) -> Vec<f32> {
    let device = Default::default();
    let mut model = model(0);
    let mut sgd = SgdConfig::new().init::<N, Mlp<N>>();
    let mut adam = AdamConfig::new().init::<N, Mlp<N>>();
    for step in 0..STEPS {
        let (x, y) = batch::<N>(&indices(step, 1, None), &device);
        let loss = MseLoss::new().forward(model.forward(x, false), y, Reduction::Mean);
        let grads = GradientsParams::from_grads::<N, _>(loss.backward(), &model);
        model = match opt {
            Opt::Sgd => sgd.step(opt.lr(), model, grads),
            Opt::Adam => adam.step(opt.lr(), model, grads),
        };
    }
    flat_params(&model)
}

/// Trains `ddp` over `steps` with `optim`; returns the parameters after each step.
fn train<O: Optimizer<Mlp<N>, N>>(
    ddp: &mut DistributedDataParallel<N, Mlp<N>>,
    optim: &mut O,
    lr: f64,
    steps: std::ops::Range<usize>,
) -> Vec<Vec<f32>> {
    let (rank, world) = (ddp.process_group().rank(), ddp.process_group().world_size());
    let device = Default::default();
    let mut history = Vec::new();
    for step in steps {
        let (x, y) = batch::<N>(&indices(step, world, Some(rank)), &device);
        let pred = ddp.forward(|m| m.forward(x, false)).expect("forward");
        let loss = MseLoss::new().forward(pred, y, Reduction::Mean);
        let grads = ddp.backward(loss).expect("backward");
        ddp.optimizer_step(optim, lr, grads);
        history.push(flat_params(ddp.module()));
    }
    history
}

/// Every rank's parameters after every step, under DDP with the optimizer held as `mode` says.
fn train_ranks(world: usize, opt: Opt, mode: Mode) -> Vec<Vec<Vec<f32>>> {
    run_ranks(world, |pg| {
        let model = model(pg.rank());
        let mut ddp = DistributedDataParallel::new(model, pg, DdpConfig::new()).expect("DDP");
        let lr = opt.lr();
        macro_rules! with_mode {
            ($inner:expr) => {
                match mode {
                    Mode::Plain => train(&mut ddp, &mut $inner, lr, 0..STEPS),
                    Mode::Zero1 => {
                        let pg = ddp.process_group().clone();
                        let mut zero = ZeroRedundancyOptimizer::new($inner, pg);
                        train(&mut ddp, &mut zero, lr, 0..STEPS)
                    }
                    Mode::Zero2 => {
                        let mut zero =
                            ZeroRedundancyOptimizer::stage2($inner, &mut ddp).expect("stage 2");
                        train(&mut ddp, &mut zero, lr, 0..STEPS)
                    }
                }
            };
        }
        match opt {
            Opt::Sgd => with_mode!(SgdConfig::new().init::<N, Mlp<N>>()),
            Opt::Adam => with_mode!(AdamConfig::new().init::<N, Mlp<N>>()),
        }
    })
}

fn bitwise_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Every rank's history equals rank 0's bit for bit.
fn assert_replicas_identical(ranks: &[Vec<Vec<f32>>], what: &str) {
    for (r, history) in ranks.iter().enumerate().skip(1) {
        for (step, params) in history.iter().enumerate() {
            assert!(
                bitwise_equal(params, &ranks[0][step]),
                "{what}: rank {r} differs from rank 0 after step {step}"
            );
        }
    }
}

#[test]
fn ddp_with_n_ranks_equals_one_process_with_n_times_the_batch() {
    for opt in [Opt::Sgd, Opt::Adam] {
        let reference = reference(opt);
        for world in [2, 3] {
            let ranks = train_ranks(world, opt, Mode::Plain);
            let what = format!("{BACKEND} {opt:?} world {world}");
            assert_replicas_identical(&ranks, &what);
            let diff = max_scaled_diff(&ranks[0][STEPS - 1], &reference);
            assert!(
                diff < 1e-5,
                "{what}: DDP differs from one process by {diff}"
            );
            let moved = max_scaled_diff(&reference, &flat_params(&model(0)));
            assert!(moved > 1e-3, "{what}: training moved nothing ({moved})");
        }
    }
}

#[test]
fn zero_stage_1_and_2_equal_plain_ddp() {
    for opt in [Opt::Sgd, Opt::Adam] {
        for world in [2, 3] {
            let plain = train_ranks(world, opt, Mode::Plain);
            for mode in [Mode::Zero1, Mode::Zero2] {
                let what = format!("{BACKEND} {mode:?} {opt:?} world {world}");
                let zero = train_ranks(world, opt, mode);
                assert_replicas_identical(&zero, &what);
                let diff = max_scaled_diff(&zero[0][STEPS - 1], &plain[0][STEPS - 1]);
                assert!(diff <= 1e-6, "{what}: differs from plain DDP by {diff}");
            }
        }
    }
}

#[test]
fn fsdp_equals_ddp() {
    for opt in [Opt::Sgd, Opt::Adam] {
        for world in [2, 3] {
            let what = format!("{BACKEND} FSDP {opt:?} world {world}");
            let ddp = train_ranks(world, opt, Mode::Plain);
            let fsdp = run_ranks(world, |pg| {
                let device = Default::default();
                let rank = pg.rank();
                let config = FsdpConfig::new().with_units(["fc1", "fc2"]);
                let mut fsdp =
                    FullyShardedDataParallel::new(model(rank), pg, config).expect("FSDP");
                let mut sgd = SgdConfig::new().init::<N, ShardedParams<N>>();
                let mut adam = AdamConfig::new().init::<N, ShardedParams<N>>();
                let mut history = Vec::new();
                for step in 0..STEPS {
                    let (x, y) = batch::<N>(&indices(step, world, Some(rank)), &device);
                    let pred = fsdp.forward(|m| m.forward(x, false)).expect("forward");
                    let loss = MseLoss::new().forward(pred, y, Reduction::Mean);
                    let grads = fsdp.backward(loss).expect("backward");
                    match opt {
                        Opt::Sgd => fsdp.optimizer_step(&mut sgd, opt.lr(), grads),
                        Opt::Adam => fsdp.optimizer_step(&mut adam, opt.lr(), grads),
                    }
                    .expect("step");
                    history.push(flat_params(&fsdp.full_module().expect("full module")));
                }
                history
            });
            assert_replicas_identical(&fsdp, &what);
            let diff = max_scaled_diff(&fsdp[0][STEPS - 1], &ddp[0][STEPS - 1]);
            assert!(diff <= 1e-6, "{what}: differs from DDP by {diff}");
        }
    }
}

const SAVE_AT: usize = 2;

/// Trains `0..SAVE_AT` with Adam, saves, trains on to `STEPS`: this rank's final parameters.
fn train_through_save(pg: ProcessGroup, dir: &std::path::Path) -> Vec<f32> {
    let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir), pg.clone()).expect("checkpointer");
    let mut ddp = DistributedDataParallel::new(model(pg.rank()), pg, DdpConfig::new()).unwrap();
    let mut adam = AdamConfig::new().init::<N, Mlp<N>>();
    train(&mut ddp, &mut adam, Opt::Adam.lr(), 0..SAVE_AT);
    ckpt.save(ddp.module(), &adam, &TrainingState::new(0, SAVE_AT as u64))
        .expect("save");
    let history = train(&mut ddp, &mut adam, Opt::Adam.lr(), SAVE_AT..STEPS);
    history.last().cloned().expect("steps after the save")
}

/// A fresh model and optimizer, loaded from `dir`, train `SAVE_AT..STEPS`.
fn resume(pg: ProcessGroup, dir: &std::path::Path) -> Vec<f32> {
    let device = Default::default();
    let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir), pg.clone()).expect("checkpointer");
    let mut model = model(pg.rank() + 10);
    let mut adam = AdamConfig::new().init::<N, Mlp<N>>();
    let outcome = ckpt
        .load_latest(&device, &mut model, &mut adam)
        .expect("load_latest");
    let LoadOutcome::Resumed(resumed) = outcome else {
        panic!("expected a resume, got {outcome}");
    };
    assert_eq!(resumed.state.global_step, SAVE_AT as u64);
    let mut ddp = DistributedDataParallel::new(model, pg, DdpConfig::new()).unwrap();
    let history = train(&mut ddp, &mut adam, Opt::Adam.lr(), SAVE_AT..STEPS);
    history.last().cloned().expect("steps after the resume")
}

#[test]
fn checkpoint_resume_continues_bitwise() {
    let dir = tempfile::tempdir().expect("temp dir");
    let straight = run_ranks(2, |pg| train_through_save(pg, dir.path()));
    let resumed = run_ranks(2, |pg| resume(pg, dir.path()));
    for (rank, (a, b)) in straight.iter().zip(&resumed).enumerate() {
        assert!(
            bitwise_equal(a, b),
            "{BACKEND}: rank {rank} resumed from the checkpoint differs from the run that saved it"
        );
    }
}
