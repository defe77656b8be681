//! Who a launcher is, for the rendezvous' records: unique among the launchers running now.

/// `host:pid`: unique among the launchers running now.
pub(crate) fn host_pid() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let host = if ok {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "localhost".to_string()
    };
    format!("{host}:{}", std::process::id())
}

/// `host:pid:nonce`: the nonce tells apart two launchers whose pids match (two hosts of the
/// same name, or a pid reused).
pub(crate) fn claimant_id() -> String {
    format!("{}:{:08x}", host_pid(), rand::random::<u32>())
}
