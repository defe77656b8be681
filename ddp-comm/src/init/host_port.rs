//! `host:port` as a string every rank parses back the same, IPv6 included: what tcp:// and
//! file:// init publish for the store, and what `ddp-run` binds, connects to and names in its
//! messages (the static rendezvous, the elastic endpoint).

/// `host:port`, with an IPv6 `host` in brackets (`[::1]:29500`, not the `::1:29500` that no
/// parser reads as intended); a host already in brackets is kept as it is.
///
/// ```
/// assert_eq!(ddp_comm::host_port("::1", 29500), "[::1]:29500");
/// assert_eq!(ddp_comm::host_port("[::1]", 29500), "[::1]:29500");
/// assert_eq!(ddp_comm::host_port("node-3", 29500), "node-3:29500");
/// ```
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_hosts_are_bracketed() {
        assert_eq!(host_port("::1", 5), "[::1]:5");
        assert_eq!(host_port("[::1]", 5), "[::1]:5");
        assert_eq!(host_port("10.0.0.1", 5), "10.0.0.1:5");
        assert_eq!(host_port("node-3", 5), "node-3:5");
    }
}
