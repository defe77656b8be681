//! Aborts that cannot hang their caller: `ncclCommAbort` blocks (NCCL makes it a blocking group
//! call even on a non-blocking communicator), and a stuck proxy or network can keep it there.
//! Every abort runs on a thread of its own and is given up on after [`ABORT_WAIT`].

use std::panic::AssertUnwindSafe;
use std::time::Duration;

/// How long an abort is waited for before the caller goes on without it.
pub(crate) const ABORT_WAIT: Duration = Duration::from_secs(10);

/// How a bounded run ended.
pub(crate) enum Bounded<T> {
    /// `f` returned this.
    Done(T),
    /// `f` panicked.
    Panicked,
    /// `f` had not returned after the limit; its thread is left to finish on its own.
    TimedOut,
    /// The thread could not be started; `f` did not run.
    NotStarted(std::io::Error),
}

/// Runs `f` on a thread named `name` and waits for it at most `limit`.
pub(crate) fn run_bounded<T: Send + 'static>(
    name: String,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Bounded<T> {
    let (done, finished) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let _ = done.send(std::panic::catch_unwind(AssertUnwindSafe(f)).ok());
    });
    if let Err(e) = spawned {
        return Bounded::NotStarted(e);
    }
    match finished.recv_timeout(limit) {
        Ok(Some(value)) => Bounded::Done(value),
        Ok(None) => Bounded::Panicked,
        Err(_) => Bounded::TimedOut,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Verdicts by causality, not by timing: a function that returns or panics is waited for
    /// with a limit no machine reaches (a panic's backtrace alone can take a loaded machine
    /// longer than 200 ms, which once made this test fail), and the one that times out cannot
    /// return until the test releases it, after the verdict.
    #[test]
    fn should_return_the_value_a_panic_or_give_up_at_the_limit() {
        let generous = Duration::from_secs(120);
        assert!(matches!(
            run_bounded("t".into(), generous, || 7),
            Bounded::Done(7)
        ));
        assert!(matches!(
            run_bounded("t".into(), generous, || -> u8 { panic!("boom") }),
            Bounded::Panicked
        ));
        let (release, released) = std::sync::mpsc::channel::<()>();
        let blocked = move || {
            let _ = released.recv();
        };
        assert!(matches!(
            run_bounded("t".into(), Duration::from_millis(50), blocked),
            Bounded::TimedOut
        ));
        drop(release);
    }
}
