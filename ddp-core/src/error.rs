//! The errors of ddp-core's DDP wrapper.

use ddp_comm::CommError;

/// What a [`CommHook`](crate::hooks::CommHook) returns when it fails; DDP reports it as
/// [`DdpError::CommHook`].
pub type HookError = Box<dyn std::error::Error + Send + Sync>;

/// Why a [`CommHookState`](crate::hooks::CommHookState) could not be restored into a hook
/// ([`CommHook::load_state`](crate::hooks::CommHook::load_state),
/// [`DistributedDataParallel::load_comm_hook_state`](crate::DistributedDataParallel::load_comm_hook_state)).
/// The hook is left as it was.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommHookStateError {
    /// The state was written by another kind of hook.
    #[error(
        "a communication-hook state written by the '{found}' hook cannot be loaded into the \
         '{hook}' hook: register the hook (and settings) the saved run used, or resume without \
         its hook state"
    )]
    OtherHook {
        /// The hook asked to load it.
        hook: String,
        /// The hook that wrote it.
        found: String,
    },
    /// The state is of a format version this build's hook does not read.
    #[error(
        "the '{hook}' hook reads state format version {supported}, this state is version \
         {found} (written by another ddp-core version): resume with the version that wrote it, \
         or without its hook state"
    )]
    UnsupportedVersion {
        /// The hook.
        hook: String,
        /// The version of the state.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The state was saved by a hook with other settings.
    #[error(
        "the '{hook}' hook's state was saved with {setting} = {saved}, this hook has {current}: \
         configure the hook as the saved run did, or resume without its hook state"
    )]
    ConfigMismatch {
        /// The hook.
        hook: String,
        /// The setting that differs.
        setting: &'static str,
        /// Its saved value.
        saved: String,
        /// Its value in this hook.
        current: String,
    },
    /// A bucket of the state does not fit the layout saved with it under this hook's settings
    /// (its buffers were made for other parameters or another compression).
    #[error(
        "the '{hook}' hook's saved state of bucket {bucket} does not fit its layout: {detail}; \
         the state belongs to another model or hook configuration: resume the run that saved \
         it, or without its hook state"
    )]
    LayoutMismatch {
        /// The hook.
        hook: String,
        /// The bucket's index.
        bucket: usize,
        /// What does not fit.
        detail: String,
    },
    /// The bytes do not decode as a hook state (truncated or not one).
    #[error("a '{hook}' hook state does not decode: {reason}")]
    Corrupt {
        /// The hook the bytes were meant for (or `unknown`).
        hook: String,
        /// What is wrong.
        reason: String,
    },
    /// The hook keeps no state, so it has none to restore.
    #[error(
        "the '{hook}' hook keeps no state, and a state written by the '{found}' hook was given \
         to it: register the hook the saved run used, or resume without its hook state"
    )]
    Stateless {
        /// The hook.
        hook: String,
        /// The hook that wrote the state.
        found: String,
    },
    /// No communication hook is registered with DDP.
    #[error(
        "no communication hook is registered, and a state written by the '{found}' hook was \
         given: call register_comm_hook with the hook the saved run used first"
    )]
    NoHookRegistered {
        /// The hook that wrote the state.
        found: String,
    },
}

/// Failures of [`DistributedDataParallel`](crate::DistributedDataParallel).
///
/// Any error from a collective call (`forward`, `backward`, `backward_no_sync`, `set_module`)
/// aborts the process group, so the other ranks fail at once with this rank's reason instead of
/// waiting for the timeout, and poisons the wrapper: every later call returns
/// [`DdpError::Poisoned`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DdpError {
    /// The ranks do not hold the same model.
    #[error("model mismatch across ranks: {0}")]
    ModelMismatch(String),
    /// A collective failed (a peer died, stalled, disagreed, or aborted with its own reason).
    #[error("{context}: {source}")]
    Comm {
        /// What DDP was doing.
        context: &'static str,
        /// The communication error.
        #[source]
        source: CommError,
    },
    /// `backward` was called without a `ddp.forward` since the last backward.
    #[error(
        "backward without forward: call `ddp.forward(|model| ...)` before every \
         `ddp.backward(loss)` (a forward made before the last optimizer_step does not count: \
         its gradients belong to the old weights)"
    )]
    BackwardWithoutForward,
    /// Gradients reached DDP outside `ddp.backward`, from a plain `loss.backward()`.
    #[error(
        "{count} gradient(s) reached DDP outside `ddp.backward`: call `ddp.backward(loss)` (or \
         `backward_no_sync`) instead of `loss.backward()` on the output of `ddp.forward`"
    )]
    BackwardOutsideDdp {
        /// How many tapped gradients arrived.
        count: usize,
    },
    /// Gradients reached this wrapper during another wrapper's backward: that wrapper's loss
    /// used this wrapper's `forward` output (two wrapped models in one graph).
    #[error(
        "{count} gradient(s) reached this DDP wrapper during another DDP or FSDP wrapper's \
         backward: that wrapper's loss used this wrapper's `forward` output, and nothing averages \
         or applies those gradients. If that loss does not train this model (a GAN's generator \
         step through the wrapped discriminator), compute it from `ddp.module()`, which has no \
         taps; if one loss trains both models, wrap them in one module and one DDP"
    )]
    BackwardOfAnotherWrapper {
        /// How many tapped gradients arrived.
        count: usize,
    },
    /// The loss used parameters of the wrapped module directly (through `ddp.module()`, or a
    /// clone of it) rather than through `ddp.forward`: DDP never sees their gradients, so
    /// they would not be averaged, nor applied at all.
    #[error(
        "the loss used {} parameter(s) of the wrapped module outside `ddp.forward` ({}): their \
         gradients do not reach DDP and would be dropped; compute every term of the loss from \
         the model that `ddp.forward(|model| ...)` hands you (a regularisation term too)",
        params.len(),
        params.join(", ")
    )]
    UsedOutsideForward {
        /// The parameters' paths in the module.
        params: Vec<String>,
    },
    /// The loss was computed from the output of a forward that an earlier backward already
    /// consumed, or that an `optimizer_step` since has made stale (its gradients belong to the
    /// old weights).
    #[error(
        "the gradient of '{path}' comes from a forward made before the previous backward or \
         optimizer_step: every backward must use outputs of the `ddp.forward` calls made since \
         both (a gradient of the old weights would be applied to the new ones)"
    )]
    StaleForward {
        /// The parameter whose stale gradient arrived.
        path: String,
    },
    /// The loss did not depend on any parameter through `ddp.forward`.
    #[error(
        "no gradient reached DDP during backward: compute the loss from the output of \
         `ddp.forward(|model| ...)`"
    )]
    NoGradients,
    /// A gradient could not be turned into reducible data.
    #[error("gradient of '{path}': {reason}")]
    Gradient {
        /// The parameter.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// The model uses a dtype or combination of options DDP cannot reduce.
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// Serialising or loading the model failed.
    #[error("{context}: {reason}")]
    Record {
        /// What DDP was doing.
        context: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// An earlier call failed; the process group was aborted and the wrapper cannot continue.
    #[error(
        "DDP is unusable after an earlier error (the process group was aborted): {first}; \
         restart the job (with `--max-restarts` it resumes from the latest checkpoint)"
    )]
    Poisoned {
        /// The first error.
        first: String,
    },
    /// The configuration is invalid.
    #[error("invalid DDP config: {0}")]
    InvalidConfig(String),
    /// A communication hook failed on a bucket.
    #[error("communication hook '{hook}' failed on bucket {bucket}: {source}")]
    CommHook {
        /// The hook's name.
        hook: String,
        /// The bucket's index.
        bucket: usize,
        /// What the hook returned.
        #[source]
        source: HookError,
    },
    /// [`join`](crate::DistributedDataParallel::join) found ranks that disagree on the step.
    #[error("uneven inputs: {0}")]
    Join(String),
    /// Writing the timeline failed. The wrapper no longer returns it: a timeline file that
    /// cannot be written turns the timeline off with a warning instead. Kept so that code
    /// matching it still compiles.
    #[error("writing the timeline to {path}: {source}")]
    Timeline {
        /// The trace file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A communication hook's state could not be restored
    /// ([`load_comm_hook_state`](crate::DistributedDataParallel::load_comm_hook_state)).
    #[error(transparent)]
    CommHookState(#[from] CommHookStateError),
    /// The ranks laid their gradient buckets out differently: their all-reduces would not
    /// match (NCCL would hang or add unrelated gradients), so DDP stops before reducing.
    #[error(
        "gradient bucket layouts differ across ranks {when}: rank(s) {ranks} differ from rank 0 \
         (this is rank {rank}, its buckets hold {buckets} elements); every rank must wrap the \
         same model (same parameters, shapes and dtypes, in the same order) with the same \
         bucket_cap_mb, first_bucket_cap_mb and min_buckets"
    )]
    BucketLayoutMismatch {
        /// At which point the layouts were compared.
        when: &'static str,
        /// The ranks whose layout differs from rank 0's, comma separated.
        ranks: String,
        /// This rank.
        rank: usize,
        /// This rank's bucket sizes, in elements.
        buckets: String,
    },
    /// A bug in DDP itself: please report it with the message.
    #[error("internal error in DDP: {0}")]
    Internal(String),
}

impl DdpError {
    pub(crate) fn comm(context: &'static str) -> impl FnOnce(CommError) -> DdpError {
        move |source| DdpError::Comm { context, source }
    }
}
