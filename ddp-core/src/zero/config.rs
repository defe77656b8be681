//! [`ZeroConfig`]: ZeRO's settings in burn's config style.

use super::error::ZeroError;
use super::optimizer::ZeroRedundancyOptimizer;
use super::stage2::{DEFAULT_ZERO_BUCKET_BYTES, ZeroStage};
use crate::{Collectives, DistributedDataParallel, TapBackend};
use burn::config::Config;
use burn::module::{AutodiffModule, ParamId};
use burn::optim::Optimizer;
use burn::record::Record;
use burn::tensor::backend::AutodiffBackend;
use ddp_comm::ProcessGroup;
use hashbrown::HashMap;

/// Settings of a [`ZeroRedundancyOptimizer`], in burn's config style, saved and loaded like
/// any burn config:
/// `ZeroConfig::new().with_stage(ZeroStage::Two).init(adam, &mut ddp)?`.
#[derive(Config, Debug)]
pub struct ZeroConfig {
    /// How much is sharded: optimizer state ([`ZeroStage::One`], the default), or gradients
    /// too ([`ZeroStage::Two`]). See [`ZeroRedundancyOptimizer::with_stage`].
    #[config(default = "ZeroStage::One")]
    pub stage: ZeroStage,
    /// Stage 2's bytes per rank in one reduce-scatter or all-gather at most. See
    /// [`ZeroRedundancyOptimizer::with_bucket_bytes`].
    #[config(default = "DEFAULT_ZERO_BUCKET_BYTES")]
    pub bucket_bytes: usize,
    /// Which communicator carries stage 2's collectives; `None` (the default): DDP's
    /// [`collectives`](crate::DdpConfig::collectives) with [`init`](Self::init), the process
    /// group's CPU transports with [`init_on_group`](Self::init_on_group). See
    /// [`ZeroRedundancyOptimizer::with_collectives`].
    pub collectives: Option<Collectives>,
}

impl ZeroConfig {
    /// Shards `inner` across the ranks of `ddp`. At stage 2 it registers
    /// [`LocalGradientsHook`](super::LocalGradientsHook) on `ddp`, as
    /// [`ZeroRedundancyOptimizer::stage2`] does, so `backward` hands the optimizer this rank's
    /// own gradients to reduce-scatter. Call it on every rank, with the same config, before
    /// the first forward.
    ///
    /// # Errors
    /// [`ZeroError::Setup`] when DDP refuses the hook (after the first forward, with another
    /// hook or compression, or with `Collectives::Nccl`).
    pub fn init<O, M, B, R>(
        &self,
        inner: O,
        ddp: &mut DistributedDataParallel<B, M>,
    ) -> Result<ZeroRedundancyOptimizer<O, M, B>, ZeroError>
    where
        B: TapBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B, Record = HashMap<ParamId, R>>,
        R: Record<B> + Clone,
    {
        let zero = match self.stage {
            ZeroStage::Two => ZeroRedundancyOptimizer::stage2(inner, ddp)?,
            _ => ZeroRedundancyOptimizer::new(inner, ddp.process_group().clone())
                .with_collectives(ddp.config().collectives),
        };
        let zero = zero.with_bucket_bytes(self.bucket_bytes);
        Ok(match self.collectives {
            Some(collectives) => zero.with_collectives(collectives),
            None => zero,
        })
    }

    /// Shards `inner` across the ranks of `pg`, for training without DDP: `step` then takes
    /// gradients averaged over the ranks at stage 1, and this rank's own gradients
    /// (`loss.backward()`) at stage 2.
    pub fn init_on_group<O, M, B, R>(
        &self,
        inner: O,
        pg: ProcessGroup,
    ) -> ZeroRedundancyOptimizer<O, M, B>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B, Record = HashMap<ParamId, R>>,
        R: Record<B> + Clone,
    {
        ZeroRedundancyOptimizer::new(inner, pg)
            .with_stage(self.stage)
            .with_bucket_bytes(self.bucket_bytes)
            .with_collectives(self.collectives.unwrap_or(Collectives::Host))
    }
}
