//! DDP semantics that must match PyTorch's, each against one process with the union batch:
//! buffers (batch norm) follow rank 0, parameters no rank used never move, f64 stays f64,
//! frozen parameters are never re-sent, a module loaded into a wrapped model trains, and a rank
//! that fails mid-step makes its peers fail at once with its reason.
use crate::common::*;
use burn::module::{Module, ModuleMapper, Param, RunningState};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, Relu};
use burn::optim::decay::WeightDecayConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer, SgdConfig};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};
use ddp_core::checkpoint::{CheckpointConfig, FullCheckpointer, LoadOutcome};
use ddp_core::{DdpConfig, DdpError, DistributedDataParallel, checkpoint::TrainingState};
use std::time::{Duration, Instant};

/// Largest difference relative to the largest value: for comparisons with a reference whose
/// float sums run in another order (conv backward's split depends on the thread pool), where a
/// weight near zero can differ relatively by more than 1e-5.
fn scaled_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Global step `s` of the union batch: `world * per_rank` samples; rank `r` takes every
/// `world`-th from `r` (DistributedSampler without shuffling).
fn shard(step: usize, world: usize, per_rank: usize, rank: usize) -> Vec<usize> {
    let base = step * world * per_rank;
    (0..per_rank).map(|i| base + i * world + rank).collect()
}

fn to_bytes<M: Module<B>>(m: &M) -> Vec<u8> {
    let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
    Recorder::<B>::record(&rec, m.clone().into_record(), ()).expect("record")
}

fn from_bytes<M: Module<B>>(m: M, bytes: &[u8]) -> M {
    let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
    let record = Recorder::<B>::load(&rec, bytes.to_vec(), &Default::default()).expect("load");
    m.load_record(record)
}

// ---------------------------------------------------------------------------------------------
// Batch norm: running statistics follow rank 0.

#[derive(Module, Debug)]
struct Cnn<B: Backend> {
    conv: Conv2d<B>,
    norm: BatchNorm<B>,
    head: Linear<B>,
    act: Relu,
}

impl<B: Backend> Cnn<B> {
    fn new(device: &B::Device) -> Self {
        Cnn {
            conv: Conv2dConfig::new([1, 4], [3, 3]).init(device),
            norm: BatchNormConfig::new(4).init(device),
            head: LinearConfig::new(4 * 4 * 4, 3).init(device),
            act: Relu::new(),
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let h = self.act.forward(self.norm.forward(self.conv.forward(x)));
        self.head.forward(h.flatten(1, 3))
    }
}

/// Images whose mean depends on the rank that gets them, so per-rank running statistics differ.
fn images(indices: &[usize], world: usize) -> (Tensor<B, 4>, Tensor<B, 2>) {
    let device = Default::default();
    let n = indices.len();
    let mut xs = Vec::with_capacity(n * 36);
    let mut ys = Vec::with_capacity(n * 3);
    for &i in indices {
        let offset = (i % world) as f32 * 1.5;
        xs.extend((0..36).map(|k| (((i * 11 + k * 7) % 23) as f32 - 11.0) / 11.0 + offset));
        let (_, y) = sample(i);
        ys.extend_from_slice(&y);
    }
    (
        Tensor::from_data(TensorData::new(xs, [n, 1, 6, 6]), &device),
        Tensor::from_data(TensorData::new(ys, [n, 3]), &device),
    )
}

fn running_stats(m: &Cnn<B>) -> Vec<f32> {
    let mut v: Vec<f32> = m
        .norm
        .running_mean
        .value()
        .into_data()
        .to_vec()
        .expect("f32");
    v.extend(
        m.norm
            .running_var
            .value()
            .into_data()
            .to_vec::<f32>()
            .expect("f32"),
    );
    v
}

const BN_STEPS: usize = 4;
const BN_BATCH: usize = 3;

/// One process: each step forwards every rank's shard separately (batch norm normalises over
/// each shard, as on the ranks) and averages the shard losses; the running statistics kept are
/// the ones shard 0 produced (rank 0's own, which DDP gives every rank).
fn bn_reference(init: &[u8], world: usize) -> (Vec<f32>, Vec<Vec<f32>>) {
    let mut model = from_bytes(Cnn::<B>::new(&Default::default()), init);
    let mut sgd = SgdConfig::new().init::<B, Cnn<B>>();
    let mut stats = Vec::new();
    for step in 0..BN_STEPS {
        let mut loss = None;
        let mut rank0 = None;
        for r in 0..world {
            let (x, y) = images(&shard(step, world, BN_BATCH, r), world);
            let l = MseLoss::new().forward(model.forward(x), y, Reduction::Mean);
            if r == 0 {
                rank0 = Some((
                    model.norm.running_mean.value_sync(),
                    model.norm.running_var.value_sync(),
                ));
            }
            loss = Some(match loss {
                None => l,
                Some(acc) => acc + l,
            });
        }
        let (mean, var) = rank0.expect("world >= 1");
        let loss = loss.expect("world >= 1").div_scalar(world as f32);
        let grads = GradientsParams::from_grads::<B, _>(loss.backward(), &model);
        model.norm.running_mean = RunningState::new(mean);
        model.norm.running_var = RunningState::new(var);
        model = sgd.step(0.05, model, grads);
        stats.push(running_stats(&model));
    }
    (flat_params(&model), stats)
}

#[test]
fn batch_norm_statistics_are_rank_zeros_on_every_rank_after_every_step() {
    let init = to_bytes(&Cnn::<B>::new(&Default::default()));
    for world in 1..=4 {
        let (reference, reference_stats) = bn_reference(&init, world);
        let ranks = run_ranks(world, |pg| {
            let rank = pg.rank();
            let model = from_bytes(Cnn::<B>::new(&Default::default()), &init);
            let mut ddp = DistributedDataParallel::new(model, pg, DdpConfig::new()).unwrap();
            let mut sgd = SgdConfig::new().init::<B, Cnn<B>>();
            let mut stats = Vec::new();
            for step in 0..BN_STEPS {
                let (x, y) = images(&shard(step, world, BN_BATCH, rank), world);
                // Every step's forward, the last one included, runs the norm layer.
                let pred = ddp.forward(|m| m.forward(x)).unwrap();
                let loss = MseLoss::new().forward(pred, y, Reduction::Mean);
                let grads = ddp.backward(loss).unwrap();
                ddp.optimizer_step(&mut sgd, 0.05, grads);
                stats.push(running_stats(ddp.module()));
            }
            (flat_params(ddp.module()), stats)
        });
        for (r, (_, stats)) in ranks.iter().enumerate() {
            for step in 0..BN_STEPS {
                assert_eq!(
                    bits(&stats[step]),
                    bits(&ranks[0].1[step]),
                    "world {world}: rank {r}'s running statistics differ from rank 0's after step {step}"
                );
                let diff = scaled_diff(&stats[step], &reference_stats[step]);
                assert!(
                    diff < 1e-5,
                    "world {world}: rank {r}'s running statistics after step {step} are not rank 0's own ({diff})"
                );
            }
        }
        assert!(
            ranks.iter().all(|(p, _)| bits(p) == bits(&ranks[0].0)),
            "world {world}: replicas differ"
        );
        let diff = scaled_diff(&ranks[0].0, &reference);
        assert!(
            diff < 1e-5,
            "world {world}: DDP differs from one process by {diff} of the largest weight"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Unused parameters.

#[derive(Module, Debug)]
struct Branches<B: Backend> {
    fc1: Linear<B>,
    fc2: Linear<B>,
    /// Used on rank 0 only.
    extra: Linear<B>,
    /// Used by no rank.
    never: Linear<B>,
    act: Relu,
}

impl<B: Backend> Branches<B> {
    fn new(device: &B::Device) -> Self {
        Branches {
            fc1: LinearConfig::new(6, 8).init(device),
            fc2: LinearConfig::new(8, 3).init(device),
            extra: LinearConfig::new(6, 3).init(device),
            never: LinearConfig::new(6, 3).init(device),
            act: Relu::new(),
        }
    }

    fn forward(&self, x: Tensor<B, 2>, use_extra: bool) -> Tensor<B, 2> {
        let y = self
            .fc2
            .forward(self.act.forward(self.fc1.forward(x.clone())));
        if use_extra {
            y + self.extra.forward(x)
        } else {
            y
        }
    }
}

fn adam_wd() -> impl Optimizer<Branches<B>, B> {
    AdamConfig::new()
        .with_weight_decay(Some(WeightDecayConfig::new(0.05)))
        .init()
}

#[test]
fn parameters_no_rank_used_never_move_and_partly_used_ones_average_with_zeros() {
    const STEPS: usize = 4;
    const PER_RANK: usize = 3;
    // Seeded: with Adam a gradient near zero amplifies the last bit of a different sum order.
    let init = to_bytes(&seed_weights(Branches::<B>::new(&Default::default()), 21));
    let initial = flat_params(&from_bytes(Branches::<B>::new(&Default::default()), &init));
    let never = |m: &Branches<B>| flat_params(&m.never);
    let initial_never = never(&from_bytes(Branches::<B>::new(&Default::default()), &init));
    for world in 1..=4 {
        // One process: the average of the shard losses, shard 0 through the extra branch.
        let mut model = from_bytes(Branches::<B>::new(&Default::default()), &init);
        let mut optim = adam_wd();
        for step in 0..STEPS {
            let mut loss = None;
            for r in 0..world {
                let (x, y) = batch(&shard(step, world, PER_RANK, r), &Default::default());
                let l = MseLoss::new().forward(model.forward(x, r == 0), y, Reduction::Mean);
                loss = Some(match loss {
                    None => l,
                    Some(acc) => acc + l,
                });
            }
            let loss = loss.expect("world >= 1").div_scalar(world as f32);
            let grads = GradientsParams::from_grads::<B, _>(loss.backward(), &model);
            model = optim.step(0.01, model, grads);
        }
        let reference = flat_params(&model);
        let ranks = run_ranks(world, |pg| {
            let rank = pg.rank();
            let model = from_bytes(Branches::<B>::new(&Default::default()), &init);
            let mut ddp = DistributedDataParallel::new(model, pg, DdpConfig::new()).unwrap();
            let mut optim = adam_wd();
            for step in 0..STEPS {
                let (x, y) = batch(&shard(step, world, PER_RANK, rank), &Default::default());
                let pred = ddp.forward(|m| m.forward(x, rank == 0)).unwrap();
                let grads = ddp
                    .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                    .unwrap();
                ddp.optimizer_step(&mut optim, 0.01, grads);
            }
            (flat_params(ddp.module()), never(ddp.module()))
        });
        for (r, (params, never_params)) in ranks.iter().enumerate() {
            assert_eq!(
                bits(never_params),
                bits(&initial_never),
                "world {world}: rank {r}: a parameter no rank used moved"
            );
            assert_eq!(
                bits(params),
                bits(&ranks[0].0),
                "world {world}: replicas differ"
            );
        }
        let diff = scaled_diff(&ranks[0].0, &reference);
        assert!(
            diff < 1e-5,
            "world {world}: DDP differs from one process by {diff} of the largest weight"
        );
        assert_ne!(ranks[0].0, initial, "world {world}: training moved nothing");
    }
}

// ---------------------------------------------------------------------------------------------
// f64 models.

/// Converts every float tensor to f64 (trainable ones stay trainable leaves).
struct ToF64;

impl ModuleMapper<B> for ToF64 {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, t, mapper) = param.consume();
        let trainable = t.is_require_grad();
        let device = t.device();
        // A value that f32 cannot hold, so an f32 round trip anywhere shows.
        let data = t.into_data().convert_dtype(DType::F64);
        let values: Vec<f64> = data.iter::<f64>().map(|v| v + 1e-12).collect();
        let data = TensorData::new(values, data.shape.clone());
        let value =
            Tensor::<B, D>::from_data(data, (&device, DType::F64)).set_require_grad(trainable);
        Param::from_mapped_value(id, value, mapper)
    }
}

fn flat_f64<M: Module<B>>(m: &M) -> Vec<u64> {
    struct Collect(Vec<u64>, Vec<DType>);
    impl burn::module::ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            let data = p.val().into_data();
            self.1.push(data.dtype);
            self.0.extend(data.iter::<f64>().map(f64::to_bits));
        }
    }
    let mut c = Collect(Vec::new(), Vec::new());
    m.visit(&mut c);
    assert!(
        c.1.iter().all(|d| *d == DType::F64),
        "dtypes after training: {:?}",
        c.1
    );
    c.0
}

fn batch_f64(indices: &[usize]) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let (x, y) = batch(indices, &Default::default());
    (x.cast(DType::F64), y.cast(DType::F64))
}

#[test]
fn f64_models_reduce_in_f64_and_start_from_rank_zeros_exact_weights() {
    const STEPS: usize = 3;
    const PER_RANK: usize = 4;
    // Seeded: a weight that ends within 1e-6 of zero would make the per-weight bound flaky.
    let base = Mlp::<B>::seeded(&Default::default(), 8, 5).map(&mut ToF64);
    let init = flat_f64(&base);
    for world in 1..=4 {
        let mut model = base.clone();
        let mut sgd = SgdConfig::new().init::<B, Mlp<B>>();
        for step in 0..STEPS {
            let all: Vec<usize> = (0..world)
                .flat_map(|r| shard(step, world, PER_RANK, r))
                .collect();
            let (x, y) = batch_f64(&all);
            let loss = MseLoss::new().forward(model.forward(x, false), y, Reduction::Mean);
            let grads = GradientsParams::from_grads::<B, _>(loss.backward(), &model);
            model = sgd.step(0.1, model, grads);
        }
        let reference: Vec<f64> = flat_f64(&model).into_iter().map(f64::from_bits).collect();
        let ranks = run_ranks(world, |pg| {
            let rank = pg.rank();
            // Ranks other than 0 start from other (f64) weights; construction must copy rank 0's
            // exactly.
            let model = if rank == 0 {
                base.clone()
            } else {
                Mlp::<B>::new(&Default::default(), 8).map(&mut ToF64)
            };
            let mut ddp = DistributedDataParallel::new(model, pg, DdpConfig::new()).unwrap();
            let start = flat_f64(ddp.module());
            let mut sgd = SgdConfig::new().init::<B, Mlp<B>>();
            for step in 0..STEPS {
                let (x, y) = batch_f64(&shard(step, world, PER_RANK, rank));
                let pred = ddp.forward(|m| m.forward(x, false)).unwrap();
                let grads = ddp
                    .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                    .unwrap();
                ddp.optimizer_step(&mut sgd, 0.1, grads);
            }
            (start, flat_f64(ddp.module()))
        });
        for (r, (start, end)) in ranks.iter().enumerate() {
            assert_eq!(
                start, &init,
                "world {world}: rank {r} did not start from rank 0's exact f64 weights"
            );
            assert_eq!(
                end, &ranks[0].1,
                "world {world}: rank {r}'s f64 replica differs"
            );
        }
        let got: Vec<f64> = ranks[0].1.iter().map(|b| f64::from_bits(*b)).collect();
        let diff = got
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs() / b.abs().max(1e-6))
            .fold(0.0, f64::max);
        // f32 arithmetic anywhere on the way would show as ~1e-7.
        assert!(
            diff < 1e-12,
            "world {world}: f64 DDP differs from one process by {diff}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Frozen parameters.

#[derive(Module, Debug)]
struct Frozen<B: Backend> {
    backbone: Linear<B>,
    head: Linear<B>,
}

#[test]
fn a_frozen_backbone_is_never_sent_again() {
    const BACKBONE: usize = 6 * 256 + 256;
    const STEPS: usize = 3;
    let device = Default::default();
    let initial = Frozen::<B> {
        backbone: LinearConfig::new(6, 256).init(&device).no_grad(),
        head: LinearConfig::new(256, 3).init(&device),
    };
    flat_params(&initial); // initialise, so that clones share the values
    let head_bytes = (256 * 3 + 3) * 4;
    for world in 1..=4 {
        // One process with the union batch.
        let mut model = initial.clone();
        let mut sgd = SgdConfig::new().init::<B, Frozen<B>>();
        for step in 0..STEPS {
            let all: Vec<usize> = (0..world).flat_map(|r| shard(step, world, 4, r)).collect();
            let (x, y) = batch(&all, &device);
            let pred = model.head.forward(model.backbone.forward(x));
            let loss = MseLoss::new().forward(pred, y, Reduction::Mean);
            let grads = GradientsParams::from_grads::<B, _>(loss.backward(), &model);
            model = sgd.step(0.1, model, grads);
        }
        let reference = flat_params(&model.head);
        let results = run_ranks(world, |pg| {
            let rank = pg.rank();
            let pg_handle = pg.clone();
            let mut ddp =
                DistributedDataParallel::new(initial.clone(), pg, DdpConfig::new()).unwrap();
            let backbone_before = flat_params(&ddp.module().backbone);
            let mut sgd = SgdConfig::new().init::<B, Frozen<B>>();
            let sent_before = pg_handle.payload_bytes();
            for step in 0..STEPS {
                let (x, y) = batch(&shard(step, world, 4, rank), &device);
                let pred = ddp
                    .forward(|m| m.head.forward(m.backbone.forward(x)))
                    .unwrap();
                let grads = ddp
                    .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                    .unwrap();
                ddp.optimizer_step(&mut sgd, 0.1, grads);
            }
            let sent = pg_handle.payload_bytes() - sent_before;
            (
                backbone_before,
                flat_params(&ddp.module().backbone),
                flat_params(&ddp.module().head),
                sent,
            )
        });
        for (r, (before, after, head, sent)) in results.iter().enumerate() {
            assert_eq!(
                bits(before),
                bits(after),
                "world {world} rank {r}: the frozen backbone moved"
            );
            assert_eq!(
                bits(before),
                bits(&results[0].0),
                "world {world} rank {r}: backbones differ"
            );
            assert_eq!(
                bits(head),
                bits(&results[0].2),
                "world {world} rank {r}: heads differ"
            );
            // Per step: the head's gradients and a flag per trainable parameter, nothing else
            // (nothing at all with one rank).
            let expected = if world == 1 {
                0..1
            } else {
                STEPS * head_bytes..STEPS * (head_bytes + 64)
            };
            assert!(
                expected.contains(&(*sent as usize)),
                "world {world} rank {r}: {sent} bytes went through collectives in {STEPS} steps; \
                 the head's gradients are {head_bytes} bytes a step and the frozen backbone {} bytes",
                BACKBONE * 4
            );
        }
        let diff = max_scaled_diff(&results[0].2, &reference);
        assert!(
            diff < 1e-5,
            "world {world}: the head differs from one process by {diff}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// A module loaded into a wrapped model (set_module) is the one that trains.

#[test]
fn a_checkpoint_loaded_into_the_wrapped_model_is_what_trains() {
    for world in 1..=4 {
        let dir = tempfile::tempdir().unwrap();
        const PER_RANK: usize = 4;
        let saved_init = to_bytes(&Mlp::<B>::seeded(&Default::default(), 16, 12));
        let other_init = to_bytes(&Mlp::<B>::new(&Default::default(), 16));
        // Save a checkpoint of `saved_init` (rank 0 writes it).
        run_ranks(world, |pg| {
            let model = from_bytes(Mlp::<B>::new(&Default::default(), 16), &saved_init);
            let ckpt =
                FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg.clone()).unwrap();
            let ddp = DistributedDataParallel::new(model, pg, DdpConfig::new()).unwrap();
            let optim = SgdConfig::new().init::<B, Mlp<B>>();
            ckpt.save(ddp.module(), &optim, &TrainingState::new(1, 0))
                .unwrap();
        });
        // Reference: one process trains the saved weights.
        let mut model = from_bytes(Mlp::<B>::new(&Default::default(), 16), &saved_init);
        let mut sgd = SgdConfig::new().init::<B, Mlp<B>>();
        for step in 0..3 {
            let all: Vec<usize> = (0..world)
                .flat_map(|r| shard(step, world, PER_RANK, r))
                .collect();
            let (x, y) = batch(&all, &Default::default());
            let loss = MseLoss::new().forward(model.forward(x, false), y, Reduction::Mean);
            let grads = GradientsParams::from_grads::<B, _>(loss.backward(), &model);
            model = sgd.step(0.1, model, grads);
        }
        let reference = flat_params(&model);
        let ranks = run_ranks(world, |pg| {
            let rank = pg.rank();
            let ckpt =
                FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg.clone()).unwrap();
            // Wrap other weights (other ids), train a step, then load the checkpoint into it.
            let model = from_bytes(Mlp::<B>::new(&Default::default(), 16), &other_init);
            let mut ddp = DistributedDataParallel::new(model, pg, DdpConfig::new()).unwrap();
            let mut sgd = SgdConfig::new().init::<B, Mlp<B>>();
            let (x, y) = batch(&shard(9, world, PER_RANK, rank), &Default::default());
            let pred = ddp.forward(|m| m.forward(x, false)).unwrap();
            let grads = ddp
                .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                .unwrap();
            ddp.optimizer_step(&mut sgd, 0.1, grads);
            let mut loaded = ddp.module().clone();
            let mut sgd = SgdConfig::new().init::<B, Mlp<B>>();
            let outcome = ckpt
                .load_latest(&Default::default(), &mut loaded, &mut sgd)
                .unwrap();
            assert!(
                matches!(outcome, LoadOutcome::Resumed(_)),
                "the checkpoint loads"
            );
            ddp.set_module(loaded).unwrap();
            for step in 0..3 {
                let (x, y) = batch(&shard(step, world, PER_RANK, rank), &Default::default());
                let pred = ddp.forward(|m| m.forward(x, false)).unwrap();
                let grads = ddp
                    .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                    .unwrap();
                ddp.optimizer_step(&mut sgd, 0.1, grads);
            }
            flat_params(ddp.module())
        });
        assert!(
            ranks.iter().all(|p| bits(p) == bits(&ranks[0])),
            "world {world}: replicas differ"
        );
        let diff = max_scaled_diff(&ranks[0], &reference);
        assert!(
            diff < 1e-5,
            "the loaded weights did not train as one process would ({diff})"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Failure mid-step.

#[test]
fn a_peer_blocked_in_backward_gets_the_failing_ranks_reason_within_two_seconds() {
    let results = run_ranks(2, |pg| {
        let rank = pg.rank();
        let device = Default::default();
        let mut ddp =
            DistributedDataParallel::new(Mlp::<B>::new(&device, 8), pg, DdpConfig::new()).unwrap();
        let (x, y) = batch(&[rank, rank + 2], &device);
        let start = Instant::now();
        let result = if rank == 1 {
            // Rank 1 misuses DDP: backward without a forward.
            ddp.backward(Tensor::<B, 1>::ones([1], &device).require_grad())
                .map(drop)
        } else {
            let pred = ddp.forward(|m| m.forward(x, false)).unwrap();
            ddp.backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                .map(drop)
        };
        let elapsed = start.elapsed();
        let next = ddp
            .forward(|m| m.fc1.weight.val())
            .err()
            .map(|e| e.to_string());
        (result.err(), elapsed, next)
    });
    let rank1 = results[1].0.as_ref().expect("rank 1 fails");
    assert!(matches!(rank1, DdpError::BackwardWithoutForward), "{rank1}");
    let (rank0, elapsed, next) = &results[0];
    let rank0 = rank0.as_ref().expect("rank 0's backward fails").to_string();
    assert!(
        rank0.contains("rank 1") && rank0.contains("backward without forward"),
        "rank 0's error must name rank 1 and its reason: {rank0}"
    );
    // Without rank 1's word it would wait for the group's 60 s timeout.
    assert!(
        *elapsed < Duration::from_secs(20),
        "rank 0 waited {elapsed:?}"
    );
    for (r, next) in [(0, next), (1, &results[1].2)] {
        assert!(
            next.as_deref()
                .is_some_and(|e| e.contains("unusable after an earlier error")),
            "rank {r}'s next call must refuse: {next:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Misuse.

#[test]
fn two_forwards_feeding_one_loss_count_every_tap_once() {
    let init = to_bytes(&Mlp::<B>::seeded(&Default::default(), 8, 11));
    // One process: loss of both halves, each through its own forward.
    let mut model = from_bytes(Mlp::<B>::new(&Default::default(), 8), &init);
    let mut sgd = SgdConfig::new().init::<B, Mlp<B>>();
    for step in 0..2 {
        let mut loss = None;
        for r in 0..2 {
            for half in 0..2 {
                let (x, y) = batch(&shard(step * 2 + half, 2, 3, r), &Default::default());
                let l = MseLoss::new().forward(model.forward(x, false), y, Reduction::Mean);
                loss = Some(match loss {
                    None => l,
                    Some(acc) => acc + l,
                });
            }
        }
        let loss = loss.expect("four terms").div_scalar(2.0);
        let grads = GradientsParams::from_grads::<B, _>(loss.backward(), &model);
        model = sgd.step(0.05, model, grads);
    }
    let reference = flat_params(&model);
    let ranks = run_ranks(2, |pg| {
        let rank = pg.rank();
        let model = from_bytes(Mlp::<B>::new(&Default::default(), 8), &init);
        let mut ddp = DistributedDataParallel::new(model, pg, DdpConfig::new()).unwrap();
        let mut sgd = SgdConfig::new().init::<B, Mlp<B>>();
        for step in 0..2 {
            let mut losses = Vec::new();
            for half in 0..2 {
                let (x, y) = batch(&shard(step * 2 + half, 2, 3, rank), &Default::default());
                let pred = ddp.forward(|m| m.forward(x, false)).unwrap();
                losses.push(MseLoss::new().forward(pred, y, Reduction::Mean));
            }
            let loss = losses.pop().unwrap() + losses.pop().unwrap();
            let grads = ddp.backward(loss).unwrap();
            ddp.optimizer_step(&mut sgd, 0.05, grads);
        }
        flat_params(ddp.module())
    });
    assert_eq!(bits(&ranks[0]), bits(&ranks[1]));
    let diff = max_scaled_diff(&ranks[0], &reference);
    assert!(diff < 1e-5, "two forwards, one backward: off by {diff}");
}

/// An op whose backward panics, as burn's does when the device runs out of memory.
#[derive(Debug)]
struct PanicsInBackward;

impl<Bk: Backend> burn::backend::autodiff::ops::Backward<Bk, 1> for PanicsInBackward {
    type State = ();

    fn backward(
        self,
        _ops: burn::backend::autodiff::ops::Ops<(), 1>,
        _grads: &mut burn::backend::autodiff::grads::Gradients,
        _checkpointer: &mut burn::backend::autodiff::checkpoint::base::Checkpointer,
    ) {
        panic!("injected: out of device memory");
    }
}

/// `x`, through [`PanicsInBackward`].
fn panics_in_backward(x: Tensor<B, 2>) -> Tensor<B, 2> {
    use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
    use burn::backend::autodiff::ops::{Backward, OpsKind};
    use burn::tensor::TensorPrimitive;
    let x = x.into_primitive().tensor();
    let prep = <PanicsInBackward as Backward<burn::backend::Flex, 1>>::prepare::<NoCheckpointing>(
        PanicsInBackward,
        [x.node.clone()],
    );
    let out = match prep.compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish((), x.primitive),
        OpsKind::UnTracked(prep) => prep.finish(x.primitive),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// burn's backward panics on rank 0 (a caller that catches panics goes on): its peer fails at
/// once quoting the panic, instead of waiting out the timeout for buckets that never come, and
/// rank 0's wrapper refuses every later call.
#[test]
fn a_panic_in_backward_fails_the_peer_at_once_and_poisons_the_wrapper() {
    let initial = Mlp::<B>::seeded(&Default::default(), 8, 3);
    let results = run_ranks(2, |pg| {
        let rank = pg.rank();
        let device = Default::default();
        let mut ddp = DistributedDataParallel::new(initial.clone(), pg, DdpConfig::new()).unwrap();
        let (x, y) = batch(&[rank, rank + 2], &device);
        let pred = ddp
            .forward(|m| {
                let out = m.forward(x, false);
                if rank == 0 {
                    panics_in_backward(out)
                } else {
                    out
                }
            })
            .unwrap();
        let loss = MseLoss::new().forward(pred, y, Reduction::Mean);
        if rank == 1 {
            return ddp.backward(loss).err();
        }
        let caught =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ddp.backward(loss).err()));
        assert!(caught.is_err(), "the panic goes on to the caller");
        let (x, _) = batch(&[0], &device);
        ddp.forward(|m| m.forward(x, false)).err()
    });
    match &results[0] {
        Some(DdpError::Poisoned { first }) => {
            assert!(first.contains("out of device memory"), "{first}")
        }
        other => panic!("rank 0's next call must be refused, got {other:?}"),
    }
    let peer = results[1]
        .as_ref()
        .expect("rank 1's backward must fail")
        .to_string();
    assert!(
        peer.contains("out of device memory"),
        "rank 1 must quote rank 0's panic: {peer}"
    );
}
