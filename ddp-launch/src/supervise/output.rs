//! Workers' output: one thread per pipe reads lines, prefixes them with `[rank N]: ` on the
//! launcher's stdout/stderr, appends them to the rank's log file, and keeps the last lines for
//! the failure summary. Reading never waits on anything but the pipe, so a chatty worker never
//! blocks on a full pipe (unless the launcher's own stdout is blocked).

use crate::supervise::live::{Console, Stream};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

/// A line longer than this is emitted in pieces (a progress bar without newlines must not grow
/// the buffer without bound).
const MAX_LINE: usize = 64 * 1024;

/// The last lines of one rank's output.
#[derive(Debug)]
pub(crate) struct Tail {
    lines: Mutex<VecDeque<String>>,
    capacity: usize,
}

impl Tail {
    pub(crate) fn new(capacity: usize) -> Self {
        Tail {
            lines: Mutex::new(VecDeque::with_capacity(capacity.min(1024))),
            capacity,
        }
    }

    fn push(&self, line: String) {
        if self.capacity == 0 {
            return;
        }
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        if lines.len() == self.capacity {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    pub(crate) fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }
}

/// Where one pipe's lines go.
pub(crate) struct Sink {
    pub(crate) prefix: String,
    /// Which of the launcher's streams the pipe is copied to.
    pub(crate) stream: Stream,
    /// Writes around rank 0's live bar, if one is shown.
    pub(crate) console: Arc<Console>,
    pub(crate) log: Option<Arc<Mutex<File>>>,
    pub(crate) tail: Arc<Tail>,
}

impl Sink {
    fn emit(&self, line: &[u8]) {
        // A trailing CR (CRLF output, progress bars) would garble the prefixed line.
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let mut out = Vec::with_capacity(self.prefix.len() + line.len() + 1);
        out.extend_from_slice(self.prefix.as_bytes());
        out.extend_from_slice(line);
        out.push(b'\n');
        self.console.write(self.stream, &out);
        // Write errors (a full disk) must not stop the draining: ignore them.
        if let Some(log) = &self.log {
            let mut f = log.lock().unwrap_or_else(PoisonError::into_inner);
            let _ = f.write_all(&out[self.prefix.len()..]);
        }
        self.tail.push(String::from_utf8_lossy(line).into_owned());
    }
}

/// Starts a thread copying `pipe` line by line into `sink` until end of file.
pub(crate) fn pump(
    name: String,
    mut pipe: impl Read + Send + 'static,
    sink: Sink,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name).spawn(move || {
        let mut buf = vec![0u8; 16 * 1024];
        let mut line: Vec<u8> = Vec::new();
        loop {
            let n = match pipe.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            let mut chunk = &buf[..n];
            while let Some(pos) = chunk.iter().position(|&b| b == b'\n') {
                line.extend_from_slice(&chunk[..pos]);
                sink.emit(&line);
                line.clear();
                chunk = &chunk[pos + 1..];
            }
            line.extend_from_slice(chunk);
            if line.len() >= MAX_LINE {
                sink.emit(&line);
                line.clear();
            }
        }
        if !line.is_empty() {
            sink.emit(&line);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines_only() {
        let t = Tail::new(2);
        for l in ["a", "b", "c"] {
            t.push(l.into());
        }
        assert_eq!(t.lines(), vec!["b", "c"]);
        let none = Tail::new(0);
        none.push("x".into());
        assert!(none.lines().is_empty());
    }

    #[test]
    fn pump_splits_lines_writes_the_log_and_keeps_the_tail() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("rank_0.log");
        let log = Arc::new(Mutex::new(File::create(&path).expect("create")));
        let tail = Arc::new(Tail::new(10));
        let input: &'static [u8] = b"one\r\ntwo\nthree without newline";
        let handle = pump(
            "test-pump".into(),
            input,
            Sink {
                prefix: "[rank 0]: ".into(),
                stream: Stream::Quiet,
                console: Arc::new(Console::new(false, indicatif::ProgressDrawTarget::hidden)),
                log: Some(log),
                tail: tail.clone(),
            },
        )
        .expect("spawn");
        handle.join().expect("join");
        assert_eq!(tail.lines(), vec!["one", "two", "three without newline"]);
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "one\ntwo\nthree without newline\n"
        );
    }
}
