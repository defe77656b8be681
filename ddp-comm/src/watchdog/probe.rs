//! What a [`Watchdog`](super::Watchdog) supervises: work items with completion probes (each
//! labelled with a [`CollectiveLabel`](super::CollectiveLabel)).

/// Tells whether one in-flight work item has finished, without blocking. For NCCL, a query of
/// the CUDA event recorded after the collective.
pub trait CompletionProbe: Send + Sync {
    /// `Ok(true)` when the item has finished, `Ok(false)` while it runs, `Err` with a
    /// description when it failed.
    fn poll(&self) -> Result<bool, String>;
}

impl<F: Fn() -> Result<bool, String> + Send + Sync> CompletionProbe for F {
    fn poll(&self) -> Result<bool, String> {
        self()
    }
}

/// Checks the whole communicator for an asynchronous failure (`ncclCommGetAsyncError`):
/// `Err` with a description once it has one.
pub type AsyncErrorProbe = Box<dyn Fn() -> Result<(), String> + Send>;

/// Aborts the communicator (`ncclCommAbort`) so that everything waiting inside it returns; the
/// watchdog calls it at most once, from its own thread.
pub type AbortFn = Box<dyn FnOnce() + Send>;
