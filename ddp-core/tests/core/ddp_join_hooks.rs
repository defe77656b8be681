//! Uneven inputs (`join`) and communication hooks, each against one process that applies the
//! same averaged updates.
use crate::common::*;
use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::Tensor;
use ddp_core::checkpoint::{CheckpointConfig, FullCheckpointer, LoadOutcome};
use ddp_core::hooks::{
    Bf16CompressHook, CommHook, Fp16CompressHook, GradBucket, HookError, PowerSgdConfig,
};
use ddp_core::{
    DdpConfig, DdpError, DistributedDataParallel, HostStaging,
    checkpoint::TrainingState,
    comm::{ProcessGroup, ReduceOp},
};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A model whose weights are drawn now, from a seed (burn initialises lazily: clones of a fresh
/// model would each draw their own), so the comparisons below see the same numbers every run.
fn model(hidden: usize) -> Mlp<B> {
    Mlp::<B>::seeded(&Default::default(), hidden, 5)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Micro-batch `micro` of step `step` of rank `rank`: 4 samples of its own.
fn samples(rank: usize, step: usize, micro: usize) -> Vec<usize> {
    (0..4)
        .map(|i| ((rank * 97 + step * 13 + micro * 7) * 4 + i) % 500)
        .collect()
}

fn loss_of(m: &Mlp<B>, idx: &[usize]) -> Tensor<B, 1> {
    let device = Default::default();
    let (x, y) = batch(idx, &device);
    MseLoss::new().forward(m.forward(x, false), y, Reduction::Mean)
}

const LR: f64 = 0.01;
/// Steps every rank trains together after `join`, so a stale optimizer state would show.
const AFTER: usize = 2;

/// Rank `r` has `batches[r]` steps of `micro` micro-batches, then joins; rank 0 saves a
/// checkpoint, every rank loads it, and all train `AFTER` more steps.
fn train_uneven(
    initial: &Mlp<B>,
    batches: &[usize],
    micro: usize,
    base: &DdpConfig,
) -> Vec<(Vec<f32>, usize)> {
    train_uneven_dangling(initial, batches, micro, base, 0)
}

/// [`train_uneven`], where each rank with fewer batches than the longest also runs `dangling`
/// `backward_no_sync` micro-batches of a step it never finishes before it joins.
fn train_uneven_dangling(
    initial: &Mlp<B>,
    batches: &[usize],
    micro: usize,
    base: &DdpConfig,
    dangling: usize,
) -> Vec<(Vec<f32>, usize)> {
    let longest = *batches.iter().max().unwrap();
    let world = batches.len();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    run_ranks(world, |pg| {
        let rank = pg.rank();
        let config = base.clone().with_uneven_inputs(true);
        let mut ddp = DistributedDataParallel::new(initial.clone(), pg, config).unwrap();
        let mut adam = AdamConfig::new().init::<B, Mlp<B>>();
        for step in 0..batches[rank] {
            for k in 0..micro {
                let idx = samples(rank, step, k);
                let loss = ddp.forward(|m| loss_of(m, &idx)).unwrap();
                if k + 1 < micro {
                    ddp.backward_no_sync(loss).unwrap();
                } else {
                    let grads = ddp.backward(loss).unwrap();
                    ddp.optimizer_step(&mut adam, LR, grads);
                }
            }
        }
        if batches[rank] < longest {
            for k in 0..dangling {
                let idx = samples(rank, batches[rank], k);
                let loss = ddp.forward(|m| loss_of(m, &idx)).unwrap();
                ddp.backward_no_sync(loss).unwrap();
            }
        }
        let answered = ddp.join(&mut adam, LR).unwrap();
        // Rank 0's checkpoint (model and Adam state), written after join, is everyone's: every
        // rank resumes from it and trains on.
        let ckpt =
            FullCheckpointer::new(CheckpointConfig::new(dir), ddp.process_group().clone()).unwrap();
        ckpt.save(ddp.module(), &adam, &TrainingState::new(1, 0))
            .unwrap();
        let mut model = ddp.module().clone();
        let mut adam = AdamConfig::new().init::<B, Mlp<B>>();
        let outcome = ckpt
            .load_latest(&Default::default(), &mut model, &mut adam)
            .unwrap();
        assert!(
            matches!(outcome, LoadOutcome::Resumed(_)),
            "the checkpoint loads"
        );
        ddp.set_module(model).unwrap();
        for step in 0..AFTER {
            let idx = samples(rank, 1000 + step, 0);
            let loss = ddp.forward(|m| loss_of(m, &idx)).unwrap();
            let grads = ddp.backward(loss).unwrap();
            ddp.optimizer_step(&mut adam, LR, grads);
        }
        (flat_params(ddp.module()), answered)
    })
}

/// One process: step `s` averages the gradients of the ranks that still had data.
fn reference(initial: &Mlp<B>, batches: &[usize], micro: usize) -> Vec<f32> {
    reference_divided(initial, batches, micro, false)
}

/// [`reference`], dividing each step's summed gradients by the whole world when `by_world`
/// (PyTorch's `divide_by_initial_world_size`) instead of by the ranks that had data.
fn reference_divided(
    initial: &Mlp<B>,
    batches: &[usize],
    micro: usize,
    by_world: bool,
) -> Vec<f32> {
    let world = batches.len();
    let mut model = initial.clone();
    let mut adam = AdamConfig::new().init::<B, Mlp<B>>();
    let steps = *batches.iter().max().unwrap();
    let apply = |model: Mlp<B>, adam: &mut _, ranks: &[usize], step: usize, micro: usize| {
        let mut total: Option<Tensor<B, 1>> = None;
        for k in 0..micro {
            for &r in ranks {
                let divisor = if by_world { world } else { ranks.len() };
                let l = loss_of(&model, &samples(r, step, k)) / divisor as f32;
                total = Some(match total {
                    Some(t) => t + l,
                    None => l,
                });
            }
        }
        let grads = GradientsParams::from_grads(total.unwrap().backward(), &model);
        Optimizer::step(adam, LR, model, grads)
    };
    for step in 0..steps {
        let ranks: Vec<usize> = (0..batches.len()).filter(|&r| batches[r] > step).collect();
        model = apply(model, &mut adam, &ranks, step, micro);
    }
    let all: Vec<usize> = (0..batches.len()).collect();
    for step in 0..AFTER {
        model = apply(model, &mut adam, &all, 1000 + step, 1);
    }
    flat_params(&model)
}

fn check_uneven(batches: &[usize], micro: usize) {
    check_uneven_with(batches, micro, &DdpConfig::new());
}

/// [`check_uneven`] with `base`'s settings besides `uneven_inputs`.
pub(crate) fn check_uneven_with(batches: &[usize], micro: usize, base: &DdpConfig) {
    let initial = model(16);
    let got = train_uneven(&initial, batches, micro, base);
    let want = reference(&initial, batches, micro);
    let longest = *batches.iter().max().unwrap();
    for (rank, (params, answered)) in got.iter().enumerate() {
        assert_eq!(
            bits(params),
            bits(&got[0].0),
            "rank {rank} differs from rank 0"
        );
        assert_eq!(
            *answered,
            (longest - batches[rank]) * micro,
            "rank {rank} answered"
        );
    }
    // Largest difference relative to the largest weight: the reference sums the ranks' losses
    // in another order, and a weight near zero can differ relatively by more after Adam.
    let diff = max_scaled_diff(&got[0].0, &want);
    assert!(
        diff < 1e-5,
        "uneven inputs {batches:?}: max scaled diff {diff}"
    );
}

#[test]
fn ranks_with_3_5_and_7_batches_train_like_one_process_averaging_the_ranks_with_data() {
    check_uneven(&[3, 5, 7], 1);
    check_uneven(&[7, 3, 5], 1);
}

#[test]
fn divide_by_initial_world_size_divides_every_step_by_the_whole_world() {
    let batches = [2, 5];
    let initial = model(16);
    let base = DdpConfig::new().with_divide_by_initial_world_size(true);
    let got = train_uneven(&initial, &batches, 1, &base);
    assert_eq!(
        bits(&got[1].0),
        bits(&got[0].0),
        "rank 1 differs from rank 0"
    );
    let want = reference_divided(&initial, &batches, 1, true);
    let diff = max_scaled_diff(&got[0].0, &want);
    assert!(
        diff < 1e-5,
        "max scaled diff to the whole-world reference {diff}"
    );
    // The two rules give different models: this test would see the rule ignored.
    let other = reference_divided(&initial, &batches, 1, false);
    let apart = max_scaled_diff(&got[0].0, &other);
    assert!(
        apart > 1e-3,
        "the two divisors gave models only {apart} apart"
    );
}

#[test]
fn join_works_with_gradient_accumulation() {
    check_uneven(&[2, 4], 2);
}

#[test]
fn a_rank_that_joins_mid_accumulation_contributes_none_of_it() {
    // Rank 1 runs one backward_no_sync of a third step, then joins: those gradients must not
    // reach rank 0's third step (the reference averages that step over rank 0 alone).
    let batches = [3, 2];
    let initial = model(16);
    let got = train_uneven_dangling(&initial, &batches, 2, &DdpConfig::new(), 1);
    let want = reference(&initial, &batches, 2);
    assert_eq!(
        bits(&got[1].0),
        bits(&got[0].0),
        "rank 1 differs from rank 0"
    );
    let diff = max_scaled_diff(&got[0].0, &want);
    assert!(diff < 1e-5, "max scaled diff {diff}");
}

#[test]
fn join_without_uneven_inputs_is_a_clear_error() {
    let initial = model(8);
    let errs = run_ranks(2, |pg| {
        let mut ddp = DistributedDataParallel::new(initial.clone(), pg, DdpConfig::new()).unwrap();
        let mut adam = AdamConfig::new().init::<B, Mlp<B>>();
        ddp.join(&mut adam, LR).unwrap_err().to_string()
    });
    for e in errs {
        assert!(e.contains("with_uneven_inputs(true)"), "{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Communication hooks.

/// A user's hook: an exact average, checking what DDP hands it.
struct CheckedAverage {
    buckets_seen: Vec<usize>,
}

impl CommHook for CheckedAverage {
    fn reduce(&mut self, bucket: &mut GradBucket, pg: &ProcessGroup) -> Result<(), HookError> {
        let mut end = 0;
        for p in bucket.parameters() {
            if p.offset != end {
                return Err(format!("{} starts at {}, expected {end}", p.path, p.offset).into());
            }
            end = p.range().end;
        }
        if end != bucket.buffer().len() {
            return Err("the parameters do not tile the buffer".into());
        }
        self.buckets_seen.push(bucket.index());
        pg.all_reduce(bucket.buffer_mut(), ReduceOp::Avg)?;
        Ok(())
    }
}

/// Buckets of a few parameters each: several per step, so hooks see more than one.
fn small_buckets() -> DdpConfig {
    DdpConfig::new()
        .with_bucket_cap_mb(0.0002)
        .with_first_bucket_cap_mb(0.0002)
}

fn train_with(
    initial: &Mlp<B>,
    world: usize,
    steps: usize,
    config: DdpConfig,
    hook: impl Fn() -> Option<Box<dyn FnOnce(&mut DistributedDataParallel<B, Mlp<B>>)>> + Sync,
) -> Vec<(Vec<f32>, u64)> {
    run_ranks(world, |pg| {
        let rank = pg.rank();
        let handle = pg.clone();
        let mut ddp = DistributedDataParallel::new(initial.clone(), pg, config.clone()).unwrap();
        if let Some(register) = hook() {
            register(&mut ddp);
        }
        let mut adam = AdamConfig::new().init::<B, Mlp<B>>();
        let before = handle.payload_bytes();
        for step in 0..steps {
            let idx = samples(rank, step, 0);
            let loss = ddp.forward(|m| loss_of(m, &idx)).unwrap();
            let grads = ddp.backward(loss).unwrap();
            ddp.optimizer_step(&mut adam, LR, grads);
        }
        (flat_params(ddp.module()), handle.payload_bytes() - before)
    })
}

#[test]
fn a_users_hook_sees_whole_buckets_in_order_and_its_average_is_ddps() {
    let initial = model(16);
    // Small buckets: several per step.
    let config = small_buckets();
    let plain = train_with(&initial, 2, 3, config.clone(), || None);
    let hooked = train_with(&initial, 2, 3, config, || {
        Some(Box::new(|ddp: &mut DistributedDataParallel<B, Mlp<B>>| {
            ddp.register_comm_hook(CheckedAverage {
                buckets_seen: Vec::new(),
            })
            .unwrap()
        }))
    });
    for (rank, ((p, _), (h, _))) in plain.iter().zip(&hooked).enumerate() {
        assert_eq!(
            bits(p),
            bits(h),
            "rank {rank}: the hook's average differs from DDP's"
        );
    }
}

/// Fails on bucket 1 of the second step on rank 1.
struct FailingHook {
    calls: usize,
}

impl CommHook for FailingHook {
    fn reduce(&mut self, bucket: &mut GradBucket, pg: &ProcessGroup) -> Result<(), HookError> {
        self.calls += 1;
        if pg.rank() == 1 && self.calls > 2 {
            return Err("out of carrier pigeons".into());
        }
        pg.all_reduce(bucket.buffer_mut(), ReduceOp::Avg)?;
        Ok(())
    }

    fn name(&self) -> &str {
        "pigeon post"
    }
}

#[test]
fn a_failing_hook_is_named_on_its_rank_and_its_peer_fails_at_once() {
    let initial = model(16);
    let errors = run_ranks(2, |pg| {
        let rank = pg.rank();
        let config = small_buckets();
        let mut ddp = DistributedDataParallel::new(initial.clone(), pg, config).unwrap();
        ddp.register_comm_hook(FailingHook { calls: 0 }).unwrap();
        let mut adam = AdamConfig::new().init::<B, Mlp<B>>();
        let start = std::time::Instant::now();
        for step in 0..3 {
            let idx = samples(rank, step, 0);
            let loss = ddp.forward(|m| loss_of(m, &idx)).unwrap();
            match ddp.backward(loss) {
                Ok(grads) => ddp.optimizer_step(&mut adam, LR, grads),
                Err(e) => return (e.to_string(), start.elapsed()),
            }
        }
        ("no error".to_string(), start.elapsed())
    });
    assert!(
        errors[1].0.contains("pigeon post") && errors[1].0.contains("out of carrier pigeons"),
        "{}",
        errors[1].0
    );
    assert!(
        errors[0].0.contains("out of carrier pigeons"),
        "rank 0: {}",
        errors[0].0
    );
    assert!(
        errors[0].1.as_secs() < 30,
        "rank 0 waited {:?}",
        errors[0].1
    );
}

/// A hook that says it leaves the gradients local (ZeRO stage 2's kind), counting the calls
/// DDP should never make.
struct KeepsLocal {
    calls: Arc<AtomicUsize>,
}

impl CommHook for KeepsLocal {
    fn reduce(&mut self, _bucket: &mut GradBucket, _pg: &ProcessGroup) -> Result<(), HookError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn leaves_gradients_local(&self) -> bool {
        true
    }
}

#[test]
fn a_hook_that_leaves_gradients_local_is_never_called_and_each_rank_keeps_its_own() {
    let initial = model(16);
    let calls = Arc::new(AtomicUsize::new(0));
    let steps = 2;
    let trained = run_ranks(2, |pg| {
        let rank = pg.rank();
        let config = small_buckets();
        let mut ddp = DistributedDataParallel::new(initial.clone(), pg, config).unwrap();
        ddp.register_comm_hook(KeepsLocal {
            calls: calls.clone(),
        })
        .unwrap();
        let mut adam = AdamConfig::new().init::<B, Mlp<B>>();
        for step in 0..steps {
            let idx = samples(rank, step, 0);
            let loss = ddp.forward(|m| loss_of(m, &idx)).unwrap();
            let grads = ddp.backward(loss).unwrap();
            ddp.optimizer_step(&mut adam, LR, grads);
        }
        flat_params(ddp.module())
    });
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "DDP called reduce on a hook that leaves gradients local"
    );
    // Each rank stepped with its own gradients, as one process training on its samples alone.
    for (rank, params) in trained.iter().enumerate() {
        let mut alone = initial.clone();
        let mut adam = AdamConfig::new().init::<B, Mlp<B>>();
        for step in 0..steps {
            let grads = loss_of(&alone, &samples(rank, step, 0)).backward();
            let grads = GradientsParams::from_grads(grads, &alone);
            alone = adam.step(LR, alone, grads);
        }
        assert_eq!(
            bits(params),
            bits(&flat_params(&alone)),
            "rank {rank} did not keep its own gradients"
        );
    }
}

#[test]
fn hooks_are_registered_once_before_the_first_forward() {
    let initial = model(8);
    run_ranks(1, |pg| {
        let mut ddp = DistributedDataParallel::new(initial.clone(), pg, DdpConfig::new()).unwrap();
        let idx = samples(0, 0, 0);
        let _ = ddp.forward(|m| loss_of(m, &idx)).unwrap();
        let err = ddp
            .register_comm_hook(PowerSgdConfig::new().init().unwrap())
            .unwrap_err();
        assert!(matches!(err, DdpError::InvalidConfig(_)), "{err}");
    });
    run_ranks(1, |pg| {
        let mut ddp = DistributedDataParallel::new(initial.clone(), pg, DdpConfig::new()).unwrap();
        ddp.register_comm_hook(Fp16CompressHook).unwrap();
        let err = ddp
            .register_comm_hook(PowerSgdConfig::new().init().unwrap())
            .unwrap_err();
        assert!(err.to_string().contains("register one hook"), "{err}");
    });
    assert!(PowerSgdConfig::new().with_start_iter(1).init().is_err());
    assert!(PowerSgdConfig::new().with_rank(0).init().is_err());
}

/// A hook reads each gradient to the host and runs on the CPU transports, so settings asking
/// for more are refused, naming what to change, instead of being silently ignored.
#[test]
fn hooks_refuse_settings_they_would_ignore() {
    let initial = model(8);
    let per_bucket = || DdpConfig::new().with_host_staging(HostStaging::PerBucket);
    // A registered hook with per-bucket staging.
    run_ranks(2, |pg| {
        let mut ddp = DistributedDataParallel::new(initial.clone(), pg, per_bucket()).unwrap();
        let err = ddp
            .register_comm_hook(PowerSgdConfig::new().init().unwrap())
            .unwrap_err();
        assert!(matches!(err, DdpError::InvalidConfig(_)), "{err}");
        assert!(err.to_string().contains("HostStaging::PerBucket"), "{err}");
        assert!(err.to_string().contains("PerGradient"), "{err}");
    });
    // The compression hooks with per-bucket staging.
    for bf16 in [false, true] {
        run_ranks(2, |pg| {
            let mut ddp = DistributedDataParallel::new(initial.clone(), pg, per_bucket()).unwrap();
            let err = if bf16 {
                ddp.register_comm_hook(Bf16CompressHook).unwrap_err()
            } else {
                ddp.register_comm_hook(Fp16CompressHook).unwrap_err()
            };
            assert!(matches!(err, DdpError::InvalidConfig(_)), "{err}");
            assert!(err.to_string().contains("HostStaging::PerBucket"), "{err}");
            assert!(err.to_string().contains("register no hook"), "{err}");
        });
    }
    // Settings a hook honours are accepted.
    for staging in [HostStaging::Auto, HostStaging::PerGradient] {
        run_ranks(2, |pg| {
            let config = DdpConfig::new().with_host_staging(staging);
            let mut ddp = DistributedDataParallel::new(initial.clone(), pg, config).unwrap();
            ddp.register_comm_hook(PowerSgdConfig::new().init().unwrap())
                .unwrap();
        });
    }
}

#[test]
fn powersgd_keeps_replicas_identical_and_sends_far_fewer_bytes() {
    // Matrices large enough for compression to matter: 6×64 and 64×3.
    let initial = model(64);
    let steps = 12;
    let start = 2;
    let plain = train_with(&initial, 2, steps, DdpConfig::new(), || None);
    let powersgd = train_with(&initial, 2, steps, DdpConfig::new(), || {
        Some(Box::new(
            move |ddp: &mut DistributedDataParallel<B, Mlp<B>>| {
                let hook = PowerSgdConfig::new().with_start_iter(start).init().unwrap();
                ddp.register_comm_hook(hook).unwrap()
            },
        ))
    });
    assert_eq!(
        bits(&powersgd[0].0),
        bits(&powersgd[1].0),
        "replicas differ"
    );
    let diff = max_scaled_diff(&powersgd[0].0, &plain[0].0);
    assert!(diff > 0.0, "PowerSGD changed nothing");
    // Bytes of the compressed steps only: the plain run's per-step bytes times the same steps.
    let per_step = plain[0].1 / steps as u64;
    let compressed = powersgd[0].1 - per_step * start as u64;
    let ratio = (per_step * (steps - start) as u64) as f64 / compressed as f64;
    assert!(ratio >= 3.0, "PowerSGD sent only {ratio:.1}x fewer bytes");
}

/// A bf16 layer under an f32 one: DDP buckets their gradients apart (one bucket per dtype).
#[derive(burn::module::Module, Debug)]
struct MixedDtypes<B: burn::tensor::backend::Backend> {
    low: burn::nn::Linear<B>,
    high: burn::nn::Linear<B>,
}

/// Makes every float parameter a bf16 leaf.
struct ToBf16;

impl burn::module::ModuleMapper<B> for ToBf16 {
    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<Tensor<B, D>>,
    ) -> burn::module::Param<Tensor<B, D>> {
        param.map(|t| {
            t.cast(burn::tensor::FloatDType::BF16)
                .detach()
                .require_grad()
        })
    }
}

/// An exact average that takes its time on rank 0, as a slow hook or a busy thread would.
struct SlowOnRank0;

impl CommHook for SlowOnRank0 {
    fn reduce(&mut self, bucket: &mut GradBucket, pg: &ProcessGroup) -> Result<(), HookError> {
        if pg.rank() == 0 {
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        pg.all_reduce(bucket.buffer_mut(), ReduceOp::Avg)?;
        Ok(())
    }
}

/// With a hook, f32 buckets are reduced on the hook's thread and the bf16 bucket on the
/// backward thread. On rank 1 the hook runs its f32 all-reduce at once while backward still
/// works through a long chain; on rank 0 the hook is slow and backward is quick. The bf16
/// bucket's collective must still follow the hook's on both ranks, or the group sees two orders.
#[test]
fn a_hook_and_a_bucket_of_another_dtype_reach_the_group_in_one_order() {
    use burn::module::Module;
    use burn::nn::LinearConfig;
    use burn::tensor::FloatDType;
    let device = Default::default();
    let initial = MixedDtypes::<B> {
        low: LinearConfig::new(6, 8).init(&device).map(&mut ToBf16),
        high: LinearConfig::new(8, 3).init(&device),
    };
    let results = run_ranks(2, |pg| {
        let rank = pg.rank();
        let mut ddp = DistributedDataParallel::new(initial.clone(), pg, DdpConfig::new())?;
        ddp.register_comm_hook(SlowOnRank0)?;
        let mut sgd = burn::optim::SgdConfig::new().init::<B, MixedDtypes<B>>();
        for step in 0..3 {
            let (x, y) = batch(&samples(rank, step, 0), &Default::default());
            let loss = ddp.forward(|m| {
                let mut h = m
                    .low
                    .forward(x.cast(FloatDType::BF16))
                    .cast(FloatDType::F32);
                if rank == 1 {
                    // Long for backward to walk back through: rank 1's bf16 gradient comes late.
                    for _ in 0..300 {
                        h = h.clone() * 0.5 + h * 0.5;
                    }
                }
                MseLoss::new().forward(m.high.forward(h), y, Reduction::Mean)
            })?;
            let grads = ddp.backward(loss)?;
            ddp.optimizer_step(&mut sgd, LR, grads);
        }
        Ok::<_, DdpError>(flat_params(ddp.module()))
    });
    let params: Vec<Vec<f32>> = results
        .into_iter()
        .enumerate()
        .map(|(rank, r)| r.unwrap_or_else(|e| panic!("rank {rank}: {e}")))
        .collect();
    assert_eq!(bits(&params[1]), bits(&params[0]), "the replicas differ");
}

/// An exact average that counts the buckets it was told end a step.
struct CountsStepEnds(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl CommHook for CountsStepEnds {
    fn reduce(&mut self, bucket: &mut GradBucket, pg: &ProcessGroup) -> Result<(), HookError> {
        if bucket.is_last() {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        pg.all_reduce(bucket.buffer_mut(), ReduceOp::Avg)?;
        Ok(())
    }
}

/// The bf16 layer's bucket comes last, and DDP reduces it itself: the hook's one f32 bucket
/// still ends each step. It was never `is_last`, so PowerSGD, which counts its steps there,
/// stayed at step 0 and never compressed.
#[test]
fn a_hooks_last_f32_bucket_ends_the_step_when_a_bucket_of_another_dtype_follows() {
    use burn::module::Module;
    use burn::nn::LinearConfig;
    use burn::tensor::FloatDType;
    let device = Default::default();
    let initial = MixedDtypes::<B> {
        low: LinearConfig::new(6, 8).init(&device).map(&mut ToBf16),
        high: LinearConfig::new(8, 3).init(&device),
    };
    let steps = 3;
    let ends = run_ranks(2, |pg| {
        let rank = pg.rank();
        let ends = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut ddp = DistributedDataParallel::new(initial.clone(), pg, DdpConfig::new()).unwrap();
        ddp.register_comm_hook(CountsStepEnds(ends.clone()))
            .unwrap();
        let mut sgd = burn::optim::SgdConfig::new().init::<B, MixedDtypes<B>>();
        for step in 0..steps {
            let (x, y) = batch(&samples(rank, step, 0), &Default::default());
            let loss = ddp
                .forward(|m| {
                    let h = m
                        .low
                        .forward(x.cast(FloatDType::BF16))
                        .cast(FloatDType::F32);
                    MseLoss::new().forward(m.high.forward(h), y, Reduction::Mean)
                })
                .unwrap();
            let grads = ddp.backward(loss).unwrap();
            ddp.optimizer_step(&mut sgd, LR, grads);
        }
        ends.load(std::sync::atomic::Ordering::SeqCst)
    });
    assert_eq!(ends, [steps, steps], "steps the hook saw end, per rank");
}

/// Registering replaces the reducer: gradients a `backward_no_sync` accumulated would be lost.
#[test]
fn a_hook_registered_after_a_no_sync_backward_is_refused() {
    let initial = model(8);
    run_ranks(1, |pg| {
        let mut ddp = DistributedDataParallel::new(initial.clone(), pg, DdpConfig::new()).unwrap();
        let loss = ddp.forward(|m| loss_of(m, &samples(0, 0, 0))).unwrap();
        ddp.backward_no_sync(loss).unwrap();
        let err = ddp.register_comm_hook(Fp16CompressHook).unwrap_err();
        assert!(matches!(err, DdpError::InvalidConfig(_)), "{err}");
        assert!(
            err.to_string().contains("before the first forward"),
            "{err}"
        );
    });
}

// ---------------------------------------------------------------------------------------------
// Uneven inputs with buffers and several forwards per backward.

/// A linear layer and a batch norm, whose running statistics are buffers DDP broadcasts.
#[derive(burn::module::Module, Debug)]
struct Normed<B: burn::tensor::backend::Backend> {
    fc: burn::nn::Linear<B>,
    norm: burn::nn::BatchNorm<B>,
}

impl Normed<B> {
    /// The same weights on every rank that builds it; the running statistics are each rank's
    /// own (built here, not cloned: clones share running states).
    fn new() -> Self {
        let device = Default::default();
        Normed {
            fc: seed_weights(burn::nn::LinearConfig::new(6, 4).init(&device), 11),
            norm: burn::nn::BatchNormConfig::new(4).init(&device),
        }
    }

    fn loss(&self, idx: &[usize]) -> Tensor<B, 1> {
        let (x, y) = batch(idx, &Default::default());
        let h = self.fc.forward(x);
        let h = self
            .norm
            .forward(h.unsqueeze_dim::<3>(2))
            .squeeze_dim::<2>(2);
        MseLoss::new().forward(h.slice([0..idx.len(), 0..3]), y, Reduction::Mean)
    }

    /// Parameters, then the running statistics as the module reads them.
    fn state(&self) -> Vec<f32> {
        let mut all = flat_params(self);
        for stat in [
            self.norm.running_mean.value(),
            self.norm.running_var.value(),
        ] {
            all.extend(stat.into_data().iter::<f32>());
        }
        all
    }
}

/// Rank `r` trains `batches[r]` steps of two forwards (each its own micro-batch) and one
/// backward, joins, then all train one step together: each rank's state and answered steps.
fn two_forwards_per_backward(batches: [usize; 2]) -> Vec<Result<(Vec<f32>, usize), DdpError>> {
    run_ranks(2, |pg| {
        let rank = pg.rank();
        let config = DdpConfig::new().with_uneven_inputs(true);
        let mut ddp = DistributedDataParallel::new(Normed::new(), pg, config)?;
        let mut adam = AdamConfig::new().init::<B, Normed<B>>();
        for s in 0..batches[rank] {
            normed_step(&mut ddp, &mut adam, s)?;
        }
        let answered = ddp.join(&mut adam, LR)?;
        normed_step(&mut ddp, &mut adam, 1000)?;
        Ok((ddp.module().state(), answered))
    })
}

/// Two forwards, one backward of their summed loss, one optimizer step.
fn normed_step<O: Optimizer<Normed<B>, B>>(
    ddp: &mut DistributedDataParallel<B, Normed<B>>,
    optim: &mut O,
    step: usize,
) -> Result<(), DdpError> {
    let rank = ddp.process_group().rank();
    let first = ddp.forward(|m| m.loss(&samples(rank, step, 0)))?;
    let second = ddp.forward(|m| m.loss(&samples(rank, step, 1)))?;
    let grads = ddp.backward(first + second)?;
    ddp.optimizer_step(optim, LR, grads);
    Ok(())
}

/// Each forward after the first of a step starts from the buffers of the first rank still
/// training (PyTorch broadcasts them before every forward); a joined rank answers that
/// broadcast too, so a rank that joins early (rank 1, then rank 0, the buffers' usual source)
/// leaves nobody waiting in a mismatched collective, and the replicas, running statistics
/// included, end bitwise equal.
#[test]
fn uneven_inputs_with_batch_norm_and_two_forwards_per_backward_keep_replicas_equal() {
    for batches in [[4, 2], [2, 4]] {
        let got = two_forwards_per_backward(batches);
        let got: Vec<(Vec<f32>, usize)> = got
            .into_iter()
            .enumerate()
            .map(|(rank, r)| r.unwrap_or_else(|e| panic!("batches {batches:?}, rank {rank}: {e}")))
            .collect();
        for (rank, (state, answered)) in got.iter().enumerate() {
            assert_eq!(
                bits(state),
                bits(&got[0].0),
                "batches {batches:?}: rank {rank}'s replica differs from rank 0's"
            );
            assert_eq!(
                *answered,
                4 - batches[rank],
                "batches {batches:?}: rank {rank} answered"
            );
        }
    }
}

/// A layer whose output reads its buffer (a running mean it subtracts), so a forward's result
/// depends on which rank's buffers it starts from.
#[derive(burn::module::Module, Debug)]
struct Centred<B: burn::tensor::backend::Backend> {
    fc: burn::nn::Linear<B>,
    mean: burn::module::RunningState<Tensor<B, 1>>,
}

impl Centred<B> {
    fn new() -> Self {
        let device = Default::default();
        Centred {
            fc: seed_weights(burn::nn::LinearConfig::new(6, 3).init(&device), 12),
            mean: burn::module::RunningState::new(Tensor::zeros([3], &device)),
        }
    }

    fn loss(&self, idx: &[usize]) -> Tensor<B, 1> {
        let (x, y) = batch(idx, &Default::default());
        let h = self.fc.forward(x);
        let mean = self.mean.value();
        let batch_mean = h.clone().mean_dim(0).squeeze_dim::<1>(0).detach();
        self.mean.update(mean.clone() * 0.5 + batch_mean * 0.5);
        MseLoss::new().forward(h - mean.unsqueeze_dim::<2>(0), y, Reduction::Mean)
    }
}

/// With every rank training, uneven inputs change nothing: the second forward of a step starts
/// from rank 0's buffers as without them, so the parameters and buffers match bit for bit.
#[test]
fn a_second_forward_starts_from_rank_zeros_buffers_with_or_without_uneven_inputs() {
    let run = |uneven: bool| {
        run_ranks(2, |pg| {
            let rank = pg.rank();
            let config = DdpConfig::new().with_uneven_inputs(uneven);
            let mut ddp = DistributedDataParallel::new(Centred::new(), pg, config).unwrap();
            let mut adam = AdamConfig::new().init::<B, Centred<B>>();
            for step in 0..3 {
                let first = ddp.forward(|m| m.loss(&samples(rank, step, 0))).unwrap();
                let second = ddp.forward(|m| m.loss(&samples(rank, step, 1))).unwrap();
                let grads = ddp.backward(first + second).unwrap();
                ddp.optimizer_step(&mut adam, LR, grads);
            }
            if uneven {
                ddp.join(&mut adam, LR).unwrap();
            }
            let mut state = flat_params(ddp.module());
            state.extend(ddp.module().mean.value().into_data().iter::<f32>());
            state
        })
    };
    let even = run(false);
    let uneven = run(true);
    for rank in 0..2 {
        assert_eq!(bits(&even[rank]), bits(&even[0]), "rank {rank} differs");
        assert_eq!(
            bits(&uneven[rank]),
            bits(&even[rank]),
            "rank {rank}: uneven inputs changed the training"
        );
    }
}
