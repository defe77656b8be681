//! `host:port` with an IPv6 host in brackets: the one spelling of an address that the
//! launcher binds, connects to and names in messages, shared by the static rendezvous
//! ([`rendezvous`](crate::rendezvous)) and the elastic endpoint
//! ([`Endpoint`](crate::plan::elastic_settings::Endpoint)).

/// `host:port`, with brackets for IPv6.
pub(crate) fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
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
        assert_eq!(join_host_port("::1", 80), "[::1]:80");
        assert_eq!(join_host_port("10.0.0.1", 80), "10.0.0.1:80");
    }
}
