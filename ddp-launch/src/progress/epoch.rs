//! Rank 0's side: [`EpochProgress`] (a bar per epoch, the loss averaged across ranks) and
//! [`ProgressDisplay`] (a bar for a loop rank 0 drives alone), drawn on rank 0's stderr, printed
//! as lines, or reported to the launcher through `report.rs`'s pipe.

use super::{Report, bar_style, report_channel, send, stderr_draws_bar, stderr_target};
use ddp_comm::{CommError, ProcessGroup, ReduceOp};
use indicatif::ProgressBar;
use std::fs::File;
use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the plain (non-terminal) output prints a line.
const PLAIN_INTERVAL: Duration = Duration::from_secs(5);
/// How often rank 0 reports its position to the launcher (the bar redraws at most this often
/// anyway; the last step of an epoch is always reported).
const REPORT_INTERVAL: Duration = Duration::from_millis(50);

/// How this rank shows an epoch.
#[derive(Debug)]
enum Display {
    /// Its own bar on its stderr (a terminal, or `DDP_PROGRESS=bar`).
    Bar(ProgressBar),
    /// Reports to the launcher, which draws the bar.
    Report(&'static Mutex<File>),
    /// A line every [`PLAIN_INTERVAL`].
    Lines,
    /// Nothing (every rank but 0).
    Quiet,
}

/// Which [`Display`] a rank uses, before any bar or pipe exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DisplayKind {
    Bar,
    Report,
    Lines,
    Quiet,
}

/// Rank 0 reports to the launcher when it was given a pipe, else draws its own bar when its
/// stderr should show one, else prints lines; other ranks are quiet.
pub(crate) fn display_kind(main: bool, has_channel: bool, stderr_bar: bool) -> DisplayKind {
    match (main, has_channel, stderr_bar) {
        (false, _, _) => DisplayKind::Quiet,
        (true, true, _) => DisplayKind::Report,
        (true, false, true) => DisplayKind::Bar,
        (true, false, false) => DisplayKind::Lines,
    }
}

/// What an epoch looked like, the same on every rank.
#[derive(Debug, Clone, Copy)]
pub struct EpochSummary {
    /// The epoch (0-based).
    pub epoch: usize,
    /// Loss averaged over every step of the epoch and every rank.
    pub mean_loss: f64,
    /// Samples processed by all ranks together.
    pub samples: u64,
    /// Wall time of the epoch.
    pub elapsed: Duration,
}

impl EpochSummary {
    /// Samples per second for the whole job.
    pub fn samples_per_sec(&self) -> f64 {
        self.samples as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Progress of one epoch; create one per epoch on every rank.
#[derive(Debug)]
pub struct EpochProgress {
    pg: ProcessGroup,
    epoch: usize,
    epochs: usize,
    done: usize,
    display: ProgressDisplay,
    start: Instant,
    loss_sum: f64,
    last_loss: f64,
    samples: u64,
}

impl EpochProgress {
    /// Starts epoch `epoch` of `epochs` with `steps` steps on each rank.
    pub fn new(pg: &ProcessGroup, epoch: usize, epochs: usize, steps: usize) -> Self {
        let main = pg.rank() == 0;
        // Only rank 0 looks at its environment: the others never show anything.
        let channel = if main { report_channel() } else { None };
        let kind = display_kind(main, channel.is_some(), main && stderr_draws_bar());
        Self::with_display(pg, epoch, epochs, steps, kind, channel)
    }

    fn with_display(
        pg: &ProcessGroup,
        epoch: usize,
        epochs: usize,
        steps: usize,
        kind: DisplayKind,
        channel: Option<&'static Mutex<File>>,
    ) -> Self {
        let label = format!("epoch {}/{}", epoch + 1, epochs);
        EpochProgress {
            pg: pg.clone(),
            epoch,
            epochs,
            done: 0,
            display: ProgressDisplay::with_kind(label, steps as u64, kind, channel),
            start: Instant::now(),
            loss_sum: 0.0,
            last_loss: 0.0,
            samples: 0,
        }
    }

    /// Records one step: this rank's loss and batch size. Averages the loss over ranks.
    ///
    /// # Errors
    /// A failed all-reduce.
    pub fn step(&mut self, local_loss: f32, local_samples: usize) -> Result<(), CommError> {
        let mut v = [local_loss as f64, local_samples as f64];
        self.pg.all_reduce(&mut v, ReduceOp::Sum)?;
        let loss = v[0] / self.pg.world_size() as f64;
        self.loss_sum += loss;
        self.last_loss = loss;
        self.samples += v[1] as u64;
        self.done += 1;
        let rate = self.samples as f64 / self.start.elapsed().as_secs_f64().max(1e-9);
        self.display.position(
            self.done as u64,
            &format!("loss {loss:.4} {rate:.0} samples/s"),
        );
        Ok(())
    }

    /// Ends the epoch and returns its summary (the same on every rank).
    pub fn finish(self) -> EpochSummary {
        let summary = EpochSummary {
            epoch: self.epoch,
            mean_loss: self.loss_sum / self.done.max(1) as f64,
            samples: self.samples,
            elapsed: self.start.elapsed(),
        };
        self.display.finish();
        if self.pg.rank() == 0 {
            line(&format!(
                "epoch {}/{}: loss {:.4}, {} samples in {:.1}s ({:.0} samples/s)",
                self.epoch + 1,
                self.epochs,
                summary.mean_loss,
                summary.samples,
                summary.elapsed.as_secs_f64(),
                summary.samples_per_sec()
            ));
        }
        summary
    }
}

/// A progress bar for a loop that rank 0 drives alone, shown as every ddp-burn display is: a
/// report to the launcher's pipe when it handed this process one (the launcher draws the bar
/// above the workers' output), else a bar on stderr when it is a terminal (or
/// `DDP_PROGRESS=bar`), else a line every few seconds. Nothing here is collective: it is for
/// trainers whose numbers are already the job's on rank 0, such as ddp-train's renderer for
/// burn-train. [`EpochProgress`] uses it for its own bars.
#[derive(Debug)]
pub struct ProgressDisplay {
    display: Display,
    label: String,
    len: u64,
    start: Instant,
    last_line: Instant,
    last_report: Option<Instant>,
}

impl ProgressDisplay {
    /// Starts a bar of `len` steps named `label` (`train epoch 2/10`). Create it on rank 0
    /// only: the other ranks of a job show nothing.
    pub fn begin(label: impl Into<String>, len: u64) -> Self {
        let channel = report_channel();
        let kind = display_kind(true, channel.is_some(), stderr_draws_bar());
        Self::with_kind(label.into(), len, kind, channel)
    }

    fn with_kind(
        label: String,
        len: u64,
        kind: DisplayKind,
        channel: Option<&'static Mutex<File>>,
    ) -> Self {
        let display = match (kind, channel) {
            (DisplayKind::Bar, _) => {
                let bar = ProgressBar::with_draw_target(Some(len), stderr_target());
                bar.set_style(bar_style("{prefix}"));
                bar.set_prefix(label.clone());
                Display::Bar(bar)
            }
            (DisplayKind::Report, Some(channel)) => {
                send(
                    channel,
                    &Report::Begin {
                        len,
                        label: label.clone(),
                    },
                );
                Display::Report(channel)
            }
            (DisplayKind::Report | DisplayKind::Lines, _) => Display::Lines,
            (DisplayKind::Quiet, _) => Display::Quiet,
        };
        ProgressDisplay {
            display,
            label,
            len,
            start: Instant::now(),
            last_line: Instant::now(),
            last_report: None,
        }
    }

    /// `pos` of the bar's steps are done; `message` (metrics, rate) is shown beside it. The
    /// launcher gets at most one report per 50 ms (the first and the last always), lines come
    /// every few seconds.
    pub fn position(&mut self, pos: u64, message: &str) {
        match &self.display {
            Display::Bar(bar) => {
                bar.set_message(message.to_string());
                bar.set_position(pos);
            }
            Display::Report(channel) => {
                let due = self
                    .last_report
                    .is_none_or(|t| t.elapsed() >= REPORT_INTERVAL);
                if due || pos >= self.len {
                    self.last_report = Some(Instant::now());
                    send(
                        channel,
                        &Report::Position {
                            pos,
                            message: message.to_string(),
                        },
                    );
                }
            }
            Display::Lines if self.last_line.elapsed() >= PLAIN_INTERVAL => {
                self.last_line = Instant::now();
                let left = self.len.saturating_sub(pos) as f64 * self.start.elapsed().as_secs_f64()
                    / pos.max(1) as f64;
                line(&format!(
                    "{} step {pos}/{} {message} eta {left:.0}s",
                    self.label, self.len
                ));
            }
            Display::Lines | Display::Quiet => {}
        }
    }

    /// Ends the bar: clears it (or tells the launcher to).
    pub fn finish(self) {
        match &self.display {
            Display::Bar(bar) => bar.finish_and_clear(),
            Display::Report(channel) => send(channel, &Report::End),
            Display::Lines | Display::Quiet => {}
        }
    }
}

/// A line on stderr.
fn line(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddp_comm::{ProcessGroupConfig, Store, StoreConfig, StoreServer};
    use std::io::Read;

    #[test]
    fn rank_0_reports_when_given_a_pipe_else_draws_or_prints_lines() {
        assert_eq!(display_kind(true, true, false), DisplayKind::Report);
        assert_eq!(display_kind(true, true, true), DisplayKind::Report);
        assert_eq!(display_kind(true, false, true), DisplayKind::Bar);
        assert_eq!(display_kind(true, false, false), DisplayKind::Lines);
        assert_eq!(display_kind(false, true, true), DisplayKind::Quiet);
    }

    /// A process group of this process alone.
    fn world_of_one() -> (StoreServer, ProcessGroup) {
        let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new()).expect("bind");
        let store =
            Store::connect(&server.local_addr().to_string(), StoreConfig::new()).expect("store");
        let pg = ProcessGroup::with_store(store, ProcessGroupConfig::new(0, 1)).expect("group");
        (server, pg)
    }

    /// A pipe standing in for the launcher's: its read end, and the write end as rank 0 holds it.
    fn launcher_pipe() -> (std::io::PipeReader, &'static Mutex<File>) {
        let (reader, writer) = std::io::pipe().expect("pipe");
        let channel = Box::leak(Box::new(Mutex::new(File::from(
            std::os::fd::OwnedFd::from(writer),
        ))));
        (reader, channel)
    }

    /// Everything written to the pipe, once its only write end is closed.
    fn read_reports(mut reader: std::io::PipeReader, channel: &Mutex<File>) -> String {
        drop(std::mem::replace(
            &mut *channel.lock().unwrap(),
            tempfile::tempfile().expect("tempfile"),
        ));
        let mut text = String::new();
        reader.read_to_string(&mut text).expect("read");
        text
    }

    #[test]
    fn reporting_rank_0_sends_begin_positions_and_end() {
        let (_server, pg) = world_of_one();
        let (reader, channel) = launcher_pipe();
        let mut p = EpochProgress::with_display(&pg, 1, 3, 4, DisplayKind::Report, Some(channel));
        for _ in 0..4 {
            p.step(0.5, 8).expect("step");
        }
        let summary = p.finish();
        assert_eq!(summary.samples, 32);
        let text = read_reports(reader, channel);
        let reports: Vec<Report> = text.lines().filter_map(Report::parse).collect();
        assert_eq!(
            reports.first(),
            Some(&Report::Begin {
                len: 4,
                label: "epoch 2/3".into()
            }),
            "{text}"
        );
        assert_eq!(reports.last(), Some(&Report::End), "{text}");
        // The first step and the last are always reported (others are rate-limited).
        let positions: Vec<u64> = reports
            .iter()
            .filter_map(|r| match r {
                Report::Position { pos, message } => {
                    assert!(message.starts_with("loss 0.5000 "), "{message}");
                    Some(*pos)
                }
                _ => None,
            })
            .collect();
        assert_eq!(positions.first(), Some(&1), "{text}");
        assert_eq!(positions.last(), Some(&4), "{text}");
        assert_eq!(text.lines().count(), reports.len(), "every line parses");
    }

    #[test]
    fn a_display_driven_by_rank_0_alone_reports_its_positions_to_the_launcher() {
        let (reader, channel) = launcher_pipe();
        let label = "valid epoch 1/2".to_string();
        let mut display = ProgressDisplay::with_kind(label, 10, DisplayKind::Report, Some(channel));
        display.position(3, "Loss 0.25");
        display.position(10, "Loss 0.20");
        display.finish();
        let text = read_reports(reader, channel);
        let reports: Vec<Report> = text.lines().filter_map(Report::parse).collect();
        assert_eq!(
            reports,
            vec![
                Report::Begin {
                    len: 10,
                    label: "valid epoch 1/2".into()
                },
                Report::Position {
                    pos: 3,
                    message: "Loss 0.25".into()
                },
                Report::Position {
                    pos: 10,
                    message: "Loss 0.20".into()
                },
                Report::End,
            ],
            "{text}"
        );
    }
}
