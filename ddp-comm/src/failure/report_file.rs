//! The failure file: how a worker tells the launcher that started it which rank its process
//! group failed on, without the store (which lives in rank 0 and may be what hangs). The
//! launcher names a file per rank in [`FAILURE_FILE_ENV`]; the first failure of any group in
//! the process is written there ([`FailureReport::write_to_env_file`]), and the launcher reads
//! every rank's back ([`FailureReport::parse`]) to follow the chain of blame to its root.

use std::io::Write;
use std::path::Path;

/// Environment variable naming a file where this process writes its group's first failure, for
/// the launcher that started it (`ddp-run` sets it per rank). Format, UTF-8 text: a first line
/// `blame <rank>` (the rank this one timed out on or lost, the next link of the chain) or
/// `blame none`, then the error message.
pub const FAILURE_FILE_ENV: &str = "DDP_FAILURE_FILE";

/// What one rank wrote when its process group (or its training function) failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureReport {
    /// The rank it blames (timed out on, lost); `None` when the failure is its own.
    pub blame: Option<usize>,
    /// Its error message.
    pub message: String,
}

impl FailureReport {
    /// Parses `blame <rank>|none\n<message>`; `None` for anything else (a torn or foreign file
    /// is ignored rather than trusted).
    pub fn parse(text: &str) -> Option<FailureReport> {
        let (first, message) = text.split_once('\n')?;
        let blame = match first.strip_prefix("blame ")? {
            "none" => None,
            rank => Some(rank.parse().ok()?),
        };
        Some(FailureReport {
            blame,
            message: message.trim_end().to_string(),
        })
    }

    /// The file's text, as [`parse`](Self::parse) reads it.
    pub fn to_text(&self) -> String {
        match self.blame {
            Some(rank) => format!("blame {rank}\n{}\n", self.message),
            None => format!("blame none\n{}\n", self.message),
        }
    }

    /// Writes this report to the file named by [`FAILURE_FILE_ENV`], unless that is unset or
    /// the file exists already: the first failure in a process is the one that counts. A file
    /// that cannot be written is logged, not an error: the failure itself is already being
    /// reported on stderr and through the store.
    pub fn write_to_env_file(&self) {
        let Some(path) = std::env::var_os(FAILURE_FILE_ENV) else {
            return;
        };
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .and_then(|mut f| f.write_all(self.to_text().as_bytes()));
        match written {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => tracing::warn!(
                path = %Path::new(&path).display(),
                %e,
                "cannot write this rank's failure report for the launcher"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_read_back_as_written_and_garbage_is_ignored() {
        for report in [
            FailureReport {
                blame: Some(3),
                message: "all_reduce #4: timed out".into(),
            },
            FailureReport {
                blame: None,
                message: "panicked".into(),
            },
        ] {
            assert_eq!(FailureReport::parse(&report.to_text()), Some(report));
        }
        assert_eq!(
            FailureReport::parse("blame 3\nall_reduce #4: timed out\n").map(|r| r.blame),
            Some(Some(3))
        );
        for bad in ["", "blame 3", "blame x\nm", "blam 3\nm", "blame -1\nm"] {
            assert_eq!(FailureReport::parse(bad), None, "{bad:?}");
        }
    }
}
