//! Benchmarks for ddp-burn (see `benches/`), and the few helpers they share.

use anyhow::Result;
use ddp_core::{ProcessGroup, ProcessGroupConfig, Store, StoreConfig, StoreServer};
use std::time::Duration;

/// Parses a byte size such as `4096`, `4K`, `64M` or `1G` (powers of 1024).
///
/// # Errors
/// A message naming the value when it is not such a size.
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let (num, mult) = match s.trim().to_ascii_uppercase() {
        t if t.ends_with('K') => (t[..t.len() - 1].to_string(), 1usize << 10),
        t if t.ends_with('M') => (t[..t.len() - 1].to_string(), 1 << 20),
        t if t.ends_with('G') => (t[..t.len() - 1].to_string(), 1 << 30),
        t => (t, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("'{s}' is not a byte size like 4K or 64M"))
}

/// The median of `v` (zero when empty).
pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// A store served by this process on a free loopback port, and a client of it. Keep the server
/// alive as long as the store is used.
///
/// # Errors
/// Binding or connecting fails.
pub fn local_store() -> Result<(StoreServer, Store)> {
    let server = StoreServer::bind("127.0.0.1:0", StoreConfig::new())?;
    let store = Store::connect(&server.local_addr().to_string(), StoreConfig::new())?;
    Ok((server, store))
}

/// A process group of this process alone (world size 1), with the server of its store.
///
/// # Errors
/// As [`local_store`], or the group cannot form.
pub fn world_of_one() -> Result<(StoreServer, ProcessGroup)> {
    let (server, store) = local_store()?;
    let pg = ProcessGroup::with_store(store, ProcessGroupConfig::new(0, 1))?;
    Ok((server, pg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_with_binary_suffixes_and_reject_garbage() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("4k"), Ok(4096));
        assert_eq!(parse_bytes("64M"), Ok(64 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("M").is_err());
    }

    #[test]
    fn median_of_durations() {
        let ms = Duration::from_millis;
        assert_eq!(median(vec![ms(3), ms(1), ms(2)]), ms(2));
        assert_eq!(median(Vec::new()), Duration::ZERO);
    }
}
