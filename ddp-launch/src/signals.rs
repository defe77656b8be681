//! The launcher's signal handling: SIGINT, SIGTERM, SIGHUP and SIGQUIT are caught (not acted
//! on) so the supervisor can forward them to every worker and stop cleanly (uncaught, SIGQUIT
//! would end the launcher without stopping the workers' process groups), unless one was ignored
//! when the launcher started (`nohup`): that one stays ignored, here and in the workers.

use crate::error::LaunchError;
use crate::signal_names::signal_name;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

/// The signals the launcher catches and forwards.
pub(crate) const FORWARDED: [libc::c_int; 4] =
    [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Last signal received (0: none since the last `take`).
static PENDING: AtomicI32 = AtomicI32::new(0);
/// Number of signals received since installation.
static RECEIVED: AtomicUsize = AtomicUsize::new(0);
/// Whether a guard is alive: the handlers are process-wide, so one launcher per process.
static INSTALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only async-signal-safe work: two atomic stores.
    PENDING.store(sig, Ordering::SeqCst);
    RECEIVED.fetch_add(1, Ordering::SeqCst);
}

/// Catches [`FORWARDED`] while alive and restores the previous dispositions on drop.
pub(crate) struct SignalGuard {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl SignalGuard {
    /// Installs the handlers.
    ///
    /// # Errors
    /// [`LaunchError::Signals`] if another launcher runs in this process or `sigaction` fails.
    pub(crate) fn install() -> Result<SignalGuard, LaunchError> {
        if INSTALLED.swap(true, Ordering::SeqCst) {
            return Err(LaunchError::Signals {
                reason: "another launcher is already running in this process".into(),
            });
        }
        PENDING.store(0, Ordering::SeqCst);
        RECEIVED.store(0, Ordering::SeqCst);
        let mut guard = SignalGuard {
            previous: Vec::new(),
        };
        for sig in FORWARDED {
            // A signal ignored when the launcher started (`nohup`, a non-interactive shell's
            // background job for SIGINT and SIGQUIT) stays ignored, as the user asked: not
            // caught, and so still ignored in the workers, which inherit it across exec.
            if is_ignored(sig)? {
                tracing::debug!(
                    signal = signal_name(sig),
                    "ignored when started: left ignored"
                );
                continue;
            }
            // SAFETY: a zeroed sigaction is a valid "default" value; we fill in the handler and
            // an empty mask, and `on_signal` only touches atomics.
            let old = unsafe {
                let mut new: libc::sigaction = std::mem::zeroed();
                new.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                new.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut new.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, &new, &mut old) != 0 {
                    let err = std::io::Error::last_os_error();
                    drop(guard); // restores what was installed so far
                    return Err(LaunchError::Signals {
                        reason: format!("sigaction({}): {err}", signal_name(sig)),
                    });
                }
                old
            };
            guard.previous.push((sig, old));
        }
        Ok(guard)
    }

    /// The signal received since the last call, if any.
    pub(crate) fn take(&self) -> Option<i32> {
        match PENDING.swap(0, Ordering::SeqCst) {
            0 => None,
            sig => Some(sig),
        }
    }

    /// How many signals arrived since installation (a second one escalates to SIGKILL).
    pub(crate) fn received(&self) -> usize {
        RECEIVED.load(Ordering::SeqCst)
    }
}

/// Whether `sig`'s disposition is SIG_IGN, read without changing it (so no window in which a
/// handler would catch it).
fn is_ignored(sig: libc::c_int) -> Result<bool, LaunchError> {
    // SAFETY: a null `act` only reads the current disposition into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
            let err = std::io::Error::last_os_error();
            return Err(LaunchError::Signals {
                reason: format!(
                    "sigaction({}) reading its disposition: {err}",
                    signal_name(sig)
                ),
            });
        }
        Ok(old.sa_sigaction == libc::SIG_IGN)
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for (sig, old) in self.previous.drain(..) {
            // SAFETY: restoring the disposition we saved from the kernel.
            unsafe {
                libc::sigaction(sig, &old, std::ptr::null_mut());
            }
        }
        INSTALLED.store(false, Ordering::SeqCst);
    }
}

/// Held by a unit test while it has a guard installed: the handlers are process-wide and the
/// tests run in parallel.
#[cfg(test)]
pub(crate) static TEST_GUARD_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_guard_at_a_time_and_handlers_see_raised_signals() {
        let _lock = TEST_GUARD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let guard = SignalGuard::install().expect("install");
        let second = SignalGuard::install();
        assert!(matches!(second, Err(LaunchError::Signals { .. })));
        // SAFETY: raising a signal we just installed a handler for.
        unsafe { libc::raise(libc::SIGHUP) };
        assert_eq!(guard.take(), Some(libc::SIGHUP));
        assert_eq!(guard.take(), None);
        assert_eq!(guard.received(), 1);
        drop(guard);
        let again = SignalGuard::install().expect("reinstall after drop");
        drop(again);
    }

    /// `nohup`: a signal ignored before installation is not caught, so it stays ignored (and
    /// workers inherit SIG_IGN across exec).
    #[test]
    fn a_signal_ignored_before_installation_stays_ignored() {
        let _lock = TEST_GUARD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: changing a disposition only this (locked) test relies on.
        let before = unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
        let guard = SignalGuard::install().expect("install");
        assert!(is_ignored(libc::SIGHUP).expect("read SIGHUP"));
        assert!(!is_ignored(libc::SIGTERM).expect("read SIGTERM"));
        // SAFETY: SIGHUP is ignored: raising it does nothing.
        unsafe { libc::raise(libc::SIGHUP) };
        assert_eq!(guard.take(), None);
        drop(guard);
        assert!(is_ignored(libc::SIGHUP).expect("read SIGHUP after drop"));
        // SAFETY: restoring what this test found.
        unsafe { libc::signal(libc::SIGHUP, before) };
    }
}
