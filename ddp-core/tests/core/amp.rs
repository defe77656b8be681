//! Dynamic loss scaling over DDP (`ddp_core::amp::GradScaler`): an inf on one rank makes every
//! rank skip that step and back off its scale, replicas stay bitwise equal, and without infs a
//! power-of-two scale trains bitwise as no scaling does.
use crate::common::*;
use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, AdamConfig, GradientsParams, Sgd, SgdConfig};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, FloatDType, Tensor, TensorData};
use ddp_core::amp::{GradScalerConfig, GradScalerState, ScaledStep, autocast};
use ddp_core::{DdpConfig, DistributedDataParallel, amp::AmpError, zero::ZeroRedundancyOptimizer};

const LR: f64 = 0.01;
const STEPS: usize = 7;
/// The step whose gradients get an inf on one rank.
const INF_STEP: usize = 2;
const SEED: u64 = 0xa3b0_0026;

type Inner = <B as AutodiffBackend>::InnerBackend;

fn adam() -> OptimizerAdaptor<Adam, Mlp<B>, B> {
    AdamConfig::new().init()
}

fn sgd() -> OptimizerAdaptor<Sgd<Inner>, Mlp<B>, B> {
    SgdConfig::new().init()
}

/// A small interval, so the scale also grows during the test: 1024 -> 2048 after step 1.
fn scaler_config() -> GradScalerConfig {
    GradScalerConfig::new()
        .with_init_scale(1024.0)
        .with_growth_interval(2)
}

fn init_bytes() -> Vec<u8> {
    record_bytes(&Mlp::<B>::seeded(&Default::default(), HIDDEN, SEED))
}

fn bitwise_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Puts an inf into one element of `fc1.weight`'s gradient: only this rank's copy, after DDP
/// averaged it, so no other rank can see it unless the flag travels.
fn inject_inf(module: &Mlp<B>, grads: &mut GradientsParams) {
    let id = module.fc1.weight.id;
    let grad = grads
        .remove::<Inner, 2>(id)
        .expect("fc1.weight has a gradient");
    let inf =
        Tensor::<Inner, 2>::from_data(TensorData::new(vec![f32::INFINITY], [1, 1]), &grad.device());
    grads.register::<Inner, 2>(id, grad.slice_assign([0..1, 0..1], inf));
}

/// One rank's record of a run: parameters before the first step and after each step, what each
/// scaled step did, the scaler's state after each step.
struct RankRun {
    params: Vec<Vec<f32>>,
    steps: Vec<ScaledStep>,
    states: Vec<GradScalerState>,
}

/// Trains `STEPS` steps with SGD and the scaler on `world` ranks; `inf_rank` injects an inf
/// into its own averaged gradients at `INF_STEP`.
fn run_with_scaler(world: usize, init: &[u8], inf_rank: Option<usize>) -> Vec<RankRun> {
    run_ranks(world, |pg| {
        let rank = pg.rank();
        let mut ddp = DistributedDataParallel::new(mlp_from(init), pg, DdpConfig::new()).unwrap();
        let mut scaler = scaler_config().init(ddp.process_group().clone()).unwrap();
        let mut optim = sgd();
        let device = Default::default();
        let mut run = RankRun {
            params: vec![flat_params(ddp.module())],
            steps: Vec::new(),
            states: Vec::new(),
        };
        for step in 0..STEPS {
            let (x, y) = batch(&contiguous_shard(step, world, rank), &device);
            let pred = ddp.forward(|m| m.forward(x, false)).expect("forward");
            let loss = MseLoss::new().forward(pred, y, Reduction::Mean);
            let mut grads = ddp.backward(scaler.scale(loss)).expect("backward");
            if step == INF_STEP && inf_rank == Some(rank) {
                inject_inf(ddp.module(), &mut grads);
            }
            let done = scaler
                .step(&mut ddp, &mut optim, LR, grads)
                .expect("scaled step");
            run.steps.push(done);
            run.states.push(scaler.state());
            run.params.push(flat_params(ddp.module()));
        }
        run
    })
}

fn check_inf_on_one_rank(world: usize) {
    let init = init_bytes();
    let inf_rank = world - 1;
    let runs = run_with_scaler(world, &init, Some(inf_rank));
    for (rank, run) in runs.iter().enumerate() {
        for step in 0..STEPS {
            assert!(
                bitwise_equal(&run.params[step + 1], &runs[0].params[step + 1]),
                "world {world}, step {step}: rank {rank}'s replica differs from rank 0's"
            );
            assert_eq!(
                run.states[step], runs[0].states[step],
                "world {world}, step {step}: rank {rank}'s scaler state differs from rank 0's"
            );
            let moved = !bitwise_equal(&run.params[step + 1], &run.params[step]);
            if step == INF_STEP {
                assert!(
                    !run.steps[step].stepped,
                    "world {world}: rank {rank} stepped although rank {inf_rank} found an inf"
                );
                assert!(
                    !moved,
                    "world {world}: rank {rank}'s parameters changed at the inf step"
                );
            } else {
                assert!(
                    run.steps[step].stepped,
                    "world {world}, step {step}: rank {rank} skipped"
                );
                assert!(
                    moved,
                    "world {world}, step {step}: rank {rank}'s parameters did not move"
                );
            }
        }
        // 1024, grown to 2048 after two finite steps, halved by the inf, grown twice more.
        let scales: Vec<f32> = run.steps.iter().map(|s| s.scale).collect();
        assert_eq!(
            scales,
            [1024.0, 1024.0, 2048.0, 1024.0, 1024.0, 2048.0, 2048.0],
            "world {world}: rank {rank}'s scale per step"
        );
        assert_eq!(
            run.steps[INF_STEP].next_scale,
            run.steps[INF_STEP].scale / 2.0
        );
        assert_eq!(run.states[INF_STEP].growth_tracker, 0);
        assert_eq!(
            run.states[STEPS - 1],
            GradScalerState {
                scale: 4096.0,
                growth_tracker: 0
            }
        );
    }
}

#[test]
fn inf_on_one_rank_makes_every_rank_skip_and_halve_the_scale_at_world_2() {
    check_inf_on_one_rank(2);
}

#[test]
fn inf_on_one_rank_makes_every_rank_skip_and_halve_the_scale_at_world_3() {
    check_inf_on_one_rank(3);
}

/// After the skipped step, training goes on exactly as a run without that step's update: the
/// inf run's parameters after the skip are the finite run's after step `INF_STEP - 1`.
#[test]
fn skipped_step_leaves_the_parameters_of_the_step_before_it() {
    let init = init_bytes();
    let clean = run_with_scaler(2, &init, None);
    let with_inf = run_with_scaler(2, &init, Some(1));
    for step in 0..INF_STEP {
        assert!(bitwise_equal(
            &with_inf[0].params[step + 1],
            &clean[0].params[step + 1]
        ));
    }
    assert!(bitwise_equal(
        &with_inf[0].params[INF_STEP + 1],
        &clean[0].params[INF_STEP]
    ));
    assert!(clean[0].steps.iter().all(|s| s.stepped));
}

/// Each rank's parameters after each step, with Adam, scaled by `scaler` or not.
fn adam_run(world: usize, init: &[u8], scaler: Option<GradScalerConfig>) -> Vec<Vec<Vec<f32>>> {
    run_ranks(world, |pg| {
        let rank = pg.rank();
        let mut ddp = DistributedDataParallel::new(mlp_from(init), pg, DdpConfig::new()).unwrap();
        let mut scaler = scaler
            .as_ref()
            .map(|c| c.init(ddp.process_group().clone()).unwrap());
        let mut optim = adam();
        let device = Default::default();
        let mut after = Vec::new();
        for step in 0..STEPS {
            let (x, y) = batch(&contiguous_shard(step, world, rank), &device);
            let pred = ddp
                .forward(|m| m.forward(x, step % 2 == 0))
                .expect("forward");
            let loss = MseLoss::new().forward(pred, y, Reduction::Mean);
            match scaler.as_mut() {
                Some(scaler) => {
                    let grads = ddp.backward(scaler.scale(loss)).expect("backward");
                    let done = scaler.step(&mut ddp, &mut optim, LR, grads).unwrap();
                    assert!(done.stepped, "step {step}: a finite run skipped a step");
                }
                None => {
                    let grads = ddp.backward(loss).expect("backward");
                    ddp.optimizer_step(&mut optim, LR, grads);
                }
            }
            after.push(flat_params(ddp.module()));
        }
        after
    })
}

/// Scaling the loss by a power of two scales every gradient exactly, and unscaling divides it
/// out exactly, so the scaler changes nothing but the skipped steps.
#[test]
fn power_of_two_scale_trains_bitwise_as_no_scaling_at_world_2_and_3() {
    let init = init_bytes();
    for world in [2, 3] {
        let plain = adam_run(world, &init, None);
        // 65536 growing every second step: 2^16 .. 2^19 over the run.
        let growing = GradScalerConfig::new().with_growth_interval(2);
        let scaled = adam_run(world, &init, Some(growing));
        let disabled = adam_run(
            world,
            &init,
            Some(GradScalerConfig::new().with_enabled(false)),
        );
        for rank in 0..world {
            for step in 0..STEPS {
                assert!(
                    bitwise_equal(&scaled[rank][step], &plain[rank][step]),
                    "world {world}, rank {rank}, step {step}: scaled training differs"
                );
                assert!(bitwise_equal(&disabled[rank][step], &plain[rank][step]));
            }
        }
    }
}

/// ZeRO stage 2 steps on each rank's *local* gradients, so an overflow in one rank's batch
/// is in that rank's gradients only: the flag must travel, or rank 0 would start the
/// reduce-scatter that rank 1 skips. Here rank 1's batch at `INF_STEP` holds a huge input.
#[test]
fn zero_stage2_overflow_in_one_ranks_batch_skips_the_step_everywhere() {
    let init = init_bytes();
    let world = 2;
    let runs = run_ranks(world, |pg| {
        let rank = pg.rank();
        let mut ddp = DistributedDataParallel::new(mlp_from(&init), pg, DdpConfig::new()).unwrap();
        let mut optim = ZeroRedundancyOptimizer::stage2(adam(), &mut ddp).unwrap();
        let mut scaler = scaler_config().init(ddp.process_group().clone()).unwrap();
        let device = Default::default();
        let mut steps = Vec::new();
        let mut params = vec![flat_params(ddp.module())];
        for step in 0..STEPS {
            let (mut x, y) = batch(&contiguous_shard(step, world, rank), &device);
            if step == INF_STEP && rank == 1 {
                let huge = Tensor::<B, 2>::full([1, 6], 1e30, &device);
                x = x.slice_assign([0..1, 0..6], huge);
            }
            let pred = ddp.forward(|m| m.forward(x, false)).expect("forward");
            let loss = MseLoss::new().forward(pred, y, Reduction::Mean);
            let grads = ddp.backward(scaler.scale(loss)).expect("backward");
            steps.push(
                scaler
                    .step(&mut ddp, &mut optim, LR, grads)
                    .expect("scaled step"),
            );
            params.push(flat_params(ddp.module()));
        }
        (steps, params)
    });
    for (rank, (steps, params)) in runs.iter().enumerate() {
        for step in 0..STEPS {
            assert_eq!(
                steps[step].stepped,
                step != INF_STEP,
                "rank {rank}, step {step}"
            );
            assert!(bitwise_equal(&params[step + 1], &runs[0].1[step + 1]));
        }
        assert!(bitwise_equal(&params[INF_STEP + 1], &params[INF_STEP]));
        assert_eq!(steps[INF_STEP].next_scale, 1024.0);
    }
}

#[test]
fn invalid_config_and_state_are_errors_not_panics() {
    run_ranks(1, |pg| {
        for bad in [
            GradScalerConfig::new().with_init_scale(0.0),
            GradScalerConfig::new().with_init_scale(f32::INFINITY),
            GradScalerConfig::new().with_growth_factor(1.0),
            GradScalerConfig::new().with_backoff_factor(1.0),
            GradScalerConfig::new().with_backoff_factor(0.0),
            GradScalerConfig::new().with_growth_interval(0),
        ] {
            let err = bad.init(pg.clone()).expect_err("out of range");
            assert!(matches!(err, AmpError::InvalidConfig(_)), "{err}");
        }
        let mut scaler = GradScalerConfig::new()
            .with_growth_interval(10)
            .init(pg.clone())
            .unwrap();
        for bad in [
            GradScalerState {
                scale: f32::NAN,
                growth_tracker: 0,
            },
            GradScalerState {
                scale: -1.0,
                growth_tracker: 0,
            },
            GradScalerState {
                scale: 8.0,
                growth_tracker: 10,
            },
        ] {
            let err = scaler.load_state(bad).expect_err("invalid state");
            assert!(matches!(err, AmpError::InvalidState(_)), "{err}");
        }
        assert_eq!(scaler.state(), GradScalerState::new(65536.0));
        let saved = GradScalerState {
            scale: 256.0,
            growth_tracker: 9,
        };
        scaler.load_state(saved).unwrap();
        // Round trip through JSON, as a checkpoint's user payload carries it.
        let json = serde_json::to_string(&scaler.state()).unwrap();
        assert_eq!(
            serde_json::from_str::<GradScalerState>(&json).unwrap(),
            saved
        );
        assert_eq!(scaler.scale_factor(), 256.0);
    });
}

/// Whether every value is a bf16 value (its low 16 bits zero as f32): the tensor went through
/// bf16.
fn all_bf16(values: &[f32]) -> bool {
    values.iter().all(|v| v.to_bits() & 0xffff == 0)
}

fn values<const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().iter::<f32>().collect()
}

/// One forward through `autocast(.., BF16)` against the f32 forward: the output is bf16, the
/// gradients land on the f32 parameters as f32, close to the f32 ones but not equal (the
/// matmuls ran in bf16).
#[test]
fn autocast_bf16_forward_gives_f32_gradients_to_the_f32_parameters() {
    let device = Default::default();
    let model = Mlp::<B>::seeded(&device, HIDDEN, SEED);
    let (x, y) = batch(&(0..GLOBAL_BATCH).collect::<Vec<_>>(), &device);
    let loss_of = |pred: Tensor<B, 2>| MseLoss::new().forward(pred, y.clone(), Reduction::Mean);

    let pred32 = model.forward(x.clone(), true);
    let grads32 = GradientsParams::from_grads(loss_of(pred32.clone()).backward(), &model);

    let pred16 = autocast(model.clone(), FloatDType::BF16).forward(x.cast(FloatDType::BF16), true);
    assert_eq!(
        pred16.dtype(),
        DType::BF16,
        "the forward did not run in bf16"
    );
    let pred16 = pred16.cast(FloatDType::F32);
    let out16 = values(pred16.clone());
    assert!(all_bf16(&out16));
    assert!(
        !all_bf16(&values(pred32)),
        "the f32 output happens to be bf16 values"
    );
    let grads16 = GradientsParams::from_grads(loss_of(pred16).backward(), &model);

    let mut differs = false;
    for (name, id) in [
        ("fc1.weight", model.fc1.weight.id),
        ("fc2.weight", model.fc2.weight.id),
        ("extra.weight", model.extra.weight.id),
    ] {
        let g16 = grads16
            .get::<Inner, 2>(id)
            .expect("a gradient for the f32 parameter");
        let g32 = grads32.get::<Inner, 2>(id).expect("an f32 gradient");
        assert_eq!(
            g16.dtype(),
            DType::F32,
            "{name}: the master's gradient is not f32"
        );
        let (a, b): (Vec<f32>, Vec<f32>) = (
            g16.into_data().iter::<f32>().collect(),
            g32.into_data().iter::<f32>().collect(),
        );
        let diff = max_scaled_diff(&a, &b);
        assert!(
            diff < 5e-2,
            "{name}: bf16 gradient off by {diff} of its scale"
        );
        differs |= !bitwise_equal(&a, &b);
    }
    assert!(
        differs,
        "bf16 gradients equal the f32 ones bitwise: nothing ran in bf16"
    );
    assert_eq!(
        model.fc1.weight.val().dtype(),
        DType::F32,
        "the master was cast"
    );
}

/// Mixed precision as the issue asks: bf16 forward, f32 master weights stepped by Adam, loss
/// scaling with the all-reduced flag, on 2 ranks. Replicas stay bitwise equal, the parameters
/// stay f32, and the loss falls about as in f32 training.
#[test]
fn bf16_autocast_with_scaler_trains_under_ddp_and_replicas_stay_bitwise_equal() {
    const EPOCHS: usize = 30;
    let init = init_bytes();
    let world = 2;
    let train = |mixed: bool| {
        run_ranks(world, |pg| {
            let rank = pg.rank();
            let mut ddp =
                DistributedDataParallel::new(mlp_from(&init), pg, DdpConfig::new()).unwrap();
            let mut scaler = GradScalerConfig::new()
                .with_enabled(mixed)
                .init(ddp.process_group().clone())
                .unwrap();
            let mut optim = AdamConfig::new().init();
            let device = Default::default();
            let mut losses = Vec::new();
            for step in 0..EPOCHS {
                // The same two global batches, again and again: the loss must fall.
                let (x, y) = batch(&contiguous_shard(step % 2, world, rank), &device);
                let pred = ddp
                    .forward(|m| match mixed {
                        true => autocast(m.clone(), FloatDType::BF16)
                            .forward(x.cast(FloatDType::BF16), false)
                            .cast(FloatDType::F32),
                        false => m.forward(x, false),
                    })
                    .expect("forward");
                let loss = MseLoss::new().forward(pred, y, Reduction::Mean);
                losses.push(values(loss.clone())[0]);
                let grads = ddp.backward(scaler.scale(loss)).expect("backward");
                let done = scaler.step(&mut ddp, &mut optim, 0.02, grads).unwrap();
                assert!(done.stepped, "step {step} skipped: bf16 has f32's range");
            }
            let dtype = ddp.module().fc1.weight.val().dtype();
            (losses, flat_params(ddp.module()), dtype)
        })
    };
    let mixed = train(true);
    let full = train(false);
    for (rank, (_, params, dtype)) in mixed.iter().enumerate() {
        assert!(
            bitwise_equal(params, &mixed[0].1),
            "rank {rank}'s replica differs"
        );
        assert_eq!(
            *dtype,
            DType::F32,
            "rank {rank}: the master weights are not f32"
        );
    }
    let (first, last) = (mixed[0].0[0], mixed[0].0[EPOCHS - 1]);
    let last32 = full[0].0[EPOCHS - 1];
    eprintln!("bf16 autocast: loss {first} -> {last}; f32: -> {last32}");
    assert!(
        last < 0.5 * first,
        "bf16 training did not converge: {first} -> {last}"
    );
    assert!(
        (last - last32).abs() <= 0.1 * last32.max(1e-3),
        "bf16 ends at {last}, f32 at {last32}"
    );
    assert!(
        !bitwise_equal(&mixed[0].1, &full[0].1),
        "the bf16 run equals the f32 run"
    );
}

/// A linear layer and a batch norm, whose running statistics are buffers.
#[derive(Module, Debug)]
struct WithBatchNorm<B: burn::tensor::backend::Backend> {
    linear: burn::nn::Linear<B>,
    norm: burn::nn::BatchNorm<B>,
}

/// Buffers' clones share their value, so a careless cast would turn the model's own batch-norm
/// statistics into bf16; autocast casts the parameters and leaves the buffers as they were.
#[test]
fn autocast_casts_parameters_but_leaves_the_models_buffers_alone() {
    let device = Default::default();
    let model = WithBatchNorm::<B> {
        linear: burn::nn::LinearConfig::new(6, 4).init(&device),
        norm: burn::nn::BatchNormConfig::new(4).init(&device),
    };
    let mean_before = values(model.norm.running_mean.value());
    let cast = autocast(model.clone(), FloatDType::BF16);
    assert_eq!(cast.linear.weight.val().dtype(), DType::BF16);
    assert_eq!(cast.norm.gamma.val().dtype(), DType::BF16);
    for (who, m) in [("the model", &model), ("the cast copy", &cast)] {
        let mean = m.norm.running_mean.value();
        assert_eq!(mean.dtype(), DType::F32, "{who}'s running mean was cast");
        assert!(bitwise_equal(&values(mean), &mean_before));
        assert_eq!(m.norm.running_var.value().dtype(), DType::F32);
    }
    assert_eq!(
        model.linear.weight.val().dtype(),
        DType::F32,
        "the master was cast"
    );
}

/// What loss scaling is for: f16 flushes gradients below 6e-8 to zero. A tiny loss's f16
/// gradients vanish; scaled by 65536 they survive, and unscaled in f32 they match the f32
/// gradients to f16's precision.
#[test]
fn f16_gradients_of_a_tiny_loss_vanish_without_scaling_and_survive_with_it() {
    const TINY: f32 = 1e-7;
    run_ranks(1, |pg| {
        let device = Default::default();
        let model = Mlp::<B>::seeded(&device, HIDDEN, SEED);
        let (x, y) = batch(&(0..GLOBAL_BATCH).collect::<Vec<_>>(), &device);
        let tiny_loss = |dtype: Option<FloatDType>| {
            let pred = match dtype {
                Some(dtype) => autocast(model.clone(), dtype)
                    .forward(x.clone().cast(dtype), false)
                    .cast(FloatDType::F32),
                None => model.forward(x.clone(), false),
            };
            MseLoss::new().forward(pred, y.clone(), Reduction::Mean) * TINY
        };
        let fc1 = |grads: &GradientsParams| -> Vec<f32> {
            let g = grads
                .get::<Inner, 2>(model.fc1.weight.id)
                .expect("fc1 gradient");
            g.into_data().iter::<f32>().collect()
        };
        let reference = fc1(&GradientsParams::from_grads(
            tiny_loss(None).backward(),
            &model,
        ));
        assert!(reference.iter().any(|g| *g != 0.0));

        let plain = fc1(&GradientsParams::from_grads(
            tiny_loss(Some(FloatDType::F16)).backward(),
            &model,
        ));
        assert!(
            plain.iter().all(|g| *g == 0.0),
            "f16 kept gradients of order 1e-8"
        );

        let scaler = GradScalerConfig::new().init(pg).unwrap();
        let scaled_loss = scaler.scale(tiny_loss(Some(FloatDType::F16)));
        let grads = GradientsParams::from_grads(scaled_loss.backward(), &model);
        let unscaled = scaler.unscale(&model, grads).unwrap();
        assert!(!unscaled.found_inf());
        let rescued = fc1(&unscaled.into_grads());
        let diff = max_scaled_diff(&rescued, &reference);
        eprintln!("f16 with loss scaling: fc1 gradient within {diff:e} of f32 (scaled)");
        assert!(
            diff < 1e-2,
            "scaled f16 gradients off by {diff} of their scale"
        );
    });
}

/// One linear layer in two fields (tied, as a language model ties its embedding and output):
/// `module.visit` meets the shared parameter twice.
#[derive(Module, Debug)]
struct TiedPair<B: burn::tensor::backend::Backend> {
    a: burn::nn::Linear<B>,
    b: burn::nn::Linear<B>,
}

fn tied_pair() -> TiedPair<B> {
    let a = seed_weights(
        burn::nn::LinearConfig::new(6, 6).init(&Default::default()),
        SEED,
    );
    TiedPair { b: a.clone(), a }
}

/// Each rank's parameters after `STEPS` SGD steps of the tied model, scaled by `scaler` or not.
fn tied_run(world: usize, scaler: Option<GradScalerConfig>) -> Vec<Vec<f32>> {
    run_ranks(world, |pg| {
        let rank = pg.rank();
        let mut ddp = DistributedDataParallel::new(tied_pair(), pg, DdpConfig::new()).unwrap();
        let mut scaler = scaler
            .as_ref()
            .map(|c| c.init(ddp.process_group().clone()).unwrap());
        let mut optim = SgdConfig::new().init::<B, TiedPair<B>>();
        let device = Default::default();
        for step in 0..STEPS {
            let (x, y) = batch(&contiguous_shard(step, world, rank), &device);
            let rows = x.dims()[0];
            let pred = ddp
                .forward(|m| m.b.forward(m.a.forward(x).tanh()).slice([0..rows, 0..3]))
                .expect("forward");
            let loss = MseLoss::new().forward(pred, y, Reduction::Mean);
            match scaler.as_mut() {
                Some(scaler) => {
                    let grads = ddp.backward(scaler.scale(loss)).expect("backward");
                    let done = scaler.step(&mut ddp, &mut optim, LR, grads).unwrap();
                    assert!(done.stepped, "step {step}: a finite run skipped a step");
                }
                None => {
                    let grads = ddp.backward(loss).expect("backward");
                    ddp.optimizer_step(&mut optim, LR, grads);
                }
            }
        }
        flat_params(ddp.module())
    })
}

/// A tied parameter is visited twice; unscaling it twice would divide its gradient by the scale
/// squared and all but freeze it. Unscaled once, a power-of-two scale trains it bitwise as no
/// scaling does.
#[test]
fn a_tied_parameter_is_unscaled_once_and_trains_bitwise_as_without_scaling() {
    let world = 2;
    let plain = tied_run(world, None);
    let scaled = tied_run(world, Some(scaler_config()));
    for rank in 0..world {
        assert!(
            bitwise_equal(&plain[rank], &plain[0]),
            "rank {rank}'s unscaled replica differs from rank 0's"
        );
        assert!(
            bitwise_equal(&scaled[rank], &plain[rank]),
            "rank {rank}: the tied model trained under GradScaler differs from plain training \
             (max scaled diff {})",
            max_scaled_diff(&scaled[rank], &plain[rank])
        );
    }
}

/// Rank 0's gradients hold an f16 one (a trainable f16 parameter only rank 0 used, its
/// gradient kept local as ZeRO-2 keeps it): rank 0 cannot unscale. Every rank must return an
/// error from the same collective, or rank 1 would wait in the found-inf all-reduce until the
/// group's timeout (60 s here) and the group would be out of step. A collective after it
/// completes on both ranks.
#[test]
fn a_half_precision_gradient_on_one_rank_is_an_error_on_every_rank_not_a_hang() {
    let results = run_ranks(2, |pg| {
        let rank = pg.rank();
        let device = Default::default();
        let model = Mlp::<B>::seeded(&device, HIDDEN, SEED);
        let scaler = scaler_config().init(pg.clone()).unwrap();
        let (x, y) = batch(&contiguous_shard(0, 2, rank), &device);
        let loss = MseLoss::new().forward(model.forward(x, false), y, Reduction::Mean);
        let mut grads = GradientsParams::from_grads(scaler.scale(loss).backward(), &model);
        if rank == 0 {
            let id = model.fc2.weight.id;
            let grad = grads
                .remove::<Inner, 2>(id)
                .expect("fc2.weight has a gradient");
            grads.register::<Inner, 2>(id, grad.cast(FloatDType::F16));
        }
        let outcome = scaler.unscale(&model, grads).map(|u| u.found_inf());
        let mut one = [1.0f32];
        let after = pg
            .all_reduce(&mut one, ddp_core::comm::ReduceOp::Sum)
            .map(|()| one[0]);
        (outcome, after.map_err(|e| e.to_string()))
    });
    for (rank, (outcome, after)) in results.iter().enumerate() {
        let err = match outcome {
            Err(e) => e.to_string(),
            Ok(found_inf) => {
                panic!(
                    "rank {rank}: unscale succeeded (found_inf {found_inf}) beside rank 0's f16 gradient"
                )
            }
        };
        assert!(!err.contains("all-reducing"), "rank {rank}: {err}");
        if rank == 0 {
            assert!(
                matches!(outcome, Err(AmpError::HalfPrecisionGradient { .. })),
                "rank 0: {err}"
            );
        } else {
            assert!(
                err.contains("rank 0") && err.contains("f32"),
                "rank {rank} must say rank 0 could not unscale and why: {err}"
            );
        }
        assert_eq!(after, &Ok(2.0), "rank {rank}: the group is out of step");
    }
}

/// Gives every parameter a fresh id: the module `step_on` is given need not share the wrapped
/// module's ids.
struct Reid;

impl<Bk: burn::tensor::backend::Backend> burn::module::ModuleMapper<Bk> for Reid {
    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<Tensor<Bk, D>>,
    ) -> burn::module::Param<Tensor<Bk, D>> {
        let (_, t, mapper) = param.consume();
        burn::module::Param::from_mapped_value(burn::module::ParamId::new(), t, mapper)
    }
}

/// `step_on`'s gradients are keyed by the caller's module: unscaling them against
/// `ddp.module()` would match no id, leave them 1024 times too large and let the optimizer
/// step with them. It is an error naming the module to pass; the right module unscales them
/// to the plain gradients bit for bit.
#[test]
fn unscaling_against_a_module_the_gradients_do_not_belong_to_is_an_error() {
    let init = init_bytes();
    let world = 2;
    let results = run_ranks(world, |pg| {
        let rank = pg.rank();
        let mut ddp = DistributedDataParallel::new(mlp_from(&init), pg, DdpConfig::new()).unwrap();
        let scaler = scaler_config().init(ddp.process_group().clone()).unwrap();
        let caller = ddp.module().clone().map(&mut Reid);
        let device = Default::default();
        let step = |ddp: &mut DistributedDataParallel<B, Mlp<B>>, scale: bool| {
            let (x, y) = batch(&contiguous_shard(0, world, rank), &device);
            let (_, grads) = ddp
                .step_on(&caller, |m| {
                    let loss = MseLoss::new().forward(m.forward(x, false), y, Reduction::Mean);
                    let loss = if scale { scaler.scale(loss) } else { loss };
                    loss.backward();
                })
                .expect("step_on");
            grads
        };
        let fc1 = |grads: &GradientsParams| -> Vec<f32> {
            let g = grads
                .get::<Inner, 2>(caller.fc1.weight.id)
                .expect("fc1 gradient, keyed by the caller's id");
            g.into_data().iter::<f32>().collect()
        };
        let plain = fc1(&step(&mut ddp, false));
        let grads = step(&mut ddp, true);
        let wrong = scaler.unscale(ddp.module(), grads).map(|u| u.found_inf());
        let grads = step(&mut ddp, true);
        let right = scaler.unscale(&caller, grads).expect("the caller's module");
        (plain, wrong, fc1(&right.into_grads()))
    });
    for (rank, (plain, wrong, right)) in results.iter().enumerate() {
        match wrong {
            Ok(found_inf) => panic!(
                "rank {rank}: unscaling against ddp.module() succeeded (found_inf {found_inf}) \
                 with gradients keyed by the caller's module"
            ),
            Err(e) => {
                let e = e.to_string();
                assert!(
                    e.contains("another module") && e.contains("step_on"),
                    "rank {rank}: {e}"
                );
            }
        }
        assert!(
            bitwise_equal(right, plain),
            "rank {rank}: unscaled with the caller's module, the gradients differ from the plain ones"
        );
    }
}
