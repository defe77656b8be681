//! [`WorkerContext`]: what the training function gets — its place in the job and a ready
//! process group.

use crate::worker::env::{LauncherKind, WorkerEnv};
use ddp_comm::ProcessGroup;

/// A worker's view of the job, handed to the training function by [`launch`](crate::launch).
///
/// The process group is already joined: every rank of the job is connected.
///
/// ```no_run
/// # fn f(ctx: ddp_launch::WorkerContext) -> Result<(), ddp_comm::CommError> {
/// use ddp_comm::ReduceOp;
/// let mut grads = vec![1.0f32; 4];
/// ctx.process_group().all_reduce(&mut grads, ReduceOp::Avg)?;
/// if ctx.is_main() && ctx.restart_count() > 0 {
///     println!("resumed after {} restarts", ctx.restart_count());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct WorkerContext {
    env: WorkerEnv,
    group: ProcessGroup,
}

impl WorkerContext {
    /// Only [`launch`](crate::launch) hands a context out.
    #[cfg(feature = "supervisor")]
    pub(crate) fn new(env: WorkerEnv, group: ProcessGroup) -> Self {
        WorkerContext { env, group }
    }

    /// Global rank, in `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.env.rank
    }
    /// Number of workers in the job.
    pub fn world_size(&self) -> usize {
        self.env.world_size
    }
    /// Rank on this node.
    pub fn local_rank(&self) -> usize {
        self.env.local_rank
    }
    /// Workers on this node.
    pub fn local_world_size(&self) -> usize {
        self.env.local_world_size
    }
    /// This node's rank.
    pub fn node_rank(&self) -> usize {
        self.env.node_rank
    }
    /// The accelerator this worker should use: its local rank (one device per local rank).
    pub fn device_index(&self) -> usize {
        self.env.local_rank
    }
    /// How many times the group was restarted before this attempt (0 on the first run). Resume
    /// from your latest checkpoint when it is above 0.
    pub fn restart_count(&self) -> u32 {
        self.env.restart_count
    }
    /// Whether this attempt is a restart of the group (`--max-restarts`) rather than the
    /// launch's first attempt.
    ///
    /// A restart continues the same run: resume from the latest checkpoint and ignore flags
    /// that mean "start over" (such as the examples' `--fresh`). The command line is repeated
    /// unchanged on every attempt, so honouring `--fresh` again would throw away the progress
    /// the restart exists to keep.
    ///
    /// ```no_run
    /// # fn f(ctx: ddp_launch::WorkerContext, fresh_flag: bool) {
    /// // `--fresh` applies to the first attempt of a launch only.
    /// let start_over = fresh_flag && !ctx.is_restart();
    /// # }
    /// ```
    pub fn is_restart(&self) -> bool {
        self.env.is_restart()
    }
    /// Whether this is rank 0 (the one that logs and saves checkpoints).
    pub fn is_main(&self) -> bool {
        self.env.rank == 0
    }
    /// Who started this process.
    pub fn launcher(&self) -> LauncherKind {
        self.env.launcher
    }
    /// The full environment this context was built from.
    pub fn env(&self) -> &WorkerEnv {
        &self.env
    }
    /// The process group of every worker in the job.
    pub fn process_group(&self) -> &ProcessGroup {
        &self.group
    }
    /// Takes the process group out (e.g. to hand it to a `DistributedDataParallel` wrapper).
    pub fn into_process_group(self) -> ProcessGroup {
        self.group
    }
}
