//! One job per checkpoint directory: rank 0 holds an exclusive advisory lock on
//! `<dir>/lock` (`flock`) for as long as its checkpointer lives.
//!
//! Two jobs writing one directory destroy each other's work: a `--fresh` start deletes the
//! other job's checkpoints, and each refuses the other's saves as "newer". The lock makes the
//! second job fail at once with an error naming the holder (host, pid, start time, which the
//! holder writes into the lock file). The kernel releases the lock when the holder's process
//! dies, however it dies, so a killed job never leaves the directory locked; and nothing in the
//! directory is removed (leftovers, `--fresh`) before the lock is held.

use super::super::error::StorageError;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// The lock file in a checkpoint directory.
pub const LOCK_FILE: &str = "lock";

/// The held lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct DirLock {
    /// Kept open: the lock lives as long as this descriptor.
    _file: File,
}

/// Takes the lock of checkpoint directory `dir` (which exists) and records who holds it. The
/// checkpointers take it themselves; a trainer that writes a directory of its own (ddp-train's
/// `DdpStrategy::with_checkpoints`) takes it on rank 0 for the whole run.
///
/// # Errors
/// [`StorageError::DirLocked`] naming the holder when another job holds it;
/// [`StorageError::Lock`] when the lock file cannot be opened or locked.
pub fn lock_dir(dir: &Path) -> Result<DirLock, StorageError> {
    let path = dir.join(LOCK_FILE);
    let fail = |source| StorageError::Lock {
        path: path.clone(),
        source,
    };
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(fail)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut holder = String::new();
            // Best effort: the holder may be between taking the lock and writing its name.
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            return Err(StorageError::DirLocked {
                dir: dir.to_path_buf(),
                holder: if holder.is_empty() {
                    "unknown (it has not written its name yet)".into()
                } else {
                    holder.to_string()
                },
            });
        }
        Err(TryLockError::Error(source)) if locks_unsupported(&source) => {
            return Err(StorageError::LockUnsupported { path, source });
        }
        Err(TryLockError::Error(source)) => return Err(fail(source)),
    }
    let me = holder_description();
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(me.as_bytes()))
        .and_then(|()| file.sync_all())
        .map_err(fail)?;
    tracing::debug!(path = %path.display(), holder = %me.trim(), "locked the checkpoint directory");
    Ok(DirLock { _file: file })
}

/// Whether `e` says the file system has no locks at all (a Lustre client mounted without
/// `-o flock` answers ENOSYS; some network file systems EOPNOTSUPP or ENOLCK).
fn locks_unsupported(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSYS | libc::EOPNOTSUPP | libc::ENOLCK)
    )
}

/// `host <name>, pid <pid>, started <UTC time>`, as another job's error shows it.
fn holder_description() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "host {}, pid {}, started {}\n",
        hostname(),
        std::process::id(),
        utc(secs)
    )
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match (ok, std::str::from_utf8(&buf[..len])) {
        (true, Ok(name)) if !name.is_empty() => name.to_string(),
        _ => "unknown".into(),
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC` of a Unix time (civil-from-days, proleptic Gregorian).
fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formats_known_times() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_800_000_000), "2027-01-15 08:00:00 UTC");
    }

    #[test]
    fn a_second_lock_names_the_holder_and_a_dropped_lock_is_free() {
        let dir = tempfile::tempdir().expect("tempdir");
        let held = lock_dir(dir.path()).expect("first lock");
        let err = lock_dir(dir.path()).expect_err("second lock");
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("pid {}", std::process::id())) && msg.contains("host "),
            "{msg}"
        );
        drop(held);
        lock_dir(dir.path()).expect("free again");
    }

    #[test]
    fn a_file_system_without_locks_is_told_apart_and_the_error_says_what_to_do() {
        for errno in [libc::ENOSYS, libc::EOPNOTSUPP, libc::ENOLCK] {
            assert!(locks_unsupported(&std::io::Error::from_raw_os_error(errno)));
        }
        assert!(!locks_unsupported(&std::io::Error::from_raw_os_error(
            libc::EACCES
        )));
        let e = StorageError::LockUnsupported {
            path: "runs/lock".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOSYS),
        }
        .to_string();
        assert!(
            e.contains("-o flock") && e.contains("with_dir_lock(false)"),
            "{e}"
        );
    }
}
