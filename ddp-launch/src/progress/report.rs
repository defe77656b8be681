//! The report pipe between rank 0 and the launcher: one line per [`Report`] on the pipe whose
//! number the launcher passes in [`PROGRESS_FD_ENV`], and rank 0's adoption of that pipe.

use std::fs::File;
use std::io::Write;
use std::sync::{Mutex, OnceLock, PoisonError};

/// Environment variable the launcher sets for rank 0 only: the number of an inherited pipe to
/// send progress reports on, which the launcher draws as a bar on its terminal.
///
/// Rank 0 removes it from its environment when it first reads it (the first epoch's progress,
/// or [`claim_report_pipe`]), so programs it starts afterwards do not adopt whatever descriptor
/// has that number; the descriptor itself becomes close-on-exec. It uses the descriptor only if
/// it is really a pipe open for writing; anything else is ignored with a warning.
pub const PROGRESS_FD_ENV: &str = "DDP_PROGRESS_FD";

/// One progress report from rank 0 to the launcher: a line on the [`PROGRESS_FD_ENV`] pipe.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// A new bar of `len` steps named `label` (`epoch 2/15`).
    Begin {
        /// Steps in the bar.
        len: u64,
        /// What the bar counts.
        label: String,
    },
    /// `pos` steps done; `message` shows the loss and rate.
    Position {
        /// Steps done.
        pos: u64,
        /// Shown beside the bar.
        message: String,
    },
    /// The bar is done: clear it.
    End,
}

impl Report {
    /// The line for the pipe, newline included. Newlines inside texts become spaces.
    pub fn encode(&self) -> String {
        let clean = |s: &str| s.replace(['\n', '\r'], " ");
        match self {
            Report::Begin { len, label } => format!("begin {len} {}\n", clean(label)),
            Report::Position { pos, message } => format!("pos {pos} {}\n", clean(message)),
            Report::End => "end\n".to_string(),
        }
    }

    /// Reads one line (without its newline); `None` for anything else.
    pub fn parse(line: &str) -> Option<Report> {
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

/// The launcher's report pipe, taken once per process (several epochs share it); `None` when
/// this process was given none (or [`PROGRESS_FD_ENV`] named something else).
pub fn report_channel() -> Option<&'static Mutex<File>> {
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

/// Sends one report on `channel` (from [`report_channel`]); a launcher that stopped reading (it is going away too) is ignored.
pub fn send(channel: &Mutex<File>, report: &Report) {
    let mut file = channel.lock().unwrap_or_else(PoisonError::into_inner);
    if let Err(e) = file.write_all(report.encode().as_bytes()) {
        tracing::debug!(%e, "cannot send a progress report to the launcher");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::{AsRawFd, IntoRawFd};

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
}
