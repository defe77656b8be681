//! The models the examples train.

use burn::module::Module;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// A multilayer perceptron: 64 -> hidden -> hidden/2 -> 10.
#[derive(Module, Debug)]
pub struct DigitsMlp<B: Backend> {
    fc1: Linear<B>,
    fc2: Linear<B>,
    out: Linear<B>,
    act: Relu,
}

impl<B: Backend> DigitsMlp<B> {
    /// A new model with `hidden` units in its first layer.
    pub fn new(hidden: usize, device: &B::Device) -> Self {
        DigitsMlp {
            fc1: LinearConfig::new(64, hidden).init(device),
            fc2: LinearConfig::new(hidden, hidden / 2).init(device),
            out: LinearConfig::new(hidden / 2, 10).init(device),
            act: Relu::new(),
        }
    }

    /// Class scores `[n, 10]` for images `[n, 64]`.
    pub fn forward(&self, images: Tensor<B, 2>) -> Tensor<B, 2> {
        let x = self.act.forward(self.fc1.forward(images));
        let x = self.act.forward(self.fc2.forward(x));
        self.out.forward(x)
    }
}

/// A small decoder-only transformer: token and position embeddings, pre-norm self-attention
/// layers with a causal mask, and a linear head. Layer boundaries
/// ([`ddp_core::layer_boundary`]) between the layers let DDP send each layer's gradients as soon
/// as its backward is done.
#[derive(Module, Debug)]
pub struct TinyGpt<B: Backend> {
    token: burn::nn::Embedding<B>,
    position: burn::nn::Embedding<B>,
    layers: Vec<burn::nn::transformer::TransformerEncoderLayer<B>>,
    norm: burn::nn::LayerNorm<B>,
    head: Linear<B>,
    boundaries: bool,
}

/// The shape of a [`TinyGpt`].
#[derive(Debug, Clone, Copy)]
pub struct GptShape {
    /// Tokens in the vocabulary.
    pub vocab: usize,
    /// Longest sequence.
    pub max_len: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Attention heads per layer.
    pub heads: usize,
    /// Layers.
    pub layers: usize,
    /// Mark a layer boundary before each layer.
    pub boundaries: bool,
}

impl GptShape {
    /// One unit per transformer layer (`layers.0`, `layers.1`, ...) for fully sharded training
    /// (`ddp_core::fsdp::FsdpConfig::with_units`); the embeddings, the final norm and the head
    /// form the root unit.
    pub fn fsdp_units(&self) -> Vec<String> {
        (0..self.layers).map(|i| format!("layers.{i}")).collect()
    }
}

impl<B: Backend> TinyGpt<B> {
    /// A new model of the given shape (feed-forward width 4 x `d_model`, no dropout).
    pub fn new(shape: GptShape, device: &B::Device) -> Self {
        use burn::nn::transformer::{TransformerEncoderConfig, TransformerEncoderLayer};
        let config = TransformerEncoderConfig::new(
            shape.d_model,
            4 * shape.d_model,
            shape.heads,
            shape.layers,
        )
        .with_dropout(0.0)
        .with_norm_first(true);
        TinyGpt {
            token: burn::nn::EmbeddingConfig::new(shape.vocab, shape.d_model).init(device),
            position: burn::nn::EmbeddingConfig::new(shape.max_len, shape.d_model).init(device),
            layers: (0..shape.layers)
                .map(|_| TransformerEncoderLayer::new(&config, device))
                .collect(),
            norm: burn::nn::LayerNormConfig::new(shape.d_model).init(device),
            head: LinearConfig::new(shape.d_model, shape.vocab).init(device),
            boundaries: shape.boundaries,
        }
    }

    /// Next-token logits `[batch, seq, vocab]` for tokens `[batch, seq]`.
    pub fn forward(&self, tokens: Tensor<B, 2, burn::tensor::Int>) -> Tensor<B, 3> {
        let [batch, seq] = tokens.dims();
        let device = tokens.device();
        let positions = Tensor::<B, 1, burn::tensor::Int>::arange(0..seq as i64, &device)
            .reshape([1, seq])
            .repeat_dim(0, batch);
        let mut x = self.token.forward(tokens) + self.position.forward(positions);
        let mask = burn::nn::attention::generate_autoregressive_mask::<B>(batch, seq, &device);
        for layer in &self.layers {
            if self.boundaries {
                x = ddp_core::layer_boundary(x);
            }
            x = layer.forward(x, None, Some(mask.clone()));
        }
        self.head.forward(self.norm.forward(x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::{Int, TensorData};

    #[test]
    fn transformer_output_at_k_ignores_tokens_after_k() {
        let device = Default::default();
        let shape = GptShape {
            vocab: 12,
            max_len: 8,
            d_model: 16,
            heads: 2,
            layers: 2,
            boundaries: false,
        };
        let model = TinyGpt::<Flex>::new(shape, &device);
        let a: Vec<i64> = vec![10, 1, 2, 3, 11, 3, 2, 1];
        let mut b = a.clone();
        b[5..].copy_from_slice(&[7, 7, 7]);
        let run = |t: Vec<i64>| -> Vec<f32> {
            let x = Tensor::<Flex, 2, Int>::from_data(TensorData::new(t, [1, 8]), &device);
            model
                .forward(x)
                .slice([0..1, 0..5, 0..12])
                .into_data()
                .to_vec()
                .unwrap()
        };
        assert_eq!(
            run(a.clone()),
            run(b),
            "positions 0..5 must not see tokens 5..8"
        );
        let mut c = a.clone();
        c[4] = 0;
        assert_ne!(run(a), run(c), "position 4 does see token 4");
    }
}

/// A small convolutional classifier for the 8x8 digits with synchronised batch norm:
/// `[conv 3x3 -> SyncBatchNorm -> relu] x 2 -> 2x2 average pool -> linear`.
///
/// With a [`ddp_core::nn::SyncBatchNormGroup`] its batch norms normalise with the statistics of the
/// global batch (all ranks), so small per-rank batches train like one big batch; without one
/// they use each rank's own batch, like burn's `BatchNorm`.
#[derive(Module, Debug)]
pub struct DigitsCnn<B: Backend> {
    conv1: burn::nn::conv::Conv2d<B>,
    norm1: ddp_core::nn::SyncBatchNorm<B>,
    conv2: burn::nn::conv::Conv2d<B>,
    norm2: ddp_core::nn::SyncBatchNorm<B>,
    pool: burn::nn::pool::AvgPool2d,
    out: Linear<B>,
    act: Relu,
}

impl<B: ddp_core::nn::SyncBatchNormBackend> DigitsCnn<B> {
    /// A new model with `channels` feature maps in its first convolution (twice that in the
    /// second), its batch norms synchronised over `group` (local statistics with `None`).
    pub fn new(
        channels: usize,
        group: Option<ddp_core::nn::SyncBatchNormGroup>,
        device: &B::Device,
    ) -> Self {
        use burn::nn::PaddingConfig2d;
        use burn::nn::conv::Conv2dConfig;
        let conv = |from: usize, to: usize| {
            Conv2dConfig::new([from, to], [3, 3])
                .with_padding(PaddingConfig2d::Same)
                .init(device)
        };
        let norm = |features: usize| {
            let bn = burn::nn::BatchNormConfig::new(features).init(device);
            ddp_core::nn::SyncBatchNorm::from_batch_norm(bn, group.clone())
        };
        DigitsCnn {
            conv1: conv(1, channels),
            norm1: norm(channels),
            conv2: conv(channels, 2 * channels),
            norm2: norm(2 * channels),
            pool: burn::nn::pool::AvgPool2dConfig::new([2, 2])
                .with_strides([2, 2])
                .init(),
            out: LinearConfig::new(2 * channels * 16, 10).init(device),
            act: Relu::new(),
        }
    }

    /// Class scores `[n, 10]` for images `[n, 64]` (read as 1x8x8).
    pub fn forward(&self, images: Tensor<B, 2>) -> Tensor<B, 2> {
        self.forward_marked(images, false)
    }

    /// [`forward`](Self::forward), with a [`layer_boundary`](ddp_core::layer_boundary) after
    /// the first block and after the pooling when `marked` (the DDP step bench's overlap
    /// table).
    pub fn forward_marked(&self, images: Tensor<B, 2>, marked: bool) -> Tensor<B, 2> {
        let mark = |t: Tensor<B, 4>| {
            if marked {
                ddp_core::layer_boundary(t)
            } else {
                t
            }
        };
        let [n, _] = images.dims();
        let x = images.reshape([n, 1, 8, 8]);
        let x = mark(self.act.forward(self.norm1.forward(self.conv1.forward(x))));
        let x = self.act.forward(self.norm2.forward(self.conv2.forward(x)));
        let x = mark(self.pool.forward(x));
        self.out.forward(x.flatten(1, 3))
    }
}
