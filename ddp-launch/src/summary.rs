//! [`FailureSummary`]: which rank failed first, how, and its last lines of output.

use crate::round_summary::{ElasticRound, rounds_lines};
use crate::signal_names::signal_name;
use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;

/// How a worker process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerExit {
    /// It exited with this status code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

impl WorkerExit {
    /// Converts a wait status.
    pub fn from_status(status: ExitStatus) -> Self {
        match (status.code(), status.signal()) {
            (Some(code), _) => WorkerExit::Code(code),
            (None, Some(sig)) => WorkerExit::Signal(sig),
            // Stopped/continued statuses are not reported by `wait`; treat as unknown failure.
            (None, None) => WorkerExit::Code(-1),
        }
    }

    /// Whether it exited with code 0.
    pub fn success(&self) -> bool {
        *self == WorkerExit::Code(0)
    }
}

impl fmt::Display for WorkerExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerExit::Code(code) => write!(f, "exited with code {code}"),
            WorkerExit::Signal(sig) => {
                write!(f, "was killed by {} (signal {sig})", signal_name(*sig))
            }
        }
    }
}

/// One rank's failure as its node's launcher saw it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RankFailure {
    /// Global rank.
    pub rank: usize,
    /// Rank on its node.
    pub local_rank: usize,
    /// Its node.
    pub node_rank: usize,
    /// Its process id.
    pub pid: u32,
    /// How it ended.
    pub exit: WorkerExit,
    /// Its last lines of output (stdout and stderr interleaved as they arrived).
    pub tail: Vec<String>,
    /// Its log file, with `--log-dir`.
    pub log_file: Option<PathBuf>,
}

impl fmt::Display for RankFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} (local rank {} on node {}, pid {}) {}",
            self.rank, self.local_rank, self.node_rank, self.pid, self.exit
        )
    }
}

/// What made an attempt fail.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum FailureCause {
    /// A worker of this node failed first.
    Rank(RankFailure),
    /// Another node reported a failure first (its launcher printed the details).
    OtherNode {
        /// What that node reported.
        description: String,
    },
    /// This node lost contact with the rendezvous on node 0.
    LostRendezvous {
        /// The error.
        reason: String,
    },
}

impl fmt::Display for FailureCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureCause::Rank(r) => r.fmt(f),
            FailureCause::OtherNode { description } => {
                write!(f, "another node failed: {description}")
            }
            FailureCause::LostRendezvous { reason } => {
                write!(f, "lost the rendezvous with node 0: {reason}")
            }
        }
    }
}

/// A failed attempt: the first failure, the attempt number and how the other local ranks ended.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FailureSummary {
    /// The first failure.
    pub cause: FailureCause,
    /// Which attempt failed: 0 for the first run, 1 after one restart, ...
    pub restart_count: u32,
    /// `--max-restarts`.
    pub max_restarts: u32,
    /// This node's other ranks and how they ended (most were stopped by the launcher).
    pub others: Vec<(usize, WorkerExit)>,
    /// Where the chain of blame from the first failure ends, when that rank failed because of
    /// another (it timed out waiting for it, or lost its connection).
    pub root_cause: Option<RootCause>,
    /// An elastic job's rounds, from the first (empty for a static job).
    pub rounds: Vec<ElasticRound>,
}

impl FailureSummary {
    /// This attempt's number, from 1: counted in `u64`, as `--max-restarts` may be `u32::MAX`.
    fn attempt(&self) -> u64 {
        u64::from(self.restart_count) + 1
    }

    /// How many attempts `--max-restarts` allows, in `u64` (see [`FailureSummary::attempt`]).
    fn attempts(&self) -> u64 {
        u64::from(self.max_restarts) + 1
    }

    /// The multi-line report the launcher prints to stderr.
    pub fn report(&self) -> String {
        let rule = "=".repeat(72);
        let mut out = format!("{rule}\nddp launcher: worker failure\n");
        if let Some(root) = &self.root_cause {
            out.push_str(&format!("  root cause:    {}\n", self.root_line(root)));
            for v in &root.victims {
                out.push_str(&format!(
                    "  victim:        rank {} (failed because of rank {}): {}\n",
                    v.rank, v.blamed, v.message
                ));
            }
        }
        out.push_str(&format!("  first failure: {}\n", self.cause));
        out.push_str(&format!(
            "  attempt:       {} of {} (--max-restarts {})\n",
            self.attempt(),
            self.attempts(),
            self.max_restarts
        ));
        if !self.rounds.is_empty() {
            out.push_str("  rounds:\n");
            out.push_str(&rounds_lines(&self.rounds));
        }
        if !self.others.is_empty() {
            let others: Vec<String> = self
                .others
                .iter()
                .map(|(rank, exit)| format!("rank {rank} {exit}"))
                .collect();
            out.push_str(&format!("  other ranks:   {}\n", others.join(", ")));
        }
        if let FailureCause::Rank(r) = &self.cause {
            if let Some(log) = &r.log_file {
                out.push_str(&format!("  log file:      {}\n", log.display()));
            }
            if r.tail.is_empty() {
                out.push_str(&format!("  rank {} printed nothing\n", r.rank));
            } else {
                out.push_str(&format!(
                    "  last {} lines of rank {}:\n",
                    r.tail.len(),
                    r.rank
                ));
                for line in &r.tail {
                    out.push_str(&format!("    [rank {}]: {line}\n", r.rank));
                }
            }
        }
        out.push_str(&rule);
        out.push('\n');
        out
    }

    /// `rank <r> (pid ..): <what it reported, or that it reported nothing>; <how it ended>`.
    fn root_line(&self, root: &RootCause) -> String {
        let local = self
            .others
            .iter()
            .find(|(rank, _)| *rank == root.rank)
            .map(|(_, exit)| *exit);
        let mut line = format!("rank {}", root.rank);
        match &root.own_report {
            Some(report) => line.push_str(&format!(" failed: {report}")),
            None => line.push_str(
                " reported no failure of its own: it stalled (stopped, hung or too slow) or its \
                 report is on another node",
            ),
        }
        if let Some(exit) = local {
            line.push_str(&format!("; it {exit} when the launcher stopped the job"));
        }
        line
    }
}

impl fmt::Display for FailureSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(root) = &self.root_cause {
            write!(f, "root cause rank {}; first failure: ", root.rank)?;
        }
        write!(
            f,
            "{} (attempt {} of {})",
            self.cause,
            self.attempt(),
            self.attempts()
        )
    }
}

/// A rank on the chain of blame that failed because of the next one.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Victim {
    /// Its global rank.
    pub rank: usize,
    /// The rank it blamed.
    pub blamed: usize,
    /// Its error message.
    pub message: String,
}

/// Where the chain of blame from the first failure ends.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RootCause {
    /// The global rank where the trouble started.
    pub rank: usize,
    /// What it reported itself: `None` when it reported no failure (it stalled or hung, or its
    /// report is on another node).
    pub own_report: Option<String>,
    /// The ranks that failed because of it, from the first to fail to the one that blamed it.
    pub victims: Vec<Victim>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(exit: WorkerExit, tail: &[&str]) -> FailureSummary {
        FailureSummary {
            cause: FailureCause::Rank(RankFailure {
                rank: 1,
                local_rank: 1,
                node_rank: 0,
                pid: 4321,
                exit,
                tail: tail.iter().map(|s| s.to_string()).collect(),
                log_file: Some("/logs/attempt_0/rank_1.log".into()),
            }),
            restart_count: 0,
            max_restarts: 0,
            others: vec![
                (0, WorkerExit::Signal(libc::SIGTERM)),
                (2, WorkerExit::Code(1)),
            ],
            root_cause: None,
            rounds: Vec::new(),
        }
    }

    #[test]
    fn exit_statuses_read_as_sentences() {
        assert_eq!(WorkerExit::Code(3).to_string(), "exited with code 3");
        assert_eq!(
            WorkerExit::Signal(9).to_string(),
            "was killed by SIGKILL (signal 9)"
        );
        assert!(WorkerExit::Code(0).success());
        assert!(!WorkerExit::Signal(15).success());
        assert_eq!(
            WorkerExit::from_status(ExitStatus::from_raw(9)),
            WorkerExit::Signal(9)
        );
        assert_eq!(
            WorkerExit::from_status(ExitStatus::from_raw(2 << 8)),
            WorkerExit::Code(2)
        );
    }

    #[test]
    fn report_names_first_rank_signal_others_log_and_tail() {
        let s = failure(WorkerExit::Signal(9), &["step 3", "step 4"]);
        let report = s.report();
        assert!(
            report.contains("first failure: rank 1 (local rank 1 on node 0, pid 4321) was killed by SIGKILL (signal 9)"),
            "{report}"
        );
        assert!(
            report.contains("attempt:       1 of 1 (--max-restarts 0)"),
            "{report}"
        );
        assert!(
            report.contains(
                "other ranks:   rank 0 was killed by SIGTERM (signal 15), rank 2 exited with code 1"
            ),
            "{report}"
        );
        assert!(
            report.contains("log file:      /logs/attempt_0/rank_1.log"),
            "{report}"
        );
        assert!(
            report
                .contains("last 2 lines of rank 1:\n    [rank 1]: step 3\n    [rank 1]: step 4\n"),
            "{report}"
        );
        assert_eq!(
            s.to_string(),
            "rank 1 (local rank 1 on node 0, pid 4321) was killed by SIGKILL (signal 9) (attempt 1 of 1)"
        );
    }

    #[test]
    fn report_names_the_root_cause_and_its_victims_before_the_first_failure() {
        let mut s = failure(WorkerExit::Code(1), &["error"]);
        s.root_cause = Some(RootCause {
            rank: 2,
            own_report: None,
            victims: vec![Victim {
                rank: 1,
                blamed: 2,
                message: "all_reduce #7: timed out after 3s waiting for rank 2".into(),
            }],
        });
        s.others = vec![
            (0, WorkerExit::Code(1)),
            (2, WorkerExit::Signal(libc::SIGTERM)),
        ];
        let report = s.report();
        assert!(
            report.contains(
                "  root cause:    rank 2 reported no failure of its own: it stalled (stopped, hung or too slow) or its report is on another node; it was killed by SIGTERM (signal 15) when the launcher stopped the job\n  victim:        rank 1 (failed because of rank 2): all_reduce #7: timed out after 3s waiting for rank 2\n  first failure: rank 1 "
            ),
            "{report}"
        );
        assert!(
            s.to_string()
                .starts_with("root cause rank 2; first failure: rank 1 "),
            "{s}"
        );
    }

    #[test]
    fn report_says_when_the_rank_printed_nothing() {
        let report = failure(WorkerExit::Code(1), &[]).report();
        assert!(report.contains("rank 1 printed nothing"), "{report}");
    }

    /// `--max-restarts 4294967295` (u32::MAX) counts attempts without overflowing.
    #[test]
    fn the_largest_max_restarts_is_reported_without_overflow() {
        let mut s = failure(WorkerExit::Code(1), &[]);
        s.max_restarts = u32::MAX;
        s.restart_count = u32::MAX;
        let report = s.report();
        assert!(
            report.contains("attempt:       4294967296 of 4294967296 (--max-restarts 4294967295)"),
            "{report}"
        );
        assert!(
            s.to_string()
                .ends_with("(attempt 4294967296 of 4294967296)"),
            "{s}"
        );
    }
}
