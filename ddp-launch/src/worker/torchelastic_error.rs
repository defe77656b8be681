//! torchrun's error file: where a worker started by torchrun leaves its failure.
//!
//! torchrun gives each worker a path in `TORCHELASTIC_ERROR_FILE`; PyTorch's `@record` writes
//! the exception there as JSON, and torchrun's agent prints it as the job's root cause. Without
//! the file, the agent's summary says only "To enable traceback see ..." and the exit code. A
//! program built on [`launch`](crate::launch) writes the same JSON, with its error as the
//! message (no Python call stack: torchrun then shows the message), for a failed training
//! function and for a failed join of the group alike.
//!
//! torchrun names as root cause the error file with the earliest timestamp, in whole seconds,
//! and the lowest rank among equals; every failing rank writes one, so a rank that failed only
//! because its peer did (a closed connection) can be named instead of that peer when both fail
//! within the same second. Its message names the peer.

use std::fmt::Display;
use std::time::{SystemTime, UNIX_EPOCH};

/// The variable torchrun sets to each worker's error file.
pub(crate) const ERROR_FILE_ENV: &str = "TORCHELASTIC_ERROR_FILE";

/// Writes `error` to torchrun's error file, if this worker has one.
pub(super) fn write_error_file(error: &dyn Display) {
    // torchrun sets it empty when it keeps no logs (`--log-dir /dev/null`): no file then.
    let Some(path) = std::env::var_os(ERROR_FILE_ENV).filter(|p| !p.is_empty()) else {
        return;
    };
    let written = std::fs::write(&path, error_json(error, SystemTime::now()));
    if let Err(e) = written {
        tracing::warn!(
            path = %std::path::Path::new(&path).display(),
            %e,
            "cannot write torchrun's error file ({ERROR_FILE_ENV})"
        );
    }
}

/// PyTorch's layout (`ErrorHandler.record_exception`): the agent reads `message.message` and
/// the `extraInfo.timestamp` string (seconds since the epoch).
fn error_json(error: &dyn Display, now: SystemTime) -> String {
    let seconds = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    serde_json::json!({
        "message": {
            "message": error.to_string(),
            "extraInfo": { "timestamp": seconds.to_string() },
        }
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_error_is_torchruns_json_with_its_message_and_timestamp() {
        let when = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let json = error_json(&"rank 1: \"shard\" failed\nat step 3", when);
        let value: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
        assert_eq!(
            value["message"]["message"],
            "rank 1: \"shard\" failed\nat step 3"
        );
        assert_eq!(value["message"]["extraInfo"]["timestamp"], "1700000000");
    }
}
