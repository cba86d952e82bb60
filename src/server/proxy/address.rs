//! Where a proxy may connect: the host it picks from a server address, and the addresses it
//! refuses. A client names any destination in `PRXY`, so without these checks the relay would
//! open connections into its own host and network (loopback, private and link-local ranges, cloud
//! metadata at 169.254.169.254) on a stranger's behalf. Every address a name resolves to is
//! checked before any packet is sent; a refusal is `PROXY BROKER HOST`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The host a proxy connects to for a server address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Ip(IpAddr),
    /// A DNS name, resolved off the shard.
    Name(String),
    /// A Tor hidden service, only reachable through the SOCKS proxy.
    Onion(String),
}

/// The reference's `chooseTransportHost` with `host_mode = public` (its proxy default): the first
/// host that is not `.onion`, else the first host. `None` for an empty list.
pub fn choose_host(hosts: &[String]) -> Option<Target> {
    let parsed: Vec<Target> = hosts.iter().map(|h| parse_host(h)).collect();
    let public = parsed.iter().position(|t| !matches!(t, Target::Onion(_)));
    let i = public.unwrap_or(0);
    parsed.into_iter().nth(i)
}

/// An IP literal (IPv6 with or without brackets), a `.onion` name, or a DNS name.
pub fn parse_host(host: &str) -> Target {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Target::Ip(ip);
    }
    let lower = host.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    if name.ends_with(".onion") {
        Target::Onion(name.to_string())
    } else {
        Target::Name(name.to_string())
    }
}

/// True for addresses a proxy must not connect to unless private destinations are allowed:
/// anything that is not a globally routed unicast address.
pub fn is_forbidden(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_forbidden_v4(v4),
        IpAddr::V6(v6) => is_forbidden_v6(v6),
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

/// IPv4 special-purpose ranges (IANA registry, RFC 6890 and successors) plus multicast and the
/// reserved 240/4.
fn is_forbidden_v4(ip: Ipv4Addr) -> bool {
    const RANGES: &[([u8; 4], u32)] = &[
        ([0, 0, 0, 0], 8),       // "this network"
        ([10, 0, 0, 0], 8),      // private
        ([100, 64, 0, 0], 10),   // shared address space (carrier-grade NAT)
        ([127, 0, 0, 0], 8),     // loopback
        ([169, 254, 0, 0], 16),  // link-local (cloud metadata services live here)
        ([172, 16, 0, 0], 12),   // private
        ([192, 0, 0, 0], 24),    // IETF protocol assignments
        ([192, 0, 2, 0], 24),    // documentation
        ([192, 88, 99, 0], 24),  // 6to4 relay anycast (deprecated)
        ([192, 168, 0, 0], 16),  // private
        ([198, 18, 0, 0], 15),   // benchmarking
        ([198, 51, 100, 0], 24), // documentation
        ([203, 0, 113, 0], 24),  // documentation
        ([224, 0, 0, 0], 4),     // multicast
        ([240, 0, 0, 0], 4),     // reserved, and the broadcast address
    ];
    RANGES.iter().any(|&(net, p)| in_v4(ip, net, p))
}

fn in_v6(ip: Ipv6Addr, net: [u16; 8], prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix)
    };
    u128::from(ip) & mask == u128::from(Ipv6Addr::from(net)) & mask
}

/// The IPv4 address carried in the low 32 bits.
fn low_v4(ip: Ipv6Addr) -> Ipv4Addr {
    Ipv4Addr::from((u128::from(ip) & 0xffff_ffff) as u32)
}

/// IPv6 special-purpose ranges; forms that carry an IPv4 address (mapped, NAT64, 6to4) are judged
/// by that address, since that is where the packets end up.
fn is_forbidden_v6(ip: Ipv6Addr) -> bool {
    // ::ffff:a.b.c.d (IPv4-mapped): a socket connects to a.b.c.d.
    if in_v6(ip, [0, 0, 0, 0, 0, 0xffff, 0, 0], 96) {
        return is_forbidden_v4(low_v4(ip));
    }
    // 64:ff9b::/96 (well-known NAT64 prefix) reaches the embedded IPv4 address.
    if in_v6(ip, [0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96) {
        return is_forbidden_v4(low_v4(ip));
    }
    // 2002::/16 (6to4) embeds the IPv4 address in bits 16..48.
    if in_v6(ip, [0x2002, 0, 0, 0, 0, 0, 0, 0], 16) {
        let v4 = ((u128::from(ip) >> 80) & 0xffff_ffff) as u32;
        return is_forbidden_v4(Ipv4Addr::from(v4));
    }
    const RANGES: &[([u16; 8], u32)] = &[
        ([0, 0, 0, 0, 0, 0, 0, 0], 96), // ::, ::1 and the deprecated IPv4-compatible ::/96
        ([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48), // local-use NAT64
        ([0x100, 0, 0, 0, 0, 0, 0, 0], 64), // discard-only
        ([0x2001, 0, 0, 0, 0, 0, 0, 0], 23), // IETF protocol assignments (Teredo, ORCHID, …)
        ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32), // documentation
        ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20), // documentation
        ([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16), // segment routing SIDs
        ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), // unique local
        ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), // link-local
        ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10), // site-local (deprecated)
        ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), // multicast
    ];
    RANGES.iter().any(|&(net, p)| in_v6(ip, net, p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden(s: &str) -> bool {
        is_forbidden(s.parse().unwrap())
    }

    #[test]
    fn ipv4_special_ranges_are_refused() {
        for a in [
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "10.255.255.255",
            "100.64.0.1",
            "100.127.255.255",
            "127.0.0.1",
            "127.255.255.254",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "192.88.99.1",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
        ] {
            assert!(forbidden(a), "{a} must be refused");
        }
    }

    #[test]
    fn ipv4_public_addresses_pass() {
        for a in [
            "1.1.1.1",
            "8.8.8.8",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "128.0.0.1",
            "169.253.255.255",
            "169.255.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.1",
            "192.167.255.255",
            "192.169.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
        ] {
            assert!(!forbidden(a), "{a} is public");
        }
    }

    #[test]
    fn ipv6_special_ranges_are_refused() {
        for a in [
            "::",
            "::1",
            "::127.0.0.1",
            "::8.8.8.8",
            "::ffff:127.0.0.1",
            "::ffff:10.1.2.3",
            "::ffff:169.254.169.254",
            "::ffff:0.0.0.0",
            "64:ff9b::127.0.0.1",
            "64:ff9b::192.168.0.1",
            "64:ff9b:1::1",
            "100::1",
            "2001::1",
            "2001:db8::1",
            "2002:7f00:1::1",
            "2002:c0a8:101::1",
            "3fff::1",
            "5f00::1",
            "fc00::1",
            "fd12:3456:789a::1",
            "fe80::1",
            "febf:ffff::1",
            "fec0::1",
            "ff02::1",
        ] {
            assert!(forbidden(a), "{a} must be refused");
        }
    }

    #[test]
    fn ipv6_public_addresses_pass() {
        for a in [
            "2606:4700:4700::1111",
            "2a00:1450:4001:80b::200e",
            "::ffff:8.8.8.8",
            "64:ff9b::8.8.8.8",
            "2002:0808:0808::1",
            "2001:200::1",
            "fbff::1",
            "fe00::1",
        ] {
            assert!(!forbidden(a), "{a} is public");
        }
    }

    #[test]
    fn hosts_parse_as_ip_onion_or_name() {
        assert_eq!(parse_host("127.0.0.1"), Target::Ip([127, 0, 0, 1].into()));
        assert_eq!(parse_host("[::1]"), Target::Ip("::1".parse().unwrap()));
        assert_eq!(parse_host("::1"), Target::Ip("::1".parse().unwrap()));
        assert_eq!(
            parse_host("Abc.ONION"),
            Target::Onion("abc.onion".to_string())
        );
        assert_eq!(
            parse_host("abc.onion."),
            Target::Onion("abc.onion".to_string())
        );
        assert_eq!(
            parse_host("Smp.Example.com"),
            Target::Name("smp.example.com".to_string())
        );
        // A name that only looks like an address is still a name.
        assert_eq!(
            parse_host("127.0.0.1.nip.io"),
            Target::Name("127.0.0.1.nip.io".to_string())
        );
    }

    #[test]
    fn the_first_public_host_is_chosen_else_the_onion() {
        let hosts = |hs: &[&str]| hs.iter().map(|h| h.to_string()).collect::<Vec<_>>();
        assert_eq!(
            choose_host(&hosts(&["x.onion", "smp.example.com", "1.2.3.4"])),
            Some(Target::Name("smp.example.com".to_string()))
        );
        assert_eq!(
            choose_host(&hosts(&["x.onion", "y.onion"])),
            Some(Target::Onion("x.onion".to_string()))
        );
        assert_eq!(choose_host(&[]), None);
    }
}
