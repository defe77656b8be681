//! [`note!`]: `eprint!` that cannot panic.
//!
//! `eprint!` panics when writing fails, and Rust programs ignore SIGPIPE: a launcher whose
//! stderr reader went away (`ddp-run ... 2>&1 | head`) would panic at its next message and
//! leave the job unsupervised, no restart done. Its messages are only words for a reader, so
//! one that cannot be written is dropped, as the workers' output is (`supervise::live`).

/// Writes `format!(...)` to stderr, ignoring write errors (a closed pipe, a full disk).
macro_rules! note {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::write!(::std::io::stderr().lock(), $($arg)*);
    }};
}
pub(crate) use note;

/// [`note!`] with a newline.
macro_rules! noteln {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stderr().lock(), $($arg)*);
    }};
}
pub(crate) use noteln;
