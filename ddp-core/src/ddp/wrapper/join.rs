//! Uneven inputs ([`DdpConfig::uneven_inputs`](crate::DdpConfig::uneven_inputs), PyTorch's
//! `Join`): every step starts with a round in which the ranks say whether they still train, and
//! a rank with no batches left answers the others' steps from
//! [`join`](DistributedDataParallel::join) until all have joined.

use super::DistributedDataParallel;
use crate::engine::tap::TapBackend;
use crate::error::DdpError;
use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use ddp_comm::ReduceOp;

/// Who trains in this step (see [`DdpConfig::uneven_inputs`](crate::DdpConfig::uneven_inputs)).
pub(super) struct JoinRound {
    /// How many ranks still train.
    pub(super) active: usize,
    /// How many ranks this step's summed gradients are divided by: those still training, or
    /// the whole world with [`DdpConfig::divide_by_initial_world_size`](crate::DdpConfig::divide_by_initial_world_size).
    pub(super) averaged_over: usize,
    /// Where buffers come from: the first rank still training.
    pub(super) root: usize,
    /// Whether this step synchronises (some training rank called `backward`).
    pub(super) sync: bool,
    /// The training ranks are in a forward that takes the buffers before it runs (a forward
    /// after a forward without a backward): the round is followed by that broadcast only.
    pub(super) buffers_only: bool,
}

/// What a rank is doing when it enters a [`JoinRound`].
#[derive(Clone, Copy)]
enum RoundCall {
    /// Answering from `join`.
    Joined,
    /// `backward` (`sync`) or `backward_no_sync`.
    Backward { sync: bool },
    /// A forward about to take the buffers of the first rank still training.
    ForwardBuffers,
}

impl<B: TapBackend, M: AutodiffModule<B>> DistributedDataParallel<B, M> {
    /// The round of a `backward` (`sync`) or `backward_no_sync`.
    pub(super) fn backward_round(&self, sync: bool) -> Result<JoinRound, DdpError> {
        self.join_round(RoundCall::Backward { sync })
    }

    /// The round of a forward about to take the buffers of the first rank still training.
    pub(super) fn forward_buffers_round(&self) -> Result<JoinRound, DdpError> {
        self.join_round(RoundCall::ForwardBuffers)
    }

    /// With [`DdpConfig::uneven_inputs`](crate::DdpConfig::uneven_inputs): one small
    /// all-reduce in which every rank says whether it still trains, whether this step
    /// synchronises, and whether it is in a backward or in a forward that takes the buffers.
    fn join_round(&self, call: RoundCall) -> Result<JoinRound, DdpError> {
        let world = self.pg.world_size();
        if !self.config.uneven_inputs || world == 1 {
            return Ok(JoinRound {
                active: world,
                averaged_over: world,
                root: 0,
                sync: matches!(call, RoundCall::Backward { sync: true }),
                buffers_only: matches!(call, RoundCall::ForwardBuffers),
            });
        }
        let rank = self.pg.rank();
        // [training][synchronising backward][forward taking the buffers], one byte per rank.
        let mut flags = vec![0u8; 3 * world];
        match call {
            RoundCall::Joined => {}
            RoundCall::Backward { sync } => {
                flags[rank] = 1;
                flags[world + rank] = u8::from(sync);
            }
            RoundCall::ForwardBuffers => {
                flags[rank] = 1;
                flags[2 * world + rank] = 1;
            }
        }
        self.pg
            .all_reduce(&mut flags, ReduceOp::Max)
            .map_err(DdpError::comm("agreeing on which ranks still have data"))?;
        let training: Vec<usize> = (0..world).filter(|&r| flags[r] == 1).collect();
        let (forwarding, stepping): (Vec<usize>, Vec<usize>) =
            training.iter().partition(|&&r| flags[2 * world + r] == 1);
        if !forwarding.is_empty() && !stepping.is_empty() {
            return Err(DdpError::Join(format!(
                "in the same step ranks {forwarding:?} ran another forward (which first takes \
                 the buffers of the first rank still training) and ranks {stepping:?} called \
                 backward; every rank still training must call forward the same number of \
                 times before each backward"
            )));
        }
        let (syncing, accumulating): (Vec<usize>, Vec<usize>) =
            stepping.iter().partition(|&&r| flags[world + r] == 1);
        if !syncing.is_empty() && !accumulating.is_empty() {
            return Err(DdpError::Join(format!(
                "in the same step ranks {syncing:?} called backward and ranks {accumulating:?} \
                 called backward_no_sync; every rank still training must make the same call"
            )));
        }
        let averaged_over = if self.config.divide_by_initial_world_size {
            world
        } else {
            training.len()
        };
        Ok(JoinRound {
            active: training.len(),
            averaged_over,
            root: training.first().copied().unwrap_or(0),
            sync: !syncing.is_empty(),
            buffers_only: !forwarding.is_empty(),
        })
    }

    /// For a rank with no batches left, with [`DdpConfig::uneven_inputs`] (PyTorch's `Join`):
    /// answers the other ranks' steps until every rank has called `join`, then returns how many
    /// steps it answered. In each of them this rank sends zero gradients, which are not counted
    /// in the average (the gradients are averaged over the ranks still training), and applies
    /// the averaged gradients with `optimizer` like everyone else, so models *and* optimizer
    /// states stay identical on every rank: a checkpoint written by rank 0 afterwards is
    /// everyone's. Buffers come from the first rank still training, at every step and before
    /// each further forward of a step (several forwards before one backward), which this rank
    /// answers too.
    ///
    /// Gradients this rank accumulated with `backward_no_sync` after its last synchronised
    /// step belong to a step it never finishes: they are dropped, with a warning, and this rank
    /// sends zeros like any joined rank (as PyTorch's `Join`).
    ///
    /// Every rank calls `join` once after its last step (the last ones to finish return at
    /// once). Until every rank has joined, make no other collective call (checkpoint saves,
    /// evaluation, `SyncBatchNorm` in training, `GradScaler::step`) in the training loop: save
    /// after `join`.
    ///
    /// Each answered step is `optimizer_step(optimizer, lr, grads)` with this `lr`: the
    /// replicas stay identical only when the training ranks' steps are exactly that. A
    /// learning-rate schedule, gradient clipping or loss scaling on the training ranks is not
    /// repeated here, and this rank's model drifts from theirs.
    ///
    /// # Errors
    /// [`DdpError::InvalidConfig`] without [`DdpConfig::uneven_inputs`]; [`DdpError::Join`]
    /// when training ranks disagree on `backward` vs `backward_no_sync` in a step;
    /// [`DdpError::Comm`]. All are final (see [Errors are final](Self#errors-are-final)).
    ///
    /// [`DdpConfig::uneven_inputs`]: crate::DdpConfig::uneven_inputs
    pub fn join<O: Optimizer<M, B>>(
        &mut self,
        optimizer: &mut O,
        lr: f64,
    ) -> Result<usize, DdpError> {
        self.check_usable()?;
        let result = self.answer_until_all_joined(optimizer, lr);
        self.guard(result)
    }

    fn answer_until_all_joined<O: Optimizer<M, B>>(
        &mut self,
        optimizer: &mut O,
        lr: f64,
    ) -> Result<usize, DdpError> {
        if !self.config.uneven_inputs {
            return Err(DdpError::InvalidConfig(
                "join needs DdpConfig::with_uneven_inputs(true) on every rank".into(),
            ));
        }
        if self.passes.forward_pending() {
            return Err(DdpError::Join(
                "join was called after a forward whose backward never ran".into(),
            ));
        }
        let dropped = self.reducer.discard_held()?;
        if dropped > 0 {
            tracing::warn!(
                parameters = dropped,
                "join: dropping the gradients accumulated by backward_no_sync since this rank's \
                 last synchronised step; a joined rank contributes zeros"
            );
        }
        let mut answered = 0;
        loop {
            let round = self.join_round(RoundCall::Joined)?;
            if round.active == 0 || self.pg.world_size() == 1 {
                return Ok(answered);
            }
            if round.buffers_only {
                // A training rank's second forward before its backward: its broadcast of the
                // first training rank's buffers, answered here too. Not a step.
                self.sync_buffers_from(round.root)?;
                continue;
            }
            // The same collectives, in the same order, as `step` on the training ranks.
            self.reducer.begin_shadow(round.sync, round.averaged_over)?;
            let buffers = self
                .buffers
                .start::<B, M>(&self.pg, self.inner(), round.root)?;
            let reduced = self.reducer.finish(&self.table, false)?;
            self.land_buffers(buffers)?;
            if let Some((grads, _)) = reduced {
                self.optimizer_step(optimizer, lr, grads);
            }
            answered += 1;
        }
    }
}
