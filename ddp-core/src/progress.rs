//! Training progress on rank 0: a bar per epoch with the loss averaged across ranks, samples per
//! second for the whole job and an ETA; a plain log line every few seconds when stderr is not a
//! terminal (CI logs, files). Other ranks stay quiet.
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
//!
//! # Collective
//! [`EpochProgress::step`] all-reduces the loss (one small collective), so every rank calls it
//! once per step.

use ddp_comm::{CommError, ProcessGroup, ReduceOp};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::fs::File;
use std::io::{IsTerminal, Write};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// How often the plain (non-terminal) output prints a line.
const PLAIN_INTERVAL: Duration = Duration::from_secs(5);
/// How often rank 0 reports its position to the launcher (the bar redraws at most this often
/// anyway; the last step of an epoch is always reported).
const REPORT_INTERVAL: Duration = Duration::from_millis(50);
/// Bar redraws per second.
const DRAW_HZ: u8 = 20;

/// Environment variable choosing the progress display: `auto` (default), `bar` or `lines`.
pub const PROGRESS_ENV: &str = "DDP_PROGRESS";
/// Environment variable the launcher sets for rank 0 only: the number of an inherited pipe to
/// send progress reports on, which the launcher draws as a bar on its terminal.
///
/// Rank 0 removes it from its environment when it first reads it (the first epoch's progress,
/// or [`claim_report_pipe`]), so programs it starts afterwards do not adopt whatever descriptor
/// has that number; the descriptor itself becomes close-on-exec. It uses the descriptor only if
/// it is really a pipe open for writing; anything else is ignored with a warning.
pub const PROGRESS_FD_ENV: &str = "DDP_PROGRESS_FD";

/// The `DDP_PROGRESS` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProgressSetting {
    /// A bar when stderr is a terminal (and `TERM` is not `dumb`), lines otherwise.
    #[default]
    Auto,
    /// Always a bar (ANSI sequences even into a file or pipe).
    Bar,
    /// Always lines.
    Lines,
}

impl ProgressSetting {
    /// Parses a `DDP_PROGRESS` value (case-insensitive; empty means `auto`).
    pub fn parse(value: &str) -> Option<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Some(ProgressSetting::Auto),
            "bar" => Some(ProgressSetting::Bar),
            "lines" => Some(ProgressSetting::Lines),
            _ => None,
        }
    }

    /// The process's setting; an unknown value warns and counts as `auto` (progress is not
    /// worth failing a job for).
    pub fn from_env() -> Self {
        let Ok(value) = std::env::var(PROGRESS_ENV) else {
            return ProgressSetting::Auto;
        };
        ProgressSetting::parse(&value).unwrap_or_else(|| {
            tracing::warn!(
                value,
                "{PROGRESS_ENV} must be auto, bar or lines; using auto"
            );
            ProgressSetting::Auto
        })
    }

    /// Whether a bar should be drawn on a stream that is (`is_terminal`) a terminal of type
    /// `term` (`TERM`).
    pub fn draws_bar(self, is_terminal: bool, term: Option<&str>) -> bool {
        match self {
            ProgressSetting::Bar => true,
            ProgressSetting::Lines => false,
            ProgressSetting::Auto => is_terminal && term != Some("dumb"),
        }
    }
}

/// Whether this process's stderr should show a bar, from the environment.
pub(crate) fn stderr_draws_bar() -> bool {
    ProgressSetting::from_env().draws_bar(
        std::io::stderr().is_terminal(),
        std::env::var("TERM").ok().as_deref(),
    )
}

/// The draw target of every bar: stderr at [`DRAW_HZ`], drawn whether or not it is a terminal
/// (the caller decided that already, see [`ProgressSetting::draws_bar`]; indicatif's own
/// stderr target would hide itself on a pipe even with `DDP_PROGRESS=bar`).
pub(crate) fn stderr_target() -> ProgressDrawTarget {
    ProgressDrawTarget::term_like_with_hz(Box::new(StderrTerm), DRAW_HZ)
}

/// stderr as indicatif's terminal: ANSI cursor movements, the width of the terminal if stderr
/// is one, else `COLUMNS`, else 80.
#[derive(Debug)]
struct StderrTerm;

impl StderrTerm {
    fn put(&self, s: &str) -> std::io::Result<()> {
        std::io::stderr().lock().write_all(s.as_bytes())
    }

    fn moved(&self, n: usize, code: char) -> std::io::Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.put(&format!("\x1b[{n}{code}"))
    }
}

impl indicatif::TermLike for StderrTerm {
    fn width(&self) -> u16 {
        // SAFETY: TIOCGWINSZ fills the winsize it is given, or fails on a non-terminal.
        let mut size: libc::winsize = unsafe { std::mem::zeroed() };
        if unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut size) } == 0
            && size.ws_col > 0
        {
            return size.ws_col;
        }
        std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.trim().parse().ok())
            .filter(|c| *c > 0)
            .unwrap_or(80)
    }
    fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
        self.moved(n, 'A')
    }
    fn move_cursor_down(&self, n: usize) -> std::io::Result<()> {
        self.moved(n, 'B')
    }
    fn move_cursor_right(&self, n: usize) -> std::io::Result<()> {
        self.moved(n, 'C')
    }
    fn move_cursor_left(&self, n: usize) -> std::io::Result<()> {
        self.moved(n, 'D')
    }
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.put(&format!("{s}\n"))
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        self.put(s)
    }
    fn clear_line(&self) -> std::io::Result<()> {
        self.put("\r\x1b[2K")
    }
    fn flush(&self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// One progress report from rank 0 to the launcher: a line on the [`PROGRESS_FD_ENV`] pipe.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Report {
    /// A new bar of `len` steps named `label` (`epoch 2/15`).
    Begin { len: u64, label: String },
    /// `pos` steps done; `message` shows the loss and rate.
    Position { pos: u64, message: String },
    /// The bar is done: clear it.
    End,
}

impl Report {
    /// The line for the pipe, newline included. Newlines inside texts become spaces.
    pub(crate) fn encode(&self) -> String {
        let clean = |s: &str| s.replace(['\n', '\r'], " ");
        match self {
            Report::Begin { len, label } => format!("begin {len} {}\n", clean(label)),
            Report::Position { pos, message } => format!("pos {pos} {}\n", clean(message)),
            Report::End => "end\n".to_string(),
        }
    }

    /// Reads one line (without its newline); `None` for anything else.
    pub(crate) fn parse(line: &str) -> Option<Report> {
        let mut parts = line.splitn(3, ' ');
        let kind = parts.next()?;
        if kind == "end" {
            return Some(Report::End);
        }
        let number: u64 = parts.next()?.parse().ok()?;
        let text = parts.next().unwrap_or("").to_string();
        match kind {
            "begin" => Some(Report::Begin {
                len: number,
                label: text,
            }),
            "pos" => Some(Report::Position {
                pos: number,
                message: text,
            }),
            _ => None,
        }
    }
}

/// Takes the launcher's report pipe now, if it handed this process one: reads and removes
/// [`PROGRESS_FD_ENV`] from the environment and keeps the pipe for the progress bars of
/// later epochs. Progress does this by itself at the first epoch; a worker that starts other
/// programs before that calls it first, so they inherit neither the variable nor the pipe.
///
/// Returns whether a usable pipe was found. Call it early, before other threads read the
/// environment (it modifies the environment once).
pub fn claim_report_pipe() -> bool {
    report_channel().is_some()
}

/// The launcher's report pipe, taken once per process (several epochs share it).
fn report_channel() -> Option<&'static Mutex<File>> {
    static CHANNEL: OnceLock<Option<Mutex<File>>> = OnceLock::new();
    CHANNEL
        .get_or_init(|| take_report_pipe().map(Mutex::new))
        .as_ref()
}

/// Reads [`PROGRESS_FD_ENV`], removes it from the environment (descendants must not adopt a
/// descriptor of that number: it is the launcher's, or by then something else), and adopts the
/// descriptor if it is a pipe open for writing.
fn take_report_pipe() -> Option<File> {
    let value = std::env::var_os(PROGRESS_FD_ENV)?;
    // SAFETY: called once per process (under the OnceLock of `report_channel`, or by a test);
    // the only other reader of this variable is this function. Concurrent getenv calls by other
    // threads are the caller's documented responsibility (`claim_report_pipe`).
    unsafe { std::env::remove_var(PROGRESS_FD_ENV) };
    let value = value.to_string_lossy();
    let file = adopt_pipe(&value);
    if file.is_none() {
        tracing::warn!(
            value = %value,
            "{PROGRESS_FD_ENV} names no inherited pipe open for writing; ignoring it and showing progress on stderr"
        );
    }
    file
}

/// The pipe whose descriptor number is `value`, if it is one open for writing; marked
/// close-on-exec so that programs this process starts do not keep the launcher's reader
/// waiting. Anything else (a regular file, a socket, a read end, stdio) is left alone: the
/// number may be stale or inherited from elsewhere.
fn adopt_pipe(value: &str) -> Option<File> {
    use std::os::fd::FromRawFd;
    let fd: libc::c_int = value.trim().parse().ok().filter(|fd| *fd > 2)?;
    // SAFETY: fstat on a descriptor number only reads; a closed number fails with EBADF.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut stat) } != 0 || stat.st_mode & libc::S_IFMT != libc::S_IFIFO {
        return None;
    }
    // SAFETY: F_GETFL only reads the open file's status flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 || !matches!(flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR) {
        return None;
    }
    // SAFETY: plain fcntl on the open descriptor checked above.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    // SAFETY: the launcher opened this pipe for this process and nothing else here uses the
    // number; the OnceLock in `report_channel` makes this the only owner.
    Some(unsafe { File::from_raw_fd(fd) })
}

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

/// The bar's look; `head` names the bar (`{prefix}` is the epoch).
pub(crate) fn bar_style(head: &str) -> ProgressStyle {
    ProgressStyle::with_template(&format!(
        "{head} [{{bar:30}}] {{pos}}/{{len}} {{msg}} eta {{eta}}"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ")
}

/// Sends one report; a launcher that stopped reading (it is going away too) is ignored.
fn send(channel: &Mutex<File>, report: &Report) {
    let mut file = channel.lock().unwrap_or_else(PoisonError::into_inner);
    if let Err(e) = file.write_all(report.encode().as_bytes()) {
        tracing::debug!(%e, "cannot send a progress report to the launcher");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddp_comm::{ProcessGroupConfig, Store, StoreConfig, StoreServer};
    use std::io::Read;
    use std::os::fd::{AsRawFd, IntoRawFd};

    #[test]
    fn settings_parse_and_decide_between_bar_and_lines() {
        assert_eq!(ProgressSetting::parse(""), Some(ProgressSetting::Auto));
        assert_eq!(ProgressSetting::parse(" BAR "), Some(ProgressSetting::Bar));
        assert_eq!(
            ProgressSetting::parse("lines"),
            Some(ProgressSetting::Lines)
        );
        assert_eq!(ProgressSetting::parse("fancy"), None);
        let auto = ProgressSetting::Auto;
        assert!(auto.draws_bar(true, Some("xterm-256color")));
        assert!(auto.draws_bar(true, None));
        assert!(!auto.draws_bar(false, Some("xterm")), "a pipe gets lines");
        assert!(!auto.draws_bar(true, Some("dumb")));
        assert!(ProgressSetting::Bar.draws_bar(false, None));
        assert!(!ProgressSetting::Lines.draws_bar(true, Some("xterm")));
    }

    #[test]
    fn rank_0_reports_when_given_a_pipe_else_draws_or_prints_lines() {
        assert_eq!(display_kind(true, true, false), DisplayKind::Report);
        assert_eq!(display_kind(true, true, true), DisplayKind::Report);
        assert_eq!(display_kind(true, false, true), DisplayKind::Bar);
        assert_eq!(display_kind(true, false, false), DisplayKind::Lines);
        assert_eq!(display_kind(false, true, true), DisplayKind::Quiet);
    }

    #[test]
    fn reports_round_trip_and_garbage_is_ignored() {
        for r in [
            Report::Begin {
                len: 23,
                label: "epoch 2/15".into(),
            },
            Report::Position {
                pos: 7,
                message: "loss 0.1234 5000 samples/s".into(),
            },
            Report::End,
        ] {
            let line = r.encode();
            assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
            assert_eq!(Report::parse(line.trim_end_matches('\n')), Some(r));
        }
        let sneaky = Report::Begin {
            len: 1,
            label: "a\nb".into(),
        };
        assert_eq!(sneaky.encode(), "begin 1 a b\n");
        for bad in ["", "pos", "pos x msg", "begin", "jump 3 x"] {
            assert_eq!(Report::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn only_an_inherited_pipe_is_adopted() {
        assert!(adopt_pipe("not a number").is_none());
        assert!(adopt_pipe("2").is_none(), "stdio is never a report pipe");
        let file = tempfile::tempfile().expect("tempfile");
        assert!(
            adopt_pipe(&file.as_raw_fd().to_string()).is_none(),
            "a regular file is not a pipe"
        );
        let (mut reader, writer) = std::io::pipe().expect("pipe");
        let fd = writer.into_raw_fd();
        let mut adopted = adopt_pipe(&fd.to_string()).expect("a pipe");
        // SAFETY: fcntl on the descriptor `adopted` owns.
        let flags = unsafe { libc::fcntl(adopted.as_raw_fd(), libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        adopted.write_all(b"end\n").expect("write");
        drop(adopted);
        let mut text = String::new();
        reader.read_to_string(&mut text).expect("read");
        assert_eq!(text, "end\n");
    }

    #[test]
    fn the_read_end_of_a_pipe_is_not_adopted() {
        let (reader, _writer) = std::io::pipe().expect("pipe");
        assert!(adopt_pipe(&reader.as_raw_fd().to_string()).is_none());
    }

    /// The only test that touches [`PROGRESS_FD_ENV`] in this process's environment.
    #[test]
    fn the_variable_is_removed_at_first_read_and_a_regular_file_is_not_written() {
        use std::os::unix::fs::FileExt;
        // A regular file under that number: ignored, never written, and the variable is gone.
        let file = tempfile::tempfile().expect("tempfile");
        // SAFETY: no other test reads or writes this variable.
        unsafe { std::env::set_var(PROGRESS_FD_ENV, file.as_raw_fd().to_string()) };
        assert!(take_report_pipe().is_none());
        assert_eq!(std::env::var_os(PROGRESS_FD_ENV), None);
        assert_eq!(file.metadata().expect("metadata").len(), 0);
        let mut buf = [0u8; 1];
        assert_eq!(
            file.read_at(&mut buf, 0).expect("read"),
            0,
            "nothing written"
        );

        // A real pipe: adopted, and a program started afterwards sees no variable.
        let (mut reader, writer) = std::io::pipe().expect("pipe");
        let fd = writer.into_raw_fd();
        // SAFETY: as above.
        unsafe { std::env::set_var(PROGRESS_FD_ENV, fd.to_string()) };
        let mut pipe = take_report_pipe().expect("a pipe");
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("echo \"${{{PROGRESS_FD_ENV}-unset}}\"")])
            .output()
            .expect("run sh");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "unset");
        pipe.write_all(b"end\n").expect("write");
        drop(pipe);
        let mut text = String::new();
        reader.read_to_string(&mut text).expect("read");
        assert_eq!(text, "end\n");
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
