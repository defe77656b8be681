//! [`SyncBatchNorm`]: burn's `BatchNorm` with statistics over the global batch.

use burn::module::{Module, Param, RunningState};
use burn::nn::{BatchNorm, BatchNormConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::{SyncBatchNormBackend, SyncBatchNormError, SyncBatchNormGroup};

/// Batch normalisation whose training statistics are those of the *global* batch: the union of
/// every rank's batch, whatever their sizes.
///
/// In training (an autodiff backend), each forward sums per channel, over the ranks of its
/// [`SyncBatchNormGroup`], the local sums and counts (one all-reduce), then the sums of squared
/// deviations from the global mean (a second one), so mean and (biased) variance equal those of
/// one process holding the union batch, computed the way burn's `BatchNorm` computes them. Both
/// sums are differentiable ([`SyncBatchNormBackend::sum_across_ranks`]): in backward, the
/// gradients flowing into the statistics are summed over the ranks too, as in PyTorch's
/// `SyncBatchNorm`, so input gradients (and everything upstream) equal the single-process ones.
///
/// Running statistics follow burn's `BatchNorm` exactly: `running = running * (1 - momentum) +
/// batch_stat * momentum`, with the biased variance; since the statistics are global, every
/// rank holds the same running values. In evaluation (an inner, non-autodiff backend, e.g. after
/// `model.valid()`) the running statistics are used and nothing is communicated.
///
/// Without a group ([`SyncBatchNorm::local`]), or at world size 1, it is burn's `BatchNorm`.
///
/// The fields and their names are `BatchNorm`'s (`gamma`, `beta`, `running_mean`,
/// `running_var`), so records and safetensors files move between the two; see
/// [`from_batch_norm`](Self::from_batch_norm) and [`into_batch_norm`](Self::into_batch_norm).
///
/// Cost: two small all-reduces (channels + 1, then channels floats) per layer in forward and
/// two in backward, on the statistics group, each blocking the calling thread.
#[derive(Module, Debug)]
pub struct SyncBatchNorm<B: Backend> {
    /// Scale per channel.
    pub gamma: Param<Tensor<B, 1>>,
    /// Shift per channel.
    pub beta: Param<Tensor<B, 1>>,
    /// Running mean per channel.
    pub running_mean: RunningState<Tensor<B, 1>>,
    /// Running (biased) variance per channel.
    pub running_var: RunningState<Tensor<B, 1>>,
    /// Weight of the batch statistic in the running update (burn's default 0.1).
    pub momentum: f64,
    /// Added to the variance before the square root.
    pub epsilon: f64,
    /// Where the statistics are summed; `None` for local statistics.
    #[module(skip)]
    group: Option<SyncBatchNormGroup>,
}

impl<B: Backend> SyncBatchNorm<B> {
    /// A new layer with `config`'s settings and burn's initial values (gamma 1, beta 0, running
    /// mean 0, running variance 1), synchronised over `group`.
    pub fn new(config: &BatchNormConfig, group: SyncBatchNormGroup, device: &B::Device) -> Self {
        Self::from_batch_norm(config.init(device), Some(group))
    }

    /// A layer that uses the local batch only (burn's `BatchNorm`), e.g. for single-process
    /// runs of a model written with `SyncBatchNorm`; [`with_group`](Self::with_group) adds one.
    pub fn local(config: &BatchNormConfig, device: &B::Device) -> Self {
        Self::from_batch_norm(config.init(device), None)
    }

    /// Takes over a `BatchNorm`'s weights, running statistics and settings unchanged.
    pub fn from_batch_norm(bn: BatchNorm<B>, group: Option<SyncBatchNormGroup>) -> Self {
        SyncBatchNorm {
            gamma: bn.gamma,
            beta: bn.beta,
            running_mean: bn.running_mean,
            running_var: bn.running_var,
            momentum: bn.momentum,
            epsilon: bn.epsilon,
            group,
        }
    }

    /// The same layer as a burn `BatchNorm` (same weights, running statistics and settings).
    pub fn into_batch_norm(self) -> BatchNorm<B> {
        BatchNorm {
            gamma: self.gamma,
            beta: self.beta,
            running_mean: self.running_mean,
            running_var: self.running_var,
            momentum: self.momentum,
            epsilon: self.epsilon,
        }
    }

    /// The same layer synchronised over `group` (or local with `None`).
    pub fn with_group(mut self, group: Option<SyncBatchNormGroup>) -> Self {
        self.group = group;
        self
    }

    /// The group the statistics are summed over, if any.
    pub fn group(&self) -> Option<&SyncBatchNormGroup> {
        self.group.as_ref()
    }

    /// burn's running update, with the (global) batch statistics detached.
    fn update_running(&self, mean: Tensor<B, 1>, var: Tensor<B, 1>) {
        let device = mean.device();
        let running_mean = self.running_mean.value_sync().to_device(&device);
        let running_var = self.running_var.value_sync().to_device(&device);
        let running_mean = running_mean
            .mul_scalar(1.0 - self.momentum)
            .add(mean.detach().mul_scalar(self.momentum));
        let running_var = running_var
            .mul_scalar(1.0 - self.momentum)
            .add(var.detach().mul_scalar(self.momentum));
        self.running_mean.update(running_mean.detach());
        self.running_var.update(running_var.detach());
    }
}

impl<B: SyncBatchNormBackend> SyncBatchNorm<B> {
    /// Normalises `input` (`[batch, channels, ...]`): with global batch statistics in training,
    /// with the running statistics in evaluation.
    ///
    /// If a collective fails, this logs the error, aborts the statistics group and the training
    /// group (so DDP's backward returns the reason on every rank) and normalises with local
    /// statistics; call [`try_forward`](Self::try_forward) to get the error instead.
    ///
    /// # Panics
    /// On an input of rank below 2 or with the wrong number of channels, like burn's
    /// `BatchNorm` (a programming error; `try_forward` returns it).
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        match self.try_forward(input.clone()) {
            Ok(out) => out,
            Err(SyncBatchNormError::Comm { context, source }) => {
                if let Some(group) = &self.group {
                    group.fail(&format!("{context}: {source}"));
                }
                self.forward_with(input, None)
                    .unwrap_or_else(|e| panic!("{e}"))
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// [`forward`](Self::forward), returning errors instead.
    ///
    /// # Collective
    /// In training with a group, every rank of the group calls it for this layer, in the same
    /// order as its other layers (batch sizes may differ between ranks, an empty batch on some
    /// ranks included).
    ///
    /// # Errors
    /// A bad input shape, a failed all-reduce, or a global batch with no sample or with only
    /// one value per channel (every rank fails alike: the count is all-reduced).
    pub fn try_forward<const D: usize>(
        &self,
        input: Tensor<B, D>,
    ) -> Result<Tensor<B, D>, SyncBatchNormError> {
        self.forward_with(input, self.group.as_ref())
    }

    fn forward_with<const D: usize>(
        &self,
        input: Tensor<B, D>,
        group: Option<&SyncBatchNormGroup>,
    ) -> Result<Tensor<B, D>, SyncBatchNormError> {
        if D < 2 {
            return Err(SyncBatchNormError::InputRank(D));
        }
        let channels = input.dims()[1];
        let [expected] = self.gamma.shape().dims();
        if channels != expected {
            return Err(SyncBatchNormError::Channels {
                got: channels,
                expected,
            });
        }
        let mut stat_shape = [1; D];
        stat_shape[1] = channels;
        let (mean, var) = if B::ad_enabled(&input.device()) {
            let (mean, var) = self.batch_statistics(input.clone(), group)?;
            self.update_running(mean.clone(), var.clone());
            (mean.reshape(stat_shape), var.reshape(stat_shape))
        } else {
            let device = input.device();
            let mean = self.running_mean.value().to_device(&device);
            let var = self.running_var.value().to_device(&device);
            (mean.reshape(stat_shape), var.reshape(stat_shape))
        };
        // burn's BatchNorm::forward_shared, operation for operation.
        let std = var.add_scalar(self.epsilon).sqrt();
        let x = input.sub(mean).div(std);
        let x = x.mul(self.gamma.val().reshape(stat_shape));
        Ok(x.add(self.beta.val().reshape(stat_shape)))
    }

    /// Global mean and biased variance per channel (`[channels]` each), differentiable.
    fn batch_statistics<const D: usize>(
        &self,
        input: Tensor<B, D>,
        group: Option<&SyncBatchNormGroup>,
    ) -> Result<(Tensor<B, 1>, Tensor<B, 1>), SyncBatchNormError> {
        let device = input.device();
        let dims = input.dims();
        let channels = dims[1];
        let per_channel: usize = dims
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 1)
            .map(|(_, d)| d)
            .product();
        let mut stat_shape = [1; D];
        stat_shape[1] = channels;
        let flat = |t: Tensor<B, D>| t.swap_dims(0, 1).reshape([channels, per_channel]);
        let sum_over = |t: Tensor<B, 1>, context| match group {
            Some(g) => B::sum_across_ranks(t, g)
                .map_err(|source| SyncBatchNormError::Comm { context, source }),
            None => Ok(t),
        };

        // Sums and the count in one all-reduce: [sum_0 .. sum_{C-1}, count].
        let local_sum = flat(input.clone()).sum_dim(1).reshape([channels]);
        let count = Tensor::<B, 1>::from_floats([per_channel as f32], &device);
        let sums = sum_over(
            Tensor::cat(vec![local_sum, count], 0),
            "all-reducing the per-channel sums",
        )?;
        let total_value: f32 = sums.clone().narrow(0, channels, 1).into_scalar().elem();
        if total_value <= 0.0 {
            return Err(SyncBatchNormError::EmptyGlobalBatch);
        }
        if total_value <= 1.0 {
            return Err(SyncBatchNormError::OneValuePerChannel);
        }
        let mean = sums.narrow(0, 0, channels).div_scalar(total_value);

        // Squared deviations from the global mean, as burn's BatchNorm computes the variance.
        let centered = input.sub(mean.clone().reshape(stat_shape));
        let local_sq = flat(centered.square()).sum_dim(1).reshape([channels]);
        let var = sum_over(local_sq, "all-reducing the per-channel squared deviations")?
            .div_scalar(total_value);
        Ok((mean, var))
    }
}

use burn::tensor::ElementConversion;
