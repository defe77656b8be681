//! The DDP strategy against burn-train's single-process semantics, with ranks as threads (each
//! with its own process group over a local store), deterministic: seeded weights, seeded
//! sampler, no timing assertions.

use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::DataLoader;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::SgdConfig;
use burn::optim::lr_scheduler::LrScheduler;
use burn::optim::momentum::MomentumConfig;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use burn_train::metric::store::{Aggregate, Direction, EventStoreClient, Split};
use burn_train::metric::{AccuracyMetric, LossMetric, Metric};
use burn_train::{
    ClassificationOutput, EarlyStoppingStrategy, InferenceStep, Learner,
    MetricEarlyStoppingStrategy, StoppingCondition, SupervisedTraining, TrainOutput, TrainStep,
};
use ddp_core::{
    DdpConfig,
    comm::{ProcessGroup, ProcessGroupConfig, Store, StoreConfig, StoreServer},
    data::{DataError, DistributedSamplerConfig},
};
use ddp_examples::digits::{DigitBatch, DigitBatcher, DigitDataset, DigitItem, load_digits, split};
use ddp_examples::models::DigitsMlp;
use ddp_train::{DdpReport, DdpStrategy, DistributedLoader, DistributedTrainingExt};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

type B = Autodiff<Flex>;

#[derive(Module, Debug)]
struct Classifier<B: Backend> {
    mlp: DigitsMlp<B>,
}

impl<B: Backend> Classifier<B> {
    fn forward_classification(&self, batch: DigitBatch<B>) -> ClassificationOutput<B> {
        let output = self.mlp.forward(batch.images);
        let loss = CrossEntropyLossConfig::new()
            .init(&output.device())
            .forward(output.clone(), batch.targets.clone());
        ClassificationOutput::new(loss, output, batch.targets)
    }
}

impl<B: AutodiffBackend> TrainStep for Classifier<B> {
    type Input = DigitBatch<B>;
    type Output = ClassificationOutput<B>;
    fn step(&self, batch: DigitBatch<B>) -> TrainOutput<ClassificationOutput<B>> {
        let item = self.forward_classification(batch);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl<B: Backend> InferenceStep for Classifier<B> {
    type Input = DigitBatch<B>;
    type Output = ClassificationOutput<B>;
    fn step(&self, batch: DigitBatch<B>) -> ClassificationOutput<B> {
        self.forward_classification(batch)
    }
}

/// A learning rate multiplied by `gamma` every step: scheduler state a resume must carry
/// (burn's exponential scheduler refuses a rate of 0, which the early-stopping test uses).
#[derive(Clone, Debug)]
struct Decay {
    lr: f64,
    gamma: f64,
}

impl LrScheduler for Decay {
    type Record<Bk: Backend> = f64;
    fn step(&mut self) -> f64 {
        let lr = self.lr;
        self.lr *= self.gamma;
        lr
    }
    fn to_record<Bk: Backend>(&self) -> f64 {
        self.lr
    }
    fn load_record<Bk: Backend>(mut self, record: f64) -> Self {
        self.lr = record;
        self
    }
}

/// Weights from a seeded stream (burn's own init draws from a global RNG the test threads share).
struct SeededInit(ChaCha8Rng);

impl<B: Backend> ModuleMapper<B> for SeededInit {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, t, mapper) = param.consume();
        let (shape, device, trainable) = (t.shape(), t.device(), t.is_require_grad());
        let bound = 1.0 / (shape.dims::<D>()[0].max(1) as f32).sqrt();
        let values: Vec<f32> = (0..shape.num_elements())
            .map(|_| self.0.random_range(-bound..bound))
            .collect();
        let value = Tensor::<B, D>::from_data(TensorData::new(values, shape), &device)
            .set_require_grad(trainable);
        Param::from_mapped_value(id, value, mapper)
    }
}

fn model(seed: u64) -> Classifier<B> {
    Classifier {
        mlp: DigitsMlp::new(32, &Default::default()),
    }
    .map(&mut SeededInit(ChaCha8Rng::seed_from_u64(seed)))
}

fn flat_params<Bk: Backend, M: Module<Bk>>(m: &M) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl<Bk: Backend> ModuleVisitor<Bk> for Collect {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<Bk, D>>) {
            self.0
                .extend(p.val().into_data().convert::<f32>().iter::<f32>());
        }
    }
    let mut c = Collect(Vec::new());
    m.visit(&mut c);
    c.0
}

/// `max|a - b| / max|b|`: scaled by the whole vector, as a weight near zero may differ
/// relatively by more than the model does.
fn max_scaled_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(f32::MIN_POSITIVE, |m, y| m.max(y.abs()));
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

/// A small, fixed slice of the digits: 256 training images (a multiple of every global batch
/// used here, so no shard is padded) and 100 test images.
fn data() -> (Vec<DigitItem>, Vec<DigitItem>) {
    let (mut train, mut test) = split(load_digits().expect("digits"), 7, 0.8);
    train.truncate(256);
    test.truncate(100);
    (train, test)
}

/// Runs `body` on `n` ranks (threads) with their own process groups.
fn run_ranks<T: Send>(n: usize, body: impl Fn(ProcessGroup) -> T + Sync) -> Vec<T> {
    let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new()).expect("store");
    let addr = server.local_addr().to_string();
    let timeout = Duration::from_secs(120); // generous: a loaded 2-core machine
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let (addr, body) = (addr.clone(), &body);
                s.spawn(move || {
                    let store = Store::connect(&addr, StoreConfig::new().with_timeout(timeout))
                        .expect("store connection");
                    let pg = ProcessGroup::with_store(
                        store,
                        ProcessGroupConfig::new(rank, n).with_timeout(timeout),
                    )
                    .expect("process group");
                    body(pg)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}

/// Per epoch, the metrics rank 0's event store holds: (train loss, train accuracy, valid loss,
/// valid accuracy).
type EpochMetrics = (f64, f64, f64, f64);

/// Early stopping that records the epoch's metrics, then defers to `inner` (if any).
#[derive(Clone)]
struct Recorder {
    seen: Arc<Mutex<Vec<EpochMetrics>>>,
    inner: Option<MetricEarlyStoppingStrategy>,
}

impl EarlyStoppingStrategy for Recorder {
    fn should_stop(&mut self, epoch: usize, store: &EventStoreClient) -> bool {
        let loss = LossMetric::<B>::new().name();
        let acc = AccuracyMetric::<B>::new().name();
        let get = |name: &str, split: Split| {
            store
                .find_metric(name, epoch, Aggregate::Mean, &split)
                .unwrap_or(f64::NAN)
        };
        let row = (
            get(&loss, Split::Train),
            get(&acc, Split::Train),
            get(&loss, Split::Valid),
            get(&acc, Split::Valid),
        );
        self.seen.lock().expect("recorder").push(row);
        self.inner
            .as_mut()
            .is_some_and(|s| s.should_stop(epoch, store))
    }
}

struct Run {
    params: Vec<f32>,
    report: DdpReport,
    metrics: Vec<EpochMetrics>,
}

struct Setup {
    batch_per_rank: usize,
    epochs: usize,
    lr: f64,
    accumulation: Option<usize>,
    stop_when_flat: bool,
    checkpoints: bool,
    /// Continue from the latest checkpoint in the directory, if any.
    resume: bool,
    /// Checkpoints through `DdpStrategy::with_checkpoints` (rank 0 writes atomically; resume
    /// takes rank 0's epoch and state) instead of burn-train's file checkpointer.
    rank0_checkpoints: bool,
    /// SGD momentum (optimizer state to carry across a resume).
    momentum: Option<f64>,
    /// The learning rate decays by this factor every optimizer step (scheduler state).
    gamma: f64,
    /// ddp-core's settings (default when `None`).
    ddp: Option<DdpConfig>,
    /// Mid-epoch checkpoints every this many optimizer steps (0: epoch ends only); with
    /// `resume`, the run resumes at `resume_point` (possibly inside an epoch).
    every_n_steps: usize,
    /// On a mid-epoch resume, the loader starts at the position itself (`with_resume`);
    /// otherwise the strategy pulls and drops the batches already taken.
    loader_resumes: bool,
}

fn train(pg: ProcessGroup, dir: &Path, setup: &Setup) -> Run {
    let (world, rank) = (pg.world_size(), pg.rank());
    let (train_items, test_items) = data();
    let sampler = DistributedSamplerConfig::new(world, rank).with_seed(42);
    let point = (setup.resume && setup.every_n_steps > 0)
        .then(|| ddp_train::resume_point(&pg, dir).expect("rank 0's resume point"))
        .flatten();
    let resume_at = match (setup.resume, setup.rank0_checkpoints) {
        _ if setup.every_n_steps > 0 => None, // the strategy takes `point`
        (false, _) => None,
        (true, false) => ddp_train::latest_checkpoint(dir).expect("checkpoint directory"),
        (true, true) => ddp_train::resume_epoch(&pg, dir).expect("rank 0's checkpoint"),
    };
    let train = DistributedLoader::<B, _, _>::train(
        DigitDataset(train_items),
        DigitBatcher,
        setup.batch_per_rank,
        sampler,
    )
    .expect("train loader")
    .with_abort_group(pg.clone());
    let train = if setup.loader_resumes {
        train.with_resume(point)
    } else {
        let epochs_done = point.map_or(0, |p| p.epochs_done);
        train.with_start_epoch(resume_at.unwrap_or(epochs_done) as u64)
    };
    let valid = DistributedLoader::<Flex, _, _>::eval(
        DigitDataset(test_items),
        DigitBatcher,
        32 / world,
        world,
        rank,
    )
    .expect("valid loader");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let inner = setup.stop_when_flat.then(|| {
        MetricEarlyStoppingStrategy::new(
            &LossMetric::<B>::new(),
            Aggregate::Mean,
            Direction::Lowest,
            Split::Valid,
            StoppingCondition::NoImprovementSince { n_epochs: 1 },
        )
    });
    let mut strategy = DdpStrategy::new(pg);
    if let Some(config) = &setup.ddp {
        strategy = strategy.with_ddp_config(config.clone());
    }
    if setup.rank0_checkpoints {
        strategy = strategy.with_checkpoints(dir);
    }
    strategy = strategy
        .with_checkpoint_every_n_steps(setup.every_n_steps)
        .with_resume(point);
    let mut training = SupervisedTraining::new(dir, Arc::new(train), Arc::new(valid))
        .metrics((AccuracyMetric::new(), LossMetric::new()))
        .num_epochs(setup.epochs)
        .with_application_logger(None)
        .early_stopping(Recorder {
            seen: seen.clone(),
            inner,
        });
    if setup.checkpoints {
        training =
            training.with_file_checkpointer(NamedMpkFileRecorder::<FullPrecisionSettings>::new());
    }
    if let Some(epoch) = resume_at {
        training = training.checkpoint(epoch);
    }
    if let Some(k) = setup.accumulation {
        training = training.grads_accumulation(k);
    }
    let optim = SgdConfig::new()
        .with_momentum(
            setup
                .momentum
                .map(|m| MomentumConfig::new().with_momentum(m)),
        )
        .init();
    let scheduler = Decay {
        lr: setup.lr,
        gamma: setup.gamma,
    };
    let learner = Learner::new(model(3), optim, scheduler);
    let result = training.distributed(&strategy).launch(learner);
    let report = strategy.finish().expect("training succeeded");
    let params = flat_params::<Flex, _>(&result.model);
    let metrics = seen.lock().expect("recorder").clone();
    Run {
        params,
        report,
        metrics,
    }
}

fn base() -> Setup {
    Setup {
        batch_per_rank: 32,
        epochs: 3,
        lr: 0.5,
        accumulation: None,
        stop_when_flat: false,
        checkpoints: false,
        resume: false,
        rank0_checkpoints: false,
        momentum: None,
        gamma: 1.0,
        ddp: None,
        every_n_steps: 0,
        loader_resumes: false,
    }
}

#[test]
fn two_ranks_match_one_process_with_the_global_batch() {
    let dir1 = tempfile::tempdir().expect("tempdir");
    let dir2 = tempfile::tempdir().expect("tempdir");
    let one = run_ranks(1, |pg| train(pg, dir1.path(), &base())).remove(0);
    let two = run_ranks(2, |pg| {
        train(
            pg,
            dir2.path(),
            &Setup {
                batch_per_rank: 16,
                ..base()
            },
        )
    });
    // Both ranks hold the same model, bitwise (they apply the same averaged gradients).
    assert_eq!(two[0].params, two[1].params, "ranks diverged");
    let diff = max_scaled_diff(&two[0].params, &one.params);
    eprintln!("world 2 vs world 1: max scaled parameter difference {diff:e}");
    eprintln!(
        "world 1 metrics per epoch (train loss, train acc, valid loss, valid acc): {:?}",
        one.metrics
    );
    eprintln!(
        "world 2 metrics per epoch (rank 0):                                      {:?}",
        two[0].metrics
    );
    assert!(
        diff < 1e-5,
        "world 2 vs world 1: parameters differ by {diff:e} (scaled)"
    );
    assert_ne!(
        one.params,
        flat_params::<B, _>(&model(3)),
        "training changed nothing"
    );
    for r in &two {
        assert_eq!(r.report.last_epoch, 3);
        assert_eq!(r.report.optimizer_steps, 24); // 256 / 32 per epoch, 3 epochs
    }
    // Metrics over the global batch: rank 0 of world 2 reports what world 1 does.
    assert_eq!(one.metrics.len(), 3);
    assert_eq!(two[0].metrics.len(), 3);
    assert!(
        two[1].metrics.is_empty(),
        "rank 1 must not evaluate metrics"
    );
    for (epoch, (a, b)) in two[0].metrics.iter().zip(&one.metrics).enumerate() {
        let pairs = [
            (a.0, b.0, "train loss"),
            (a.1, b.1, "train accuracy"),
            (a.2, b.2, "valid loss"),
            (a.3, b.3, "valid accuracy"),
        ];
        for (x, y, what) in pairs {
            assert!(
                x.is_finite() && y.is_finite(),
                "epoch {}: {what} missing ({x}, {y})",
                epoch + 1
            );
            assert!(
                (x - y).abs() <= 1e-4 * y.abs().max(1.0),
                "epoch {}: {what}: world 2 {x} vs world 1 {y}",
                epoch + 1
            );
        }
    }
}

/// The gradient all-reduce overlaps burn's backward: every bucket's all-reduce is issued from
/// inside the user's `TrainStep::step` (its plain `loss.backward()`), by the taps, none after it
/// returned; and the result is the one of the default (coarser) layout. Deterministic: counts
/// of buckets, not timings.
#[test]
fn buckets_are_all_reduced_during_the_train_steps_backward() {
    let dir1 = tempfile::tempdir().expect("tempdir");
    let dir2 = tempfile::tempdir().expect("tempdir");
    let setup = |ddp| Setup {
        batch_per_rank: 16,
        epochs: 1,
        ddp,
        ..base()
    };
    let small = DdpConfig::new()
        .with_bucket_cap_mb(0.004)
        .with_first_bucket_cap_mb(0.001);
    let split = run_ranks(2, |pg| train(pg, dir1.path(), &setup(Some(small.clone()))));
    let whole = run_ranks(2, |pg| train(pg, dir2.path(), &setup(None)));
    for (rank, r) in split.iter().enumerate() {
        let per_step = r.report.buckets / r.report.optimizer_steps;
        eprintln!(
            "rank {rank}: {} optimizer steps, {} buckets, {} launched during backward",
            r.report.optimizer_steps, r.report.buckets, r.report.buckets_launched_during_backward
        );
        assert_eq!(r.report.optimizer_steps, 8); // 256 / 32 per epoch
        assert!(per_step >= 3, "rank {rank}: {per_step} buckets per step");
        assert_eq!(
            r.report.buckets_launched_during_backward, r.report.buckets,
            "rank {rank}: every bucket is issued during backward"
        );
    }
    for r in &whole {
        assert!(r.report.buckets >= r.report.optimizer_steps);
        assert_eq!(r.report.buckets_launched_during_backward, r.report.buckets);
    }
    assert_eq!(split[0].params, split[1].params, "ranks diverged");
    let diff = max_scaled_diff(&split[0].params, &whole[0].params);
    assert!(diff < 1e-6, "bucket layout changed the result by {diff:e}");
}

#[test]
fn gradient_accumulation_is_no_sync_then_one_all_reduce() {
    // 2 ranks x 2 micro-batches of 8, gradients summed locally then averaged over ranks, equal
    // twice the mean gradient of the global batch of 32: one process with batch 32 and twice
    // the learning rate takes the same steps.
    let dir1 = tempfile::tempdir().expect("tempdir");
    let dir2 = tempfile::tempdir().expect("tempdir");
    let one = run_ranks(1, |pg| train(pg, dir1.path(), &Setup { lr: 0.5, ..base() })).remove(0);
    let two = run_ranks(2, |pg| {
        train(
            pg,
            dir2.path(),
            &Setup {
                batch_per_rank: 8,
                lr: 0.25,
                accumulation: Some(2),
                ..base()
            },
        )
    });
    assert_eq!(two[0].params, two[1].params, "ranks diverged");
    let diff = max_scaled_diff(&two[0].params, &one.params);
    eprintln!("accumulated world 2 vs world 1: max scaled parameter difference {diff:e}");
    assert!(
        diff < 1e-5,
        "accumulated world 2 vs world 1: differ by {diff:e} (scaled)"
    );
    for r in &two {
        assert_eq!(r.report.train_steps, 48);
        assert_eq!(r.report.optimizer_steps, 24);
    }
}

#[test]
fn early_stopping_decided_by_rank0_stops_every_rank_in_the_same_epoch() {
    // Learning rate 0: the validation loss stays flat, so "no improvement since 1 epoch" fires
    // after epoch 2, on rank 0 (the only rank with metrics); rank 1 must stop there too instead
    // of waiting in epoch 3's first collective.
    let dirs = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    let runs = run_ranks(2, |pg| {
        let dir = dirs[pg.rank()].path().to_path_buf();
        train(
            pg,
            &dir,
            &Setup {
                epochs: 6,
                lr: 0.0,
                stop_when_flat: true,
                checkpoints: true,
                ..base()
            },
        )
    });
    for (rank, r) in runs.iter().enumerate() {
        assert_eq!(
            r.report.stopped_early_at,
            Some(2),
            "rank {rank}: {:?}",
            r.report
        );
        assert_eq!(r.report.last_epoch, 2, "rank {rank}");
        assert_eq!(r.report.optimizer_steps, 4 * 2, "rank {rank}"); // 256 / 64 per epoch
    }
    // Rank 0 alone writes burn-train's checkpoints.
    let listing = |rank: usize| -> Vec<String> {
        std::fs::read_dir(dirs[rank].path().join("checkpoint"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    // burn-train's checkpointer has joined its writer thread when `launch` returns.
    let rank0 = listing(0);
    assert!(
        rank0.iter().any(|f| f.starts_with("model-2")),
        "rank 0 wrote {rank0:?}"
    );
    assert!(
        listing(1).is_empty(),
        "rank 1 wrote checkpoints: {:?}",
        listing(1)
    );
}

/// Batches of sample indices.
#[derive(Clone)]
struct Ids;

impl Batcher<Flex, usize, Vec<usize>> for Ids {
    fn batch(&self, items: Vec<usize>, _device: &burn::tensor::Device<Flex>) -> Vec<usize> {
        items
    }
}

#[test]
fn the_loader_gives_each_rank_its_shard_and_reshuffles_every_epoch() {
    let epoch_of = |rank: usize, loader: &DistributedLoader<Flex, usize, Vec<usize>>| {
        let _ = rank;
        loader.iter().flatten().collect::<Vec<usize>>()
    };
    let loaders: Vec<_> = (0..2)
        .map(|rank| {
            DistributedLoader::train(
                InMemDataset::new((0..40).collect::<Vec<usize>>()),
                Ids,
                4,
                DistributedSamplerConfig::new(2, rank).with_seed(5),
            )
            .expect("loader")
            .with_num_workers(2)
        })
        .collect();
    let mut previous: Option<Vec<usize>> = None;
    for _epoch in 0..3 {
        let shards: Vec<Vec<usize>> = (0..2).map(|r| epoch_of(r, &loaders[r])).collect();
        assert_eq!(shards[0].len(), 20);
        let mut all: Vec<usize> = shards.concat();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..40).collect::<Vec<_>>(),
            "shards must cover the data set once"
        );
        if let Some(p) = &previous {
            assert_ne!(p, &shards[0], "no reshuffle between epochs");
        }
        previous = Some(shards[0].clone());
    }
    assert_eq!(loaders[0].num_items(), 40);
    // Evaluation shards: every sample once, no padding, uneven sizes allowed.
    let eval: Vec<Vec<usize>> = (0..2)
        .map(|rank| {
            let l = DistributedLoader::<Flex, _, _>::eval(
                InMemDataset::new((0..7).collect::<Vec<usize>>()),
                Ids,
                2,
                2,
                rank,
            )
            .expect("eval loader");
            l.iter().flatten().collect()
        })
        .collect();
    assert_eq!(eval, vec![vec![0, 2, 4, 6], vec![1, 3, 5]]);
}

/// An evaluation set smaller than the world leaves the last ranks without batches: an empty
/// epoch there, not a loading error that aborts the process group.
#[test]
fn an_eval_set_smaller_than_the_world_gives_the_last_ranks_empty_epochs() {
    let outcomes = run_ranks(1, |pg| {
        (0..4)
            .map(|rank| {
                let l = DistributedLoader::<Flex, _, _>::eval(
                    InMemDataset::new((0..3).collect::<Vec<usize>>()),
                    Ids,
                    2,
                    4,
                    rank,
                )
                .expect("eval loader")
                .with_abort_group(pg.clone());
                let items: Vec<usize> = l.iter().flatten().collect();
                (items, pg.barrier().map_err(|e| e.to_string()))
            })
            .collect::<Vec<_>>()
    });
    for (rank, (items, group)) in outcomes[0].iter().enumerate() {
        let expected: Vec<usize> = (rank..3).step_by(4).collect();
        assert_eq!(items, &expected, "rank {rank}");
        assert!(group.is_ok(), "rank {rank} aborted the group: {group:?}");
    }
}

/// Trains with this rank's `batch_per_rank` and `hidden` units for two epochs, returning the
/// run's outcome; with `rank0_checkpoints`, rank 0 writes its checkpoints in `dir`.
fn outcome(
    pg: ProcessGroup,
    dir: &Path,
    batch_per_rank: usize,
    hidden: usize,
    rank0_checkpoints: bool,
) -> ddp_train::Result<DdpReport> {
    outcome_with(pg, dir, batch_per_rank, hidden, rank0_checkpoints, |s| s)
}

/// [`outcome`], with the strategy passed through `adjust` first.
fn outcome_with(
    pg: ProcessGroup,
    dir: &Path,
    batch_per_rank: usize,
    hidden: usize,
    rank0_checkpoints: bool,
    adjust: impl FnOnce(DdpStrategy) -> DdpStrategy,
) -> ddp_train::Result<DdpReport> {
    let (world, rank) = (pg.world_size(), pg.rank());
    let (train_items, test_items) = data();
    let sampler = DistributedSamplerConfig::new(world, rank).with_seed(42);
    let train = DistributedLoader::<B, _, _>::train(
        DigitDataset(train_items),
        DigitBatcher,
        batch_per_rank,
        sampler,
    )?;
    let valid = DistributedLoader::<Flex, _, _>::eval(
        DigitDataset(test_items),
        DigitBatcher,
        16,
        world,
        rank,
    )?;
    let mut strategy = DdpStrategy::new(pg);
    if rank0_checkpoints {
        strategy = strategy.with_checkpoints(dir);
    }
    let strategy = adjust(strategy);
    let model = Classifier::<B> {
        mlp: DigitsMlp::new(hidden, &Default::default()),
    };
    let training = SupervisedTraining::new(dir, Arc::new(train), Arc::new(valid))
        .metrics((LossMetric::new(),))
        .num_epochs(2)
        .with_application_logger(None)
        .distributed(&strategy);
    let _ = training.launch(Learner::new(model, SgdConfig::new().init(), 0.1));
    strategy.finish()
}

#[test]
fn ranks_with_different_numbers_of_batches_fail_together_instead_of_hanging() {
    // Rank 0 has 8 batches of 16, rank 1 4 batches of 32: step 5 finds rank 1 without a batch.
    let dir = tempfile::tempdir().expect("tempdir");
    let results = run_ranks(2, |pg| {
        let batch = if pg.rank() == 0 { 16 } else { 32 };
        outcome(pg, dir.path(), batch, 32, false)
    });
    for (rank, r) in results.iter().enumerate() {
        let err = r
            .as_ref()
            .expect_err("uneven batches must fail")
            .to_string();
        assert!(
            err.contains("ranks [1] have no batch left") || err.contains("abort"),
            "rank {rank}: {err}"
        );
    }
    assert!(
        results.iter().any(|r| matches!(
            r,
            Err(ddp_train::DdpTrainError::UnevenBatches { step: 5, .. })
        )),
        "{results:?}"
    );
}

/// Rank 0 cannot write its checkpoints (`checkpoint` is a file there): the run fails on every
/// rank, with rank 0's reason, not on rank 0 alone while the others report success.
#[test]
fn a_checkpoint_rank0_cannot_write_fails_the_run_on_every_rank() {
    let dirs = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    std::fs::write(dirs[0].path().join("checkpoint"), b"not a directory").expect("file");
    let results = run_ranks(2, |pg| {
        let dir = dirs[pg.rank()].path().to_path_buf();
        outcome(pg, &dir, 16, 32, true)
    });
    for (rank, r) in results.iter().enumerate() {
        let err = r
            .as_ref()
            .expect_err("a failed checkpoint write must fail every rank")
            .to_string();
        assert!(err.contains("checkpoint"), "rank {rank}: {err}");
    }
}

/// Another job holds the checkpoint directory (here: this test, through ddp-core's lock):
/// the run fails on every rank naming the holder, before anything there is read or removed.
#[test]
fn a_checkpoint_directory_another_job_holds_fails_the_run_on_every_rank() {
    let dir = tempfile::tempdir().expect("tempdir");
    let leftover = dir.path().join("checkpoint").join(".tmp-model-1.mpk-999");
    std::fs::create_dir_all(leftover.parent().expect("parent")).expect("dir");
    std::fs::write(&leftover, b"the other job's write in progress").expect("file");
    let held = ddp_core::checkpoint::lock_dir(dir.path()).expect("the other job's lock");
    let results = run_ranks(2, |pg| outcome(pg, dir.path(), 16, 32, true));
    for (rank, r) in results.iter().enumerate() {
        let err = r
            .as_ref()
            .expect_err("a locked directory must fail every rank")
            .to_string();
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "rank {rank}: {err}"
        );
    }
    assert!(leftover.exists(), "the other job's file was removed");
    // Without the lock (a file system that has none), the run goes on beside the holder.
    let unlocked = run_ranks(2, |pg| {
        outcome_with(pg, dir.path(), 16, 32, true, |s| s.with_dir_lock(false))
    });
    for (rank, r) in unlocked.iter().enumerate() {
        assert!(r.is_ok(), "rank {rank}: {r:?}");
    }
    drop(held);
}

#[test]
fn ranks_with_different_models_fail_before_training() {
    let dir = tempfile::tempdir().expect("tempdir");
    let results = run_ranks(2, |pg| {
        let hidden = if pg.rank() == 0 { 32 } else { 64 };
        outcome(pg, dir.path(), 16, hidden, false)
    });
    for (rank, r) in results.iter().enumerate() {
        match r {
            Err(ddp_train::DdpTrainError::ModelMismatch(why)) => {
                assert!(why.contains("ranks [1] differ"), "rank {rank}: {why}")
            }
            other => panic!("rank {rank}: expected a model mismatch, got {other:?}"),
        }
    }
}

#[test]
fn a_resumed_run_continues_exactly_where_the_checkpoint_left_off() {
    // 3 epochs straight, vs 2 epochs, then a new run (as after a restart) resuming from the
    // latest checkpoint for the third: the same parameters, bitwise.
    let straight = tempfile::tempdir().expect("tempdir");
    let resumed = tempfile::tempdir().expect("tempdir");
    let with_checkpoints = |epochs, resume| Setup {
        epochs,
        checkpoints: true,
        resume,
        batch_per_rank: 16,
        ..base()
    };
    let full = run_ranks(2, |pg| {
        train(pg, straight.path(), &with_checkpoints(3, false))
    });
    let first = run_ranks(2, |pg| {
        train(pg, resumed.path(), &with_checkpoints(2, false))
    });
    assert_eq!(
        ddp_train::latest_checkpoint(resumed.path()).expect("readable"),
        Some(2)
    );
    let second = run_ranks(2, |pg| {
        train(pg, resumed.path(), &with_checkpoints(3, true))
    });
    assert_ne!(
        first[0].params, full[0].params,
        "the third epoch changed nothing"
    );
    for rank in 0..2 {
        assert_eq!(second[rank].report.last_epoch, 3);
        assert_eq!(
            second[rank].report.optimizer_steps, 8,
            "rank {rank}: one epoch of 8 steps"
        );
        assert_eq!(
            second[rank].params, full[rank].params,
            "rank {rank}: resumed != straight"
        );
    }
}

/// Lists `dir/checkpoint` (empty when it does not exist).
fn checkpoint_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("checkpoint"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn ranks_without_a_shared_directory_resume_rank0s_model_optimizer_and_scheduler() {
    // Each rank has its own directory and only rank 0 writes, so rank 1's stays empty: a
    // resumed run must take the epoch, weights, momentum buffers and decayed learning rate
    // from rank 0 (the straight run shows any of them missing on rank 1 as a difference).
    let straight = tempfile::tempdir().expect("tempdir");
    let dirs = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    let setup = |epochs, resume| Setup {
        epochs,
        resume,
        rank0_checkpoints: true,
        momentum: Some(0.9),
        gamma: 0.97,
        lr: 0.2,
        batch_per_rank: 16,
        ..base()
    };
    let full = run_ranks(2, |pg| train(pg, straight.path(), &setup(3, false)));
    let first = run_ranks(2, |pg| {
        let dir = dirs[pg.rank()].path().to_path_buf();
        train(pg, &dir, &setup(2, false))
    });
    assert_eq!(
        checkpoint_files(dirs[0].path()),
        [
            "model-1.mpk",
            "model-2.mpk",
            "optim-1.mpk",
            "optim-2.mpk",
            "scheduler-1.mpk",
            "scheduler-2.mpk"
        ],
        "rank 0 wrote both epochs, nothing temporary left"
    );
    assert!(
        checkpoint_files(dirs[1].path()).is_empty(),
        "rank 1 wrote {:?}",
        checkpoint_files(dirs[1].path())
    );
    let second = run_ranks(2, |pg| {
        let dir = dirs[pg.rank()].path().to_path_buf();
        train(pg, &dir, &setup(3, true))
    });
    assert_ne!(
        first[0].params, full[0].params,
        "the third epoch changed nothing"
    );
    for rank in 0..2 {
        assert_eq!(second[rank].report.last_epoch, 3, "rank {rank}");
        assert_eq!(
            second[rank].report.optimizer_steps, 8,
            "rank {rank}: one epoch of 8 steps"
        );
        assert!(
            second[rank].params == full[rank].params,
            "rank {rank}: resumed != straight (max scaled difference {:e})",
            max_scaled_diff(&second[rank].params, &full[rank].params)
        );
    }
}

#[test]
fn ranks_told_to_resume_different_epochs_fail_together() {
    // Rank 1 resumes nothing while rank 0 resumes epoch 1 (as with per-rank
    // `latest_checkpoint` on unshared directories): an error on both, not a silent divergence.
    let dirs = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    let setup = |epochs, resume| Setup {
        epochs,
        resume,
        checkpoints: true,
        batch_per_rank: 16,
        ..base()
    };
    let _ = run_ranks(2, |pg| {
        let dir = dirs[pg.rank()].path().to_path_buf();
        train(pg, &dir, &setup(1, false))
    });
    let results = run_ranks(2, |pg| {
        let dir = dirs[pg.rank()].path().to_path_buf();
        let resume = ddp_train::latest_checkpoint(&dir).expect("readable");
        resume_outcome(pg, &dir, resume)
    });
    for (rank, r) in results.iter().enumerate() {
        match r {
            Err(ddp_train::DdpTrainError::Resume(why)) => {
                assert!(
                    why.contains("by rank: [after epoch 1, none]"),
                    "rank {rank}: {why}"
                )
            }
            other => panic!("rank {rank}: expected a resume error, got {other:?}"),
        }
    }
}

/// Two epochs resuming `resume` (burn-train's file checkpointer), returning the outcome.
fn resume_outcome(
    pg: ProcessGroup,
    dir: &Path,
    resume: Option<usize>,
) -> ddp_train::Result<DdpReport> {
    let (world, rank) = (pg.world_size(), pg.rank());
    let (train_items, test_items) = data();
    let sampler = DistributedSamplerConfig::new(world, rank).with_seed(42);
    let train =
        DistributedLoader::<B, _, _>::train(DigitDataset(train_items), DigitBatcher, 16, sampler)?;
    let valid = DistributedLoader::<Flex, _, _>::eval(
        DigitDataset(test_items),
        DigitBatcher,
        16,
        world,
        rank,
    )?;
    let strategy = DdpStrategy::new(pg);
    let mut training = SupervisedTraining::new(dir, Arc::new(train), Arc::new(valid))
        .metrics((LossMetric::new(),))
        .num_epochs(2)
        .with_file_checkpointer(NamedMpkFileRecorder::<FullPrecisionSettings>::new())
        .with_application_logger(None);
    if let Some(epoch) = resume {
        training = training.checkpoint(epoch);
    }
    let _ = training.distributed(&strategy).launch(Learner::new(
        model(3),
        SgdConfig::new().init(),
        0.1,
    ));
    strategy.finish()
}

/// Epoch 3 of a run with mid-epoch checkpoints (every 3 of its 8 steps) was cut after step 6:
/// its epoch-end files are removed, so rank 0's latest checkpoint is epoch 3's step 6.
fn run_cut_inside_epoch_3(dirs: &[tempfile::TempDir; 2], setup: &Setup) -> Vec<Run> {
    let first = run_ranks(2, |pg| {
        let dir = dirs[pg.rank()].path().to_path_buf();
        train(pg, &dir, setup)
    });
    for kind in ["model", "optim", "scheduler"] {
        std::fs::remove_file(dirs[0].path().join(format!("checkpoint/{kind}-3.mpk")))
            .expect("epoch 3's checkpoint");
    }
    first
}

#[test]
fn a_run_resumed_inside_an_epoch_ends_with_the_uninterrupted_weights() {
    // Each rank has its own directory (only rank 0 writes), SGD momentum and a decaying
    // learning rate: model, optimizer, scheduler and the loader's position must all come back
    // from rank 0's mid-epoch checkpoint, for both ways of skipping the steps already taken.
    let straight = tempfile::tempdir().expect("tempdir");
    let setup = |resume, loader_resumes| Setup {
        resume,
        loader_resumes,
        rank0_checkpoints: true,
        every_n_steps: 3,
        momentum: Some(0.9),
        gamma: 0.97,
        lr: 0.2,
        batch_per_rank: 16,
        ..base()
    };
    let full = run_ranks(2, |pg| train(pg, straight.path(), &setup(false, false)));
    assert_eq!(
        full[0].report.step_checkpoints, 6,
        "steps 3 and 6 of 3 epochs"
    );
    assert_eq!(full[1].report.step_checkpoints, 0, "rank 0 alone writes");
    for loader_resumes in [true, false] {
        let dirs = [
            tempfile::tempdir().expect("tempdir"),
            tempfile::tempdir().expect("tempdir"),
        ];
        run_cut_inside_epoch_3(&dirs, &setup(false, false));
        let resumed = run_ranks(2, |pg| {
            let dir = dirs[pg.rank()].path().to_path_buf();
            train(pg, &dir, &setup(true, loader_resumes))
        });
        for rank in 0..2 {
            let report = &resumed[rank].report;
            assert_eq!(
                report.resumed_from,
                Some(ddp_train::ResumePoint {
                    epochs_done: 2,
                    steps_done: 6
                }),
                "rank {rank}"
            );
            assert_eq!(report.last_epoch, 3);
            assert_eq!(
                report.optimizer_steps, 2,
                "rank {rank} (loader resumes: {loader_resumes}): steps 7 and 8 of epoch 3"
            );
            assert_eq!(
                resumed[rank].params, full[rank].params,
                "rank {rank} (loader resumes: {loader_resumes}): resumed != straight"
            );
        }
    }
}

#[test]
fn a_loader_resuming_inside_an_epoch_without_the_strategy_fails_on_every_rank() {
    let dirs = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    let setup = Setup {
        rank0_checkpoints: true,
        every_n_steps: 3,
        batch_per_rank: 16,
        ..base()
    };
    run_cut_inside_epoch_3(&dirs, &setup);
    let errors = run_ranks(2, |pg| {
        let dir = dirs[pg.rank()].path().to_path_buf();
        let point = ddp_train::resume_point(&pg, &dir).expect("resume point");
        let (world, rank) = (pg.world_size(), pg.rank());
        let (train_items, test_items) = data();
        let train = DistributedLoader::<B, _, _>::train(
            DigitDataset(train_items),
            DigitBatcher,
            16,
            DistributedSamplerConfig::new(world, rank).with_seed(42),
        )
        .expect("train loader")
        .with_resume(point);
        let valid = DistributedLoader::<Flex, _, _>::eval(
            DigitDataset(test_items),
            DigitBatcher,
            16,
            world,
            rank,
        )
        .expect("valid loader");
        // The strategy is told epoch 2's end only: the loader is 6 steps further.
        let strategy = DdpStrategy::new(pg).with_checkpoints(&dir);
        let scheduler = Decay {
            lr: 0.5,
            gamma: 1.0,
        }; // as the run that wrote the files
        let learner = Learner::new(model(3), SgdConfig::new().init(), scheduler);
        SupervisedTraining::new(&dir, Arc::new(train), Arc::new(valid))
            .num_epochs(3)
            .with_application_logger(None)
            .checkpoint(2)
            .distributed(&strategy)
            .launch(learner);
        strategy
            .finish()
            .expect_err("a mismatched resume")
            .to_string()
    });
    assert!(
        errors[0].contains("starts at item") && errors[0].contains("with_resume"),
        "rank 0: {}",
        errors[0]
    );
    // Rank 1 fails too (the same check, or rank 0's abort), never hangs.
    assert!(!errors[1].is_empty());
}

#[test]
fn a_run_with_gradient_accumulation_resumed_inside_an_epoch_ends_with_the_uninterrupted_weights() {
    // 8 micro-batches per epoch, 2 per optimizer step: checkpoints after optimizer step 3
    // (micro-batch 6) of each epoch, never between the micro-batches of one optimizer step.
    let straight = tempfile::tempdir().expect("tempdir");
    let dirs = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    let setup = |resume| Setup {
        resume,
        loader_resumes: true,
        rank0_checkpoints: true,
        every_n_steps: 3,
        accumulation: Some(2),
        momentum: Some(0.9),
        batch_per_rank: 16,
        ..base()
    };
    let full = run_ranks(2, |pg| train(pg, straight.path(), &setup(false)));
    assert_eq!(full[0].report.step_checkpoints, 3, "one per epoch");
    run_cut_inside_epoch_3(&dirs, &setup(false));
    let resumed = run_ranks(2, |pg| {
        let dir = dirs[pg.rank()].path().to_path_buf();
        train(pg, &dir, &setup(true))
    });
    for rank in 0..2 {
        let report = &resumed[rank].report;
        let point = report.resumed_from.expect("resumed");
        assert_eq!((point.epochs_done, point.steps_done), (2, 6), "rank {rank}");
        assert_eq!(
            report.optimizer_steps, 1,
            "rank {rank}: micro-batches 7 and 8"
        );
        assert_eq!(
            resumed[rank].params, full[rank].params,
            "rank {rank}: resumed != straight"
        );
    }
}

/// A data set whose `get` returns `None` at `missing` although it is below `len()` (an
/// inconsistent `Dataset`, as a corrupt file read makes one).
struct Holey<T> {
    items: Vec<T>,
    missing: Option<usize>,
}

impl<T: Clone + Send + Sync> burn::data::dataset::Dataset<T> for Holey<T> {
    fn get(&self, index: usize) -> Option<T> {
        if Some(index) == self.missing {
            return None;
        }
        self.items.get(index).cloned()
    }
    fn len(&self) -> usize {
        self.items.len()
    }
}

/// Two epochs over `train` and `valid` (batches of 16 per rank).
fn outcome_with_loaders(
    pg: ProcessGroup,
    dir: &Path,
    train: Arc<dyn DataLoader<B, DigitBatch<B>>>,
    valid: Arc<dyn DataLoader<Flex, DigitBatch<Flex>>>,
) -> ddp_train::Result<DdpReport> {
    let strategy = DdpStrategy::new(pg);
    let model = Classifier::<B> {
        mlp: DigitsMlp::new(32, &Default::default()),
    };
    let training = SupervisedTraining::new(dir, train, valid)
        .metrics((LossMetric::new(),))
        .num_epochs(2)
        .with_application_logger(None)
        .distributed(&strategy);
    let _ = training.launch(Learner::new(model, SgdConfig::new().init(), 0.1));
    strategy.finish()
}

/// Two epochs over the digits, with `get` returning `None` at `train_missing` of the training
/// set and at `valid_missing` of the validation set; `abort` gives the loaders the group.
fn outcome_with_holes(
    pg: ProcessGroup,
    dir: &Path,
    train_missing: Option<usize>,
    valid_missing: Option<usize>,
    abort: bool,
) -> ddp_train::Result<DdpReport> {
    let (world, rank) = (pg.world_size(), pg.rank());
    let (train_items, test_items) = data();
    let sampler = DistributedSamplerConfig::new(world, rank).with_seed(42);
    let mut train = DistributedLoader::<B, _, _>::train(
        Holey {
            items: train_items,
            missing: train_missing,
        },
        DigitBatcher,
        16,
        sampler,
    )?;
    let mut valid = DistributedLoader::<Flex, _, _>::eval(
        Holey {
            items: test_items,
            missing: valid_missing,
        },
        DigitBatcher,
        16,
        world,
        rank,
    )?;
    if abort {
        train = train.with_abort_group(pg.clone());
        valid = valid.with_abort_group(pg.clone());
    }
    outcome_with_loaders(pg, dir, Arc::new(train), Arc::new(valid))
}

/// The message of ddp-data's `MissingItem` for `index` of a data set of `len`.
fn missing(index: usize, len: usize) -> String {
    format!("no item for index {index} although its len() is {len}")
}

#[test]
fn a_data_error_fails_a_one_process_run_instead_of_ending_the_epoch_early() {
    for (train_missing, valid_missing, what, index, len) in [
        (Some(5), None, "training", 5, 256),
        (None, Some(41), "validation", 41, 100),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let results = run_ranks(1, |pg| {
            outcome_with_holes(pg, dir.path(), train_missing, valid_missing, false)
        });
        match &results[0] {
            Err(
                e @ ddp_train::DdpTrainError::Loading {
                    epoch: 1,
                    what: failed,
                    sampler_epoch: 0,
                    source: DataError::MissingItem { .. },
                },
            ) => {
                assert_eq!(*failed, what, "{e}");
                assert!(e.to_string().contains(&missing(index, len)), "{e}");
            }
            other => panic!("{what}: expected the data error, got {other:?}"),
        }
    }
}

/// Without an abort group on the loaders: the rank whose data failed reports the data error,
/// the other one the group's abort quoting it (not "uneven batches", not a silently shorter
/// validation set); the index is the data set's own, also for rank 1's evaluation shard.
#[test]
fn a_data_error_on_one_rank_fails_every_rank_naming_it() {
    // Training: index 5 is in one rank's shard of epoch 0 (256 samples, no padding).
    // Validation: 41 is rank 1's 21st sample (1, 3, ..., 41), in its shard of 50.
    for (train_missing, valid_missing, what, index, len) in [
        (Some(5), None, "training", 5, 256),
        (None, Some(41), "validation", 41, 100),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let results = run_ranks(2, |pg| {
            outcome_with_holes(pg, dir.path(), train_missing, valid_missing, false)
        });
        for (rank, r) in results.iter().enumerate() {
            let err = r.as_ref().expect_err("a data error must fail every rank");
            assert!(
                err.to_string().contains(&missing(index, len)),
                "{what}, rank {rank}: {err}"
            );
        }
        let failed: Vec<usize> = (0..2)
            .filter(|&r| {
                matches!(&results[r], Err(ddp_train::DdpTrainError::Loading { what: w, .. }) if *w == what)
            })
            .collect();
        assert_eq!(failed.len(), 1, "{what}: {results:?}");
        if what == "validation" {
            assert_eq!(failed, [1], "{results:?}");
        }
    }
}

/// With the loaders' abort group too: every rank fails with the data error's text.
#[test]
fn a_data_error_with_the_abort_group_fails_every_rank_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let results = run_ranks(2, |pg| {
        outcome_with_holes(pg, dir.path(), Some(5), None, true)
    });
    for (rank, r) in results.iter().enumerate() {
        let err = r.as_ref().expect_err("a data error must fail every rank");
        assert!(
            err.to_string().contains(&missing(5, 256)),
            "rank {rank}: {err}"
        );
    }
}

/// Outside the strategy, a failed epoch panics with its error (as burn's loaders do) instead
/// of ending early; an evaluation shard's (and a slice's) error names the data set's index and
/// length, not the shard's.
#[test]
fn a_loader_iterated_by_anything_else_panics_with_the_data_sets_index() {
    let eval = DistributedLoader::<Flex, _, _>::eval(
        Holey {
            items: (0..1000).collect::<Vec<usize>>(),
            missing: Some(401),
        },
        Ids,
        8,
        4,
        1,
    )
    .expect("eval loader");
    let sliced = eval.slice(200, 1000);
    let loaders: [(&str, &dyn DataLoader<Flex, Vec<usize>>); 2] =
        [("eval", &eval), ("slice", &*sliced)];
    for (name, loader) in loaders {
        let panic =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loader.iter().count()))
                .expect_err("the failed epoch must not just end");
        let text = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(text.contains(&missing(401, 1000)), "{name}: {text}");
        assert!(text.contains("validation data loader"), "{name}: {text}");
    }
}

#[test]
fn a_batch_size_of_zero_is_refused() {
    let train = DistributedLoader::<Flex, _, _>::train(
        InMemDataset::new((0..10).collect::<Vec<usize>>()),
        Ids,
        0,
        DistributedSamplerConfig::new(2, 0),
    );
    assert!(
        matches!(
            train,
            Err(ddp_train::DdpTrainError::Data(DataError::ZeroBatchSize))
        ),
        "{train:?}"
    );
    let eval = DistributedLoader::<Flex, _, _>::eval(
        InMemDataset::new((0..10).collect::<Vec<usize>>()),
        Ids,
        0,
        2,
        0,
    );
    assert!(
        matches!(
            eval,
            Err(ddp_train::DdpTrainError::Data(DataError::ZeroBatchSize))
        ),
        "{eval:?}"
    );
}

#[test]
fn an_empty_evaluation_set_is_refused_when_the_loader_is_built() {
    for world in [1, 3] {
        let eval = DistributedLoader::<Flex, _, _>::eval(
            InMemDataset::new(Vec::<usize>::new()),
            Ids,
            2,
            world,
            0,
        );
        assert!(
            matches!(
                eval,
                Err(ddp_train::DdpTrainError::Data(DataError::EmptyDataset))
            ),
            "world {world}: {eval:?}"
        );
    }
}

/// A loader that logs `to_device` and which copy each `iter()` runs on.
struct DeviceProbe<Bk: burn::tensor::backend::Backend, O> {
    name: &'static str,
    inner: Arc<dyn DataLoader<Bk, O>>,
    moved_to: Option<Bk::Device>,
    log: Arc<Mutex<Vec<String>>>,
}

impl<Bk: burn::tensor::backend::Backend, O: 'static> DataLoader<Bk, O> for DeviceProbe<Bk, O> {
    fn iter<'a>(&'a self) -> Box<dyn burn::data::dataloader::DataLoaderIterator<O> + 'a> {
        let on = match &self.moved_to {
            Some(device) => format!("{device:?}"),
            None => "the loader as given".into(),
        };
        self.log
            .lock()
            .expect("log")
            .push(format!("{} iter on {on}", self.name));
        self.inner.iter()
    }
    fn num_items(&self) -> usize {
        self.inner.num_items()
    }
    fn to_device(&self, device: &Bk::Device) -> Arc<dyn DataLoader<Bk, O>> {
        self.log
            .lock()
            .expect("log")
            .push(format!("{} to_device {device:?}", self.name));
        Arc::new(DeviceProbe {
            name: self.name,
            inner: self.inner.to_device(device),
            moved_to: Some(device.clone()),
            log: self.log.clone(),
        })
    }
    fn slice(&self, start: usize, end: usize) -> Arc<dyn DataLoader<Bk, O>> {
        self.inner.slice(start, end)
    }
}

/// As burn-train's own strategies: both loaders are moved to the model's device once, before
/// the first epoch, and every epoch iterates the moved loaders (with one GPU per rank, batches
/// on the default device would not be on the model's).
#[test]
fn the_loaders_are_moved_to_the_models_device_once_before_training() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(Mutex::new(Vec::new()));
    let results = run_ranks(1, |pg| {
        let (train_items, test_items) = data();
        let train = DistributedLoader::<B, _, _>::train(
            DigitDataset(train_items),
            DigitBatcher,
            32,
            DistributedSamplerConfig::new(1, 0).with_seed(42),
        )?;
        let valid = DistributedLoader::<Flex, _, _>::eval(
            DigitDataset(test_items),
            DigitBatcher,
            32,
            1,
            0,
        )?;
        let train = DeviceProbe {
            name: "train",
            inner: Arc::new(train),
            moved_to: None,
            log: log.clone(),
        };
        let valid = DeviceProbe {
            name: "valid",
            inner: Arc::new(valid),
            moved_to: None,
            log: log.clone(),
        };
        outcome_with_loaders(pg, dir.path(), Arc::new(train), Arc::new(valid))
    });
    let report = results[0].as_ref().expect("training succeeded");
    assert_eq!(report.last_epoch, 2);
    let device = format!("{:?}", burn::tensor::Device::<B>::default());
    let log = log.lock().expect("log").clone();
    let epoch = [
        format!("train iter on {device}"),
        format!("valid iter on {device}"),
    ];
    let mut expected = vec![
        format!("train to_device {device}"),
        format!("valid to_device {device}"),
    ];
    expected.extend(epoch.iter().chain(&epoch).cloned());
    assert_eq!(log, expected);
}

/// The copy `to_device` returns is the same loader, moved: it continues at the loader's epoch
/// and resume point, and iterating it advances the loader.
#[test]
fn a_moved_loader_continues_where_the_loader_is() {
    let build = || {
        DistributedLoader::<Flex, _, _>::train(
            InMemDataset::new((0..40).collect::<Vec<usize>>()),
            Ids,
            4,
            DistributedSamplerConfig::new(2, 1).with_seed(5),
        )
        .expect("loader")
        .with_resume(Some(ddp_train::ResumePoint {
            epochs_done: 3,
            steps_done: 2,
        }))
    };
    let reference = build();
    let expected: Vec<Vec<Vec<usize>>> = (0..2).map(|_| reference.iter().collect()).collect();
    let loader = build();
    let moved = loader.to_device(&Default::default());
    let mut iter = moved.iter();
    assert_eq!(
        iter.progress().items_processed,
        2 * 4 * 2,
        "after the resumed steps"
    );
    let first: Vec<Vec<usize>> = iter.by_ref().collect();
    drop(iter);
    assert_eq!(first, expected[0]);
    assert_eq!(
        loader.next_epoch(),
        4,
        "the moved copy's epoch advanced the loader"
    );
    let second: Vec<Vec<usize>> = loader.iter().collect();
    assert_eq!(
        second, expected[1],
        "the loader continues after the moved copy's epoch"
    );
}

/// A run resumed from an epoch end takes the steps of a mid-epoch checkpoint already in the
/// directory again: when the re-save fails after the records were replaced (here its position
/// cannot be written), the old checkpoint no longer counts (its files are a mix of two runs).
#[test]
fn a_step_checkpoint_saved_again_and_cut_short_is_incomplete_not_a_mix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let every_6 = |s: DdpStrategy| s.with_checkpoint_every_n_steps(6);
    let first = run_ranks(1, |pg| outcome_with(pg, dir.path(), 32, 32, true, every_6)).remove(0);
    assert!(first.is_ok(), "{first:?}");
    let checkpoint = dir.path().join("checkpoint");
    for kind in ["model", "optim", "scheduler"] {
        std::fs::remove_file(checkpoint.join(format!("{kind}-2.mpk"))).expect("epoch 2's files");
    }
    let point = |epochs_done, steps_done| ddp_train::ResumePoint {
        epochs_done,
        steps_done,
    };
    let latest = || {
        run_ranks(1, |pg| {
            ddp_train::resume_point(&pg, dir.path()).expect("readable")
        })
        .remove(0)
    };
    assert_eq!(latest(), Some(point(1, 6)), "epoch 2's step 6");
    let steps = checkpoint.join("steps");
    let model = steps.join("model-2-6.mpk");
    let old_model = std::fs::read(&model).expect("the step's model");
    // Where the re-save writes the position before renaming it into place.
    let tmp = steps.join(format!(".tmp-position-2-6.txt-{}", std::process::id()));
    std::fs::create_dir(&tmp).expect("blocking the position's write");
    let again = run_ranks(1, |pg| {
        outcome_with(pg, dir.path(), 32, 32, true, |s| {
            every_6(s).with_resume(Some(point(1, 0)))
        })
    })
    .remove(0);
    let error = again
        .expect_err("the position cannot be written")
        .to_string();
    assert!(error.contains("position"), "{error}");
    assert_ne!(
        std::fs::read(&model).expect("the step's model"),
        old_model,
        "the re-save replaced the model (this loader reshuffles epoch 2 as its first)"
    );
    assert_eq!(
        latest(),
        Some(point(1, 0)),
        "the mixed step checkpoint counted"
    );
}

/// An epoch end given to resume from, with no checkpointer at all: refused on every rank (it
/// would train the next epoch from untrained weights while reporting a resume).
#[test]
fn resuming_an_epoch_end_without_a_checkpointer_is_refused_on_every_rank() {
    let dir = tempfile::tempdir().expect("tempdir");
    let results = run_ranks(2, |pg| {
        outcome_with(pg, dir.path(), 16, 32, false, |s| {
            s.with_resume(Some(ddp_train::ResumePoint {
                epochs_done: 1,
                steps_done: 0,
            }))
        })
    });
    refused_on_every_rank(
        &results,
        |e| matches!(e, ddp_train::DdpTrainError::Settings(_)),
        &[
            "resuming after epoch 1 needs a checkpoint",
            "with_checkpoints(dir)",
        ],
    );
}

/// Every rank failed with an error saying all of `says`, and one of them with the error
/// `is` accepts (each rank decides alike, but one may see the other's abort first).
fn refused_on_every_rank(
    results: &[ddp_train::Result<DdpReport>],
    is: impl Fn(&ddp_train::DdpTrainError) -> bool,
    says: &[&str],
) {
    for (rank, r) in results.iter().enumerate() {
        let error = r.as_ref().expect_err("refused").to_string();
        for part in says {
            assert!(error.contains(part), "rank {rank}: {error}");
        }
    }
    assert!(
        results.iter().any(|r| r.as_ref().is_err_and(&is)),
        "{results:?}"
    );
}

/// `with_checkpoints` on rank 0 only: rank 0 would broadcast its files while rank 1 went on to
/// the model check's all-gather. Refused on every rank, naming each rank's setting.
#[test]
fn ranks_resuming_with_and_without_with_checkpoints_are_refused_on_every_rank() {
    let dirs = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    for (rank, r) in run_ranks(2, |pg| {
        let dir = dirs[pg.rank()].path().to_path_buf();
        outcome(pg, &dir, 16, 32, true)
    })
    .iter()
    .enumerate()
    {
        assert!(r.is_ok(), "rank {rank}: {r:?}");
    }
    let results = run_ranks(2, |pg| {
        let dir = dirs[pg.rank()].path().to_path_buf();
        let rank0 = pg.rank() == 0;
        outcome_with(pg, &dir, 16, 32, rank0, |s| {
            s.with_resume(Some(ddp_train::ResumePoint {
                epochs_done: 1,
                steps_done: 0,
            }))
        })
    });
    refused_on_every_rank(
        &results,
        |e| matches!(e, ddp_train::DdpTrainError::Settings(_)),
        &["by rank: [with_checkpoints, no checkpointer]"],
    );
}

/// burn-train's checkpointer writes in place, so a kill can leave a cut file, on which its
/// loader panics: every rank fails instead, naming the epoch and what to delete.
#[test]
fn a_cut_short_burn_checkpoint_fails_the_resume_on_every_rank_saying_what_to_delete() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (rank, r) in run_ranks(2, |pg| resume_outcome(pg, dir.path(), None))
        .iter()
        .enumerate()
    {
        assert!(r.is_ok(), "rank {rank}: {r:?}");
    }
    let model = dir.path().join("checkpoint/model-1.mpk");
    let len = std::fs::metadata(&model).expect("epoch 1's model").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&model)
        .and_then(|f| f.set_len(len / 2))
        .expect("cutting the file");
    let results = run_ranks(2, |pg| resume_outcome(pg, dir.path(), Some(1)));
    refused_on_every_rank(
        &results,
        |e| matches!(e, ddp_train::DdpTrainError::Resume(_)),
        &[
            "checkpoint of epoch 1",
            "model checkpoint",
            "Delete those three files of epoch 1",
        ],
    );
}

/// A learning rate that panics on its `panic_at`-th step: the user's code failing on one rank
/// outside the training step (which ddp-core guards itself).
#[derive(Clone, Debug)]
struct PanicAt {
    lr: f64,
    steps: usize,
    panic_at: Option<usize>,
}

impl LrScheduler for PanicAt {
    type Record<Bk: Backend> = f64;
    fn step(&mut self) -> f64 {
        self.steps += 1;
        if Some(self.steps) == self.panic_at {
            panic!("the scheduler gave up at step {}", self.steps);
        }
        self.lr
    }
    fn to_record<Bk: Backend>(&self) -> f64 {
        self.lr
    }
    fn load_record<Bk: Backend>(mut self, record: f64) -> Self {
        self.lr = record;
        self
    }
}

/// Opens once; until then `wait` blocks (no timing: the test opens it).
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: std::sync::Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().expect("gate") = true;
        self.opened.notify_all();
    }
    fn wait(&self) {
        let mut open = self.open.lock().expect("gate");
        while !*open {
            open = self.opened.wait(open).expect("gate");
        }
    }
}

/// Opens the gate when dropped, also when the holder panics.
struct OpenOnDrop<'a>(&'a Gate);

impl Drop for OpenOnDrop<'_> {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// The digits, whose `get` waits at `gate` from its call number `block_from` (0-based) on: a
/// slow data set, so the loader thread is inside `get` when the epoch ends.
struct Gated<'a> {
    items: Vec<DigitItem>,
    calls: std::sync::atomic::AtomicUsize,
    block_from: Option<usize>,
    gate: &'a Gate,
}

impl burn::data::dataset::Dataset<DigitItem> for Gated<'static> {
    fn get(&self, index: usize) -> Option<DigitItem> {
        let call = self
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.block_from.is_some_and(|from| call >= from) {
            self.gate.wait();
        }
        self.items.get(index).cloned()
    }
    fn len(&self) -> usize {
        self.items.len()
    }
}

/// Two epochs (batches of 16 per rank) over `train_set`, with `scheduler` and the strategy
/// passed through `adjust`; also the message of a panic that ended `launch`.
fn outcome_over<S: LrScheduler + 'static>(
    pg: ProcessGroup,
    dir: &Path,
    train_set: Gated<'static>,
    scheduler: S,
    adjust: impl FnOnce(DdpStrategy) -> DdpStrategy,
) -> (ddp_train::Result<DdpReport>, Option<String>) {
    let (world, rank) = (pg.world_size(), pg.rank());
    let sampler = DistributedSamplerConfig::new(world, rank).with_seed(42);
    let train = DistributedLoader::<B, _, _>::train(train_set, DigitBatcher, 16, sampler)
        .expect("train loader");
    let valid = DistributedLoader::<Flex, _, _>::eval(
        DigitDataset(data().1),
        DigitBatcher,
        16,
        world,
        rank,
    )
    .expect("valid loader");
    let strategy = adjust(DdpStrategy::new(pg));
    let model = Classifier::<B> {
        mlp: DigitsMlp::new(32, &Default::default()),
    };
    let training = SupervisedTraining::new(dir, Arc::new(train), Arc::new(valid))
        .metrics((LossMetric::new(),))
        .num_epochs(2)
        .with_application_logger(None)
        .distributed(&strategy);
    let learner = Learner::new(model, SgdConfig::new().init(), scheduler);
    let launched =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| training.launch(learner)));
    let panic = launched.err().map(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "a panic without a message".into())
    });
    (strategy.finish(), panic)
}

fn gated(gate: &'static Gate, block_from: Option<usize>) -> Gated<'static> {
    Gated {
        items: data().0,
        calls: Default::default(),
        block_from,
        gate,
    }
}

/// A panic on rank 1 outside the training step (its LR scheduler): it aborts the group with
/// the panic's message before unwinding on, so rank 0 fails at once quoting it (not at the
/// timeout, not with a bare "connection closed"), and `finish` on rank 1 reports it.
#[test]
fn a_panic_on_one_rank_aborts_the_group_with_its_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gate: &'static Gate = Box::leak(Box::default());
    let results = run_ranks(2, |pg| {
        let panic_at = (pg.rank() == 1).then_some(3);
        let scheduler = PanicAt {
            lr: 0.1,
            steps: 0,
            panic_at,
        };
        outcome_over(pg, dir.path(), gated(gate, None), scheduler, |s| s)
    });
    let message = "the scheduler gave up at step 3";
    let (rank0, panic0) = &results[0];
    assert_eq!(panic0, &None, "rank 0 did not panic");
    let error = rank0.as_ref().expect_err("rank 0 must fail").to_string();
    assert!(
        error.contains(&format!("rank 1 panicked: {message}")),
        "rank 0: {error}"
    );
    let (rank1, panic1) = &results[1];
    assert_eq!(
        panic1.as_deref(),
        Some(message),
        "rank 1's panic unwinds on"
    );
    let error = rank1.as_ref().expect_err("rank 1 failed").to_string();
    assert!(error.contains(message), "rank 1: {error}");
}

/// Rank 0 fails (its mid-epoch checkpoint cannot be written: `checkpoint/steps` is a file)
/// while its loader thread is inside a slow `get`: it aborts the group before joining that
/// thread, so rank 1 fails at once quoting rank 0's reason. Rank 1 opens the gate only after
/// it has its result, so without the early abort rank 1 would wait for the timeout.
#[test]
fn a_failing_rank_aborts_the_group_before_waiting_for_its_loader_thread() {
    let dirs = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    let checkpoint = dirs[0].path().join("checkpoint");
    std::fs::create_dir_all(&checkpoint).expect("dir");
    std::fs::write(checkpoint.join("steps"), b"not a directory").expect("file");
    let gate: &'static Gate = Box::leak(Box::default());
    let results = run_ranks(2, |pg| {
        let rank = pg.rank();
        let dir = dirs[rank].path().to_path_buf();
        // Rank 0's batch 4 (after the checkpoint due at step 3) never loads until opened.
        let block_from = (rank == 0).then_some(3 * 16);
        let _open = (rank == 1).then(|| OpenOnDrop(gate));
        let (result, panic) = outcome_over(pg, &dir, gated(gate, block_from), 0.1, |s| {
            s.with_checkpoints(&dir).with_checkpoint_every_n_steps(3)
        });
        assert_eq!(panic, None, "rank {rank} panicked");
        result
    });
    let error = results[0]
        .as_ref()
        .expect_err("rank 0's checkpoint write fails")
        .to_string();
    assert!(error.contains("creating the directory"), "rank 0: {error}");
    let error = results[1]
        .as_ref()
        .expect_err("rank 1 fails with rank 0")
        .to_string();
    assert!(
        error.contains("aborted") && error.contains("creating the directory"),
        "rank 1: {error}"
    );
}
