//! The models of the DDP step benches (`ddp_step`'s overlap table and `ddp_vs_pytorch`),
//! generic over the burn backend so one definition runs on Flex, NdArray and LibTorch: the MLP
//! of [`BenchMlp`], the `transformer` example's `TinyGpt`, the `digits_cnn` example's
//! `DigitsCnn`, and a user's CNN on 28x28 images ([`UserCnn`]).
//! `benches/pytorch/ddp_overlap.py` builds the same models in PyTorch.

use crate::{BenchMlp, bench_batch, class_labels};
use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Tensor};
use ddp_core::nn::{SyncBatchNormBackend, SyncBatchNormGroup};
use ddp_examples::models::{DigitsCnn, GptShape, TinyGpt};
use ddp_examples::reverse::{ReverseBatcher, VOCAB, scored_positions, sequence};

/// A model of the tables: how to build it and compute one step's loss.
pub trait Workload<B: AutodiffBackend + SyncBatchNormBackend> {
    /// The model.
    type M: AutodiffModule<B>;
    /// Its row label.
    const NAME: &'static str;
    /// A new model; `marked`: with layer boundaries; `group`: SyncBatchNorm's group (the CNN
    /// only; `None` normalises with each rank's own batch, as burn's and PyTorch's BatchNorm).
    fn model(device: &B::Device, marked: bool, group: Option<SyncBatchNormGroup>) -> Self::M;
    /// The loss of step `step`'s batch.
    fn loss(m: &Self::M, marked: bool, step: usize, device: &B::Device) -> Tensor<B, 1>;
}

/// MLP 1024-2048-2048-10 (6.3M parameters), batch 64 ([`BenchMlp`]).
pub struct Mlp;

impl<B: AutodiffBackend + SyncBatchNormBackend> Workload<B> for Mlp {
    type M = BenchMlp<B>;
    const NAME: &'static str = "MLP 6.3M";
    fn model(device: &B::Device, _: bool, _: Option<SyncBatchNormGroup>) -> Self::M {
        BenchMlp::new(device)
    }
    fn loss(m: &Self::M, marked: bool, _: usize, device: &B::Device) -> Tensor<B, 1> {
        let (x, y) = bench_batch::<B>(device);
        CrossEntropyLossConfig::new()
            .init(device)
            .forward(m.forward(x, marked), y)
    }
}

/// Digits per sequence of the transformer's batches (sequences of 2 x 6 + 2 tokens).
pub const SEQ_LEN: usize = 6;
/// Sequences per transformer batch.
pub const GPT_BATCH: usize = 32;

/// The transformer example's `TinyGpt`: d_model 256, 4 layers, 4 heads (3.2M parameters),
/// batch 32 sequences of 13 tokens, loss on the 6 reversed digits.
pub struct Gpt;

impl<B: AutodiffBackend + SyncBatchNormBackend> Workload<B> for Gpt {
    type M = TinyGpt<B>;
    const NAME: &'static str = "transformer 3.2M";
    fn model(device: &B::Device, marked: bool, _: Option<SyncBatchNormGroup>) -> Self::M {
        let shape = GptShape {
            vocab: VOCAB,
            max_len: 2 * SEQ_LEN + 2,
            d_model: 256,
            heads: 4,
            layers: 4,
            boundaries: marked,
        };
        TinyGpt::new(shape, device)
    }
    fn loss(m: &Self::M, _: bool, step: usize, device: &B::Device) -> Tensor<B, 1> {
        use burn::data::dataloader::batcher::Batcher;
        let items: Vec<Vec<i64>> = (0..GPT_BATCH)
            .map(|i| sequence(7, (step * GPT_BATCH + i) as u64, SEQ_LEN))
            .collect();
        let b: ddp_examples::reverse::ReverseBatch<B> = ReverseBatcher.batch(items, device);
        let scored = scored_positions(SEQ_LEN);
        let logits = m
            .forward(b.inputs)
            .slice([0..GPT_BATCH, scored.clone(), 0..VOCAB])
            .reshape([GPT_BATCH * SEQ_LEN, VOCAB]);
        let targets = b
            .targets
            .slice([0..GPT_BATCH, scored])
            .reshape([GPT_BATCH * SEQ_LEN]);
        CrossEntropyLossConfig::new()
            .init(device)
            .forward(logits, targets)
    }
}

/// Feature maps of the CNN's first convolution.
pub const CNN_CHANNELS: usize = 32;
/// Images per CNN batch.
pub const CNN_BATCH: usize = 64;

/// The `digits_cnn` example's model: two 3x3 convolutions (32 and 64 maps) with batch norm on
/// 8x8 images, average pooling, a linear layer (29K parameters), batch 64.
pub struct ConvNet;

impl<B: AutodiffBackend + SyncBatchNormBackend> Workload<B> for ConvNet {
    type M = DigitsCnn<B>;
    const NAME: &'static str = "CNN 29K";
    fn model(device: &B::Device, _: bool, group: Option<SyncBatchNormGroup>) -> Self::M {
        DigitsCnn::new(CNN_CHANNELS, group, device)
    }
    fn loss(m: &Self::M, marked: bool, _: usize, device: &B::Device) -> Tensor<B, 1> {
        let x = Tensor::<B, 2>::random([CNN_BATCH, 64], Distribution::Normal(0.0, 1.0), device);
        let y = class_labels(CNN_BATCH, device);
        let logits = m.forward_marked(x, marked);
        CrossEntropyLossConfig::new()
            .init(device)
            .forward(logits, y)
    }
}

/// A CNN as a user writes one for 28x28 images (issue 46's program): two 3x3 same-padding
/// convolutions (1 -> 32 -> 64 maps) with ReLU, then a linear layer on the 64x28x28 maps to
/// 10 classes (0.5M parameters, nearly all in that linear layer).
#[derive(burn::module::Module, Debug)]
pub struct UserCnnModel<B: burn::tensor::backend::Backend> {
    conv1: burn::nn::conv::Conv2d<B>,
    conv2: burn::nn::conv::Conv2d<B>,
    out: burn::nn::Linear<B>,
    act: burn::nn::Relu,
}

/// Images per [`UserCnn`] batch.
pub const USER_CNN_BATCH: usize = 32;

impl<B: burn::tensor::backend::Backend> UserCnnModel<B> {
    /// A new model.
    pub fn new(device: &B::Device) -> Self {
        use burn::nn::PaddingConfig2d;
        use burn::nn::conv::Conv2dConfig;
        let conv = |from: usize, to: usize| {
            Conv2dConfig::new([from, to], [3, 3])
                .with_padding(PaddingConfig2d::Same)
                .init(device)
        };
        UserCnnModel {
            conv1: conv(1, 32),
            conv2: conv(32, 64),
            out: burn::nn::LinearConfig::new(64 * 28 * 28, 10).init(device),
            act: burn::nn::Relu::new(),
        }
    }

    /// Class scores `[n, 10]` for images `[n, 1, 28, 28]`.
    pub fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = self.act.forward(self.conv1.forward(images));
        let x = self.act.forward(self.conv2.forward(x));
        self.out.forward(x.flatten(1, 3))
    }
}

/// [`UserCnnModel`], batch 32 of normal 28x28 images.
pub struct UserCnn;

impl<B: AutodiffBackend + SyncBatchNormBackend> Workload<B> for UserCnn {
    type M = UserCnnModel<B>;
    const NAME: &'static str = "CNN 0.5M 28x28";
    fn model(device: &B::Device, _: bool, _: Option<SyncBatchNormGroup>) -> Self::M {
        UserCnnModel::new(device)
    }
    fn loss(m: &Self::M, _: bool, _: usize, device: &B::Device) -> Tensor<B, 1> {
        let n = USER_CNN_BATCH;
        let x = Tensor::<B, 4>::random([n, 1, 28, 28], Distribution::Normal(0.0, 1.0), device);
        let y = class_labels(n, device);
        CrossEntropyLossConfig::new()
            .init(device)
            .forward(m.forward(x), y)
    }
}
