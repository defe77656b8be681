//! [`BlockingWaiter`]: a blocking wait for the device, run on a thread of its own, that the
//! caller gives up on at a deadline.
//!
//! cubecl 0.10's ready fence (`client.sync()`) is a future whose first poll blocks in
//! `cuEventSynchronize` until the stream reaches its event: it can be neither polled with a
//! timeout nor queried, and cubecl does not expose the event. A caller that must not hang on a
//! kernel that never ends hands the wait to a thread and waits for its answer with a timeout.
//! The thread is one per communicator, started at its first wait and kept: a collective pays
//! a channel hand-off and one wake-up (microseconds, the hand-off made while the GPU still runs
//! the kernels waited for), not a thread start. A wait that never ends keeps that thread
//! forever; later waits queue behind it and give up at their own deadlines (by then the
//! communicator has been aborted, and training ends).

use super::Readiness;
use std::sync::{Mutex, PoisonError, mpsc};
use std::time::Instant;

/// A blocking wait: `Err` says why the device failed it.
type Wait = Box<dyn FnOnce() -> Result<(), String> + Send>;

struct Job {
    wait: Wait,
    /// Room for the answer, so the thread never blocks on a caller that gave up.
    done: mpsc::SyncSender<Result<(), String>>,
}

/// Runs blocking waits on its thread, in the order given.
pub(super) struct BlockingWaiter {
    /// The thread's name.
    name: String,
    /// `None` until the first wait.
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
}

impl BlockingWaiter {
    /// A waiter whose thread, once started, is called `name`.
    pub(super) fn new(name: String) -> BlockingWaiter {
        BlockingWaiter {
            name,
            jobs: Mutex::new(None),
        }
    }

    /// Runs `wait` on the waiter's thread (after the waits given before it) and waits for it
    /// until `deadline`: [`Readiness::Pending`] if it has not returned by then (it goes on, on
    /// that thread).
    pub(super) fn wait_until(
        &self,
        deadline: Instant,
        wait: impl FnOnce() -> Result<(), String> + Send + 'static,
    ) -> Result<Readiness, String> {
        let (done, answer) = mpsc::sync_channel(1);
        self.send(Job {
            wait: Box::new(wait),
            done,
        })?;
        match answer.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(result) => result.map(|()| Readiness::Ready),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(Readiness::Pending),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(format!(
                "the thread waiting for the device ({}) ended",
                self.name
            )),
        }
    }

    /// Hands `job` to the thread, starting it if there is none (or it has ended).
    fn send(&self, job: Job) -> Result<(), String> {
        let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        let job = match jobs.as_ref() {
            Some(sender) => match sender.send(job) {
                Ok(()) => return Ok(()),
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        let (sender, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(self.name.clone())
            .spawn(move || {
                for Job { wait, done } in queue {
                    // A panic (a driver bug) fails this wait only, not the ones behind it.
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(wait))
                        .unwrap_or_else(|_| Err("the wait for the device panicked".to_string()));
                    // A caller that gave up dropped its receiver: nothing to tell.
                    let _ = done.try_send(result);
                }
            })
            .map_err(|e| format!("starting the thread that waits for the device: {e}"))?;
        sender
            .send(job)
            .map_err(|_| "the thread that waits for the device ended at once".to_string())?;
        *jobs = Some(sender);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A wait that has not returned by the deadline is `Pending` (and the caller is back),
    /// waits queued behind it too; once it returns, the thread answers later ones again.
    /// Waits that must finish get a generous deadline (the thread's start included, on a busy
    /// machine); the short one is only for waits that cannot finish.
    #[test]
    fn a_wait_past_its_deadline_is_pending_and_the_waiter_goes_on_after_it() {
        let waiter = BlockingWaiter::new("test-waiter".into());
        let soon = || Instant::now() + Duration::from_millis(50);
        let later = || Instant::now() + Duration::from_secs(60);
        assert_eq!(waiter.wait_until(later(), || Ok(())), Ok(Readiness::Ready));
        assert_eq!(
            waiter.wait_until(later(), || Err("device lost".into())),
            Err("device lost".into())
        );
        let (release, stuck) = mpsc::channel::<()>();
        let hung = move || stuck.recv().map_err(|e| e.to_string());
        assert_eq!(waiter.wait_until(soon(), hung), Ok(Readiness::Pending));
        assert_eq!(waiter.wait_until(soon(), || Ok(())), Ok(Readiness::Pending));
        release.send(()).unwrap();
        assert_eq!(waiter.wait_until(later(), || Ok(())), Ok(Readiness::Ready));
    }

    /// A wait that panics fails, and only it: the thread goes on with the next one.
    #[test]
    fn a_panicking_wait_fails_and_the_next_one_is_answered() {
        let waiter = BlockingWaiter::new("test-waiter".into());
        let later = || Instant::now() + Duration::from_secs(60);
        let panicked = waiter.wait_until(later(), || panic!("a driver bug"));
        assert!(panicked.unwrap_err().contains("panicked"));
        assert_eq!(waiter.wait_until(later(), || Ok(())), Ok(Readiness::Ready));
    }
}
