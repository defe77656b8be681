//! Bucket sizing by default: a small model is split into several buckets (`min_buckets`), so
//! that its gradients can leave during backward; the split never changes the result.
use crate::common::*;
use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::SgdConfig;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use ddp_core::{DdpConfig, DdpError, DistributedDataParallel};

/// 6-256-128-3: about 140 KB of f32 gradients, one bucket under the 1 MiB first cap alone; a
/// quarter of that (35 KB) puts the last layer, the middle weight (131 KB, alone) and the
/// first layer in buckets of their own.
#[derive(Module, Debug)]
struct Wide<B: Backend> {
    l1: Linear<B>,
    l2: Linear<B>,
    l3: Linear<B>,
    act: Relu,
}

impl<B: Backend> Wide<B> {
    fn new(device: &B::Device) -> Self {
        Wide {
            l1: LinearConfig::new(6, 256).init(device),
            l2: LinearConfig::new(256, 128).init(device),
            l3: LinearConfig::new(128, 3).init(device),
            act: Relu::new(),
        }
    }
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let x = self.act.forward(self.l1.forward(x));
        let x = self.act.forward(self.l2.forward(x));
        self.l3.forward(x)
    }
}

/// Trains 4 steps at world 2; returns each rank's parameters and bucket count per step.
fn train(initial: &Wide<B>, config: DdpConfig) -> Vec<(Vec<f32>, Vec<usize>)> {
    run_ranks(2, |pg| {
        let device = Default::default();
        let rank = pg.rank();
        let mut ddp = DistributedDataParallel::new(initial.clone(), pg, config.clone()).unwrap();
        let mut sgd = SgdConfig::new().init::<B, Wide<B>>();
        let mut buckets = Vec::new();
        for step in 0..4 {
            let idx: Vec<usize> = (0..4).map(|i| step * 8 + i * 2 + rank).collect();
            let (x, y) = batch(&idx, &device);
            let pred = ddp.forward(|m| m.forward(x)).unwrap();
            let grads = ddp
                .backward(MseLoss::new().forward(pred, y, Reduction::Mean))
                .unwrap();
            buckets.push(ddp.last_step_stats().unwrap().buckets);
            ddp.optimizer_step(&mut sgd, 0.1, grads);
        }
        (flat_params(ddp.module()), buckets)
    })
}

#[test]
fn a_small_model_gets_several_buckets_by_default_and_the_same_result() {
    let initial = Wide::<B>::new(&Default::default());
    flat_params(&initial);
    let split = train(&initial, DdpConfig::new());
    let whole = train(&initial, DdpConfig::new().with_min_buckets(1));
    for r in 0..2 {
        assert!(
            split[r].1.iter().all(|&n| n >= 3),
            "rank {r}: the default splits ~140 KB into 35 KB buckets: {:?}",
            split[r].1
        );
        assert!(
            whole[r].1.iter().all(|&n| n == 1),
            "rank {r}: min_buckets 1 keeps PyTorch's caps, one bucket: {:?}",
            whole[r].1
        );
        assert_eq!(
            split[r].0, whole[r].0,
            "rank {r}: the layout changes no bit"
        );
    }
    assert_eq!(split[0].0, split[1].0, "replicas stay equal");
}

#[test]
fn zero_min_buckets_is_refused_naming_the_setting() {
    let initial = Wide::<B>::new(&Default::default());
    run_ranks(1, |pg| {
        let err =
            DistributedDataParallel::new(initial.clone(), pg, DdpConfig::new().with_min_buckets(0))
                .unwrap_err();
        assert!(matches!(err, DdpError::InvalidConfig(_)), "{err}");
        assert!(err.to_string().contains("min_buckets"), "{err}");
    });
}
