//! [`FullyShardedDataParallel::backward`]: backward with each unit's reduce-scatter started as
//! soon as the unit's gradients are complete (`unit_reducer.rs`), then the averaged chunks.

use super::{FullyShardedDataParallel, ShardedGradients};
use crate::engine::arrival_order::agree_on_rank0_order;
use crate::engine::model_sync::{broadcast_bytes, read_values, write_values};
use crate::engine::tap::TapBackend;
use crate::fsdp::error::FsdpError;
use crate::fsdp::unit_reducer::{FsdpStepStats, Launched};
use burn::module::{AutodiffModule, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use ddp_comm::ReduceOp;

impl<B: TapBackend, M: AutodiffModule<B>> FullyShardedDataParallel<B, M> {
    /// Back-propagates `loss`, releases the gathered parameters and reduce-scatters every
    /// unit's gradient: the result holds this rank's chunk of the gradients, averaged over the
    /// ranks. A unit's reduce-scatter starts during backward, as soon as every parameter of it
    /// has its gradient and the units before it in the launch order have started (DDP's
    /// automatic overlap: taps anchored from the second step on). A unit this rank did not
    /// use contributes zeros; a unit no rank used gets no gradient.
    pub fn backward(&mut self, loss: Tensor<B, 1>) -> Result<ShardedGradients, FsdpError> {
        self.check()?;
        self.reducer.warn_strays();
        if !self.gathered {
            return Err(self.poison(FsdpError::NoForward));
        }
        self.reducer
            .begin(self.passes.pending_forwards(), self.generation);
        // Probes learn where to anchor the taps the first time (and when the graph changes).
        let anchored = self.passes.backward(loss).0.anchored_taps;
        self.generation += 1;
        let finished = match self.reducer.finish() {
            Ok(f) => f,
            Err(reason) => return Err(self.poison(FsdpError::Gradients(reason))),
        };
        // Which units any rank used (DDP's rule: a parameter no rank used gets no gradient),
        // and one more flag: whether this rank's taps were anchored.
        let units = self.layout.units.len();
        let mut flags = finished.used;
        flags.push(u8::from(anchored == 0));
        if self.pg.world_size() > 1
            && let Err(source) = self.pg.all_reduce(&mut flags, ReduceOp::Max)
        {
            return Err(self.poison(FsdpError::UsedUnits(source)));
        }
        let anchored_everywhere = flags.pop() == Some(0);
        if anchored_everywhere
            && !self.relaid
            && let Err(e) = self.adopt_rank0_order(&finished.arrival)
        {
            return Err(self.poison(e));
        }
        if let Err(e) = self.sync_buffers() {
            return Err(self.poison(FsdpError::BufferSync(e)));
        }
        self.release();
        let world = self.pg.world_size();
        let ids: Vec<ParamId> = match self.shards.as_ref() {
            Some(shards) => shards.ids(),
            None => return Err(self.poison(super::poisoned_shards())),
        };
        let mut out = GradientsParams::new();
        let mut elements = 0;
        for (((work, unit), id), &used) in finished
            .works
            .into_iter()
            .zip(&self.layout.units)
            .zip(ids)
            .zip(&flags)
        {
            let g = match work {
                Launched::Host(work) => match work.wait() {
                    Ok(mine) => {
                        let len = mine.len();
                        Tensor::<B::InnerBackend, 1>::from_data(
                            TensorData::new(mine, [len]),
                            &self.device,
                        )
                    }
                    Err(source) => {
                        return Err(self.poison(FsdpError::ReduceScatter {
                            unit: unit.name.clone(),
                            source,
                        }));
                    }
                },
                Launched::Device(pending) => match pending.wait(&self.device) {
                    Ok(mine) => Tensor::from_primitive(TensorPrimitive::Float(mine)),
                    Err(e) => {
                        return Err(self.poison(FsdpError::Device {
                            unit: unit.name.clone(),
                            op: "reduce_scatter",
                            reason: e.to_string(),
                        }));
                    }
                },
            };
            if used == 0 {
                continue;
            }
            let len = g.dims()[0];
            debug_assert_eq!(len, unit.chunk(world));
            elements += len;
            out.register(id, g);
        }
        self.last_stats = Some(FsdpStepStats {
            units,
            reduced_during_backward: finished.during_backward,
            anchored_taps: anchored,
        });
        Ok(ShardedGradients::new(out, elements))
    }

    /// Forgets the taps of the forwards since the last backward; their gradients, should a
    /// backward of theirs come later, are ignored.
    pub(super) fn forget_forwards(&mut self) {
        self.passes.forget();
        self.generation += 1;
    }

    /// Launch order from now on: the order rank 0's units completed in this backward (the
    /// units that completed only at its end after them, in the current order). Once.
    fn adopt_rank0_order(&mut self, arrival: &[usize]) -> Result<(), FsdpError> {
        let pg = Some(&self.pg);
        let order = agree_on_rank0_order(pg, arrival, &self.reducer.order())
            .map_err(|e| FsdpError::Gradients(format!("agreeing on rank 0's unit order: {e}")))?;
        self.reducer.set_order(order);
        self.relaid = true;
        Ok(())
    }

    /// Every rank takes rank 0's buffers (running statistics), as DDP does after backward.
    fn sync_buffers(&mut self) -> Result<(), crate::DdpError> {
        if !self.buffers.contains(&true) || self.pg.world_size() == 1 {
            return Ok(());
        }
        let bytes = if self.pg.rank() == 0 {
            read_values(&self.module, &self.buffers, false)
        } else {
            Vec::new()
        };
        let bytes = broadcast_bytes(&self.pg, bytes, 0)?;
        if self.pg.rank() != 0 {
            self.module = write_values(self.module.clone(), &self.buffers, false, &bytes)?;
        }
        Ok(())
    }

    /// How the last `backward` went: how many units' reduce-scatters started while backward
    /// ran. `None` before the first.
    pub fn last_step_stats(&self) -> Option<&FsdpStepStats> {
        self.last_stats.as_ref()
    }
}
