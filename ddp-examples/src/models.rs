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
