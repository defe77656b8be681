//! The launcher's half of rank 0's progress display: the pipe protocol rank 0 reports on
//! (`report.rs`: [`Report`], [`send`]) and the bar drawing on stderr that the launcher and rank
//! 0 share (`terminal.rs`: [`bar_style`], [`stderr_target`]). The reporting side (the bars of an epoch) is ddp-core's `progress`.
//!
//! A worker's stderr is a pipe to the launcher, so rank 0 cannot draw a bar on it. When the
//! launcher's own stderr is a terminal, it hands rank 0 a pipe for progress reports
//! ([`PROGRESS_FD_ENV`]) and draws the bar itself, printing the workers' lines above it; with
//! the launcher's stderr in a file or pipe, rank 0 prints lines as usual.
//!
//! `DDP_PROGRESS` ([`PROGRESS_ENV`]) overrides the choice for the launcher and rank 0 alike:
//! `auto` (the default: a bar on a terminal), `bar` (draw even when stderr is not a terminal,
//! e.g. for a console that renders ANSI sequences), `lines`.

mod report;
mod terminal;

pub use report::{PROGRESS_FD_ENV, Report, claim_report_pipe, report_channel, send};
pub use terminal::{PROGRESS_ENV, ProgressSetting, bar_style, stderr_draws_bar, stderr_target};
