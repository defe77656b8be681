//! The hook interface: [`CommHook`] and the [`GradBucket`] it reduces.

use super::hook_state::CommHookState;
use ddp_comm::ProcessGroup;

pub use crate::error::{CommHookStateError, HookError};

/// Reduces one bucket of gradients across the ranks of a process group.
///
/// # Contract
/// - Every rank's hook is called with the buckets in the same order, with buffers of the same
///   layout; it must issue the same collectives on every rank.
/// - On return, `bucket.buffer()` holds the gradients every rank uses, identical on every rank
///   (for the replicas to stay equal), approximately their average.
pub trait CommHook: Send + 'static {
    /// Replaces this rank's gradients in `bucket` by (an approximation of) their average over
    /// `pg`'s ranks.
    ///
    /// # Errors
    /// Anything; the error fails this backward on this rank (and aborts the group).
    fn reduce(&mut self, bucket: &mut GradBucket, pg: &ProcessGroup) -> Result<(), HookError>;

    /// A short name for logs and errors.
    fn name(&self) -> &str {
        std::any::type_name::<Self>()
    }

    /// Whether `reduce` leaves every bucket as it is, so each rank keeps its own gradients
    /// (ZeRO stage 2's [`LocalGradientsHook`](crate::zero::LocalGradientsHook)). DDP then
    /// never copies the gradients into host buckets: they stay where backward left them, and
    /// `reduce` is not called. A gradient this rank did not produce is then absent rather than
    /// zeros.
    fn leaves_gradients_local(&self) -> bool {
        false
    }

    /// This rank's state of the hook, for a checkpoint (PyTorch pickles its `PowerSGDState`
    /// for this): `None` for a hook that keeps none (the default). Taken between steps,
    /// restored with [`load_state`](Self::load_state), a resumed run continues bit for bit.
    /// A hook's state may differ per rank (PowerSGD's error feedback does).
    fn state(&self) -> Option<CommHookState> {
        None
    }

    /// Restores a state [`state`](Self::state) returned (on the same rank of a run of the
    /// same world size, model and hook settings). The default, for hooks without state,
    /// refuses every state.
    ///
    /// # Errors
    /// A [`CommHookStateError`] naming what does not match (another hook's state, another
    /// format version, other settings or layouts); the hook is then unchanged.
    fn load_state(&mut self, state: CommHookState) -> Result<(), CommHookStateError> {
        Err(CommHookStateError::Stateless {
            hook: self.name().to_string(),
            found: state.hook().to_string(),
        })
    }
}

/// One parameter's place in a [`GradBucket`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketParam {
    /// Module path of the parameter (`fc1.weight`).
    pub path: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Where its gradient starts in the bucket's buffer.
    pub offset: usize,
}

impl BucketParam {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Its range in the bucket's buffer.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.numel()
    }
}

/// A bucket of f32 gradients, flattened into one buffer in bucket order.
#[derive(Debug, Clone)]
pub struct GradBucket {
    index: usize,
    last: bool,
    buffer: Vec<f32>,
    params: Vec<BucketParam>,
}

impl GradBucket {
    /// A bucket; `params` must tile `buffer` in order; `last`: no later bucket of the step
    /// goes to the hook.
    pub(crate) fn new(
        index: usize,
        last: bool,
        buffer: Vec<f32>,
        params: Vec<BucketParam>,
    ) -> Self {
        GradBucket {
            index,
            last,
            buffer,
            params,
        }
    }

    /// The bucket's position in this step (0 is reduced first). Bucket `i` holds the same
    /// parameters step after step, except when DDP lays the buckets out again (in arrival
    /// order, once, in the first steps): a hook that keeps state per bucket checks
    /// [`parameters`](Self::parameters) too, as [`PowerSgdHook`](super::PowerSgdHook) does.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Whether this is the last bucket of the step that the hook is given (a hook counting
    /// steps counts here). Hooks get the f32 buckets; a bf16, f16 or f64 bucket after it (DDP
    /// all-reduces those itself) does not make this one less last.
    pub fn is_last(&self) -> bool {
        self.last
    }

    /// The gradients, flattened.
    pub fn buffer(&self) -> &[f32] {
        &self.buffer
    }

    /// The gradients, flattened, to overwrite with the result.
    pub fn buffer_mut(&mut self) -> &mut [f32] {
        &mut self.buffer
    }

    /// The parameters whose gradients the buffer holds, in order.
    pub fn parameters(&self) -> &[BucketParam] {
        &self.params
    }

    pub(crate) fn into_buffer(self) -> Vec<f32> {
        self.buffer
    }
}
