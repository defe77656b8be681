//! The launcher's terminal: where the workers' lines are printed and, when the launcher's
//! stderr is a terminal, rank 0's progress bar is drawn live.
//!
//! A worker's stderr is a pipe to the launcher, so rank 0 cannot draw on the terminal itself:
//! its bar would arrive as garbled prefixed lines, and other ranks' lines would cut through it.
//! Instead the launcher gives rank 0 a second pipe ([`PROGRESS_FD_ENV`]) for progress reports,
//! draws the bar from them, and prints every worker line above the bar. With stderr in a file or
//! pipe, no pipe is given and rank 0 prints its usual lines.

use crate::progress::{PROGRESS_FD_ENV, Report};
use crate::progress::{ProgressSetting, bar_style, stderr_target};
use indicatif::{ProgressBar, ProgressDrawTarget};
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

/// Which of the launcher's streams a line goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
    /// Nowhere (keeps unit test output clean).
    #[cfg(test)]
    Quiet,
}

/// The launcher's output: plain writes, or writes around a live bar.
#[derive(Debug)]
pub(crate) struct Console {
    /// Whether rank 0 gets a report pipe (the bar is drawn).
    live: bool,
    /// Where bars are drawn ([`stderr_target`] normally; hidden in tests).
    target: fn() -> ProgressDrawTarget,
    /// The bar of the epoch in progress, if any.
    bar: Mutex<Option<ProgressBar>>,
}

/// Whether the launcher draws rank 0's bar: its stderr is a terminal (and not `TERM=dumb`), or
/// `DDP_PROGRESS=bar`.
pub(crate) fn launcher_draws_bar(
    setting: ProgressSetting,
    stderr_is_terminal: bool,
    term: Option<&str>,
) -> bool {
    setting.draws_bar(stderr_is_terminal, term)
}

impl Console {
    /// The console of this process, live per [`launcher_draws_bar`].
    pub(crate) fn from_env() -> Arc<Console> {
        let live = launcher_draws_bar(
            ProgressSetting::from_env(),
            std::io::stderr().is_terminal(),
            std::env::var("TERM").ok().as_deref(),
        );
        Arc::new(Console::new(live, stderr_target))
    }

    pub(crate) fn new(live: bool, target: fn() -> ProgressDrawTarget) -> Console {
        Console {
            live,
            target,
            bar: Mutex::new(None),
        }
    }

    /// Whether global rank 0 (when on this node) gets a report pipe.
    pub(crate) fn is_live(&self) -> bool {
        self.live
    }

    /// The extra variable for the worker of global rank `rank` whose report pipe is `fd`:
    /// only rank 0 reports, and only to a live console.
    pub(crate) fn report_env(&self, rank: usize, fd: i32) -> Option<(String, String)> {
        (self.live && rank == 0).then(|| (PROGRESS_FD_ENV.to_string(), fd.to_string()))
    }

    /// Writes `bytes` (whole lines) to `stream`, clearing the bar around it if one is shown.
    pub(crate) fn write(&self, stream: Stream, bytes: &[u8]) {
        let bar = self
            .bar
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match bar {
            Some(bar) => bar.suspend(|| write_to(stream, bytes)),
            None => write_to(stream, bytes),
        }
    }

    /// Applies one report of rank 0.
    pub(crate) fn apply(&self, report: Report) {
        let mut slot = self.bar.lock().unwrap_or_else(PoisonError::into_inner);
        match report {
            Report::Begin { len, label } => {
                if let Some(old) = slot.take() {
                    old.finish_and_clear();
                }
                let bar = ProgressBar::with_draw_target(Some(len), (self.target)());
                bar.set_style(bar_style("[rank 0]: {prefix}"));
                bar.set_prefix(label);
                bar.tick();
                *slot = Some(bar);
            }
            Report::Position { pos, message } => {
                if let Some(bar) = slot.as_ref() {
                    bar.set_message(message);
                    bar.set_position(pos);
                }
            }
            Report::End => {
                if let Some(bar) = slot.take() {
                    bar.finish_and_clear();
                }
            }
        }
    }

    /// Removes the bar (rank 0 is gone, or the attempt is being stopped).
    pub(crate) fn clear(&self) {
        self.apply(Report::End);
    }

    /// The bar shown now: (prefix, position, length, message), for tests.
    #[cfg(test)]
    pub(crate) fn shown(&self) -> Option<(String, u64, Option<u64>, String)> {
        let slot = self.bar.lock().unwrap_or_else(PoisonError::into_inner);
        slot.as_ref()
            .map(|b| (b.prefix(), b.position(), b.length(), b.message()))
    }
}

fn write_to(stream: Stream, bytes: &[u8]) {
    // Write errors (a closed stdout, a full disk) must not stop the draining: ignore them.
    match stream {
        Stream::Stdout => {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(bytes).and_then(|()| o.flush());
        }
        Stream::Stderr => {
            let _ = std::io::stderr().lock().write_all(bytes);
        }
        #[cfg(test)]
        Stream::Quiet => {}
    }
}

/// Starts a thread applying the reports read from `pipe` to `console` until end of file (rank 0
/// exited), then clearing the bar. Unknown lines are skipped.
pub(crate) fn follow_reports(
    name: String,
    pipe: impl Read + Send + 'static,
    console: Arc<Console>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name).spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if let Some(report) = Report::parse(line.trim_end_matches(['\n', '\r'])) {
                        console.apply(report);
                    }
                }
            }
        }
        console.clear();
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launcher_draws_only_on_a_terminal_unless_told_otherwise() {
        let auto = ProgressSetting::Auto;
        assert!(launcher_draws_bar(auto, true, Some("xterm")));
        assert!(
            !launcher_draws_bar(auto, false, Some("xterm")),
            "pipe: lines"
        );
        assert!(!launcher_draws_bar(auto, true, Some("dumb")));
        assert!(launcher_draws_bar(ProgressSetting::Bar, false, None));
        assert!(!launcher_draws_bar(ProgressSetting::Lines, true, None));
    }

    #[test]
    fn only_rank_0_of_a_live_console_gets_the_report_pipe() {
        let live = Console::new(true, ProgressDrawTarget::hidden);
        assert_eq!(
            live.report_env(0, 7),
            Some((PROGRESS_FD_ENV.to_string(), "7".to_string()))
        );
        assert_eq!(live.report_env(1, 7), None);
        let plain = Console::new(false, ProgressDrawTarget::hidden);
        assert_eq!(plain.report_env(0, 7), None);
    }

    #[test]
    fn reports_drive_the_bar_and_end_of_file_clears_it() {
        let console = Arc::new(Console::new(true, ProgressDrawTarget::hidden));
        console.apply(Report::Begin {
            len: 23,
            label: "epoch 1/2".into(),
        });
        console.apply(Report::Position {
            pos: 5,
            message: "loss 1.2".into(),
        });
        assert_eq!(
            console.shown(),
            Some(("epoch 1/2".into(), 5, Some(23), "loss 1.2".into()))
        );
        console.write(Stream::Quiet, b"[rank 1]: a line above the bar\n");
        console.apply(Report::End);
        assert_eq!(console.shown(), None);

        let (reader, mut writer) = std::io::pipe().expect("pipe");
        let handle =
            follow_reports("test-reports".into(), reader, console.clone()).expect("thread");
        writer
            .write_all(b"begin 10 epoch 2/2\nnonsense\npos 3 loss 0.5\n")
            .expect("write");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while console.shown().is_none_or(|s| s.1 != 3) {
            assert!(
                std::time::Instant::now() < deadline,
                "{:?}",
                console.shown()
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(
            console.shown(),
            Some(("epoch 2/2".into(), 3, Some(10), "loss 0.5".into()))
        );
        drop(writer); // rank 0 exits mid-epoch
        handle.join().expect("join");
        assert_eq!(console.shown(), None, "the bar goes with rank 0");
    }
}
