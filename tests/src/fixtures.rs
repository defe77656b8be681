//! The model, data and training loop shared by the DDP worker program and the tests that check
//! it against single-process training.

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamConfig, GradientsParams, Optimizer, SgdConfig};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The backend of the tests (CPU). The fixtures are generic so that the same runs can be made
/// on burn's CUDA backend (feature `cuda`).
pub type TestBackend = Autodiff<Flex>;

/// Steps trained by every equivalence run.
pub const STEPS: usize = 4;
/// Samples per rank per step.
pub const PER_RANK: usize = 4;

/// A two-layer perceptron, 6 -> 16 -> 3.
#[derive(Module, Debug)]
pub struct SmallMlp<B: Backend> {
    fc1: Linear<B>,
    fc2: Linear<B>,
    act: Relu,
}

impl<B: Backend> SmallMlp<B> {
    /// A freshly initialised model.
    pub fn new(device: &B::Device) -> Self {
        SmallMlp {
            fc1: LinearConfig::new(6, 16).init(device),
            fc2: LinearConfig::new(16, 3).init(device),
            act: Relu::new(),
        }
    }
    /// Weights drawn from a seeded ChaCha stream, uniform in `±1/sqrt(fan_in)` as burn's default
    /// init is: a comparison with a reference sees the same numbers on every machine and run
    /// (`new` draws from burn's global RNG, unseeded).
    pub fn seeded(device: &B::Device, seed: u64) -> Self {
        Self::new(device).map(&mut SeededInit(ChaCha8Rng::seed_from_u64(seed)))
    }
    /// Outputs `[n, 3]` for inputs `[n, 6]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.fc2.forward(self.act.forward(self.fc1.forward(x)))
    }
    /// [`forward`](Self::forward) without `fc2.bias` when `skip_bias` (an unused parameter).
    pub fn forward_using_bias(&self, x: Tensor<B, 2>, skip_bias: bool) -> Tensor<B, 2> {
        if !skip_bias {
            return self.forward(x);
        }
        let hidden = self.act.forward(self.fc1.forward(x));
        hidden.matmul(self.fc2.weight.val())
    }
}

/// Overwrites every float parameter with seeded uniform values (see [`SmallMlp::seeded`]).
struct SeededInit(ChaCha8Rng);

impl<B: Backend> ModuleMapper<B> for SeededInit {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, t, mapper) = param.consume();
        let trainable = t.is_require_grad();
        let (device, shape) = (t.device(), t.shape());
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

/// Largest difference relative to the largest magnitude in `reference`:
/// `max|a - reference| / max|reference|`.
///
/// Scaled by the whole vector rather than per element: Adam's update ignores the gradient's
/// size, so a weight that ends near zero can differ relatively by far more than the model does
/// when the reference sums its batch in another order (CI saw 1.8e-5 per element at world 3).
pub fn max_scaled_diff(a: &[f32], reference: &[f32]) -> f32 {
    assert_eq!(a.len(), reference.len(), "parameter counts differ");
    let scale = reference
        .iter()
        .fold(f32::MIN_POSITIVE, |m, y| m.max(y.abs()));
    let diff = a
        .iter()
        .zip(reference)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

/// The optimizers the equivalence runs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opt {
    /// SGD, learning rate 0.1.
    Sgd,
    /// Adam, learning rate 0.01.
    Adam,
}

impl std::str::FromStr for Opt {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sgd" => Ok(Opt::Sgd),
            "adam" => Ok(Opt::Adam),
            other => Err(format!("unknown optimizer '{other}' (sgd, adam)")),
        }
    }
}

/// Sample `i`: 6 inputs and 3 targets, deterministic.
pub fn sample(i: usize) -> ([f32; 6], [f32; 3]) {
    let x: [f32; 6] = std::array::from_fn(|k| (((i * 7 + k * 13) % 17) as f32 - 8.0) / 8.0);
    (x, [x[0] - x[1] * 0.5, x[2] * x[3], (x[4] + x[5]).sin()])
}

/// The indices of global step `step`: `rank = None` gives the whole global batch, `Some(r)` every
/// `world`-th sample from `r` (DistributedSampler's interleaving without shuffle).
pub fn step_indices(step: usize, world: usize, rank: Option<usize>) -> Vec<usize> {
    let all = step * world * PER_RANK..(step + 1) * world * PER_RANK;
    match rank {
        None => all.collect(),
        Some(r) => all.skip(r).step_by(world).collect(),
    }
}

/// A batch of the given samples.
pub fn batch<B: Backend>(indices: &[usize], device: &B::Device) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let (xs, ys): (Vec<[f32; 6]>, Vec<[f32; 3]>) = indices.iter().map(|&i| sample(i)).unzip();
    let n = indices.len();
    (
        Tensor::from_data(TensorData::new(xs.concat(), [n, 6]), device),
        Tensor::from_data(TensorData::new(ys.concat(), [n, 3]), device),
    )
}

/// Serialises a model (for handing the same initial weights to other processes).
pub fn to_bytes<B: Backend>(m: &SmallMlp<B>) -> Vec<u8> {
    let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
    Recorder::<B>::record(&rec, m.clone().into_record(), ()).expect("recording a model in memory")
}

/// Loads a model serialised by [`to_bytes`] onto `device`.
pub fn from_bytes<B: Backend>(bytes: &[u8], device: &B::Device) -> Result<SmallMlp<B>, String> {
    let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
    let record = Recorder::<B>::load(&rec, bytes.to_vec(), device).map_err(|e| e.to_string())?;
    Ok(SmallMlp::<B>::new(device).load_record(record))
}

/// Every float parameter, in module order.
pub fn flat_params<B: Backend>(m: &SmallMlp<B>) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            self.0
                .extend(p.val().into_data().convert::<f32>().iter::<f32>());
        }
    }
    let mut c = Collect(Vec::new());
    m.visit(&mut c);
    c.0
}

/// Single-process training on the whole global batch of `world * PER_RANK` samples per step,
/// on the CPU.
pub fn train_reference(init: &[u8], world: usize, opt: Opt) -> Result<Vec<f32>, String> {
    train_reference_on::<TestBackend>(init, world, opt, &Default::default())
}

/// [`train_reference`] on backend `B`, on `device`.
pub fn train_reference_on<B: AutodiffBackend>(
    init: &[u8],
    world: usize,
    opt: Opt,
    device: &B::Device,
) -> Result<Vec<f32>, String> {
    let mut model = from_bytes::<B>(init, device)?;
    let mut sgd = SgdConfig::new().init::<B, SmallMlp<B>>();
    let mut adam = AdamConfig::new().init::<B, SmallMlp<B>>();
    for step in 0..STEPS {
        let (x, y) = batch::<B>(&step_indices(step, world, None), device);
        let loss = MseLoss::new().forward(model.forward(x), y, Reduction::Mean);
        let grads = GradientsParams::from_grads::<B, _>(loss.backward(), &model);
        model = match opt {
            Opt::Sgd => sgd.step(0.1, model, grads),
            Opt::Adam => adam.step(0.01, model, grads),
        };
    }
    Ok(flat_params(&model))
}

/// How each rank of a world trains, for [`train_reference_ranks`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankPlan {
    /// Steps each rank trains (uneven inputs: the others have joined), by rank.
    pub steps: Vec<usize>,
    /// The rank whose forward leaves `fc2.bias` unused, if any.
    pub skips_bias: Option<usize>,
}

impl RankPlan {
    /// `world` ranks training [`STEPS`] steps each, every parameter used.
    pub fn even(world: usize) -> RankPlan {
        RankPlan {
            steps: vec![STEPS; world],
            skips_bias: None,
        }
    }
}

/// Single-process training that follows `plan`: step `s` averages the losses of the ranks that
/// still train at `s`, each on its own share of the global batch ([`step_indices`]) and with its
/// own forward, which is what DDP computes (a parameter unused on a rank counts as zero there;
/// a joined rank is not counted).
pub fn train_reference_ranks(init: &[u8], plan: &RankPlan, opt: Opt) -> Result<Vec<f32>, String> {
    type B = TestBackend;
    let device = Default::default();
    let world = plan.steps.len();
    let mut model = from_bytes::<B>(init, &device)?;
    let mut sgd = SgdConfig::new().init::<B, SmallMlp<B>>();
    let mut adam = AdamConfig::new().init::<B, SmallMlp<B>>();
    let longest = plan.steps.iter().copied().max().unwrap_or(0);
    for step in 0..longest {
        let ranks: Vec<usize> = (0..world).filter(|&r| plan.steps[r] > step).collect();
        let mut total: Option<Tensor<B, 1>> = None;
        for &r in &ranks {
            let (x, y) = batch::<B>(&step_indices(step, world, Some(r)), &device);
            let pred = model.forward_using_bias(x, plan.skips_bias == Some(r));
            let loss = MseLoss::new().forward(pred, y, Reduction::Mean) / ranks.len() as f32;
            total = Some(match total {
                Some(t) => t + loss,
                None => loss,
            });
        }
        let total = total.ok_or("a step without ranks")?;
        let grads = GradientsParams::from_grads::<B, _>(total.backward(), &model);
        model = match opt {
            Opt::Sgd => sgd.step(0.1, model, grads),
            Opt::Adam => adam.step(0.01, model, grads),
        };
    }
    Ok(flat_params(&model))
}
