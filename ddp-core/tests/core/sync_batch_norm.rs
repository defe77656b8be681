//! SyncBatchNorm against burn's BatchNorm on one process holding the union batch: forward
//! output, gradients of the input, gamma and beta, running statistics, at world 1-4 with uneven
//! per-rank batches; evaluation without communication; and inside DDP with a small CNN.
use crate::common::*;
use burn::module::{AutodiffModule, Module, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, PaddingConfig2d, Relu};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use ddp_core::{
    DdpConfig, DistributedDataParallel,
    nn::{SyncBatchNorm, SyncBatchNormBackend, SyncBatchNormGroup},
};

const C: usize = 3;
const HW: usize = 2;
const TOL: f32 = 1e-4;

/// Value `k` of sample `i`: deterministic, different per channel (different means and scales).
fn pixel(i: usize, k: usize) -> f32 {
    let c = (k / (HW * HW)) as f32;
    ((i * 31 + k * 17) % 23) as f32 / 7.0 * (1.0 + c) - c
}

fn inputs(indices: std::ops::Range<usize>, device: &burn::tensor::Device<B>) -> Tensor<B, 4> {
    let n = indices.len();
    let v: Vec<f32> = indices
        .flat_map(|i| (0..C * HW * HW).map(move |k| pixel(i, k)))
        .collect();
    Tensor::from_data(TensorData::new(v, [n, C, HW, HW]), device).require_grad()
}

/// Per-output weights of the loss `sum(w * y)`, so that d loss / d y is not uniform.
fn loss_weights(indices: std::ops::Range<usize>, device: &burn::tensor::Device<B>) -> Tensor<B, 4> {
    let n = indices.len();
    let v: Vec<f32> = indices
        .flat_map(|i| (0..C * HW * HW).map(move |k| (((i * 5 + k * 3) % 11) as f32 - 5.0) / 5.0))
        .collect();
    Tensor::from_data(TensorData::new(v, [n, C, HW, HW]), device)
}

fn batch_norm(device: &burn::tensor::Device<B>) -> BatchNorm<B> {
    let mut bn = BatchNormConfig::new(C).with_momentum(0.3).init::<B>(device);
    bn.gamma = Param::from_tensor(Tensor::from_floats([1.5, 0.5, -1.0], device));
    bn.beta = Param::from_tensor(Tensor::from_floats([0.1, -0.2, 0.3], device));
    bn
}

fn values<const D: usize, E: Backend>(t: Tensor<E, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().iter::<f32>().collect()
}

/// What a forward + backward gives: output, input grad, gamma grad, beta grad, running mean,
/// running var.
#[derive(Debug, Clone)]
struct Outcome {
    output: Vec<f32>,
    input_grad: Vec<f32>,
    gamma_grad: Vec<f32>,
    beta_grad: Vec<f32>,
    running_mean: Vec<f32>,
    running_var: Vec<f32>,
}

/// Two training forwards (the second one's statistics and running update build on the first),
/// the backward of the second.
fn run_layer<M>(
    forward: impl Fn(Tensor<B, 4>) -> Tensor<B, 4>,
    layer: &M,
    gamma: &Param<Tensor<B, 1>>,
    beta: &Param<Tensor<B, 1>>,
    running: impl Fn(&M) -> (Vec<f32>, Vec<f32>),
    samples: std::ops::Range<usize>,
) -> Outcome {
    let device = Default::default();
    let _ = forward(inputs(samples.start + 100..samples.end + 100, &device));
    let x = inputs(samples.clone(), &device);
    let y = forward(x.clone());
    let loss = (y.clone() * loss_weights(samples, &device)).sum();
    let grads = loss.backward();
    let (running_mean, running_var) = running(layer);
    Outcome {
        output: values(y),
        input_grad: values(x.grad(&grads).expect("input grad")),
        gamma_grad: values(gamma.grad(&grads).expect("gamma grad")),
        beta_grad: values(beta.grad(&grads).expect("beta grad")),
        running_mean,
        running_var,
    }
}

fn reference(total: usize) -> Outcome {
    let bn = batch_norm(&Default::default());
    run_layer(
        |x| bn.forward(x),
        &bn,
        &bn.gamma,
        &bn.beta,
        |bn| {
            (
                values(bn.running_mean.value_sync()),
                values(bn.running_var.value_sync()),
            )
        },
        0..total,
    )
}

/// Equal within `TOL`, relative to the larger of the value and 1 (gradients near zero differ
/// by rounding only).
fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let d = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
        .fold(0.0, f32::max);
    assert!(
        d < TOL,
        "{what}: max difference {d}\n got {got:?}\nwant {want:?}"
    );
}

/// Rank `r` holds samples `offset_r .. offset_r + sizes[r]` of the union batch.
fn check_world(sizes: &[usize]) {
    let world = sizes.len();
    let total: usize = sizes.iter().sum();
    let want = reference(total);
    let per_rank = run_ranks(world, |pg| {
        let device = Default::default();
        let group = SyncBatchNormGroup::new(&pg).expect("statistics group");
        let layer = SyncBatchNorm::from_batch_norm(batch_norm(&device), Some(group));
        let start: usize = sizes[..pg.rank()].iter().sum();
        run_layer(
            |x| layer.try_forward(x).expect("forward"),
            &layer,
            &layer.gamma,
            &layer.beta,
            |l| {
                (
                    values(l.running_mean.value_sync()),
                    values(l.running_var.value_sync()),
                )
            },
            start..start + sizes[pg.rank()],
        )
    });
    let cat = |f: fn(&Outcome) -> &Vec<f32>| -> Vec<f32> {
        per_rank.iter().flat_map(|o| f(o).clone()).collect()
    };
    assert_close("output", &cat(|o| &o.output), &want.output);
    assert_close("input grad", &cat(|o| &o.input_grad), &want.input_grad);
    // The loss is the sum of the ranks' losses, so parameter gradients add up.
    let sum = |f: fn(&Outcome) -> &Vec<f32>| -> Vec<f32> {
        (0..C)
            .map(|c| per_rank.iter().map(|o| f(o)[c]).sum())
            .collect()
    };
    assert_close("gamma grad", &sum(|o| &o.gamma_grad), &want.gamma_grad);
    assert_close("beta grad", &sum(|o| &o.beta_grad), &want.beta_grad);
    for o in &per_rank {
        assert_close("running mean", &o.running_mean, &want.running_mean);
        assert_close("running var", &o.running_var, &want.running_var);
    }
}

#[test]
fn equals_one_process_on_the_union_batch_at_world_1_to_4_with_uneven_batches() {
    // World 1 to 4, uneven sizes, and one rank with an empty batch.
    check_world(&[5]);
    check_world(&[3, 1]);
    check_world(&[2, 4, 1]);
    check_world(&[1, 3, 2, 5]);
    check_world(&[0, 4, 2]);
}

#[test]
fn local_layer_equals_burn_batch_norm() {
    let device = Default::default();
    let layer = SyncBatchNorm::from_batch_norm(batch_norm(&device), None);
    let got = run_layer(
        |x| layer.forward(x),
        &layer,
        &layer.gamma,
        &layer.beta,
        |l| {
            (
                values(l.running_mean.value_sync()),
                values(l.running_var.value_sync()),
            )
        },
        0..6,
    );
    let want = reference(6);
    assert_close("output", &got.output, &want.output);
    assert_close("input grad", &got.input_grad, &want.input_grad);
    assert_close("running var", &got.running_var, &want.running_var);
}

#[test]
fn evaluation_uses_running_statistics_without_communicating() {
    // Rank 1 stops after the training forward; rank 0's evaluation must not wait for it.
    let outputs = run_ranks(2, |pg| {
        let device = Default::default();
        let group = SyncBatchNormGroup::new(&pg).expect("statistics group");
        let layer = SyncBatchNorm::from_batch_norm(batch_norm(&device), Some(group));
        let start = pg.rank() * 3;
        let _ = layer.forward(inputs(start..start + 3, &device));
        if pg.rank() != 0 {
            return None;
        }
        let eval = layer.valid();
        let x = inputs(0..4, &device).inner();
        Some(values(eval.forward(x)))
    });
    let device = Default::default();
    let bn = batch_norm(&device);
    let _ = bn.forward(inputs(0..6, &device));
    let want = values(bn.valid().forward(inputs(0..4, &device).inner()));
    assert_close("eval output", outputs[0].as_ref().expect("rank 0"), &want);
}

#[test]
fn converts_to_and_from_batch_norm_unchanged() {
    let device = Default::default();
    let bn = batch_norm(&device);
    let _ = bn.forward(inputs(0..4, &device));
    let (gamma, mean, momentum) = (
        values(bn.gamma.val()),
        values(bn.running_mean.value_sync()),
        bn.momentum,
    );
    let back = SyncBatchNorm::from_batch_norm(bn, None).into_batch_norm();
    assert_eq!(values(back.gamma.val()), gamma);
    assert_eq!(values(back.running_mean.value_sync()), mean);
    assert_eq!(back.momentum, momentum);
}

#[test]
fn bad_input_is_an_error() {
    let device = Default::default();
    let layer = SyncBatchNorm::<B>::from_batch_norm(batch_norm(&device), None);
    let wrong_channels = Tensor::<B, 2>::zeros([4, C + 1], &device);
    let err = layer.try_forward(wrong_channels).unwrap_err();
    assert!(err.to_string().contains("4 channels"), "{err}");
    // One value per channel in training: a variance of 0 (PyTorch refuses it too).
    let one = Tensor::<B, 2>::ones([1, C], &device);
    let err = layer.try_forward(one).unwrap_err();
    assert!(
        matches!(err, ddp_core::nn::SyncBatchNormError::OneValuePerChannel),
        "{err}"
    );
}

/// conv -> SyncBatchNorm (or BatchNorm) -> relu -> linear, on 1x4x4 images.
#[derive(Module, Debug)]
struct Cnn<B: Backend, N> {
    conv: Conv2d<B>,
    norm: N,
    fc: Linear<B>,
    act: Relu,
}

trait Norm<B: Backend> {
    fn norm(&self, x: Tensor<B, 4>) -> Tensor<B, 4>;
}
impl<B: Backend> Norm<B> for BatchNorm<B> {
    fn norm(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        self.forward(x)
    }
}
impl<B: SyncBatchNormBackend> Norm<B> for SyncBatchNorm<B> {
    fn norm(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        self.forward(x)
    }
}

impl<B: Backend, N: Norm<B>> Cnn<B, N> {
    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let h = self.act.forward(self.norm.norm(self.conv.forward(x)));
        self.fc.forward(h.flatten(1, 3))
    }
}

fn cnn(device: &burn::tensor::Device<B>) -> Cnn<B, BatchNorm<B>> {
    Cnn {
        conv: Conv2dConfig::new([1, 4], [3, 3])
            .with_padding(PaddingConfig2d::Same)
            .init(device),
        norm: BatchNormConfig::new(4).init(device),
        fc: LinearConfig::new(4 * 16, 3).init(device),
        act: Relu::new(),
    }
}

fn images(
    indices: std::ops::Range<usize>,
    device: &burn::tensor::Device<B>,
) -> (Tensor<B, 4>, Tensor<B, 1, Int>) {
    let n = indices.len();
    let px: Vec<f32> = indices
        .clone()
        .flat_map(|i| (0..16).map(move |k| ((i * 13 + k * 7) % 19) as f32 / 19.0))
        .collect();
    let labels: Vec<i64> = indices.map(|i| (i % 3) as i64).collect();
    (
        Tensor::from_data(TensorData::new(px, [n, 1, 4, 4]), device),
        Tensor::from_data(TensorData::new(labels, [n]), device),
    )
}

fn init_bytes(m: &Cnn<B, BatchNorm<B>>) -> Vec<u8> {
    let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
    Recorder::<B>::record(&rec, m.clone().into_record(), ()).expect("record")
}

fn load_cnn(bytes: &[u8]) -> Cnn<B, BatchNorm<B>> {
    let device = Default::default();
    let rec = BinBytesRecorder::<FullPrecisionSettings>::default();
    let record = Recorder::<B>::load(&rec, bytes.to_vec(), &device).expect("load");
    cnn(&device).load_record(record)
}

const STEPS: usize = 3;
const PER_RANK: usize = 4;

#[test]
fn ddp_with_sync_batch_norm_trains_like_one_process() {
    for world in [2, 3] {
        let device = Default::default();
        let init = init_bytes(&cnn(&device));
        // Reference: one process, the union batch, burn's BatchNorm, mean loss.
        let mut reference = load_cnn(&init);
        let mut sgd = SgdConfig::new().init::<B, Cnn<B, BatchNorm<B>>>();
        let loss_fn = CrossEntropyLossConfig::new().init(&device);
        for step in 0..STEPS {
            let (x, y) = images(
                step * world * PER_RANK..(step + 1) * world * PER_RANK,
                &device,
            );
            let loss = loss_fn.forward(reference.forward(x), y);
            let grads = GradientsParams::from_grads(loss.backward(), &reference);
            reference = sgd.step(0.5, reference, grads);
        }
        // burn's RunningState shows a thread's latest update only after a sync (DDP syncs it
        // when it sends rank 0's buffers).
        let _ = reference.norm.running_mean.value_sync();
        let _ = reference.norm.running_var.value_sync();
        let want = flat_params(&reference);

        let got = run_ranks(world, |pg| {
            let device = Default::default();
            let group = SyncBatchNormGroup::new(&pg).expect("statistics group");
            // Each rank loads its own copy: tensors shared between threads would merge their
            // autodiff graphs (and their locks).
            let init = load_cnn(&init);
            let model = Cnn {
                conv: init.conv,
                norm: SyncBatchNorm::from_batch_norm(init.norm, Some(group)),
                fc: init.fc,
                act: init.act,
            };
            let rank = pg.rank();
            let mut ddp = DistributedDataParallel::new(model, pg, DdpConfig::new()).expect("ddp");
            let mut sgd = SgdConfig::new().init();
            let loss_fn = CrossEntropyLossConfig::new().init(&device);
            for step in 0..STEPS {
                let start = (step * world + rank) * PER_RANK;
                let (x, y) = images(start..start + PER_RANK, &device);
                let logits = ddp.forward(|m| m.forward(x)).expect("forward");
                let grads = ddp.backward(loss_fn.forward(logits, y)).expect("backward");
                ddp.optimizer_step(&mut sgd, 0.5, grads);
            }
            flat_params(ddp.module())
        });
        for (rank, params) in got.iter().enumerate() {
            let diffs: Vec<(usize, f32, f32)> = params
                .iter()
                .zip(&want)
                .enumerate()
                .filter(|(_, (a, b))| (*a - *b).abs() > 1e-4 * b.abs().max(1.0))
                .map(|(i, (a, b))| (i, *a, *b))
                .collect();
            assert!(
                diffs.is_empty(),
                "world {world} rank {rank}: {} of {} values differ: {:?}",
                diffs.len(),
                want.len(),
                &diffs[..diffs.len().min(12)]
            );
        }
    }
}
