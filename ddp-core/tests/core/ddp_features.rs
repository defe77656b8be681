//! DDP options: layer boundaries, compression, timeline, tied parameters, buffers.
use crate::common::*;
use burn::module::{Module, Param};
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, Relu};
use burn::optim::SgdConfig;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use ddp_core::hooks::{Bf16CompressHook, Fp16CompressHook};
use ddp_core::{DdpConfig, DistributedDataParallel, layer_boundary};

/// Three layers with boundaries between them when `marked`.
#[derive(Module, Debug)]
struct Deep<B: Backend> {
    l1: Linear<B>,
    l2: Linear<B>,
    l3: Linear<B>,
    act: Relu,
}

impl<B: Backend> Deep<B> {
    fn new(device: &B::Device) -> Self {
        Deep {
            l1: LinearConfig::new(6, 32).init(device),
            l2: LinearConfig::new(32, 32).init(device),
            l3: LinearConfig::new(32, 3).init(device),
            act: Relu::new(),
        }
    }
    fn forward(&self, x: Tensor<B, 2>, marked: bool) -> Tensor<B, 2> {
        let mark = |t: Tensor<B, 2>| if marked { layer_boundary(t) } else { t };
        let x = mark(self.act.forward(self.l1.forward(x)));
        let x = mark(self.act.forward(self.l2.forward(x)));
        self.l3.forward(x)
    }
}

/// A model whose lazy parameters are initialised, so that its clones share their values (a clone
/// of an uninitialised burn module draws new ones).
fn initial_deep() -> Deep<B> {
    let m = Deep::<B>::new(&Default::default());
    flat_params(&m);
    m
}

/// Trains from one initial model: burn's RNG is global, so models created concurrently on rank
/// threads would depend on the interleaving.
fn train_deep_from(initial: &Deep<B>, marked: bool, config: DdpConfig) -> Vec<(Vec<f32>, usize)> {
    train_deep(initial, marked, config, None)
}

/// The half-precision compression hooks.
#[derive(Debug, Clone, Copy)]
enum Compress {
    Fp16,
    Bf16,
}

fn register(ddp: &mut DistributedDataParallel<B, Deep<B>>, compress: Option<Compress>) {
    match compress {
        Some(Compress::Fp16) => ddp.register_comm_hook(Fp16CompressHook).unwrap(),
        Some(Compress::Bf16) => ddp.register_comm_hook(Bf16CompressHook).unwrap(),
        None => {}
    }
}

fn train_deep(
    initial: &Deep<B>,
    marked: bool,
    config: DdpConfig,
    compress: Option<Compress>,
) -> Vec<(Vec<f32>, usize)> {
    run_ranks(2, |pg| {
        let device = Default::default();
        let rank = pg.rank();
        let mut ddp = DistributedDataParallel::new(initial.clone(), pg, config.clone()).unwrap();
        register(&mut ddp, compress);
        let mut sgd = SgdConfig::new().init::<B, Deep<B>>();
        let mut early = 0;
        for step in 0..4 {
            let idx: Vec<usize> = (0..4).map(|i| step * 8 + i * 2 + rank).collect();
            let (x, y) = batch(&idx, &device);
            let pred = ddp.forward(|m| m.forward(x, marked)).unwrap();
            let grads = ddp
                .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                .unwrap();
            early += ddp.last_step_stats().unwrap().early_gradients;
            ddp.optimizer_step(&mut sgd, 0.1, grads);
        }
        (flat_params(ddp.module()), early)
    })
}

fn small_buckets() -> DdpConfig {
    // ~1 KiB buckets: several buckets even for this small model.
    DdpConfig::new()
        .with_bucket_cap_mb(0.001)
        .with_first_bucket_cap_mb(0.001)
}

#[test]
fn layer_boundaries_hand_gradients_over_early_and_change_nothing() {
    let initial = initial_deep();
    let plain = train_deep_from(&initial, false, small_buckets());
    let marked = train_deep_from(&initial, true, small_buckets());
    assert_eq!(
        plain[0].1, 0,
        "without boundaries nothing is handed over early"
    );
    assert!(
        marked[0].1 > 0,
        "boundaries must hand some gradients over early"
    );
    for r in 0..2 {
        assert_eq!(
            marked[r].0, plain[r].0,
            "rank {r}: boundaries must not change the result"
        );
    }
    assert_eq!(marked[0].0, marked[1].0);
}

#[test]
fn layer_boundary_outside_ddp_is_the_identity() {
    let device = Default::default();
    let x = Tensor::<B, 2>::ones([2, 3], &device);
    let y = layer_boundary(x.clone());
    assert_eq!(x.into_data(), y.into_data());
}

#[test]
fn fp16_and_bf16_compression_stay_close_and_identical_across_ranks() {
    let initial = initial_deep();
    let exact = train_deep_from(&initial, false, DdpConfig::new());
    for c in [Compress::Fp16, Compress::Bf16] {
        let got = train_deep(&initial, false, DdpConfig::new(), Some(c));
        assert_eq!(got[0].0, got[1].0, "{c:?}: replicas identical");
        // Relative to the weights' scale: half precision keeps ~3 significant digits, so a
        // weight near zero can differ by more than itself.
        let scale = exact[0].0.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let diff = got[0]
            .0
            .iter()
            .zip(&exact[0].0)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
            / scale;
        assert!(
            diff < 0.01,
            "{c:?}: differs from f32 by {diff} of the largest weight"
        );
        assert!(
            got[0].0 != exact[0].0,
            "{c:?}: compression had no effect at all"
        );
    }
}

#[test]
fn timeline_writes_a_chrome_trace_with_every_phase() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    let config = small_buckets().with_timeline_path(Some(path.display().to_string()));
    let stats = run_ranks(2, |pg| {
        let device = Default::default();
        let mut ddp =
            DistributedDataParallel::new(Deep::<B>::new(&device), pg, config.clone()).unwrap();
        let mut sgd = SgdConfig::new().init::<B, Deep<B>>();
        let (x, y) = batch(&[0, 1, 2], &device);
        let pred = ddp.forward(|m| m.forward(x, true)).unwrap();
        let grads = ddp
            .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
            .unwrap();
        ddp.optimizer_step(&mut sgd, 0.1, grads);
        ddp.last_step_stats().cloned().unwrap()
    });
    let text = std::fs::read_to_string(&path).expect("rank 0 wrote the trace");
    for phase in [
        "forward",
        "backward",
        "bucket 0 ready",
        "all_reduce bucket 0",
        "unpack bucket 0",
        "optimizer",
    ] {
        assert!(
            text.contains(&format!("\"{phase}\"")),
            "trace lacks {phase}"
        );
    }
    assert!(text.starts_with("{\"traceEvents\":["));
    assert!(stats[0].buckets > 1);
    assert!(stats[0].comm > std::time::Duration::ZERO);
    assert!((0.0..=1.0).contains(&stats[0].overlap_fraction()));
}

/// A timeline file that cannot be written (its directory does not exist) is a warning that
/// turns the timeline off, not an error that ends training and aborts the peers.
#[test]
fn an_unwritable_timeline_turns_itself_off_and_training_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no such directory").join("trace.json");
    let config = small_buckets().with_timeline_path(Some(path.display().to_string()));
    let outcomes = run_ranks(2, |pg| {
        let device = Default::default();
        let mut ddp =
            DistributedDataParallel::new(Deep::<B>::new(&device), pg, config.clone()).unwrap();
        let mut sgd = SgdConfig::new().init::<B, Deep<B>>();
        (0..2)
            .map(|step| {
                let (x, y) = batch(&[step, step + 1], &device);
                let pred = ddp.forward(|m| m.forward(x, true))?;
                let grads = ddp.backward(MseLoss::new().forward(pred, y, Reduction::Mean))?;
                ddp.optimizer_step(&mut sgd, 0.1, grads);
                Ok(())
            })
            .collect::<Result<Vec<()>, ddp_core::DdpError>>()
    });
    for (rank, outcome) in outcomes.iter().enumerate() {
        assert!(outcome.is_ok(), "rank {rank}: {outcome:?}");
    }
    assert!(!path.exists());
}

/// A weight used twice (tied): its gradient must be the sum of both uses.
#[derive(Module, Debug)]
struct Tied<B: Backend> {
    w: Param<Tensor<B, 2>>,
}

#[test]
fn tied_parameter_used_twice_gets_its_full_gradient() {
    let results = run_ranks(2, |pg| {
        let device = Default::default();
        let model = Tied::<B> {
            w: Param::from_tensor(Tensor::ones([3, 3], &device)),
        };
        let mut ddp = DistributedDataParallel::new(model, pg, DdpConfig::new()).unwrap();
        let mut sgd = SgdConfig::new().init::<B, Tied<B>>();
        let x = Tensor::<B, 2>::ones([1, 3], &device);
        // y = (x W) W: W is used by two matmuls.
        let y = ddp
            .forward(|m| x.clone().matmul(m.w.val()).matmul(m.w.val()))
            .unwrap();
        let grads = ddp.backward(y.sum()).unwrap();
        ddp.optimizer_step(&mut sgd, 1.0, grads);
        flat_params(ddp.module())
    });
    // Single-process reference with plain autodiff.
    let device = Default::default();
    let w = Tensor::<B, 2>::ones([3, 3], &device).require_grad();
    let x = Tensor::<B, 2>::ones([1, 3], &device);
    let g = x.matmul(w.clone()).matmul(w.clone()).sum().backward();
    let expected: Vec<f32> = (Tensor::<B, 2>::ones([3, 3], &device).inner() - w.grad(&g).unwrap())
        .into_data()
        .to_vec()
        .unwrap();
    assert_eq!(results[0], expected);
    assert_eq!(results[1], expected);
}

/// Batch norm's running statistics are buffers: rank 0's are copied to every rank before each
/// forward (PyTorch's broadcast_buffers default).
#[derive(Module, Debug)]
struct WithNorm<B: Backend> {
    fc: Linear<B>,
    norm: BatchNorm<B>,
}

fn train_with_norm(broadcast_buffers: bool) -> Vec<Vec<f32>> {
    run_ranks(2, |pg| {
        let device = Default::default();
        let rank = pg.rank();
        let model = WithNorm::<B> {
            fc: LinearConfig::new(6, 4).init(&device),
            norm: BatchNormConfig::new(4).init(&device),
        };
        let config = DdpConfig::new().with_broadcast_buffers(broadcast_buffers);
        let mut ddp = DistributedDataParallel::new(model, pg, config).unwrap();
        let mut sgd = SgdConfig::new().init::<B, WithNorm<B>>();
        for step in 0..3 {
            // Different data per rank: local running stats would diverge.
            let idx: Vec<usize> = (0..4).map(|i| 100 * rank + step * 4 + i).collect();
            let (x, y) = batch(&idx, &device);
            let pred = ddp
                .forward(|m| {
                    let h = m.fc.forward(x);
                    m.norm.forward(h.unsqueeze_dim::<3>(2)).squeeze_dim::<2>(2)
                })
                .unwrap();
            let y = y.slice([0..4, 0..3]).pad((0, 1, 0, 0), 0.0);
            let grads = ddp
                .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                .unwrap();
            ddp.optimizer_step(&mut sgd, 0.1, grads);
        }
        // One more forward syncs buffers from rank 0 before running.
        let (x, _) = batch(&[0], &device);
        let _ = ddp.forward(|m| m.fc.forward(x)).unwrap();
        flat_params(ddp.module())
    })
}

#[test]
fn buffers_follow_rank_zero() {
    let synced = train_with_norm(true);
    assert_eq!(
        synced[0], synced[1],
        "parameters and running statistics match rank 0"
    );
    let local = train_with_norm(false);
    assert_ne!(
        local[0], local[1],
        "without the broadcast the running statistics diverge"
    );
}

/// With boundaries marked, a boundary hands over the taps that have not fired yet: plain taps
/// (which fire at the end of backward) are all handed over early; anchored taps
/// (`automatic_overlap`) mostly fire on their own, right after their layer's backward, so fewer
/// are left to hand over. Deterministic: it observes the order of backward's steps, not time.
#[test]
fn automatic_overlap_fires_taps_before_the_end_of_backward_and_changes_nothing() {
    let initial = initial_deep();
    let run = |automatic: bool| {
        run_ranks(2, |pg| {
            let device = Default::default();
            let rank = pg.rank();
            let config = small_buckets().with_automatic_overlap(automatic);
            let mut ddp = DistributedDataParallel::new(initial.clone(), pg, config).unwrap();
            let mut sgd = SgdConfig::new().init::<B, Deep<B>>();
            let mut early = Vec::new();
            for step in 0..4 {
                let idx: Vec<usize> = (0..4).map(|i| step * 8 + i * 2 + rank).collect();
                let (x, y) = batch(&idx, &device);
                let pred = ddp.forward(|m| m.forward(x, true)).unwrap();
                let grads = ddp
                    .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                    .unwrap();
                early.push(ddp.last_step_stats().unwrap().early_gradients);
                ddp.optimizer_step(&mut sgd, 0.1, grads);
            }
            (flat_params(ddp.module()), early)
        })
    };
    let plain = run(false);
    let anchored = run(true);
    for r in 0..2 {
        let diff = max_scaled_diff(&anchored[r].0, &plain[r].0);
        assert!(
            diff < 1e-6,
            "rank {r}: anchored taps changed the result by {diff}"
        );
        assert!(
            plain[r].1.iter().all(|&e| e > 0),
            "rank {r}: plain taps wait for the boundaries: {:?}",
            plain[r].1
        );
        // Step 0 learns the depths (plain taps); from step 1 on most taps fire on their own.
        assert_eq!(anchored[r].1[0], plain[r].1[0], "rank {r}: step 0 learns");
        for step in 1..4 {
            assert!(
                anchored[r].1[step] < plain[r].1[step],
                "rank {r} step {step}: anchored taps must fire before the boundaries reach \
                 more of them than plain taps: {:?} vs {:?}",
                anchored[r].1,
                plain[r].1
            );
        }
    }
    assert_eq!(anchored[0].0, anchored[1].0, "replicas differ");
}

/// Records when backward passes it: an identity autodiff op whose backward notes the time, a
/// reference point inside backward for the buckets' readiness.
mod clock {
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{Tensor, TensorPrimitive};
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    pub type Seen = Arc<Mutex<Option<Instant>>>;

    #[derive(Debug)]
    struct Clock;

    impl Backward<Flex, 1> for Clock {
        type State = Seen;
        fn backward(self, ops: Ops<Seen, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
            *ops.state.lock().unwrap() = Some(Instant::now());
            unary::<Flex, _>(ops.parents, ops.node, grads, |g| g);
        }
    }

    pub fn clock(x: Tensor<Autodiff<Flex>, 2>, seen: &Seen) -> Tensor<Autodiff<Flex>, 2> {
        let t = x.into_primitive().tensor();
        let out = match Clock
            .prepare::<NoCheckpointing>([t.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(seen.clone(), t.primitive),
            OpsKind::UnTracked(prep) => prep.finish(t.primitive),
        };
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }
}

/// Per-bucket readiness (`StepStats::bucket_ready`, relative to the end of backward) is
/// observed against a clock op between the first and second layer: backward passes it after
/// the upper layers' backward and before the first layer's. Plain taps fire at the end of
/// backward, so no bucket is ready before the clock; with boundaries the upper layers' buckets
/// are. Deterministic: it compares the order of events on the backward thread, not durations.
#[test]
fn bucket_readiness_shows_which_buckets_left_before_the_end_of_backward() {
    let initial = initial_deep();
    let run = |marked: bool, config: DdpConfig| {
        run_ranks(2, |pg| {
            let device = Default::default();
            let rank = pg.rank();
            let mut ddp =
                DistributedDataParallel::new(initial.clone(), pg, config.clone()).unwrap();
            let mut sgd = SgdConfig::new().init::<B, Deep<B>>();
            let mut before_clock = Vec::new();
            for step in 0..3 {
                let idx: Vec<usize> = (0..4).map(|i| step * 8 + i * 2 + rank).collect();
                let (x, y) = batch(&idx, &device);
                let seen = clock::Seen::default();
                let pred = ddp
                    .forward(|m| {
                        let mark = |t| if marked { layer_boundary(t) } else { t };
                        let h = m.act.forward(m.l1.forward(x));
                        let h = mark(clock::clock(h, &seen));
                        let h = mark(m.act.forward(m.l2.forward(h)));
                        m.l3.forward(h)
                    })
                    .unwrap();
                let grads = ddp
                    .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                    .unwrap();
                let stats = ddp.last_step_stats().unwrap();
                let end = stats.backward_end.unwrap();
                let at = seen.lock().unwrap().expect("backward passed the clock");
                let clock_vs_end = -(end - at).as_secs_f64();
                assert_eq!(stats.bucket_ready.len(), stats.buckets);
                assert!(stats.bucket_ready.iter().all(|r| r.is_finite()));
                before_clock.push(
                    stats
                        .bucket_ready
                        .iter()
                        .filter(|&&r| r < clock_vs_end)
                        .count(),
                );
                ddp.optimizer_step(&mut sgd, 0.1, grads);
            }
            before_clock
        })
    };
    let plain = run(false, small_buckets().with_automatic_overlap(false));
    let marked = run(true, small_buckets().with_automatic_overlap(false));
    let automatic = run(false, small_buckets().with_automatic_overlap(true));
    for r in 0..2 {
        // Step 0 learns where to anchor (plain taps); then the anchored taps of the upper
        // layers fire right after their layer, before backward reaches the clock.
        assert_eq!(automatic[r][0], 0, "rank {r}: the first step learns");
        assert!(
            automatic[r][1..].iter().all(|&n| n > 0),
            "rank {r}: automatic overlap, no marks: {:?}",
            automatic[r]
        );
        assert!(
            plain[r].iter().all(|&n| n == 0),
            "rank {r}: plain taps fire at the end of backward: {:?}",
            plain[r]
        );
        assert!(
            marked[r].iter().all(|&n| n > 0),
            "rank {r}: boundaries hand the upper layers' buckets over before the first layer's \
             backward: {:?}",
            marked[r]
        );
    }
}

/// Buckets are laid out once from the first backward's arrival order; with automatic overlap
/// that backward learns with plain taps, whose order is not the layers' order, so the first
/// backward whose taps are anchored on every rank lays them out again, once: in the order
/// anchored taps arrive, which is the order layer boundaries give.
#[test]
fn automatic_overlap_lays_buckets_out_again_once_from_the_first_anchored_step() {
    let initial = {
        let m = Fan::<B>::new(&Default::default());
        flat_params(&m);
        m
    };
    let run = |automatic: bool| {
        run_ranks(2, |pg| {
            let device = Default::default();
            let rank = pg.rank();
            let config = small_buckets().with_automatic_overlap(automatic);
            let mut ddp = DistributedDataParallel::new(initial.clone(), pg, config).unwrap();
            let mut sgd = SgdConfig::new().init::<B, Fan<B>>();
            let mut layouts = Vec::new();
            for step in 0..4 {
                let idx: Vec<usize> = (0..4).map(|i| step * 8 + i * 2 + rank).collect();
                let (x, y) = batch(&idx, &device);
                let pred = ddp.forward(|m| m.forward(x, 0)).unwrap();
                let grads = ddp
                    .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                    .unwrap();
                ddp.optimizer_step(&mut sgd, 0.1, grads);
                layouts.push(ddp.bucket_assignment());
            }
            layouts
        })
    };
    let plain = run(false);
    let automatic = run(true);
    for r in 0..2 {
        assert_eq!(
            automatic[r][0], plain[r][0],
            "rank {r}: the learning step's taps are plain"
        );
        assert_ne!(
            automatic[r][1], automatic[r][0],
            "rank {r}: the first anchored step lays the buckets out again"
        );
        assert!(
            automatic[r][2..].iter().all(|l| *l == automatic[r][1]),
            "rank {r}: and never again: {:?}",
            automatic[r]
        );
        assert!(plain[r][1..].iter().all(|l| *l == plain[r][0]));
    }
    assert_eq!(automatic[0], automatic[1], "every rank has the same layout");
    // Slots are in registration order (inp, a, b, c, shared, extra, out; weight then bias):
    // after the re-layout the output layer comes first and the input layer last.
    let order: Vec<usize> = automatic[0][1].iter().flatten().copied().collect();
    let position = |slot: usize| order.iter().position(|&s| s == slot).unwrap();
    assert!(
        position(12) < position(8) && position(8) < position(0),
        "out before shared before inp: {order:?}"
    );
}

/// Backward sums several contributions into one node (a fan-out of four, a layer used twice):
/// burn adds them in the order its schedule reaches them, so a tap that moved any other node
/// would change the floating-point result.
#[derive(Module, Debug)]
struct Fan<B: Backend> {
    inp: Linear<B>,
    a: Linear<B>,
    b: Linear<B>,
    c: Linear<B>,
    shared: Linear<B>,
    extra: Linear<B>,
    out: Linear<B>,
    act: Relu,
}

impl<B: Backend> Fan<B> {
    fn new(device: &B::Device) -> Self {
        let l = |i, o| LinearConfig::new(i, o).init(device);
        Fan {
            inp: l(6, 16),
            a: l(16, 16),
            b: l(16, 16),
            c: l(16, 16),
            shared: l(16, 16),
            extra: l(16, 16),
            out: l(16, 3),
            act: Relu::new(),
        }
    }

    /// `variant` 0: the usual graph; 1: the same parameters, a deeper graph; 2: `extra` is
    /// used, and the fan-out skipped.
    fn forward(&self, x: Tensor<B, 2>, variant: usize) -> Tensor<B, 2> {
        let h = self.act.forward(self.inp.forward(x));
        let h = if variant == 2 {
            self.extra.forward(h)
        } else {
            self.a.forward(h.clone()) + self.b.forward(h.clone()) + self.c.forward(h.clone()) + h
        };
        let h = if variant == 1 {
            (h * 1.0 + 0.0) * 1.0
        } else {
            h
        };
        let h = self.act.forward(self.shared.forward(h));
        let h = self.act.forward(self.shared.forward(h));
        self.out.forward(h)
    }
}

/// Anchored taps (automatic overlap) move no other node of the graph, so every step's result is
/// bitwise the one of plain taps, including steps whose graph changed: a deeper graph is seen
/// (the loss's depth) and learned again; a forward that uses other parameters gets plain taps
/// from its first difference on.
#[test]
fn automatic_overlap_is_bitwise_plain_taps_and_learns_again_when_the_graph_changes() {
    let initial = {
        let m = Fan::<B>::new(&Default::default());
        flat_params(&m);
        m
    };
    // Per step: the forward's variant.
    let variants = [0, 0, 1, 0, 0, 2, 0, 0];
    let run = |automatic: bool| {
        run_ranks(2, |pg| {
            let device = Default::default();
            let rank = pg.rank();
            let config = small_buckets().with_automatic_overlap(automatic);
            let mut ddp = DistributedDataParallel::new(initial.clone(), pg, config).unwrap();
            let mut sgd = SgdConfig::new().init::<B, Fan<B>>();
            let mut history = Vec::new();
            for (step, &variant) in variants.iter().enumerate() {
                let idx: Vec<usize> = (0..4).map(|i| step * 8 + i * 2 + rank).collect();
                let (x, y) = batch(&idx, &device);
                let pred = ddp.forward(|m| m.forward(x, variant)).unwrap();
                let grads = ddp
                    .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                    .unwrap();
                let anchored = ddp.last_step_stats().unwrap().anchored_taps;
                ddp.optimizer_step(&mut sgd, 0.1, grads);
                history.push((flat_params(ddp.module()), anchored));
            }
            history
        })
    };
    let plain = run(false);
    let anchored = run(true);
    let taps: Vec<usize> = anchored[0].iter().map(|(_, a)| *a).collect();
    for r in 0..2 {
        for step in 0..variants.len() {
            assert_eq!(plain[r][step].1, 0);
            assert!(
                anchored[r][step]
                    .0
                    .iter()
                    .zip(&plain[r][step].0)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "rank {r} step {step}: anchored taps changed the result (anchored {taps:?})"
            );
        }
    }
    for (step, (a, b)) in anchored[0].iter().zip(&anchored[1]).enumerate() {
        assert_eq!(a.0, b.0, "step {step}: replicas differ");
    }
    assert_eq!(taps[0], 0, "step 0 learns: {taps:?}");
    assert!(taps[1] > 6, "step 1 anchors most taps: {taps:?}");
    assert_eq!(
        taps[2], taps[1],
        "step 2 (deeper) is seen only after it: {taps:?}"
    );
    assert_eq!(taps[3], 0, "step 3 learns again: {taps:?}");
    assert_eq!(taps[4], taps[1], "step 4 anchors again: {taps:?}");
    assert!(
        taps[5] < taps[1],
        "step 5 uses other parameters: plain taps from the first difference: {taps:?}"
    );
    assert_eq!(taps[6], 0, "step 6 learns again: {taps:?}");
    assert_eq!(taps[7], taps[1], "step 7 anchors again: {taps:?}");
}

/// Ranks configured with different bucket caps would reduce buckets of different sizes (NCCL
/// would hang or add unrelated gradients): the first backward names the rank that differs.
#[test]
fn different_bucket_layouts_are_a_named_error_before_any_bucket_is_reduced() {
    let initial = initial_deep();
    let errors = run_ranks(3, |pg| {
        let device = Default::default();
        let rank = pg.rank();
        let config = if rank == 2 {
            DdpConfig::new()
        } else {
            small_buckets()
        };
        let mut ddp = DistributedDataParallel::new(initial.clone(), pg, config).unwrap();
        let (x, y) = batch(&[rank, rank + 3], &device);
        let pred = ddp.forward(|m| m.forward(x, false)).unwrap();
        match ddp.backward(MseLoss::new().forward(pred, y, Reduction::Mean)) {
            Ok(_) => panic!("rank {rank}: mismatched layouts were reduced"),
            Err(e) => e.to_string(),
        }
    });
    for (rank, e) in errors.iter().enumerate() {
        assert!(
            e.contains("bucket layouts differ across ranks before the first bucket")
                && e.contains("rank(s) 2 differ from rank 0")
                && e.contains(&format!("this is rank {rank}")),
            "rank {rank}: {e}"
        );
    }
}

/// NCCL asked for where it cannot run is refused at construction, saying why, on every rank.
#[test]
fn nccl_collectives_on_the_cpu_backend_are_refused_with_the_reason() {
    let initial = initial_deep();
    let errors = run_ranks(2, |pg| {
        let config = DdpConfig::new().with_collectives(ddp_core::Collectives::Nccl);
        match DistributedDataParallel::new(initial.clone(), pg, config) {
            Ok(_) => panic!("NCCL was accepted for a CPU model"),
            Err(e) => e.to_string(),
        }
    });
    let reason = if cfg!(feature = "cuda") {
        "reduces buffers of burn's CUDA backend in place"
    } else {
        "needs ddp-core built with its `cuda` feature"
    };
    for e in errors {
        assert!(
            e.contains("invalid DDP config") && e.contains(reason),
            "{e}"
        );
    }
}

/// A communication hook's run is its bucket's communication: the step statistics (and the
/// timeline) count it, as they count the built-in all-reduce.
#[test]
fn hook_buckets_report_their_communication_time() {
    let initial = initial_deep();
    let comm = run_ranks(2, |pg| {
        let device = Default::default();
        let mut ddp = DistributedDataParallel::new(initial.clone(), pg, small_buckets()).unwrap();
        register(&mut ddp, Some(Compress::Fp16));
        let (x, y) = batch(&[0, 1, 2], &device);
        let pred = ddp.forward(|m| m.forward(x, false)).unwrap();
        ddp.backward(MseLoss::new().forward(pred, y, Reduction::Mean))
            .unwrap();
        let stats = ddp.last_step_stats().unwrap().clone();
        (stats.buckets, stats.comm)
    });
    for (buckets, comm) in comm {
        assert!(buckets > 1, "several buckets");
        assert!(!comm.is_zero(), "the hooks' time is counted");
    }
}
