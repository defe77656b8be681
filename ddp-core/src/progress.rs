//! Training progress on rank 0: a bar per epoch with the loss averaged across ranks, samples per
//! second for the whole job and an ETA; a plain log line every few seconds when stderr is not a
//! terminal (CI logs, files). Other ranks stay quiet.
//!
//! # Collective
//! [`EpochProgress::step`] all-reduces the loss (one small collective), so every rank calls it
//! once per step.

use ddp_comm::{CommError, ProcessGroup, ReduceOp};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// How often the plain (non-terminal) output prints a line.
const PLAIN_INTERVAL: Duration = Duration::from_secs(5);

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
    steps: usize,
    done: usize,
    bar: Option<ProgressBar>,
    plain: bool,
    start: Instant,
    last_line: Instant,
    loss_sum: f64,
    last_loss: f64,
    samples: u64,
}

impl EpochProgress {
    /// Starts epoch `epoch` of `epochs` with `steps` steps on each rank.
    pub fn new(pg: &ProcessGroup, epoch: usize, epochs: usize, steps: usize) -> Self {
        let main = pg.rank() == 0;
        let tty = std::io::stderr().is_terminal();
        let bar = (main && tty).then(|| {
            let bar =
                ProgressBar::with_draw_target(Some(steps as u64), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "epoch {prefix} [{bar:30}] {pos}/{len} {msg} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
            bar.set_prefix(format!("{}/{}", epoch + 1, epochs));
            bar
        });
        EpochProgress {
            pg: pg.clone(),
            epoch,
            epochs,
            steps,
            done: 0,
            bar,
            plain: main && !tty,
            start: Instant::now(),
            last_line: Instant::now(),
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
        if let Some(bar) = &self.bar {
            bar.set_message(format!("loss {loss:.4} {rate:.0} samples/s"));
            bar.inc(1);
        } else if self.plain && self.last_line.elapsed() >= PLAIN_INTERVAL {
            self.last_line = Instant::now();
            let left = (self.steps.saturating_sub(self.done)) as f64
                * self.start.elapsed().as_secs_f64()
                / self.done.max(1) as f64;
            self.line(&format!(
                "epoch {}/{} step {}/{} loss {loss:.4} {rate:.0} samples/s eta {left:.0}s",
                self.epoch + 1,
                self.epochs,
                self.done,
                self.steps
            ));
        }
        Ok(())
    }

    fn line(&self, text: &str) {
        let _ = writeln!(std::io::stderr().lock(), "{text}");
    }

    /// Ends the epoch and returns its summary (the same on every rank).
    pub fn finish(self) -> EpochSummary {
        let summary = EpochSummary {
            epoch: self.epoch,
            mean_loss: self.loss_sum / self.done.max(1) as f64,
            samples: self.samples,
            elapsed: self.start.elapsed(),
        };
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if self.pg.rank() == 0 {
            self.line(&format!(
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
