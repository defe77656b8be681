//! `step_on`: the caller owns the module and runs its own forward *and* `loss.backward()` in a
//! closure (as burn-train's `TrainStep::step` does); DDP's buckets still fill and launch during
//! that backward, and the result is bit for bit that of `forward` + `backward`.
use crate::common::*;
use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, Relu};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use ddp_core::{DdpConfig, DdpError, DistributedDataParallel, layer_boundary};

/// A layer boundary, a buffer (batch norm), and a parameter (`extra`) some ranks skip.
#[derive(Module, Debug)]
struct Net<B: Backend> {
    fc1: Linear<B>,
    norm: BatchNorm<B>,
    fc2: Linear<B>,
    extra: Linear<B>,
    act: Relu,
}

impl<B: Backend> Net<B> {
    fn new(device: &B::Device, hidden: usize) -> Self {
        Net {
            fc1: LinearConfig::new(6, hidden).init(device),
            norm: BatchNormConfig::new(hidden).init(device),
            fc2: LinearConfig::new(hidden, 3).init(device),
            extra: LinearConfig::new(6, 3).init(device),
            act: Relu::new(),
        }
    }

    fn forward(&self, x: Tensor<B, 2>, use_extra: bool) -> Tensor<B, 2> {
        let h = self.act.forward(self.fc1.forward(x.clone()));
        let h = layer_boundary(h);
        let h = self
            .norm
            .forward(h.unsqueeze_dim::<3>(2))
            .squeeze_dim::<2>(2);
        let y = self.fc2.forward(h);
        if use_extra {
            y + self.extra.forward(x)
        } else {
            y
        }
    }
}

/// Gives every parameter a fresh id: the caller's module need not share the wrapped ids.
struct Reid;

impl<B: Backend> ModuleMapper<B> for Reid {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (_, t, mapper) = param.consume();
        Param::from_mapped_value(ParamId::new(), t, mapper)
    }
}

fn init_bytes() -> Vec<u8> {
    let m = Net::<B>::new(&Default::default(), 8);
    let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
    Recorder::<B>::record(&rec, m.into_record(), ()).unwrap()
}

/// Rank 0 starts from `init`, the others from their own random weights (DDP overwrites them).
fn start(init: &[u8], rank: usize) -> Net<B> {
    let device = Default::default();
    let fresh = Net::<B>::new(&device, 8);
    if rank != 0 {
        return fresh;
    }
    let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
    fresh.load_record(Recorder::<B>::load(&rec, init.to_vec(), &device).unwrap())
}

/// Step `step`, micro-batch `micro` on `rank`: (data, whether `extra` is used). `extra` is
/// unused everywhere, used on rank 0 only, or used everywhere, in turn.
fn data(step: usize, micro: usize, rank: usize) -> (Tensor<B, 2>, Tensor<B, 2>, bool) {
    let idx: Vec<usize> = (0..4)
        .map(|i| 40 * step + 20 * micro + 8 * rank + i)
        .collect();
    let (x, y) = batch(&idx, &Default::default());
    let use_extra = match step % 3 {
        0 => false,
        1 => rank == 0,
        _ => true,
    };
    (x, y, use_extra)
}

const STEPS: usize = 4;

fn config() -> DdpConfig {
    DdpConfig::new()
        .with_bucket_cap_mb(0.0002)
        .with_first_bucket_cap_mb(0.0001)
}

/// The reference: `forward` + `backward` on the wrapped module. Per step: parameters and
/// buffers of the wrapped module.
fn with_forward_backward(init: &[u8], micro_batches: usize) -> Vec<Vec<Vec<f32>>> {
    run_ranks(2, |pg| {
        let rank = pg.rank();
        let mut ddp = DistributedDataParallel::new(start(init, rank), pg, config()).unwrap();
        let mut adam = AdamConfig::new().init::<B, Net<B>>();
        let mut history = Vec::new();
        for step in 0..STEPS {
            for micro in 0..micro_batches {
                let (x, y, extra) = data(step, micro, rank);
                let pred = ddp.forward(|m| m.forward(x, extra)).unwrap();
                let loss = MseLoss::new().forward(pred, y, Reduction::Mean);
                if micro + 1 < micro_batches {
                    ddp.backward_no_sync(loss).unwrap();
                } else {
                    let grads = ddp.backward(loss).unwrap();
                    ddp.optimizer_step(&mut adam, 0.01, grads);
                }
            }
            history.push(flat_params(ddp.module()));
        }
        history
    })
}

/// The same training with `step_on`: the caller owns the module (with ids of its own) and the
/// optimizer, and the closure calls a plain `loss.backward()`. Per step: the caller's module,
/// and (buckets, buckets launched during the closure, early gradients).
#[allow(clippy::type_complexity)]
fn with_step_on(
    init: &[u8],
    micro_batches: usize,
) -> Vec<(Vec<Vec<f32>>, Vec<(usize, usize, usize)>)> {
    run_ranks(2, |pg| {
        let rank = pg.rank();
        let mut ddp = DistributedDataParallel::new(start(init, rank), pg, config()).unwrap();
        let mut model = ddp.module().clone().map(&mut Reid);
        let mut adam = AdamConfig::new().init::<B, Net<B>>();
        let (mut history, mut stats) = (Vec::new(), Vec::new());
        for step in 0..STEPS {
            for micro in 0..micro_batches {
                let (x, y, extra) = data(step, micro, rank);
                let f = |m: &Net<B>| {
                    let loss = MseLoss::new().forward(m.forward(x, extra), y, Reduction::Mean);
                    // What the tapped copy keeps: nothing (DDP took the gradients).
                    GradientsParams::from_grads(loss.backward(), m).len()
                };
                if micro + 1 < micro_batches {
                    ddp.step_on_no_sync(&model, f).unwrap();
                } else {
                    let (left, grads) = ddp.step_on(&model, f).unwrap();
                    assert_eq!(left, 0, "the taps keep the gradients");
                    model = adam.step(0.01, model, grads);
                    let s = ddp.last_step_stats().expect("stats of a synchronised step");
                    stats.push((
                        s.buckets,
                        s.buckets_launched_during_backward,
                        s.early_gradients,
                    ));
                }
            }
            history.push(flat_params(&model));
        }
        (history, stats)
    })
}

fn assert_bitwise(what: &str, a: &[Vec<Vec<f32>>], b: &[Vec<Vec<f32>>]) {
    for (rank, (a, b)) in a.iter().zip(b).enumerate() {
        for (step, (a, b)) in a.iter().zip(b).enumerate() {
            assert!(
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{what}: rank {rank} differs after step {step}"
            );
        }
    }
}

#[test]
fn step_on_equals_forward_and_backward_bitwise() {
    let init = init_bytes();
    let reference = with_forward_backward(&init, 1);
    let (closure, _): (Vec<_>, Vec<_>) = with_step_on(&init, 1).into_iter().unzip();
    assert_bitwise("step_on vs forward/backward", &reference, &closure);
    assert_bitwise("rank 1 vs rank 0", &closure[..1], &closure[1..]);
}

#[test]
fn step_on_no_sync_accumulates_like_backward_no_sync() {
    let init = init_bytes();
    let reference = with_forward_backward(&init, 2);
    let (closure, _): (Vec<_>, Vec<_>) = with_step_on(&init, 2).into_iter().unzip();
    assert_bitwise("step_on_no_sync vs backward_no_sync", &reference, &closure);
}

/// Deterministic (counts, not timings): the buckets' all-reduces were issued from inside the
/// closure's plain `loss.backward()`, by the tap events, not after it. Buckets launch in order,
/// so a bucket holding a parameter this rank did not use waits for `finish`, and so do the
/// ones after it: in step 0 that is all of them (the initial layout, reverse registration
/// order, puts `extra` first); from step 1 buckets follow rank 0's arrival order, where the
/// unused `extra` comes last.
#[test]
fn step_on_issues_the_buckets_during_the_closures_backward() {
    let init = init_bytes();
    for (rank, (_, stats)) in with_step_on(&init, 1).into_iter().enumerate() {
        eprintln!("rank {rank}: (buckets, launched during backward, early gradients) {stats:?}");
        for (step, &(buckets, during, early)) in stats.iter().enumerate().skip(1) {
            assert!(buckets >= 3, "small buckets: {buckets}");
            let used_here = step % 3 == 2 || (step % 3 == 1 && rank == 0);
            if used_here {
                assert_eq!(
                    during, buckets,
                    "rank {rank} step {step}: every bucket starts during backward"
                );
            } else {
                // `extra` (one weight and one bias slot) is in at most the last two buckets.
                assert!(
                    during + 2 >= buckets && during >= 1,
                    "rank {rank} step {step}: {during} of {buckets} buckets during backward"
                );
            }
            assert!(
                early > 0,
                "rank {rank} step {step}: the boundary handed over none"
            );
        }
    }
}

#[test]
fn step_on_rejects_a_module_with_another_layout_on_every_rank() {
    let init = init_bytes();
    let results = run_ranks(2, |pg| {
        let rank = pg.rank();
        let mut ddp = DistributedDataParallel::new(start(&init, rank), pg, config()).unwrap();
        let model = if rank == 1 {
            Net::<B>::new(&Default::default(), 4) // another hidden size
        } else {
            ddp.module().clone()
        };
        let (x, y, _) = data(0, 0, rank);
        let result = ddp.step_on(&model, |m| {
            MseLoss::new()
                .forward(m.forward(x, true), y, Reduction::Mean)
                .backward();
        });
        let again = ddp.step_on(&model, |_| ());
        (result.map(drop), again.map(drop))
    });
    match &results[1].0 {
        Err(DdpError::ModelMismatch(why)) => {
            assert!(
                why.contains("parameter layout") && why.contains("fc1.weight"),
                "{why}"
            );
        }
        other => panic!("rank 1: expected a layout error, got {other:?}"),
    }
    // Rank 0 fails too (the group was aborted with rank 1's reason), instead of hanging.
    assert!(results[0].0.is_err(), "rank 0 went on alone");
    for (rank, (_, again)) in results.iter().enumerate() {
        assert!(
            matches!(again, Err(DdpError::Poisoned { .. })),
            "rank {rank}: errors are final, got {again:?}"
        );
    }
}

#[test]
fn step_on_without_a_backward_in_the_closure_is_an_error() {
    let init = init_bytes();
    let results = run_ranks(1, |pg| {
        let mut ddp = DistributedDataParallel::new(start(&init, 0), pg, config()).unwrap();
        let model = ddp.module().clone();
        let (x, _, _) = data(0, 0, 0);
        ddp.step_on(&model, |m| m.forward(x, true)).map(drop)
    });
    assert!(
        matches!(results[0], Err(DdpError::NoGradients)),
        "{:?}",
        results[0]
    );
}

/// `step_on`'s two misuse errors name the rule and what to do, as one readable sentence (they
/// once carried runs of spaces from a line break inside the string).
#[test]
fn step_on_misuse_errors_name_the_rule_in_readable_text() {
    let init = init_bytes();
    let uneven = run_ranks(1, |pg| {
        let config = config().with_uneven_inputs(true);
        let mut ddp = DistributedDataParallel::new(start(&init, 0), pg, config).unwrap();
        let model = ddp.module().clone();
        let (x, _, _) = data(0, 0, 0);
        ddp.step_on(&model, |m| m.forward(x, true)).map(drop)
    });
    let pending = run_ranks(1, |pg| {
        let mut ddp = DistributedDataParallel::new(start(&init, 0), pg, config()).unwrap();
        let (x, _, _) = data(0, 0, 0);
        let _waiting = ddp.forward(|m| m.forward(x.clone(), true)).unwrap();
        let model = ddp.module().clone();
        ddp.step_on(&model, |m| m.forward(x, true)).map(drop)
    });
    for (err, words) in [
        (&uneven[0], ["uneven_inputs", "forward/backward/join"]),
        (&pending[0], ["waits for its backward", "backward_no_sync"]),
    ] {
        let Err(DdpError::InvalidConfig(message)) = err else {
            panic!("expected InvalidConfig, got {err:?}");
        };
        assert!(words.iter().all(|w| message.contains(w)), "{message}");
        assert!(!message.contains("  "), "a run of spaces in: {message:?}");
    }
}
