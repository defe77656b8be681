//! Every `unsafe` of the shared-memory transport: mapping a segment, the atomics and bytes
//! inside it, and the futex calls. The rest of `shm` is safe code on top of [`Segment`].
//!
//! # Soundness
//! A [`Segment`] is a `MAP_SHARED` mapping that lives until the `Segment` is dropped, so every
//! reference handed out borrows `&self` and cannot outlive it. Control words are only accessed
//! as atomics. Payload bytes are plain `u8` (every bit pattern is valid) and are only touched
//! through the copy and reduce methods below, which never hold a reference across a call. That
//! no two ranks write (or one writes while another reads) the same payload bytes at the same
//! time is the job of the step protocol (see the [module docs](super)): a rank writes only its
//! own staging buffer, only after every peer has released it (`consumed`), and peers read it
//! only after the owner published it with a release store (`posted`/`reduced`) that they
//! observed with an acquire load. A peer *process* that broke the protocol could corrupt the
//! numbers we read, as a corrupt TCP peer could; it cannot make this process touch memory
//! outside the mapping, because every offset is bounds-checked here.

use crate::dtype::DataType;
use crate::reduce_op::{ReduceOp, combine_bytes, divide_bytes, prescale_bytes};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

/// A shared mapping of a file under `/dev/shm`.
#[derive(Debug)]
pub(super) struct Segment {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is not tied to a thread, and shared access is what it is for: control
// words are atomics and payload bytes follow the protocol in the module docs, whether the
// other party is a thread or a process.
unsafe impl Send for Segment {}
// SAFETY: as for `Send`.
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates `path` (which must not exist yet, mode 0600) with `header` at offset 0, sizes it
    /// to `len` bytes with every block allocated (so a full `/dev/shm` is an error here rather
    /// than a SIGBUS later), and maps it.
    pub(super) fn create(path: &Path, len: usize, header: &[u8]) -> io::Result<Segment> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)?;
        // The header first: from here on a crash leaves a file that names its creator.
        file.write_all(header)?;
        file.set_len(len as u64)?;
        // SAFETY: a plain system call on a file descriptor we own; it touches no memory of ours.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Self::map(&file, len)
    }

    /// Maps an existing segment, whole, if it is ours (see [`open_own_file`]).
    pub(super) fn open(path: &Path) -> io::Result<Segment> {
        let file = open_own_file(path, true)?;
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "segment too large"))?;
        Self::map(&file, len)
    }

    fn map(file: &File, len: usize) -> io::Result<Segment> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "empty segment"));
        }
        // SAFETY: we ask the kernel for a fresh shared mapping of `len` bytes of a file we hold
        // open read-write, at an address it chooses; nothing existing is replaced. The result
        // is checked before use. Closing the file afterwards keeps the mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Segment { ptr, len })
    }

    /// Size of the mapping in bytes.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    fn check(&self, off: usize, len: usize, align: usize) {
        assert!(
            off.checked_add(len).is_some_and(|end| end <= self.len) && off.is_multiple_of(align),
            "shm: access {off}+{len} (align {align}) outside a segment of {} bytes",
            self.len
        );
    }

    /// The 32-bit control word at `off`.
    pub(super) fn u32_at(&self, off: usize) -> &AtomicU32 {
        self.check(off, 4, 4);
        // SAFETY: in bounds and 4-aligned (the mapping is page aligned), checked above; valid
        // for the lifetime of `&self`; AtomicU32 has the layout of u32, any bit pattern is a
        // valid value, and every access to control words, in any process, is atomic.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU32>() }
    }

    /// The 64-bit control word at `off`.
    pub(super) fn u64_at(&self, off: usize) -> &AtomicU64 {
        self.check(off, 8, 8);
        // SAFETY: as in `u32_at`, with 8-byte alignment.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU64>() }
    }

    /// Copies `src` into the segment at `off`.
    pub(super) fn write(&self, off: usize, src: &[u8]) {
        self.check(off, src.len(), 1);
        // SAFETY: in bounds (checked); `src` is private memory, so the ranges cannot overlap;
        // the protocol gives this rank exclusive access to the destination bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(off), src.len())
        }
    }

    /// Copies the segment's bytes at `off` into `dst`.
    pub(super) fn read(&self, off: usize, dst: &mut [u8]) {
        self.check(off, dst.len(), 1);
        // SAFETY: in bounds (checked); `dst` is private memory; the protocol guarantees nobody
        // writes the source bytes while we read them.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), dst.len())
        }
    }

    /// `dst[i] = dst[i] (op) segment[off + i]`, element-wise.
    pub(super) fn combine_into(&self, off: usize, dst: &mut [u8], dtype: DataType, op: ReduceOp) {
        self.check(off, dst.len(), dtype.size_bytes());
        // SAFETY: in bounds and aligned for `dtype` (checked; the mapping is page aligned); the
        // bytes are stable while we read them (protocol) and `dst` is private, so the shared
        // slice lives only for this call and aliases nothing mutable.
        let src = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), dst.len()) };
        combine_bytes(dtype, op, dst, src);
    }

    /// `segment[dst + i] = segment[dst + i] (op) segment[src + i]` for `len` bytes.
    pub(super) fn combine_within(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        dtype: DataType,
        op: ReduceOp,
    ) {
        let e = dtype.size_bytes();
        self.check(dst, len, e);
        self.check(src, len, e);
        assert!(
            dst + len <= src || src + len <= dst,
            "shm: overlapping reduction ranges"
        );
        // SAFETY: both ranges in bounds, aligned for `dtype` and disjoint (checked); the
        // protocol gives this rank exclusive access to `dst` and keeps `src` stable; both
        // slices live only for this call.
        let (d, s) = unsafe {
            (
                std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(dst), len),
                std::slice::from_raw_parts(self.ptr.as_ptr().add(src), len),
            )
        };
        combine_bytes(dtype, op, d, s);
    }

    /// The `Avg` epilogue of a sum over `n` ranks on the `len` bytes of elements at `off`
    /// ([`divide_bytes`]).
    pub(super) fn divide(&self, off: usize, len: usize, dtype: DataType, n: usize) {
        self.elements_mut(off, len, dtype, |d| divide_bytes(dtype, d, n));
    }

    /// The `Avg` prologue of a sum over `n` ranks on the `len` bytes of elements at `off`, a
    /// rank's input just posted ([`prescale_bytes`]).
    pub(super) fn prescale(&self, off: usize, len: usize, dtype: DataType, n: usize) {
        self.elements_mut(off, len, dtype, |d| prescale_bytes(dtype, d, n));
    }

    /// Runs `f` on the `len` bytes of elements of `dtype` at `off`, which this rank owns.
    fn elements_mut(&self, off: usize, len: usize, dtype: DataType, f: impl FnOnce(&mut [u8])) {
        self.check(off, len, dtype.size_bytes());
        // SAFETY: in bounds and aligned (checked); the protocol gives this rank exclusive
        // access to these bytes; the slice lives only for this call.
        let d = unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), len) };
        f(d);
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping we created; no reference into it outlives
        // `self` (they all borrow it).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// Opens a file under `/dev/shm` that another process named, refusing anything a different
/// user could have planted there: a symbolic link (never followed: `O_NOFOLLOW`), a FIFO or
/// device (never blocked on: `O_NONBLOCK`; refused after `fstat`), or a file owned by another
/// user. The checks are made on the open descriptor, so the name cannot be swapped between
/// check and use.
pub(super) fn open_own_file(path: &Path, write: bool) -> io::Result<File> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    open_file_of(path, write, unsafe { libc::geteuid() })
}

/// [`open_own_file`] for the user `me`: tests pass another uid to see the ownership check
/// refuse a file without having to be root to give one away.
fn open_file_of(path: &Path, write: bool, me: u32) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} is a symbolic link; refusing to follow it",
                        path.display()
                    ),
                )
            } else {
                e
            }
        })?;
    let meta = file.metadata()?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is {what}, not a shared-memory segment", path.display()),
        ));
    }
    if meta.uid() != me {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} belongs to uid {}, not to this user (uid {me}); refusing to map it",
                path.display(),
                meta.uid()
            ),
        ));
    }
    Ok(file)
}

/// Sleeps while `word` still holds `expected`, for at most `timeout` (or until woken). Spurious
/// returns are fine: callers re-check their condition.
pub(super) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT reads the aligned u32 behind a live reference and the timespec on our
    // stack; it writes nothing. Not FUTEX_PRIVATE: the word is shared between processes.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every thread, in any process, sleeping in [`futex_wait`] on `word`.
pub(super) fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address of `word` as a key; it reads and writes nothing.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    #[test]
    fn a_segment_is_shared_between_two_mappings_and_futex_wakes_across_them() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("seg");
        let a = Segment::create(&path, 8192, b"hello").unwrap();
        let b = Segment::open(&path).unwrap();
        assert_eq!(b.len(), 8192);
        let mut head = [0u8; 5];
        b.read(0, &mut head);
        assert_eq!(&head, b"hello");
        a.write(4096, &[1, 2, 3, 4]);
        let mut got = [0u8; 4];
        b.read(4096, &mut got);
        assert_eq!(got, [1, 2, 3, 4]);
        a.u64_at(64).store(7, Ordering::SeqCst);
        assert_eq!(b.u64_at(64).load(Ordering::SeqCst), 7);

        // A waiter on mapping `b` is woken through mapping `a`.
        let start = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                while b.u32_at(128).load(Ordering::SeqCst) == 0 {
                    futex_wait(b.u32_at(128), 0, Duration::from_secs(10));
                }
            });
            std::thread::sleep(Duration::from_millis(50));
            a.u32_at(128).store(1, Ordering::SeqCst);
            futex_wake_all(a.u32_at(128));
        });
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    /// Runs `f` on another thread and fails if it takes more than twenty seconds (a FIFO opened
    /// without `O_NONBLOCK` would block forever; the margin is for a busy machine).
    fn quickly<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(20))
            .expect("the open must not block")
    }

    #[test]
    fn shm_symlink_is_refused() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let real = dir.path().join("real");
        let _seg = Segment::create(&real, 8192, b"hello").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = quickly(move || Segment::open(&link)).expect_err("a symlink must be refused");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        // Creating through a symlink is refused too (it must not create the link's target).
        let target = dir.path().join("target");
        let link = dir.path().join("link2");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(Segment::create(&link, 8192, b"").is_err());
        assert!(!target.exists());
    }

    #[test]
    fn shm_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let f = fifo.clone();
        let e = quickly(move || Segment::open(&f)).expect_err("a FIFO must be refused");
        assert!(e.to_string().contains("a FIFO"), "{e}");
        // Read-only (the stale-segment scan) is what blocks without O_NONBLOCK.
        let e = quickly(move || open_own_file(&fifo, false)).expect_err("read-only too");
        assert!(e.to_string().contains("a FIFO"), "{e}");
    }

    /// A file owned by another user is refused. As root, a segment is given away and opened
    /// for real; as anyone else (who cannot give a file away) the same check on the same
    /// descriptor runs as if we were another user, so it is exercised either way.
    #[test]
    fn shm_segment_of_another_user_is_refused() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("foreign");
        let _seg = Segment::create(&path, 8192, b"hello").unwrap();
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        let stranger = if me == 65534 { 65533 } else { 65534 };
        // Our own file passes; seen by another user, it is refused naming its owner.
        assert!(open_file_of(&path, false, me).is_ok());
        let e = open_file_of(&path, true, stranger).expect_err("someone else's file");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(
            e.to_string().contains(&format!("belongs to uid {me}")),
            "{e}"
        );
        // Only root can give a file away: then the real path, Segment::open, is checked too.
        if std::os::unix::fs::chown(&path, Some(stranger), Some(stranger)).is_ok() {
            let e = Segment::open(&path).expect_err("another user's file must be refused");
            assert!(e.to_string().contains(&format!("uid {stranger}")), "{e}");
        }
    }

    #[test]
    #[should_panic(expected = "outside a segment")]
    fn out_of_bounds_access_panics() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let a = Segment::create(&dir.path().join("seg"), 4096, &[]).unwrap();
        a.write(4090, &[0; 8]);
    }
}
