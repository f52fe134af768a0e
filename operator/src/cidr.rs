//! CIDR blocks (docs/behaviour.md#hardening): the addresses of `FLEET_TRUSTED_PROXIES`, read by
//! the configuration and matched by the HTTP side.

use std::net::IpAddr;

/// One CIDR block (`10.0.0.0/8`, `fd00::/8`, or one address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    bits: u8,
}

impl Cidr {
    /// `addr/bits` or a bare address.
    pub fn parse(s: &str) -> Option<Cidr> {
        let (addr, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let net: IpAddr = addr.trim().parse().ok()?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            Some(b) if !b.is_empty() && b.bytes().all(|c| c.is_ascii_digit()) => b.parse::<u8>().ok()?,
            Some(_) => return None,
            None => max,
        };
        (bits <= max).then_some(Cidr { net, bits })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, canonical(ip)) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix(u32::from(n).into(), u32::from(a).into(), 32, self.bits),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix(u128::from(n), u128::from(a), 128, self.bits),
            _ => false,
        }
    }
}

/// Whether the top `bits` of two `width`-bit numbers agree.
fn prefix(net: u128, addr: u128, width: u32, bits: u8) -> bool {
    let shift = width - u32::from(bits);
    shift >= width || (net >> shift) == (addr >> shift)
}

/// An IPv4 address mapped into IPv6 (a dual-stack listener) is the IPv4 address.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}
