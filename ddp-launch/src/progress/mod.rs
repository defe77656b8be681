//! Training progress, one concept in one place: rank 0's bars and lines ([`EpochProgress`], in
//! `epoch.rs`), the pipe on which rank 0 reports to the launcher (`report.rs`), and the bar
//! drawing on stderr that the launcher and rank 0 share (`terminal.rs`). ddp-core re-exports
//! this module as `ddp_core::progress`.
//!
//! [`EpochProgress`] shows a bar per epoch on rank 0 with the loss averaged across ranks,
//! samples per second for the whole job and an ETA; a plain log line every few seconds when
//! stderr is not a terminal (CI logs, files). Other ranks stay quiet. [`EpochProgress::step`]
//! all-reduces the loss (one small collective), so every rank calls it once per step.
//!
//! # Under the launcher
//! A worker's stderr is a pipe to the launcher, so rank 0 cannot draw a bar on it. When the
//! launcher's own stderr is a terminal, it hands rank 0 a pipe for progress reports
//! ([`PROGRESS_FD_ENV`]) and draws the bar itself, printing the workers' lines above it; with
//! the launcher's stderr in a file or pipe, rank 0 prints lines as usual.
//!
//! `DDP_PROGRESS` ([`PROGRESS_ENV`]) overrides the choice for the launcher and rank 0 alike:
//! `auto` (the default: a bar on a terminal), `bar` (draw even when stderr is not a terminal,
//! e.g. for a console that renders ANSI sequences), `lines`.

mod epoch;
mod report;
mod terminal;

pub use epoch::{EpochProgress, EpochSummary, ProgressDisplay};
pub use report::{PROGRESS_FD_ENV, Report, claim_report_pipe, report_channel, send};
pub use terminal::{PROGRESS_ENV, ProgressSetting, bar_style, stderr_draws_bar, stderr_target};
