//! Timeouts and the deadlines made from them, safe for any value a user or a peer supplies.
//!
//! `Instant + Duration` panics on overflow, and `Duration::from_secs(u64::MAX)` is a valid
//! duration. Configured timeouts are therefore capped at [`MAX_TIMEOUT`] (a clear config error
//! beyond it), and every deadline is made through [`deadline_after`], which also clamps the
//! timeouts that arrive over the wire.

use crate::error::{CommError, Result};
use std::time::{Duration, Instant};

/// The longest timeout a config may ask for: 365 days, far beyond any real collective, and
/// small enough that no deadline made from it can overflow.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// The deadline `timeout` from now, with `timeout` clamped to [`MAX_TIMEOUT`].
pub(crate) fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout.min(MAX_TIMEOUT)).unwrap_or(now)
}

/// Checks a configured timeout: longer than zero and at most [`MAX_TIMEOUT`].
///
/// # Errors
/// [`CommError::InvalidConfig`] naming `what` and the limit.
pub(crate) fn check_timeout(what: &str, timeout: Duration) -> Result<()> {
    if timeout.is_zero() {
        return Err(CommError::config(what, "must be longer than zero"));
    }
    if timeout > MAX_TIMEOUT {
        return Err(CommError::config(
            what,
            format!(
                "{} s is longer than the maximum of {} s (365 days)",
                timeout.as_secs(),
                MAX_TIMEOUT.as_secs()
            ),
        ));
    }
    Ok(())
}

/// Parses a timeout in whole seconds (`DDP_TIMEOUT_SECS`), within `1..=MAX_TIMEOUT`.
///
/// # Errors
/// [`CommError::InvalidConfig`] naming `what` when the text is not a number or out of range.
pub(crate) fn parse_timeout_secs(what: &str, text: &str) -> Result<Duration> {
    let secs = text.trim().parse::<u64>().map_err(|_| {
        CommError::config(
            what,
            format!(
                "'{text}' is not a whole number of seconds (1..={})",
                MAX_TIMEOUT.as_secs()
            ),
        )
    })?;
    let timeout = Duration::from_secs(secs);
    check_timeout(what, timeout)?;
    Ok(timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_timeouts_are_config_errors_not_panics() {
        for text in ["9223372036854775808", "18446744073709551615", "31536001"] {
            let e = parse_timeout_secs("DDP_TIMEOUT_SECS", text)
                .expect_err(text)
                .to_string();
            assert!(e.starts_with("DDP_TIMEOUT_SECS: "), "{e}");
        }
        let e = parse_timeout_secs("T", "99999999999999999999999").expect_err("too long");
        assert!(e.to_string().contains("not a whole number"), "{e}");
        assert_eq!(
            parse_timeout_secs("T", " 60 ").ok(),
            Some(Duration::from_secs(60))
        );
        assert!(parse_timeout_secs("T", "0").is_err());
    }

    #[test]
    fn deadlines_of_any_duration_do_not_overflow() {
        let d = deadline_after(Duration::MAX);
        assert!(d > Instant::now() + Duration::from_secs(364 * 24 * 3600));
        assert!(deadline_after(Duration::ZERO) <= Instant::now());
    }

    mod properties {
        use super::super::*;
        use crate::proptest_support::config;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(config())]

            /// Any text is a timeout within `1..=MAX_TIMEOUT` or an error; a deadline from any
            /// duration is made without overflow.
            #[test]
            fn any_timeout_text_parses_safely(text in "\\PC{0,24}", secs in any::<u64>(), nanos in 0u32..1_000_000_000) {
                if let Ok(t) = parse_timeout_secs("T", &text) {
                    prop_assert!(!t.is_zero() && t <= MAX_TIMEOUT);
                }
                match parse_timeout_secs("T", &secs.to_string()) {
                    Ok(t) => prop_assert_eq!(t.as_secs(), secs),
                    Err(_) => prop_assert!(secs == 0 || secs > MAX_TIMEOUT.as_secs()),
                }
                let _ = deadline_after(Duration::new(secs, nanos));
            }
        }
    }
}
