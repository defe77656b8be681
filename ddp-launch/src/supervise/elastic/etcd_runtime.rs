//! [`RuntimeThread`]: the etcd client's tokio runtime, and [`call`], how the synchronous
//! rendezvous waits on it. A current-thread runtime only drives I/O and timers inside
//! `Runtime::block_on`, so a thread of its own sits there; callers use `Handle::block_on`.

use super::backend::BackendError;
use std::future::Future;
use std::thread::JoinHandle;
use std::time::Duration;

/// Each request's own time limit: an etcd that does not answer in this time is lost.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The tokio runtime of the client, driven by its own thread until dropped.
pub(super) struct RuntimeThread {
    pub(super) handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl RuntimeThread {
    pub(super) fn start() -> std::io::Result<RuntimeThread> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("ddp-etcd".into())
            .spawn(move || {
                // Drives I/O, timers and the lease keep-alive task for `Handle::block_on`.
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        Ok(RuntimeThread {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for RuntimeThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Runs `request` on `runtime`, within [`REQUEST_TIMEOUT`].
pub(super) fn call<T>(
    runtime: &RuntimeThread,
    endpoint: &str,
    what: &str,
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, BackendError> {
    // The timer is made inside the runtime: `timeout` needs its context.
    let limited = async { tokio::time::timeout(REQUEST_TIMEOUT, request).await };
    match runtime.handle.block_on(limited) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(BackendError(format!("etcd at {endpoint}: {what}: {e}"))),
        Err(_) => Err(BackendError(format!(
            "etcd at {endpoint} did not answer ({what}) within {REQUEST_TIMEOUT:?}"
        ))),
    }
}
