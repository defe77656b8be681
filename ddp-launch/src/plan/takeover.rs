//! How long a launcher started for a `--node-rank` that another launcher holds waits before it
//! takes that place ([`TAKEOVER_ENV`]): a setting of this host's launch, read with the plan;
//! [`rendezvous::node_claim`](crate::rendezvous::node_claim) does the waiting.

use crate::error::LaunchError;
use std::time::Duration;

/// How long, by default, a holder's heartbeat must stay still for a newcomer to take its claim:
/// fifteen beats missed in a row, the default of the elastic path's `--rdzv-heartbeat-timeout`
/// and about what torchrun allows an agent. Calling a live holder dead is costly: the newcomer
/// ends the attempt under way, and the displaced holder stops at its next look at its claim. A
/// live holder's beat is one `add` on a connection whose calls all return at once, but the
/// holder itself may be held off for seconds (stopped and continued, swapping, a paused VM, a
/// busy node 0), so the margin is wide; waiting longer costs only a newcomer for a node whose
/// launcher really died a few seconds more. Only the newcomer waits, so nodes need not agree
/// on it.
pub(crate) const DEFAULT_GRACE: Duration = Duration::from_secs(15);
/// The shortest grace [`TAKEOVER_ENV`] may ask for: four beats, so that a live holder is not
/// taken for dead for one late beat.
pub(crate) const MIN_GRACE: Duration = Duration::from_secs(4);
/// Seconds a launcher started for a `--node-rank` that another launcher holds watches that
/// launcher's heartbeat before it takes its place ([`DEFAULT_GRACE`] when unset): shorter
/// brings a replacement for a dead node in sooner (the launcher tests use it), longer suits
/// hosts that stall for long.
pub(crate) const TAKEOVER_ENV: &str = "DDP_NODE_TAKEOVER_SECS";

/// The takeover grace [`TAKEOVER_ENV`]'s `value` asks for: seconds (fractions allowed) in
/// [`MIN_GRACE`]`..=`[`MAX_DURATION`](crate::MAX_DURATION); [`DEFAULT_GRACE`] when unset.
///
/// # Errors
/// [`LaunchError::WorkerEnv`] naming the variable, the value and the range.
pub(crate) fn takeover_grace(value: Option<&str>) -> Result<Duration, LaunchError> {
    let Some(value) = value else {
        return Ok(DEFAULT_GRACE);
    };
    let grace = super::args::parse_secs(value)
        .map_err(|reason| LaunchError::worker_env(TAKEOVER_ENV, reason))?;
    if grace < MIN_GRACE {
        return Err(LaunchError::worker_env(
            TAKEOVER_ENV,
            format!(
                "'{value}' is shorter than the minimum of {} s (four heartbeats: shorter would \
                 take a live launcher for dead); unset it for the default of {} s",
                MIN_GRACE.as_secs(),
                DEFAULT_GRACE.as_secs()
            ),
        ));
    }
    Ok(grace)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The takeover grace: the default when unset, seconds within `MIN_GRACE..=MAX_DURATION`
    /// otherwise, and a clear error naming the variable for anything else.
    #[test]
    fn the_takeover_grace_is_read_and_checked() {
        assert_eq!(takeover_grace(None).expect("default"), DEFAULT_GRACE);
        assert_eq!(
            takeover_grace(Some("5")).expect("5 s"),
            Duration::from_secs(5)
        );
        assert_eq!(
            takeover_grace(Some("4.5")).expect("4.5 s"),
            Duration::from_millis(4500)
        );
        for (value, expected) in [
            ("1", "is shorter than the minimum of 4 s"),
            ("0", "is shorter than the minimum of 4 s"),
            ("soon", "expected a number of seconds, got 'soon'"),
            ("-5", "non-negative number of seconds"),
            ("1e19", "is longer than the maximum of 31536000 s"),
        ] {
            let err = takeover_grace(Some(value)).expect_err(value);
            assert!(
                matches!(&err, LaunchError::WorkerEnv { var, .. } if var == TAKEOVER_ENV),
                "{err}"
            );
            assert_eq!(err.exit_code(), 2);
            assert!(err.to_string().contains(expected), "{value}: {err}");
        }
    }
}
