//! Which local addresses hold a listening TCP port, read from `/proc/net/tcp{,6}`: binding the
//! wildcard address fails when any address holds the port, and the error should name the one
//! that does (a port held on 127.0.0.1 was reported as "in use on 0.0.0.0").

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// TCP state `LISTEN` in `/proc/net/tcp`.
const LISTEN: &str = "0A";

/// The local addresses listening on `port`, IPv4 first; empty where `/proc` cannot tell.
pub(crate) fn listening_addresses(port: u16) -> Vec<IpAddr> {
    let mut found = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for addr in parse_table(&text, port) {
            if !found.contains(&addr) {
                found.push(addr);
            }
        }
    }
    found
}

/// The listening addresses on `port` in one table's text.
fn parse_table(text: &str, port: u16) -> Vec<IpAddr> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let local = fields.nth(1)?;
            let state = fields.nth(1)?;
            let (addr, p) = local.split_once(':')?;
            (state == LISTEN && u16::from_str_radix(p, 16).ok()? == port)
                .then(|| parse_addr(addr))
                .flatten()
        })
        .collect()
}

/// A kernel-formatted address: 32-bit words in hex, each in host (little-endian) byte order.
fn parse_addr(hex: &str) -> Option<IpAddr> {
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_le_bytes())
    };
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(0)?))),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            let v6 = Ipv6Addr::from(bytes);
            Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_tables_parse_to_the_listening_addresses() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue\n   \
                  0: 0100007F:1F90 00000000:0000 0A 00000000:00000000\n   \
                  1: 00000000:1F91 00000000:0000 0A 00000000:00000000\n   \
                  2: 0100007F:1F90 0100007F:A000 01 00000000:00000000\n";
        assert_eq!(parse_table(v4, 0x1F90), [IpAddr::V4(Ipv4Addr::LOCALHOST)]);
        assert_eq!(parse_table(v4, 0x1F91), [IpAddr::V4(Ipv4Addr::UNSPECIFIED)]);
        let v6 = "  sl  local_address                         remote_address                        st\n   \
                  0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A\n";
        assert_eq!(parse_table(v6, 0x1F90), [IpAddr::V6(Ipv6Addr::LOCALHOST)]);
        assert!(parse_table(v6, 1).is_empty());
    }

    #[test]
    fn a_port_this_test_holds_is_found_on_its_address() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        assert_eq!(listening_addresses(port), [IpAddr::V4(Ipv4Addr::LOCALHOST)]);
    }
}
