//! Metrics over the global batch: each rank's step output is encoded as numbers, gathered, and
//! rank 0 rebuilds the output one process would have produced for the whole global batch, which
//! burn-train's metrics then consume unchanged.
//!
//! Why gather the outputs instead of all-reducing (numerator, count) pairs: burn's metrics take
//! the model's output item, not partial sums, and some of them (AUROC, top-k, confusion-based
//! precision/recall) are not sums of per-rank values. Rebuilding the global item makes every
//! metric that burn computes from one item exact, at the price of sending the outputs (for a
//! classifier `batch x classes` numbers per step). [`MetricsSync::Rank0`](crate::MetricsSync)
//! skips it.

use crate::error::{DdpTrainError, Result};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use burn_train::{ClassificationOutput, MultiLabelClassificationOutput, RegressionOutput};
use ddp_core::comm::{ProcessGroup, ReduceOp};

/// A step output (burn-train's `TrainStep::Output` / `InferenceStep::Output`) that can be merged
/// across ranks into the output of the global batch.
///
/// Implemented for burn-train's [`ClassificationOutput`], [`MultiLabelClassificationOutput`]
/// and [`RegressionOutput`]; implement it for your own output type to train with
/// [`DdpStrategy`](crate::DdpStrategy).
pub trait DistributedItem: Sized {
    /// The backend the item's tensors live on.
    type Backend: Backend;

    /// This rank's item as numbers. `f64` holds every `f32` and every integer label below
    /// 2^53 exactly, so the merged item carries the same values.
    fn encode(&self) -> Vec<f64>;

    /// The item of the global batch, from every rank's [`encode`](Self::encode) in rank order
    /// (ranks without a batch this step are left out).
    ///
    /// # Errors
    /// A description of what does not fit (inconsistent shapes across ranks).
    fn merge(
        parts: &[Vec<f64>],
        device: &burn::tensor::Device<Self::Backend>,
    ) -> std::result::Result<Self, String>;
}

fn values<B: Backend, const D: usize, K>(t: &Tensor<B, D, K>) -> Vec<f64>
where
    K: burn::tensor::TensorKind<B> + burn::tensor::BasicOps<B>,
{
    t.clone()
        .into_data()
        .convert::<f64>()
        .iter::<f64>()
        .collect()
}

/// Encodes `(loss, output [n, c], targets [n, t])` (`t` = 1 for labels `[n]`): `[n, c, t,
/// loss, output.., targets..]`. The one encoding of burn-train's three output types.
fn encode_triplet<B: Backend, const D: usize, K>(
    loss: &Tensor<B, 1>,
    output: &Tensor<B, 2>,
    targets: &Tensor<B, D, K>,
) -> Vec<f64>
where
    K: burn::tensor::TensorKind<B> + burn::tensor::BasicOps<B>,
{
    let dims = output.dims();
    let n = dims.first().copied().unwrap_or(0);
    let c = dims.get(1).copied().unwrap_or(1);
    let targets = (targets.dims().get(1).copied().unwrap_or(1), values(targets));
    let (loss, output) = (values(loss), values(output));
    let mean_loss = if loss.is_empty() {
        0.0
    } else {
        loss.iter().sum::<f64>() / loss.len() as f64
    };
    let mut v = Vec::with_capacity(4 + output.len() + targets.1.len());
    v.extend_from_slice(&[n as f64, c as f64, targets.0 as f64, mean_loss]);
    v.extend(output);
    v.extend(targets.1);
    v
}

/// The merged pieces: batch size, columns of output and targets, the batch-weighted mean loss
/// (the mean loss over the global batch, for losses that are means over samples), rows
/// concatenated in rank order.
struct Merged {
    n: usize,
    c: usize,
    t: usize,
    loss: f64,
    output: Vec<f64>,
    targets: Vec<f64>,
}

impl Merged {
    /// The merged loss, as burn-train's one-element loss tensor.
    fn loss_tensor<B: Backend>(&self, device: &B::Device) -> Tensor<B, 1> {
        Tensor::from_data(TensorData::new(vec![self.loss as f32], [1]), device)
    }

    /// The merged output rows, `[n, c]`.
    fn output_tensor<B: Backend>(&self, device: &B::Device) -> Tensor<B, 2> {
        Tensor::from_data(
            TensorData::new(to_f32(&self.output), [self.n, self.c]),
            device,
        )
    }

    /// The merged targets as the integer labels they were encoded from.
    fn int_targets(&self) -> Vec<i64> {
        self.targets.iter().map(|&x| x as i64).collect()
    }
}

fn merge_triplets(parts: &[Vec<f64>]) -> std::result::Result<Merged, String> {
    let mut m = Merged {
        n: 0,
        c: 0,
        t: 0,
        loss: 0.0,
        output: Vec::new(),
        targets: Vec::new(),
    };
    let mut weighted = 0.0;
    for (k, p) in parts.iter().enumerate() {
        if p.len() < 4 {
            return Err(format!(
                "part {k} has {} numbers, fewer than its header",
                p.len()
            ));
        }
        let (n, c, t) = (p[0] as usize, p[1] as usize, p[2] as usize);
        if k == 0 {
            (m.c, m.t) = (c, t);
        } else if (c, t) != (m.c, m.t) {
            return Err(format!(
                "part {k} has {c} output and {t} target columns, part 0 has {} and {}",
                m.c, m.t
            ));
        }
        if p.len() != 4 + n * c + n * t {
            return Err(format!(
                "part {k}: {} numbers for {n} rows of {c} + {t} columns",
                p.len()
            ));
        }
        weighted += p[3] * n as f64;
        m.n += n;
        m.output.extend_from_slice(&p[4..4 + n * c]);
        m.targets.extend_from_slice(&p[4 + n * c..]);
    }
    m.loss = if m.n == 0 { 0.0 } else { weighted / m.n as f64 };
    Ok(m)
}

/// [`DistributedItem`] for one of burn-train's `(loss, output, targets)` outputs: the one
/// triplet encoding, and the merged `targets`, built by the given expression from the merged
/// pieces (`m`) on `device`.
macro_rules! triplet_item {
    ($output:ident, |$m:ident, $device:ident| $targets:expr) => {
        impl<B: Backend> DistributedItem for $output<B> {
            type Backend = B;

            fn encode(&self) -> Vec<f64> {
                encode_triplet(&self.loss, &self.output, &self.targets)
            }

            fn merge(parts: &[Vec<f64>], $device: &B::Device) -> std::result::Result<Self, String> {
                let $m = merge_triplets(parts)?;
                Ok($output {
                    loss: $m.loss_tensor($device),
                    output: $m.output_tensor($device),
                    targets: $targets,
                })
            }
        }
    };
}

triplet_item!(ClassificationOutput, |m, device| {
    Tensor::<B, 1, Int>::from_data(TensorData::new(m.int_targets(), [m.n]), device)
});
triplet_item!(MultiLabelClassificationOutput, |m, device| {
    Tensor::<B, 2, Int>::from_data(TensorData::new(m.int_targets(), [m.n, m.t]), device)
});
triplet_item!(RegressionOutput, |m, device| {
    Tensor::from_data(TensorData::new(to_f32(&m.targets), [m.n, m.t]), device)
});

fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// One step's exchange of metrics items.
pub(crate) enum Exchange<T> {
    /// No rank had a batch: the loop is over on every rank.
    Done,
    /// This step happened; rank 0 gets the item to render (global or its own), others `None`.
    Step(Option<T>),
}

/// Exchanges one step's items: first every rank's encoded length (0: no batch), then, when
/// `global`, the encodings themselves. Rank 0 merges them.
///
/// # Collective
/// Every rank calls it once per step of the loop, also when it has no batch (so ranks whose
/// shards differ by one batch, as in evaluation, stay in step).
pub(crate) fn exchange<T: DistributedItem>(
    pg: &ProcessGroup,
    item: Option<T>,
    global: bool,
    device: &burn::tensor::Device<T::Backend>,
    step: usize,
) -> Result<Exchange<T>> {
    let world = pg.world_size();
    let rank = pg.rank();
    let global = global && world > 1;
    let encoded = item.as_ref().filter(|_| global).map(T::encode);
    let mut lens = vec![0i64; world];
    lens[rank] = match (&item, &encoded) {
        (None, _) => 0,
        (Some(_), None) => 1,
        (Some(_), Some(e)) => e.len() as i64 + 1,
    };
    if world > 1 {
        pg.all_reduce(&mut lens, ReduceOp::Sum)
            .map_err(DdpTrainError::comm(format!(
                "exchanging the metrics of step {step}"
            )))?;
    }
    if lens.iter().all(|&l| l == 0) {
        return Ok(Exchange::Done);
    }
    if !global {
        // World 1 or rank-0-only metrics: rank 0 renders its own item.
        return Ok(Exchange::Step(if rank == 0 { item } else { None }));
    }
    drop(item);
    let mine = encoded.unwrap_or_default();
    let max = lens.iter().copied().max().unwrap_or(0) as usize;
    let mut send = mine;
    send.resize(max, 0.0);
    let mut all = vec![0f64; max * world];
    pg.all_gather(&send, &mut all)
        .map_err(DdpTrainError::comm(format!(
            "gathering the metrics of step {step}"
        )))?;
    if rank != 0 {
        return Ok(Exchange::Step(None));
    }
    let parts: Vec<Vec<f64>> = (0..world)
        .filter(|&r| lens[r] > 0)
        .map(|r| all[r * max..r * max + lens[r] as usize - 1].to_vec())
        .collect();
    T::merge(&parts, device)
        .map(|m| Exchange::Step(Some(m)))
        .map_err(|reason| DdpTrainError::ItemSync { step, reason })
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    fn item(rows: &[[f32; 2]], targets: &[i64], loss: f32) -> ClassificationOutput<Flex> {
        let device = Default::default();
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        ClassificationOutput::new(
            Tensor::from_data(TensorData::new(vec![loss], [1]), &device),
            Tensor::from_data(TensorData::new(flat, [rows.len(), 2]), &device),
            Tensor::from_data(TensorData::new(targets.to_vec(), [targets.len()]), &device),
        )
    }

    #[test]
    fn merged_classification_output_is_the_global_batch_with_the_weighted_mean_loss() {
        let a = item(&[[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]], &[1, 0, 0], 0.5);
        let b = item(&[[0.6, 0.4]], &[1], 2.5);
        let merged =
            ClassificationOutput::<Flex>::merge(&[a.encode(), b.encode()], &Default::default())
                .expect("merge");
        assert_eq!(merged.output.dims(), [4, 2]);
        let targets: Vec<i64> = merged
            .targets
            .into_data()
            .convert::<i64>()
            .to_vec()
            .expect("i64");
        assert_eq!(targets, vec![1, 0, 0, 1]);
        // (0.5 * 3 + 2.5 * 1) / 4
        let loss: Vec<f32> = merged.loss.into_data().to_vec().expect("f32");
        assert!((loss[0] - 1.0).abs() < 1e-6, "{loss:?}");
    }

    #[test]
    fn parts_with_different_class_counts_are_an_error() {
        let a = item(&[[0.1, 0.9]], &[1], 0.5);
        let mut b = a.encode();
        b[1] = 3.0;
        let err = ClassificationOutput::<Flex>::merge(&[a.encode(), b], &Default::default())
            .err()
            .expect("mismatch");
        assert!(err.contains("part 1 has 3 output"), "{err}");
    }
}
