//! Fully sharded parameters (`fsdp::FullyShardedDataParallel`): the same parameters as plain
//! DDP with the same optimizer (bitwise at world 1 and 2), also when a unit goes unused and
//! with batch norm's buffers; every rank's whole model bitwise equal; each rank holding only
//! its chunk between steps; frozen parameters whole; a forward between backward and step
//! harmless; clear errors for units that match nothing, tied parameters and a backward without
//! a forward.
use crate::common::*;
use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig};
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamConfig, Optimizer, SgdConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use ddp_core::fsdp::{FsdpConfig, FsdpError, FullyShardedDataParallel, ShardedParams};
use ddp_core::{Collectives, DdpConfig, DistributedDataParallel};

const STEPS: usize = 4;
pub(crate) const SEED: u64 = 0xf5d9;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opt {
    /// SGD with momentum, learning rate 0.1.
    Sgd,
    /// Adam, learning rate 0.01.
    Adam,
}

/// Rank `rank`'s samples of global step `step` (DistributedSampler's interleaving).
pub(crate) fn indices(step: usize, world: usize, rank: usize) -> Vec<usize> {
    let base = step * GLOBAL_BATCH;
    (0..GLOBAL_BATCH / world)
        .map(|i| base + i * world + rank)
        .collect()
}

pub(crate) fn lr(opt: Opt) -> f64 {
    match opt {
        Opt::Sgd => 0.1,
        Opt::Adam => 0.01,
    }
}

pub(crate) fn model(rank: usize) -> Mlp<B> {
    // Only rank 0 starts from the seeded weights: the others must be overwritten.
    let device = Default::default();
    if rank == 0 {
        Mlp::seeded(&device, HIDDEN, SEED)
    } else {
        Mlp::seeded(&device, HIDDEN, SEED + rank as u64)
    }
}

/// Plain DDP: rank 0's parameters after every step.
fn train_ddp(world: usize, opt: Opt) -> Vec<Vec<f32>> {
    let mut ranks = run_ranks(world, |pg| {
        let rank = pg.rank();
        let device = Default::default();
        let mut ddp = DistributedDataParallel::new(model(rank), pg, DdpConfig::new()).unwrap();
        let mut sgd = SgdConfig::new()
            .with_momentum(Some(MomentumConfig::new()))
            .init::<B, Mlp<B>>();
        let mut adam = AdamConfig::new().init::<B, Mlp<B>>();
        let mut history = Vec::new();
        for step in 0..STEPS {
            let (x, y) = batch(&indices(step, world, rank), &device);
            let pred = ddp.forward(|m| m.forward(x, false)).unwrap();
            let grads = ddp
                .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                .unwrap();
            match opt {
                Opt::Sgd => ddp.optimizer_step(&mut sgd, lr(opt), grads),
                Opt::Adam => ddp.optimizer_step(&mut adam, lr(opt), grads),
            }
            history.push(flat_params(ddp.module()));
        }
        history
    });
    ranks.swap_remove(0)
}

pub(crate) fn units() -> FsdpConfig {
    FsdpConfig::new().with_units(["fc1", "fc2"])
}

/// The units, through host memory (the CPU transports) and on the device path (the device
/// engine's CPU stand-in: gradients and parameters stay tensors, each unit's reduce-scatter is
/// queued by the issuing thread during backward, as NCCL's on a GPU).
fn both_paths() -> [FsdpConfig; 2] {
    [units(), units().with_collectives(Collectives::StandIn)]
}

/// Fully sharded: every rank's whole model after every step.
fn train_fsdp(world: usize, opt: Opt, config: &FsdpConfig) -> Vec<Vec<Vec<f32>>> {
    run_ranks(world, |pg| {
        let rank = pg.rank();
        let device = Default::default();
        let mut fsdp = FullyShardedDataParallel::new(model(rank), pg, config.clone()).unwrap();
        let mut sgd = SgdConfig::new()
            .with_momentum(Some(MomentumConfig::new()))
            .init::<B, ShardedParams<B>>();
        let mut adam = AdamConfig::new().init::<B, ShardedParams<B>>();
        let mut history = Vec::new();
        for step in 0..STEPS {
            let (x, y) = batch(&indices(step, world, rank), &device);
            let pred = fsdp.forward(|m| m.forward(x, false)).unwrap();
            let grads = fsdp
                .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                .unwrap();
            let result = match opt {
                Opt::Sgd => fsdp.optimizer_step(&mut sgd, lr(opt), grads),
                Opt::Adam => fsdp.optimizer_step(&mut adam, lr(opt), grads),
            };
            result.unwrap();
            history.push(flat_params(&fsdp.full_module().unwrap()));
        }
        history
    })
}

#[test]
fn fully_sharded_training_equals_ddp_with_the_same_optimizer() {
    for (opt, config) in [Opt::Sgd, Opt::Adam]
        .into_iter()
        .flat_map(|opt| both_paths().map(|config| (opt, config)))
    {
        let path = config.collectives();
        for world in 1..=4 {
            let reference = train_ddp(world, opt);
            let ranks = train_fsdp(world, opt, &config);
            for (r, history) in ranks.iter().enumerate() {
                for (step, params) in history.iter().enumerate() {
                    assert_eq!(
                        bits(params),
                        bits(&ranks[0][step]),
                        "{opt:?} {path:?} world {world}: rank {r}'s whole model differs from \
                         rank 0's after step {step}"
                    );
                    if world <= 2 {
                        assert_eq!(
                            bits(params),
                            bits(&reference[step]),
                            "{opt:?} {path:?} world {world}: FSDP differs from DDP after step \
                             {step}"
                        );
                    } else {
                        // From world 3 the reduce-scatter and DDP's all-reduce may add in
                        // another order (last bit; the TCP ring's order depends on where an
                        // element sits), which Adam can amplify where a gradient is near zero:
                        // the bound of the other different-order comparisons.
                        let diff = max_scaled_diff(params, &reference[step]);
                        assert!(
                            diff < 1e-5,
                            "{opt:?} world {world}: FSDP differs from DDP by {diff} after step \
                             {step}"
                        );
                    }
                }
            }
            assert_ne!(
                bits(&ranks[0][STEPS - 1]),
                bits(&flat_params(&model(0))),
                "{opt:?} world {world}: training moved nothing"
            );
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn between_steps_each_rank_holds_only_its_chunk_of_every_unit() {
    let world = 3;
    let whole = flat_params(&model(0)).len();
    let held = run_ranks(world, |pg| {
        let rank = pg.rank();
        let device = Default::default();
        let mut fsdp = FullyShardedDataParallel::new(model(rank), pg, units()).unwrap();
        assert_eq!(fsdp.units(), ["fc1", "fc2", "(root)"]);
        assert_eq!(fsdp.total_elements(), whole);
        let before = flat_params(fsdp.module()).len();
        let mut adam = AdamConfig::new().init::<B, ShardedParams<B>>();
        let (x, y) = batch(&indices(0, world, rank), &device);
        let pred = fsdp.forward(|m| m.forward(x, false)).unwrap();
        let during = flat_params(fsdp.module()).len();
        let grads = fsdp
            .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
            .unwrap();
        let after_backward = flat_params(fsdp.module()).len();
        let grad_bytes = grads.bytes();
        fsdp.optimizer_step(&mut adam, 0.01, grads).unwrap();
        let after_step = flat_params(fsdp.module()).len();
        let moments = adam.to_record().len();
        (
            before,
            during,
            after_backward,
            after_step,
            fsdp.parameter_bytes(),
            grad_bytes,
            moments,
        )
    });
    // fc1 6x16 + 16, fc2 16x3 + 3, extra 6x3 + 3: each unit's chunk is ceil(numel / 3). The
    // root unit (`extra`) is unused: no gradient, no Adam state.
    let chunk = |n: usize| n.div_ceil(world);
    let used = (chunk(6 * 16 + 16) + chunk(16 * 3 + 3)) as u64 * 4;
    let expected = used + chunk(6 * 3 + 3) as u64 * 4;
    for (r, (before, during, after_backward, after_step, params, grads, moments)) in
        held.into_iter().enumerate()
    {
        assert_eq!(before, 0, "rank {r}: the module holds values after setup");
        assert_eq!(during, whole, "rank {r}: forward must see the whole model");
        assert_eq!(
            after_backward, 0,
            "rank {r}: backward must release the gathered values"
        );
        assert_eq!(after_step, 0, "rank {r}: the step must not gather");
        assert_eq!(params, expected, "rank {r}: parameter bytes held");
        assert_eq!(grads, used, "rank {r}: gradient bytes held");
        assert_eq!(
            moments, 2,
            "rank {r}: Adam holds one state per used unit's chunk"
        );
    }
}

#[test]
fn frozen_parameters_stay_whole_on_every_rank_and_do_not_move() {
    let world = 2;
    let ranks = run_ranks(world, |pg| {
        let rank = pg.rank();
        let device = Default::default();
        let mut m = model(rank);
        m.fc1 = m.fc1.no_grad();
        let frozen_at_start = flat_params(&model(0).fc1);
        let mut fsdp =
            FullyShardedDataParallel::new(m, pg, FsdpConfig::new().with_unit("fc2")).unwrap();
        assert_eq!(fsdp.units(), ["fc2", "(root)"]);
        assert_eq!(flat_params(&fsdp.module().fc1), frozen_at_start);
        let mut sgd = SgdConfig::new().init::<B, ShardedParams<B>>();
        for step in 0..2 {
            let (x, y) = batch(&indices(step, world, rank), &device);
            let pred = fsdp.forward(|m| m.forward(x, false)).unwrap();
            let grads = fsdp
                .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                .unwrap();
            fsdp.optimizer_step(&mut sgd, 0.1, grads).unwrap();
        }
        let whole = fsdp.full_module().unwrap();
        (
            flat_params(&fsdp.module().fc1) == frozen_at_start,
            flat_params(&whole.fc1) == frozen_at_start,
            flat_params(&whole.fc2) != flat_params(&model(0).fc2),
        )
    });
    for (r, (kept, whole_kept, trained)) in ranks.into_iter().enumerate() {
        assert!(kept, "rank {r}: the frozen layer moved or was released");
        assert!(
            whole_kept,
            "rank {r}: the whole model's frozen layer differs"
        );
        assert!(trained, "rank {r}: the sharded layer did not train");
    }
}

#[test]
fn a_unit_that_matches_nothing_is_refused_with_the_models_paths() {
    let errors = run_ranks(2, |pg| {
        let config = units().with_unit("decoder");
        FullyShardedDataParallel::new(model(pg.rank()), pg, config)
            .err()
            .map(|e| e.to_string())
    });
    for (r, e) in errors.into_iter().enumerate() {
        let e = e.unwrap_or_else(|| panic!("rank {r}: an unknown unit must be refused"));
        assert!(
            e.contains("'decoder'") && e.contains("fc1") && e.contains("extra"),
            "rank {r}: the error must name the unit and the model's paths: {e}"
        );
    }
}

#[test]
fn backward_without_a_forward_is_an_error_not_a_panic() {
    run_ranks(1, |pg| {
        let device = Default::default();
        let mut fsdp = FullyShardedDataParallel::new(model(0), pg, units()).unwrap();
        let (x, y) = batch(&[0, 1], &device);
        // A loss that never went through `fsdp.forward`.
        let loss = MseLoss::new().forward(model(0).forward(x, false), y, Reduction::Mean);
        let err = fsdp.backward(loss).unwrap_err();
        assert!(matches!(err, FsdpError::NoForward), "{err}");
        assert!(err.to_string().contains("call `forward`"), "{err}");
    });
}

/// Adam with weight decay, `extra` used on the first step only: DDP leaves a parameter no rank
/// used alone (no gradient, so no decay and no momentum step); so must FSDP for a unit no rank
/// used (here the root unit, `extra` alone).
#[test]
fn a_unit_no_rank_used_is_left_alone_as_ddp_leaves_it() {
    for config in both_paths() {
        a_unit_no_rank_used_is_left_alone(&config);
    }
}

fn a_unit_no_rank_used_is_left_alone(config: &FsdpConfig) {
    let world = 2;
    let adam = || AdamConfig::new().with_weight_decay(Some(WeightDecayConfig::new(0.05)));
    let ddp = run_ranks(world, |pg| {
        let rank = pg.rank();
        let device = Default::default();
        let mut ddp = DistributedDataParallel::new(model(rank), pg, DdpConfig::new()).unwrap();
        let mut optim = adam().init::<B, Mlp<B>>();
        for step in 0..STEPS {
            let (x, y) = batch(&indices(step, world, rank), &device);
            let pred = ddp.forward(|m| m.forward(x, step == 0)).unwrap();
            let grads = ddp
                .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                .unwrap();
            ddp.optimizer_step(&mut optim, 0.01, grads);
        }
        flat_params(ddp.module())
    });
    let fsdp = run_ranks(world, |pg| {
        let rank = pg.rank();
        let device = Default::default();
        let mut fsdp = FullyShardedDataParallel::new(model(rank), pg, config.clone()).unwrap();
        let mut optim = adam().init::<B, ShardedParams<B>>();
        for step in 0..STEPS {
            let (x, y) = batch(&indices(step, world, rank), &device);
            let pred = fsdp.forward(|m| m.forward(x, step == 0)).unwrap();
            let grads = fsdp
                .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                .unwrap();
            fsdp.optimizer_step(&mut optim, 0.01, grads).unwrap();
        }
        flat_params(&fsdp.full_module().unwrap())
    });
    for (r, params) in fsdp.iter().enumerate() {
        assert_eq!(
            bits(params),
            bits(&ddp[0]),
            "rank {r}, {:?}: FSDP moved a unit no rank used (DDP does not)",
            config.collectives()
        );
    }
}

/// A forward between backward and the optimizer step (evaluation, logging) must not leave the
/// next step on the old weights.
#[test]
fn a_forward_between_backward_and_step_does_not_leave_stale_weights() {
    let run = |peek: bool| {
        run_ranks(2, |pg| {
            let rank = pg.rank();
            let device = Default::default();
            let mut fsdp = FullyShardedDataParallel::new(model(rank), pg, units()).unwrap();
            let mut sgd = SgdConfig::new().init::<B, ShardedParams<B>>();
            for step in 0..3 {
                let (x, y) = batch(&indices(step, 2, rank), &device);
                let pred = fsdp.forward(|m| m.forward(x.clone(), false)).unwrap();
                let grads = fsdp
                    .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                    .unwrap();
                if peek {
                    let _ = fsdp.forward(|m| m.forward(x, false)).unwrap();
                }
                fsdp.optimizer_step(&mut sgd, 0.1, grads).unwrap();
            }
            flat_params(&fsdp.full_module().unwrap())
        })
    };
    assert_eq!(
        run(true).iter().map(|p| bits(p)).collect::<Vec<_>>(),
        run(false).iter().map(|p| bits(p)).collect::<Vec<_>>(),
        "an extra forward before the step changed the training"
    );
}

/// Linear, batch norm over the hidden features, linear.
#[derive(Module, Debug)]
struct NormNet<B: Backend> {
    fc: Linear<B>,
    norm: BatchNorm<B>,
    head: Linear<B>,
}

impl<B: Backend> NormNet<B> {
    fn new(device: &B::Device, seed: u64) -> Self {
        seed_weights(
            NormNet {
                fc: LinearConfig::new(6, 8).init(device),
                norm: BatchNormConfig::new(8).init(device),
                head: LinearConfig::new(8, 3).init(device),
            },
            seed,
        )
    }
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let [n, _] = x.dims();
        let h = self.fc.forward(x).reshape([n, 8, 1]);
        self.head.forward(self.norm.forward(h).reshape([n, 8]))
    }
}

/// Batch norm's running statistics follow rank 0 after every backward, as under DDP: the
/// whole model (statistics included) equals DDP's on every rank.
#[test]
fn buffers_follow_rank_zero_as_under_ddp() {
    let world = 2;
    let start = |rank: usize| NormNet::<B>::new(&Default::default(), SEED + rank as u64);
    let ddp = run_ranks(world, |pg| {
        let rank = pg.rank();
        let device = Default::default();
        let mut ddp = DistributedDataParallel::new(start(rank), pg, DdpConfig::new()).unwrap();
        let mut sgd = SgdConfig::new().init::<B, NormNet<B>>();
        for step in 0..STEPS {
            let (x, y) = batch(&indices(step, world, rank), &device);
            let pred = ddp.forward(|m| m.forward(x)).unwrap();
            let grads = ddp
                .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                .unwrap();
            ddp.optimizer_step(&mut sgd, 0.1, grads);
        }
        flat_params(ddp.module())
    });
    let fsdp = run_ranks(world, |pg| {
        let rank = pg.rank();
        let device = Default::default();
        let mut fsdp = FullyShardedDataParallel::new(start(rank), pg, FsdpConfig::new()).unwrap();
        let mut sgd = SgdConfig::new().init::<B, ShardedParams<B>>();
        for step in 0..STEPS {
            let (x, y) = batch(&indices(step, world, rank), &device);
            let pred = fsdp.forward(|m| m.forward(x)).unwrap();
            let grads = fsdp
                .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                .unwrap();
            fsdp.optimizer_step(&mut sgd, 0.1, grads).unwrap();
        }
        flat_params(&fsdp.full_module().unwrap())
    });
    for (r, params) in fsdp.iter().enumerate() {
        assert_eq!(
            bits(params),
            bits(&ddp[0]),
            "rank {r}: FSDP's whole model (running statistics included) differs from DDP's"
        );
    }
}

/// Two fields sharing one parameter.
#[derive(Module, Debug)]
struct Tied<B: Backend> {
    a: Linear<B>,
    b: Linear<B>,
}

#[test]
fn tied_parameters_and_repeated_prefixes_are_refused_by_name() {
    let errors = run_ranks(1, |pg| {
        let a = LinearConfig::new(4, 4).init::<B>(&Default::default());
        let tied = Tied { b: a.clone(), a };
        let tied = FullyShardedDataParallel::new(tied, pg.clone(), FsdpConfig::new())
            .err()
            .map(|e| e.to_string());
        let repeated = FullyShardedDataParallel::new(model(0), pg, units().with_unit("fc1"))
            .err()
            .map(|e| e.to_string());
        (tied, repeated)
    });
    let (tied, repeated) = errors.into_iter().next().unwrap();
    let tied = tied.expect("a tied parameter must be refused");
    assert!(
        tied.contains("'b.weight'") && tied.contains("tied"),
        "{tied}"
    );
    let repeated = repeated.expect("a repeated prefix must be refused");
    assert!(
        repeated.contains("'fc1'") && repeated.contains("once"),
        "{repeated}"
    );
}

/// Reduce-scatters start during backward from the second step on (taps anchored as DDP's
/// automatic overlap anchors them); the first step learns where, and all of them start at its
/// end. The unit order is taken from rank 0 once: `extra` (the root unit) is never used here,
/// so in the first order (the reverse of the units') it would hold back the others.
#[test]
fn units_reduce_scatter_while_backward_runs_from_the_second_step() {
    for config in both_paths() {
        units_reduce_scatter_while_backward_runs(&config);
    }
}

fn units_reduce_scatter_while_backward_runs(config: &FsdpConfig) {
    let stats = run_ranks(2, |pg| {
        let rank = pg.rank();
        let device = Default::default();
        let mut fsdp = FullyShardedDataParallel::new(model(rank), pg, config.clone()).unwrap();
        let mut sgd = SgdConfig::new().init::<B, ShardedParams<B>>();
        let mut stats = Vec::new();
        for step in 0..4 {
            let (x, y) = batch(&indices(step, 2, rank), &device);
            let pred = fsdp.forward(|m| m.forward(x, false)).unwrap();
            let grads = fsdp
                .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                .unwrap();
            fsdp.optimizer_step(&mut sgd, 0.1, grads).unwrap();
            stats.push(fsdp.last_step_stats().cloned().unwrap());
        }
        stats
    });
    for (r, s) in stats.iter().enumerate() {
        assert!(s.iter().all(|s| s.units == 3), "rank {r}: {s:?}");
        assert_eq!(
            s[0].reduced_during_backward, 0,
            "rank {r}: step 0 learns: {s:?}"
        );
        assert_eq!(s[0].anchored_taps, 0, "rank {r}: {s:?}");
        for later in &s[2..] {
            assert!(later.anchored_taps > 0, "rank {r}: {s:?}");
            assert_eq!(
                later.reduced_during_backward, 2,
                "rank {r}: fc2 and fc1 start during backward, the unused root unit at its end: \
                 {s:?}"
            );
        }
    }
}

/// `layer_boundary` marks are active under FSDP too (its forward runs through the engine's
/// passes, as DDP's does): they change no value, and each step's units still reduce-scatter
/// during backward as without them. (In the first step the units launch in module order, so
/// a mark cannot start fc2's unit before fc1's; from the second step anchored taps do that
/// without marks.)
#[test]
fn layer_boundaries_under_fsdp_change_no_value() {
    let run = |marked: bool| {
        run_ranks(2, move |pg| {
            let rank = pg.rank();
            let device = Default::default();
            let mut fsdp = FullyShardedDataParallel::new(model(rank), pg, units()).unwrap();
            let mut sgd = SgdConfig::new().init::<B, ShardedParams<B>>();
            let mut history = Vec::new();
            for step in 0..4 {
                let (x, y) = batch(&indices(step, 2, rank), &device);
                let pred = fsdp
                    .forward(|m| {
                        let h = m.act.forward(m.fc1.forward(x));
                        let h = if marked {
                            ddp_core::layer_boundary(h)
                        } else {
                            h
                        };
                        m.fc2.forward(h)
                    })
                    .unwrap();
                let grads = fsdp
                    .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                    .unwrap();
                let during = fsdp.last_step_stats().unwrap().reduced_during_backward;
                fsdp.optimizer_step(&mut sgd, 0.1, grads).unwrap();
                history.push((during, flat_params(&fsdp.full_module().unwrap())));
            }
            history
        })
    };
    let (plain, marked) = (run(false), run(true));
    for (r, (plain, marked)) in plain.iter().zip(&marked).enumerate() {
        assert_eq!(
            plain, marked,
            "rank {r}: the marks changed a value or a launch"
        );
        assert!(
            marked[2..].iter().all(|(during, _)| *during == 2),
            "rank {r}: fc2 and fc1 reduce-scatter during backward from the third step: {marked:?}"
        );
    }
}

/// Two blocks under one list field: paths `blocks.0.weight`, `blocks.1.bias`, ...
#[derive(Module, Debug)]
struct Blocks<B: Backend> {
    blocks: Vec<Linear<B>>,
}

/// `blocks` matches every parameter, but each one belongs to the longer `blocks.0` or
/// `blocks.1` (the longest prefix wins): the error says so instead of claiming `blocks`
/// matches nothing.
#[test]
fn a_unit_whose_parameters_all_belong_to_longer_units_is_refused_saying_so() {
    let errors = run_ranks(1, |pg| {
        let device = Default::default();
        let model = Blocks::<B> {
            blocks: vec![
                LinearConfig::new(4, 4).init(&device),
                LinearConfig::new(4, 4).init(&device),
            ],
        };
        let config = FsdpConfig::new().with_units(["blocks", "blocks.0", "blocks.1"]);
        FullyShardedDataParallel::new(model, pg, config)
            .err()
            .map(|e| e.to_string())
    });
    let e = errors
        .into_iter()
        .next()
        .unwrap()
        .expect("a unit left empty by longer units must be refused");
    assert!(
        !e.contains("matches no trainable parameter"),
        "'blocks' matches every parameter: {e}"
    );
    assert!(
        e.contains("'blocks'") && e.contains("blocks.0") && e.contains("blocks.1"),
        "the error must name the empty unit and the longer units that took its parameters: {e}"
    );
}
