//! Progress bars on stderr, for the launcher (rank 0's bar, drawn from its reports) and for
//! rank 0 itself: the `DDP_PROGRESS` setting, the draw target and the bar's look.

use indicatif::{ProgressDrawTarget, ProgressStyle};
use std::io::{IsTerminal, Write};

/// Bar redraws per second.
const DRAW_HZ: u8 = 20;

/// Environment variable choosing the progress display: `auto` (default), `bar` or `lines`.
pub const PROGRESS_ENV: &str = "DDP_PROGRESS";

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
        let value = match ddp_comm::env_var(PROGRESS_ENV) {
            Ok(Some(value)) => value,
            Ok(None) => return ProgressSetting::Auto,
            Err(e) => {
                tracing::warn!(%e, "using auto");
                return ProgressSetting::Auto;
            }
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
pub fn stderr_draws_bar() -> bool {
    ProgressSetting::from_env().draws_bar(
        std::io::stderr().is_terminal(),
        std::env::var("TERM").ok().as_deref(),
    )
}

/// The draw target of every bar: stderr at `DRAW_HZ` (20) redraws a second, drawn whether or
/// not it is a terminal (the caller decided that already, see [`ProgressSetting::draws_bar`];
/// indicatif's own stderr target would hide itself on a pipe even with `DDP_PROGRESS=bar`).
pub fn stderr_target() -> ProgressDrawTarget {
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

/// The bar's look; `head` names the bar (`{prefix}` is the epoch).
pub fn bar_style(head: &str) -> ProgressStyle {
    ProgressStyle::with_template(&format!(
        "{head} [{{bar:30}}] {{pos}}/{{len}} {{msg}} eta {{eta}}"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ")
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
