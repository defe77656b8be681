//! Shared test fixtures: ranks as threads, a small model, deterministic data.
#![allow(dead_code)]

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use ddp_core::comm::{
    CommError, ProcessGroup, ProcessGroupConfig, Store, StoreConfig, StoreServer,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Duration;

pub type B = Autodiff<Flex>;

/// Hidden units of the [`Mlp`] the sharded-training tests train.
pub const HIDDEN: usize = 16;
/// Samples per global step in those tests, split evenly over 1, 2, 3 or 4 ranks.
pub const GLOBAL_BATCH: usize = 12;

/// Rank `rank`'s contiguous share of global step `step` ([`GLOBAL_BATCH`] samples).
pub fn contiguous_shard(step: usize, world: usize, rank: usize) -> Vec<usize> {
    let per = GLOBAL_BATCH / world;
    (0..per)
        .map(|i| step * GLOBAL_BATCH + rank * per + i)
        .collect()
}

/// The module's record as bytes, at full precision: a snapshot to rebuild replicas from.
pub fn record_bytes<M: Module<B>>(m: &M) -> Vec<u8> {
    let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
    Recorder::<B>::record(&rec, m.clone().into_record(), ()).expect("record")
}

/// An [`Mlp`] of [`HIDDEN`] units with the weights of [`record_bytes`]' snapshot.
pub fn mlp_from(bytes: &[u8]) -> Mlp<B> {
    let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
    let record = Recorder::<B>::load(&rec, bytes.to_vec(), &Default::default()).expect("load");
    Mlp::<B>::new(&Default::default(), HIDDEN).load_record(record)
}

/// Two linear layers; `extra` is used only when `use_extra` is set in the forward.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    pub fc1: Linear<B>,
    pub fc2: Linear<B>,
    pub extra: Linear<B>,
    pub act: Relu,
}

impl<B: Backend> Mlp<B> {
    /// Weights drawn from a seeded ChaCha stream, uniform in `±1/sqrt(fan_in)` as burn's default
    /// init is: tests that compare against a reference get the same numbers on every run.
    /// (`new` draws from burn's global RNG, which the tests running in parallel share.)
    pub fn seeded(device: &B::Device, hidden: usize, seed: u64) -> Self {
        Self::new(device, hidden).map(&mut SeededInit(ChaCha8Rng::seed_from_u64(seed)))
    }

    pub fn new(device: &B::Device, hidden: usize) -> Self {
        Mlp {
            fc1: LinearConfig::new(6, hidden).init(device),
            fc2: LinearConfig::new(hidden, 3).init(device),
            extra: LinearConfig::new(6, 3).init(device),
            act: Relu::new(),
        }
    }

    pub fn forward(&self, x: Tensor<B, 2>, use_extra: bool) -> Tensor<B, 2> {
        let h = self.act.forward(self.fc1.forward(x.clone()));
        let y = self.fc2.forward(h);
        if use_extra {
            y + self.extra.forward(x)
        } else {
            y
        }
    }
}

/// `module` with every float parameter drawn from a seeded ChaCha stream (see [`Mlp::seeded`]):
/// for tests that compare against a reference summed in another order, where which weights end
/// near zero must not change from run to run.
pub fn seed_weights<Bk: Backend, M: Module<Bk>>(module: M, seed: u64) -> M {
    module.map(&mut SeededInit(ChaCha8Rng::seed_from_u64(seed)))
}

/// Overwrites every float parameter with seeded uniform values (see [`Mlp::seeded`]).
struct SeededInit(ChaCha8Rng);

impl<B: Backend> ModuleMapper<B> for SeededInit {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, t, mapper) = param.consume();
        let trainable = t.is_require_grad();
        let device = t.device();
        let shape = t.shape();
        let fan_in = if D >= 2 {
            shape.dims::<D>()[0]
        } else {
            shape.num_elements()
        };
        let bound = 1.0 / (fan_in.max(1) as f32).sqrt();
        let values: Vec<f32> = (0..shape.num_elements())
            .map(|_| self.0.random_range(-bound..bound))
            .collect();
        let value = Tensor::<B, D>::from_data(TensorData::new(values, shape), &device)
            .set_require_grad(trainable);
        Param::from_mapped_value(id, value, mapper)
    }
}

/// Sample `i` of the synthetic regression set: 6 inputs, 3 targets, deterministic.
pub fn sample(i: usize) -> ([f32; 6], [f32; 3]) {
    let x: [f32; 6] = std::array::from_fn(|k| (((i * 7 + k * 13) % 17) as f32 - 8.0) / 8.0);
    let y = [x[0] - x[1] * 0.5, x[2] * x[3], (x[4] + x[5]).sin()];
    (x, y)
}

pub fn batch(indices: &[usize], device: &burn::tensor::Device<B>) -> (Tensor<B, 2>, Tensor<B, 2>) {
    batch_on::<B>(indices, device)
}

/// [`batch`] on any backend.
pub fn batch_on<Bk: Backend>(
    indices: &[usize],
    device: &Bk::Device,
) -> (Tensor<Bk, 2>, Tensor<Bk, 2>) {
    let (xs, ys): (Vec<[f32; 6]>, Vec<[f32; 3]>) = indices.iter().map(|&i| sample(i)).unzip();
    let n = indices.len();
    let x = Tensor::from_data(TensorData::new(xs.concat(), [n, 6]), device);
    let y = Tensor::from_data(TensorData::new(ys.concat(), [n, 3]), device);
    (x, y)
}

/// Trains `ddp` over global steps `steps` with `optim` at `lr`, each rank on its contiguous
/// shard of each global batch; `extra` is used on even steps only, so some steps leave it
/// without a gradient. Returns the parameters after each step.
pub fn train_mlp<O: burn::optim::Optimizer<Mlp<B>, B>>(
    ddp: &mut ddp_core::DistributedDataParallel<B, Mlp<B>>,
    optim: &mut O,
    lr: f64,
    steps: std::ops::Range<usize>,
) -> Vec<Vec<f32>> {
    use burn::nn::loss::{MseLoss, Reduction};
    let (rank, world) = (ddp.process_group().rank(), ddp.process_group().world_size());
    let device = Default::default();
    let mut after = Vec::new();
    for step in steps {
        let (x, y) = batch(&contiguous_shard(step, world, rank), &device);
        let pred = ddp
            .forward(|m| m.forward(x, step % 2 == 0))
            .expect("forward");
        let loss = MseLoss::new().forward(pred, y, Reduction::Mean);
        let grads = ddp.backward(loss).expect("backward");
        ddp.optimizer_step(optim, lr, grads);
        after.push(flat_params(ddp.module()));
    }
    after
}

/// Every float parameter's values, in module order.
pub fn flat_params<Bk: Backend, M: Module<Bk>>(m: &M) -> Vec<f32> {
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

/// Runs `body` on `n` ranks (threads) with their own process groups.
pub fn run_ranks<T: Send>(n: usize, body: impl Fn(ProcessGroup) -> T + Sync) -> Vec<T> {
    let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new()).expect("store");
    let addr = server.local_addr().to_string();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let (addr, body) = (addr.clone(), &body);
                s.spawn(move || {
                    let pg = connect(&addr, rank, n).expect("process group");
                    body(pg)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}

fn connect(addr: &str, rank: usize, n: usize) -> Result<ProcessGroup, CommError> {
    let t = Duration::from_secs(60);
    let store = Store::connect(addr, StoreConfig::new().with_timeout(t))?;
    ProcessGroup::with_store(store, ProcessGroupConfig::new(rank, n).with_timeout(t))
}

/// Largest difference relative to the largest magnitude in `b`: `max|a - b| / max|b|`.
///
/// Scaled by the whole vector rather than per element, because a weight that is near zero after
/// Adam (whose update ignores the gradient's size) can differ relatively by far more than the
/// model does, and which weight ends near zero depends on the initial weights.
pub fn max_scaled_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(f32::MIN_POSITIVE, |m, y| m.max(y.abs()));
    let diff = a
        .iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}
