//! Reading the kernel's table of IPv4 TCP sockets (`/proc/net/tcp`), shared by the tests that
//! count a listener's accepted connections or the bytes waiting in them.

/// An established connection whose local end listens on the port asked for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Established {
    /// Local address, as the kernel writes it (hex `ADDR:PORT`).
    pub local: String,
    /// Remote address, as the kernel writes it.
    pub remote: String,
    /// Bytes received and not yet read by the process.
    pub receive_queue: u64,
}

/// Established connections whose local end is `port` (accepted by that listener).
pub fn established_on(port: u16) -> Vec<Established> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    let want = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl, local address, remote address, state (01: established), tx_queue:rx_queue.
            (f.len() > 4 && f[1].ends_with(&want) && f[3] == "01").then(|| {
                let rx = f[4].split(':').nth(1).unwrap_or("0");
                Established {
                    local: f[1].to_string(),
                    remote: f[2].to_string(),
                    receive_queue: u64::from_str_radix(rx, 16).unwrap_or(u64::MAX),
                }
            })
        })
        .collect()
}
