//! A thread that owns some state and runs the jobs submitted from any thread against it, one at
//! a time, in submission order.
//!
//! Both communication threads are one: the CPU transports' thread (`group::transport_thread`: its state is the transport)
//! and the NCCL group's (its state is the communicator, which cannot leave its thread). What a
//! job does on failure (reporting to the store, marking the group failed) is the caller's
//! business; this file only moves jobs, results and borrows between threads.

use super::handle::{Work, WorkTiming};
use crate::error::{CommError, Result};
use crate::locked;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

/// A job as the thread sees it: it sends its own result.
pub(crate) type Job<S> = Box<dyn FnOnce(&mut S) + Send + 'static>;

/// Handle to the thread; dropping it lets queued jobs finish and joins the thread.
pub(crate) struct JobThread<S> {
    jobs: Mutex<Option<Sender<Job<S>>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl<S> std::fmt::Debug for JobThread<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobThread").finish_non_exhaustive()
    }
}

/// Runs the jobs of `rx` against `state` until every handle is gone; returns the state for
/// whatever teardown it needs.
pub(crate) fn serve<S>(rx: Receiver<Job<S>>, mut state: S) -> S {
    while let Ok(job) = rx.recv() {
        job(&mut state);
    }
    state
}

impl<S: 'static> JobThread<S> {
    /// Starts a thread named `name` running `main` with the job queue; `main` normally sets up
    /// its state and calls [`serve`].
    pub(crate) fn spawn(
        name: String,
        main: impl FnOnce(Receiver<Job<S>>) + Send + 'static,
    ) -> std::io::Result<JobThread<S>> {
        let (tx, rx) = mpsc::channel::<Job<S>>();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || main(rx))?;
        Ok(JobThread {
            jobs: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }
}

impl<S> JobThread<S> {
    fn sender(&self) -> Option<Sender<Job<S>>> {
        self.jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Queues a job that owns its data; its result and timing arrive through the [`Work`].
    pub(crate) fn submit<R: Send + 'static>(
        &self,
        job: impl FnOnce(&mut S) -> Result<R> + Send + 'static,
    ) -> Work<R> {
        let (tx, rx) = mpsc::sync_channel(1);
        let queued = Instant::now();
        let boxed: Job<S> = Box::new(move |s| {
            let started = Instant::now();
            let result = job(s);
            let timing = WorkTiming {
                queued,
                started,
                finished: Instant::now(),
            };
            let _ = tx.send((result, timing));
        });
        match self.sender().map(|s| s.send(boxed)) {
            Some(Ok(())) => Work::pending(rx),
            _ => Work::failed(CommError::Destroyed),
        }
    }

    /// Runs a job that borrows the caller's data, blocking until it has finished.
    pub(crate) fn run_blocking<'a, R: Send + 'a>(
        &self,
        job: impl FnOnce(&mut S) -> Result<R> + Send + 'a,
    ) -> Result<R> {
        let (tx, rx) = mpsc::sync_channel::<Result<R>>(1);
        let boxed: Box<dyn FnOnce(&mut S) + Send + 'a> = Box::new(move |s| {
            let _ = tx.send(job(s));
        });
        // SAFETY: the job borrows data for 'a. We only return after `rx` yields, which happens
        // when the job has sent its result (it has finished with the borrowed data, which
        // `job(s)` consumed) or when the job was dropped without running or unwound (the sender
        // inside it is dropped, and with it every borrow). Either way no borrow outlives this
        // call, which is the same argument that makes scoped threads sound.
        let boxed: Job<S> =
            unsafe { std::mem::transmute::<Box<dyn FnOnce(&mut S) + Send + 'a>, Job<S>>(boxed) };
        let sender = self.sender().ok_or(CommError::Destroyed)?;
        if sender.send(boxed).is_err() {
            return Err(CommError::Destroyed);
        }
        rx.recv().unwrap_or(Err(CommError::Destroyed))
    }

    /// Stops accepting jobs, lets queued ones finish, and joins the thread.
    pub(crate) fn shutdown(&self) {
        drop(locked::take(&self.jobs));
        if let Some(t) = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = t.join();
        }
    }
}

impl<S> Drop for JobThread<S> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_in_order_and_blocking_jobs_may_borrow() {
        let t = JobThread::<Vec<u32>>::spawn("test".into(), |rx| drop(serve(rx, Vec::new())))
            .expect("spawning");
        let first = t.submit(|s| {
            s.push(1);
            Ok(s.len())
        });
        let mut borrowed = [0u32; 2];
        t.run_blocking(|s| {
            s.push(2);
            borrowed.copy_from_slice(s);
            Ok(())
        })
        .expect("blocking job");
        assert_eq!(borrowed, [1, 2]);
        assert_eq!(first.wait().expect("first job"), 1);
        t.shutdown();
        assert!(matches!(
            t.run_blocking(|_| Ok(())),
            Err(CommError::Destroyed)
        ));
        assert!(matches!(
            t.submit(|_| Ok(())).wait(),
            Err(CommError::Destroyed)
        ));
    }
}
