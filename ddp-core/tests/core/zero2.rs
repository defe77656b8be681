//! ZeRO stage 2 (`ZeroRedundancyOptimizer::stage2`): gradients reduce-scattered to their
//! owners, parameters all-gathered. The same parameters as plain DDP with the same optimizer
//! (bitwise at world 1 and 2, where a two-term average rounds the same in any order), replicas
//! bitwise identical after every step, each rank holding only its shard of the optimizer state
//! and of the averaged gradients, and checkpoints that resume.
use crate::common::*;
use burn::config::Config;
use burn::module::{Module, ParamId};
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamConfig, Optimizer, SgdConfig, SimpleOptimizer};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use ddp_core::checkpoint::{CheckpointConfig, FullCheckpointer, LoadOutcome, TrainingState};
use ddp_core::zero::{DEFAULT_ZERO_BUCKET_BYTES, LocalGradientsHook, ZeroConfig};
use ddp_core::{
    Collectives, DdpConfig, DistributedDataParallel,
    comm::ProcessGroup,
    zero::{ZeroError, ZeroRedundancyOptimizer, ZeroStage},
};
use std::collections::BTreeSet;
use std::path::Path;

const LR: f64 = 0.01;
const STEPS: usize = 6;
const SEED: u64 = 0x5e40_0002;

type Inner = <B as AutodiffBackend>::InnerBackend;

/// Which optimizer setup a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Plain DDP, the optimizer unsharded (the reference).
    Plain,
    /// ZeRO stage 1.
    Stage1,
    /// ZeRO stage 2.
    Stage2,
    /// ZeRO stage 2 with collectives of at most this many bytes per rank (tiny: one tensor
    /// per reduce-scatter and all-gather).
    Stage2Buckets(usize),
    /// ZeRO stage 2 on the device engine's CPU stand-in (`Collectives::StandIn`), with
    /// collectives of at most this many bytes per rank: the device path (tensors assembled on
    /// the device, reduce-scatter and all-gather on the device communicator).
    Stage2StandIn(usize),
    /// ZeRO stage 2 built from a [`ZeroConfig`] (with this bucket size) instead of the builder.
    Stage2Config(usize),
}

fn adam<M: burn::module::AutodiffModule<B>>() -> OptimizerAdaptor<burn::optim::Adam, M, B> {
    AdamConfig::new()
        .with_weight_decay(Some(WeightDecayConfig::new(1e-2)))
        .init()
}

fn sgd<M: burn::module::AutodiffModule<B>>() -> OptimizerAdaptor<burn::optim::Sgd<Inner>, M, B> {
    SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new().with_nesterov(true)))
        .init()
}

/// Trains over global steps `steps`; `extra` is used on even steps only, so some steps leave it
/// without a gradient. Returns the parameters after each step.
fn train<O: Optimizer<Mlp<B>, B>>(
    ddp: &mut DistributedDataParallel<B, Mlp<B>>,
    optim: &mut O,
    steps: std::ops::Range<usize>,
) -> Vec<Vec<f32>> {
    train_mlp(ddp, optim, LR, steps)
}

/// Each rank's parameters after each of `STEPS` steps from `init`, with `make`'s optimizer
/// set up as `mode` says.
fn trajectory<Opt>(
    world: usize,
    init: &[u8],
    mode: Mode,
    make: impl Fn() -> OptimizerAdaptor<Opt, Mlp<B>, B> + Sync,
) -> Vec<Vec<Vec<f32>>>
where
    Opt: SimpleOptimizer<Inner>,
{
    run_ranks(world, |pg| {
        let config = match mode {
            Mode::Stage2StandIn(_) => DdpConfig::new().with_collectives(Collectives::StandIn),
            _ => DdpConfig::new(),
        };
        let mut ddp = DistributedDataParallel::new(mlp_from(init), pg, config).unwrap();
        match mode {
            Mode::Plain => train(&mut ddp, &mut make(), 0..STEPS),
            Mode::Stage1 => {
                let mut zero = ZeroRedundancyOptimizer::new(make(), ddp.process_group().clone());
                train(&mut ddp, &mut zero, 0..STEPS)
            }
            Mode::Stage2 => {
                let mut zero = ZeroRedundancyOptimizer::stage2(make(), &mut ddp).unwrap();
                assert_eq!(zero.stage(), ZeroStage::Two);
                train(&mut ddp, &mut zero, 0..STEPS)
            }
            Mode::Stage2Buckets(bytes) => {
                let mut zero = ZeroRedundancyOptimizer::stage2(make(), &mut ddp)
                    .unwrap()
                    .with_bucket_bytes(bytes);
                train(&mut ddp, &mut zero, 0..STEPS)
            }
            Mode::Stage2Config(bytes) => {
                let config = ZeroConfig::new()
                    .with_stage(ZeroStage::Two)
                    .with_bucket_bytes(bytes);
                let mut zero = config.init(make(), &mut ddp).unwrap();
                assert_eq!(zero.stage(), ZeroStage::Two);
                train(&mut ddp, &mut zero, 0..STEPS)
            }
            Mode::Stage2StandIn(bytes) => {
                let mut zero = ZeroRedundancyOptimizer::stage2(make(), &mut ddp)
                    .unwrap()
                    .with_bucket_bytes(bytes);
                assert_eq!(zero.device_communicator(), None, "chosen at the first step");
                let after = train(&mut ddp, &mut zero, 0..STEPS);
                assert_eq!(zero.device_communicator(), Some("the stand-in"));
                after
            }
        }
    })
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn bitwise_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Stage 2 against plain DDP at every step: bitwise at world 1 and 2; from world 3 on the
/// shared-memory all-reduce (DDP) and reduce-scatter (ZeRO) may add the three or four ranks'
/// gradients in different orders, so within `TOLERANCE`.
fn check_against_plain<Opt>(
    name: &str,
    make: impl Fn() -> OptimizerAdaptor<Opt, Mlp<B>, B> + Sync + Copy,
) where
    Opt: SimpleOptimizer<Inner>,
{
    const TOLERANCE: f32 = 1e-6;
    let init = record_bytes(&Mlp::<B>::seeded(&Default::default(), HIDDEN, SEED));
    for world in 1..=4 {
        let plain = trajectory(world, &init, Mode::Plain, make);
        // One collective of each kind per step, then one per tensor.
        let buckets = trajectory(world, &init, Mode::Stage2Buckets(64), make);
        let zero = trajectory(world, &init, Mode::Stage2, make);
        for step in 0..STEPS {
            for ranks in &buckets[1..] {
                assert!(bitwise_equal(&ranks[step], &buckets[0][step]));
            }
            let (b, z) = (&buckets[0][step], &zero[0][step]);
            if world <= 2 {
                assert!(
                    bitwise_equal(b, z),
                    "{name}, world {world}, step {step}: stage 2 in per-tensor collectives \
                     differs from one collective by {:e}",
                    max_abs_diff(b, z)
                );
            } else {
                assert!(max_abs_diff(b, z) <= TOLERANCE);
            }
            for (r, ranks) in zero.iter().enumerate() {
                assert!(
                    bitwise_equal(&ranks[step], &zero[0][step]),
                    "{name}, world {world}, step {step}: rank {r}'s replica differs from rank 0's"
                );
            }
            let (z, p) = (&zero[0][step], &plain[0][step]);
            let diff = max_abs_diff(z, p);
            if world <= 2 {
                assert!(
                    bitwise_equal(z, p),
                    "{name}, world {world}, step {step}: stage 2 differs from plain DDP by {diff:e}"
                );
            } else {
                assert!(
                    diff <= TOLERANCE,
                    "{name}, world {world}, step {step}: stage 2 differs from plain DDP by {diff:e}"
                );
            }
        }
        let last = max_abs_diff(&zero[0][STEPS - 1], &plain[0][STEPS - 1]);
        eprintln!(
            "{name}, world {world}: max |stage 2 - plain DDP| after {STEPS} steps = {last:e}"
        );
        let moved = max_abs_diff(&zero[0][STEPS - 1], &flat_params(&mlp_from(&init)));
        assert!(
            moved > 1e-3,
            "{name}, world {world}: training moved nothing ({moved})"
        );
    }
}

#[test]
fn stage2_with_adam_equals_plain_ddp_bitwise_at_world_1_2_and_within_1e6_at_3_4() {
    check_against_plain("Adam", adam::<Mlp<B>>);
}

#[test]
fn stage2_with_sgd_momentum_equals_plain_ddp_bitwise_at_world_1_2_and_within_1e6_at_3_4() {
    check_against_plain("SGD", sgd::<Mlp<B>>);
}

#[test]
fn stage2_matches_stage1_bitwise_at_world_2() {
    let init = record_bytes(&Mlp::<B>::seeded(&Default::default(), HIDDEN, SEED + 1));
    let one = trajectory(2, &init, Mode::Stage1, adam::<Mlp<B>>);
    let two = trajectory(2, &init, Mode::Stage2, adam::<Mlp<B>>);
    for step in 0..STEPS {
        assert!(
            bitwise_equal(&one[1][step], &two[1][step]),
            "step {step}: stage 2 differs from stage 1 by {:e}",
            max_abs_diff(&one[1][step], &two[1][step])
        );
    }
}

/// Stage 2 on a device communicator (the CPU stand-in of NCCL: gradients and parameters
/// assembled as tensors on the model's device, reduce-scattered and all-gathered on the
/// communicator's own thread) gives what stage 2 through host memory gives: bitwise at world 1
/// and 2, within `TOLERANCE` from world 3 on (the stand-in's subgroup may add in another
/// order), in one collective per step and in one per tensor, replicas bitwise identical. The
/// `extra` layer gets no gradient on odd steps, so the ranks' agreement on which tensors have
/// one is exercised.
#[test]
fn stage2_on_the_device_stand_in_equals_stage2_through_host_memory_at_worlds_1_to_4() {
    const TOLERANCE: f32 = 1e-6;
    let init = record_bytes(&Mlp::<B>::seeded(&Default::default(), HIDDEN, SEED + 2));
    for world in 1..=4 {
        for bytes in [DEFAULT_ZERO_BUCKET_BYTES, 64] {
            let host = trajectory(world, &init, Mode::Stage2Buckets(bytes), adam::<Mlp<B>>);
            let device = trajectory(world, &init, Mode::Stage2StandIn(bytes), adam::<Mlp<B>>);
            for step in 0..STEPS {
                for (r, ranks) in device.iter().enumerate() {
                    assert!(
                        bitwise_equal(&ranks[step], &device[0][step]),
                        "world {world}, {bytes} B, step {step}: rank {r}'s replica differs"
                    );
                }
                let (h, d) = (&host[0][step], &device[0][step]);
                let diff = max_abs_diff(h, d);
                if world <= 2 {
                    assert!(
                        bitwise_equal(h, d),
                        "world {world}, {bytes} B, step {step}: the device path differs from \
                         the host path by {diff:e}"
                    );
                } else {
                    assert!(diff <= TOLERANCE, "world {world}, step {step}: {diff:e}");
                }
            }
        }
    }
}

/// A [`ZeroConfig`] builds the optimizer the builder builds: stage 2 from the config trains
/// bitwise like `stage2(..).with_bucket_bytes(..)` at world 2 (so the config registered DDP's
/// hook and set the bucket size), and the config survives a save and a load as burn's configs do.
#[test]
fn zero_config_builds_what_the_builder_builds_and_saves_as_a_burn_config() {
    let init = record_bytes(&Mlp::<B>::seeded(&Default::default(), HIDDEN, SEED + 3));
    let built = trajectory(2, &init, Mode::Stage2Buckets(64), adam::<Mlp<B>>);
    let configured = trajectory(2, &init, Mode::Stage2Config(64), adam::<Mlp<B>>);
    for step in 0..STEPS {
        for rank in 0..2 {
            assert!(
                bitwise_equal(&built[rank][step], &configured[rank][step]),
                "step {step}, rank {rank}: the config's optimizer trained differently"
            );
        }
    }

    let config = ZeroConfig::new()
        .with_stage(ZeroStage::Two)
        .with_bucket_bytes(4096)
        .with_collectives(Some(Collectives::StandIn));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("zero.json");
    config.save(&path).unwrap();
    let loaded = ZeroConfig::load(&path).unwrap();
    assert_eq!(loaded.stage, ZeroStage::Two);
    assert_eq!(loaded.bucket_bytes, 4096);
    assert_eq!(loaded.collectives, Some(Collectives::StandIn));
    let defaults = ZeroConfig::new();
    assert_eq!(defaults.stage, ZeroStage::One);
    assert_eq!(defaults.bucket_bytes, DEFAULT_ZERO_BUCKET_BYTES);
    assert_eq!(defaults.collectives, None);

    // Without DDP: the stage and the group as configured.
    run_ranks(1, |pg| {
        let zero = loaded.init_on_group(adam::<Mlp<B>>(), pg);
        assert_eq!(zero.stage(), ZeroStage::Two);
        assert_eq!(zero.process_group().world_size(), 1);
    });
}

// ---------------------------------------------------------------------------------------------
// Memory: twelve equal layers, so the partition is exact at world 1-4.

#[derive(Module, Debug)]
struct Deep<B: Backend> {
    layers: Vec<Linear<B>>,
    act: Relu,
}

impl<B: Backend> Deep<B> {
    fn new(device: &B::Device) -> Self {
        Deep {
            layers: (0..12)
                .map(|_| LinearConfig::new(16, 16).init(device))
                .collect(),
            act: Relu::new(),
        }
    }

    fn forward(&self, mut x: Tensor<B, 2>) -> Tensor<B, 2> {
        for layer in &self.layers {
            x = self.act.forward(layer.forward(x));
        }
        x
    }
}

/// Trainable bytes of `Deep`: 12 x (16 x 16 weights + 16 biases) f32.
const DEEP_BYTES: usize = 12 * (16 * 16 + 16) * 4;
const DEEP_TENSORS: usize = 24;

/// What one rank holds after two steps.
#[derive(Debug)]
struct Held {
    /// Serialised size of its optimizer state.
    state_bytes: usize,
    /// The parameters whose optimizer state it holds.
    state_ids: BTreeSet<u64>,
    /// `gradient_bytes()`.
    gradient_bytes: usize,
    /// `shard_bytes()[rank]`.
    shard_bytes: usize,
}

fn deep_held(world: usize, init: &[u8], stage: ZeroStage) -> Vec<Held> {
    run_ranks(world, |pg| {
        let device = Default::default();
        let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
        let record = Recorder::<B>::load(&rec, init.to_vec(), &device).expect("load");
        let model = Deep::<B>::new(&device).load_record(record);
        let rank = pg.rank();
        let mut ddp = DistributedDataParallel::new(model, pg, DdpConfig::new()).unwrap();
        let mut optim = match stage {
            ZeroStage::Two => ZeroRedundancyOptimizer::stage2(adam::<Deep<B>>(), &mut ddp).unwrap(),
            _ => ZeroRedundancyOptimizer::new(adam::<Deep<B>>(), ddp.process_group().clone()),
        };
        assert_eq!(optim.gradient_bytes(), None, "no step yet");
        for step in 0..2 {
            let n = GLOBAL_BATCH / world;
            let xs: Vec<f32> = (0..n * 16)
                .map(|k| (((step * 31 + rank * 7 + k * 13) % 19) as f32 - 9.0) / 9.0)
                .collect();
            let x = Tensor::<B, 2>::from_data(TensorData::new(xs, [n, 16]), &device);
            let pred = ddp.forward(|m| m.forward(x)).unwrap();
            let loss = MseLoss::new().forward(pred.clone(), pred.ones_like(), Reduction::Mean);
            let grads = ddp.backward(loss).unwrap();
            ddp.optimizer_step(&mut optim, LR, grads);
        }
        Held {
            state_bytes: optim.local_state_bytes().unwrap(),
            state_ids: optim.local_state().keys().map(ParamId::val).collect(),
            gradient_bytes: optim.gradient_bytes().expect("stepped"),
            shard_bytes: optim.shard_bytes().expect("partitioned")[rank],
        }
    })
}

#[test]
fn stage2_each_rank_holds_only_its_shard_of_adam_state_and_of_the_gradients() {
    let init = record_bytes(&Deep::<B>::new(&Default::default()));
    let full = deep_held(1, &init, ZeroStage::Two).remove(0);
    assert_eq!(
        full.state_ids.len(),
        DEEP_TENSORS,
        "world 1 holds every parameter's state"
    );
    // Stage 1 for contrast: DDP's all-reduce leaves every rank with the whole gradient.
    for held in deep_held(2, &init, ZeroStage::One) {
        assert_eq!(
            held.gradient_bytes, DEEP_BYTES,
            "stage 1 holds every gradient"
        );
    }
    for world in 1..=4 {
        let ranks = deep_held(world, &init, ZeroStage::Two);
        let mut seen = BTreeSet::new();
        for (r, held) in ranks.iter().enumerate() {
            eprintln!(
                "world {world}, rank {r}: Adam state {} bytes (world 1: {}), averaged gradients \
                 {} bytes (whole model: {DEEP_BYTES})",
                held.state_bytes, full.state_bytes, held.gradient_bytes
            );
            for id in &held.state_ids {
                assert!(
                    seen.insert(*id),
                    "world {world}: rank {r} holds state another rank also holds"
                );
            }
            // Equal layers: an exact 1/world split of the parameters...
            assert_eq!(
                held.shard_bytes,
                DEEP_BYTES / world,
                "world {world}, rank {r}"
            );
            assert_eq!(
                held.state_ids.len(),
                DEEP_TENSORS / world,
                "world {world}, rank {r}"
            );
            // ... of the averaged gradients (plus one presence flag per owned tensor) ...
            assert_eq!(
                held.gradient_bytes,
                DEEP_BYTES / world + 4 * DEEP_TENSORS / world,
                "world {world}, rank {r}: averaged gradient bytes"
            );
            // ... and of Adam's state.
            let bound = full.state_bytes as f64 / world as f64 * 1.05;
            assert!(
                held.state_bytes as f64 <= bound,
                "world {world}: rank {r} holds {} bytes of optimizer state, over 1.05 x {} / {world}",
                held.state_bytes,
                full.state_bytes
            );
        }
        assert_eq!(
            seen, full.state_ids,
            "world {world}: the shards together are the whole state"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Checkpoints and failures.

const SAVE_AT: usize = 3;

#[test]
fn stage2_checkpoint_resumes_bitwise_at_world_2_and_within_1e6_at_world_3() {
    let init = record_bytes(&Mlp::<B>::seeded(&Default::default(), HIDDEN, SEED + 2));
    let uninterrupted = trajectory(2, &init, Mode::Stage2, adam::<Mlp<B>>)
        .remove(0)
        .pop()
        .expect("steps");
    let dir = tempfile::tempdir().expect("tempdir");
    run_ranks(2, |pg| {
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg.clone()).unwrap();
        let mut ddp = DistributedDataParallel::new(mlp_from(&init), pg, DdpConfig::new()).unwrap();
        let mut zero = ZeroRedundancyOptimizer::stage2(adam::<Mlp<B>>(), &mut ddp).unwrap();
        train(&mut ddp, &mut zero, 0..SAVE_AT);
        zero.save_checkpoint(&ckpt, ddp.module(), &TrainingState::new(0, SAVE_AT as u64))
            .expect("save");
    });
    // Resumed by hand: the stage set on the optimizer, the hook registered on DDP.
    let resume = |pg: ProcessGroup, dir: &Path| {
        let device = Default::default();
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir), pg.clone()).unwrap();
        let mut model = Mlp::<B>::seeded(&device, HIDDEN, 99);
        let mut zero =
            ZeroRedundancyOptimizer::new(adam::<Mlp<B>>(), pg.clone()).with_stage(ZeroStage::Two);
        let outcome = ckpt
            .load_latest(&device, &mut model, &mut zero)
            .expect("load");
        assert!(matches!(outcome, LoadOutcome::Resumed(_)), "{outcome}");
        let mut ddp = DistributedDataParallel::new(model, pg, DdpConfig::new()).unwrap();
        ddp.register_comm_hook(LocalGradientsHook).unwrap();
        train(&mut ddp, &mut zero, SAVE_AT..STEPS)
            .pop()
            .expect("steps")
    };
    let same = run_ranks(2, |pg| resume(pg, dir.path()));
    for (r, p) in same.iter().enumerate() {
        assert!(
            bitwise_equal(p, &uninterrupted),
            "resumed at world 2, rank {r}: differs from the uninterrupted run by {:e}",
            max_abs_diff(p, &uninterrupted)
        );
    }
    let three = run_ranks(3, |pg| resume(pg, dir.path()));
    for (r, p) in three.iter().enumerate() {
        assert!(
            bitwise_equal(p, &three[0]),
            "resumed at world 3: rank {r} differs"
        );
    }
    let diff = max_abs_diff(&three[0], &uninterrupted);
    eprintln!("resumed at world 3: max |resumed - uninterrupted| = {diff:e}");
    assert!(diff <= 1e-6, "resumed at world 3: differs by {diff}");
}

#[test]
fn stage2_must_be_set_up_before_the_first_forward() {
    let results = run_ranks(1, |pg| {
        let mut ddp = DistributedDataParallel::new(
            mlp_from(&record_bytes(&Mlp::<B>::seeded(
                &Default::default(),
                HIDDEN,
                SEED,
            ))),
            pg,
            DdpConfig::new(),
        )
        .unwrap();
        let (x, _) = batch(&[0, 1], &Default::default());
        let _ = ddp.forward(|m| m.forward(x, true)).unwrap();
        ZeroRedundancyOptimizer::stage2(adam::<Mlp<B>>(), &mut ddp).err()
    });
    match &results[0] {
        Some(e @ ZeroError::Setup(_)) => {
            assert!(e.to_string().contains("before the first forward"), "{e}")
        }
        other => panic!("expected a setup error, got {other:?}"),
    }
}

#[test]
fn stage2_a_peer_that_fails_mid_step_fails_the_reduce_scatter_with_its_reason() {
    let init = record_bytes(&Mlp::<B>::seeded(&Default::default(), HIDDEN, SEED));
    let (first, _) = crate::zero::steps_after_a_peer_fails(&init, |ddp| {
        ZeroRedundancyOptimizer::stage2(adam::<Mlp<B>>(), ddp).unwrap()
    });
    match first {
        Some(e @ ZeroError::ReduceGradients { .. }) => assert!(
            e.to_string().contains("rank 1 ran out of memory"),
            "the error does not carry the peer's reason: {e}"
        ),
        other => panic!("expected a reduce-scatter error, got {other:?}"),
    }
}

/// On the device path a rank's own failure before a reduce-scatter (here: a gradient of the
/// wrong size on rank 1 only) must fail its peers at once with its reason: they wait in the
/// device communicator, which the process group's abort does not reach, so the optimizer
/// aborts that communicator too.
#[test]
fn stage2_on_the_stand_in_a_rank_that_fails_before_the_reduce_scatter_fails_its_peer() {
    let init = record_bytes(&Mlp::<B>::seeded(&Default::default(), HIDDEN, SEED));
    // Rank 1 stays alive until rank 0 has its answer, as a process that handles its error
    // would: its closing connections must not be what tells rank 0.
    let both_answered = std::sync::Barrier::new(2);
    let results = run_ranks(2, |pg| {
        let rank = pg.rank();
        let config = DdpConfig::new().with_collectives(Collectives::StandIn);
        let mut ddp = DistributedDataParallel::new(mlp_from(&init), pg, config).unwrap();
        let mut zero = ZeroRedundancyOptimizer::stage2(adam::<Mlp<B>>(), &mut ddp).unwrap();
        let (x, y) = batch(&contiguous_shard(0, 2, rank), &Default::default());
        let pred = ddp.forward(|m| m.forward(x, true)).unwrap();
        let mut grads = ddp
            .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
            .unwrap();
        let module = ddp.module().clone();
        if rank == 1 {
            let id = module.fc1.weight.id;
            grads.remove::<Inner, 2>(id);
            grads.register::<Inner, 1>(id, Tensor::zeros([3], &Default::default()));
        }
        let outcome = zero.try_step(LR, module, grads).err();
        both_answered.wait();
        outcome
    });
    let own = results[1]
        .as_ref()
        .expect("rank 1 fails on its own gradient");
    let peer = results[0].as_ref().expect("rank 0 fails with it");
    assert!(
        !matches!(peer, ZeroError::Poisoned { .. }),
        "rank 0's first step failed as poisoned: {peer}"
    );
    assert!(
        peer.to_string().contains("got 3 F32 elements"),
        "rank 0 does not quote rank 1's reason: {peer}\n(rank 1: {own})"
    );
}

#[test]
fn local_gradients_hook_leaves_each_rank_its_own_gradient() {
    let init = record_bytes(&Mlp::<B>::seeded(&Default::default(), HIDDEN, SEED + 3));
    let ranks = run_ranks(2, |pg| {
        let device = Default::default();
        let rank = pg.rank();
        let (x, y) = batch(&contiguous_shard(0, 2, rank), &device);
        // The reference: this rank's batch through burn alone, no DDP.
        let model = mlp_from(&init);
        let loss =
            MseLoss::new().forward(model.forward(x.clone(), true), y.clone(), Reduction::Mean);
        let local = burn::optim::GradientsParams::from_grads(loss.backward(), &model);
        let id = model.fc1.weight.id;
        let local = local.get::<Inner, 2>(id).expect("local gradient");
        let mut ddp = DistributedDataParallel::new(mlp_from(&init), pg, DdpConfig::new()).unwrap();
        ddp.register_comm_hook(LocalGradientsHook).unwrap();
        let pred = ddp.forward(|m| m.forward(x, true)).unwrap();
        let grads = ddp
            .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
            .unwrap();
        let through_ddp = grads.get::<Inner, 2>(id).expect("DDP's gradient");
        let flat = |t: Tensor<Inner, 2>| t.into_data().to_vec::<f32>().unwrap();
        (flat(local), flat(through_ddp))
    });
    for (r, (local, through_ddp)) in ranks.iter().enumerate() {
        assert!(
            bitwise_equal(local, through_ddp),
            "rank {r}: DDP with the hook did not return this rank's own gradient"
        );
    }
    assert!(
        !bitwise_equal(&ranks[0].1, &ranks[1].1),
        "different batches gave both ranks the same gradient: it was averaged"
    );
}
