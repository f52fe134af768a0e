//! Who a client is, by address (docs/behaviour.md#hardening): the peer of the TCP connection,
//! or behind a proxy of `FLEET_TRUSTED_PROXIES` the last address of `X-Forwarded-For` that is
//! not itself a trusted proxy; and `FLEET_MAX_CONNECTIONS_PER_IP`, the connections one
//! address may hold at once where nodes connect directly.

use crate::cidr::canonical;
pub use crate::cidr::Cidr;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::net::IpAddr;
use std::sync::Arc;

/// The proxies of `FLEET_TRUSTED_PROXIES`, whose `X-Forwarded-For` is believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<Cidr>);

impl TrustedProxies {
    pub fn new(blocks: Vec<Cidr>) -> TrustedProxies {
        TrustedProxies(blocks)
    }

    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|c| c.contains(ip))
    }

    /// The client behind `peer`: the peer itself unless it is trusted; then the last address
    /// of `forwarded` (every `X-Forwarded-For` value, in order, comma-joined) that is not
    /// trusted — or the first one when all are. An entry that is not an address ends the
    /// walk there: what is left of it was written by someone not trusted.
    pub fn client(&self, peer: IpAddr, forwarded: Option<&str>) -> IpAddr {
        let peer = canonical(peer);
        let Some(forwarded) = forwarded.filter(|_| self.trusts(peer)) else { return peer };
        let mut client = peer;
        for entry in forwarded.rsplit(',') {
            let Some(ip) = forwarded_address(entry) else { return client };
            client = canonical(ip);
            if !self.trusts(client) {
                return client;
            }
        }
        client
    }
}

/// An `X-Forwarded-For` entry: an address, maybe with a port (`1.2.3.4:5`, `[::1]:5`).
fn forwarded_address(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim();
    if let Ok(ip) = entry.parse() {
        return Some(ip);
    }
    if let Ok(sa) = entry.parse::<std::net::SocketAddr>() {
        return Some(sa.ip());
    }
    None
}

/// Connections open per client address, at most `max` each (`FLEET_MAX_CONNECTIONS_PER_IP`).
pub struct PerAddress {
    max: u32,
    open: Mutex<FxHashMap<IpAddr, u32>>,
}

impl PerAddress {
    pub fn new(max: u32) -> Arc<PerAddress> {
        Arc::new(PerAddress { max, open: Mutex::new(FxHashMap::default()) })
    }

    /// A slot for one more connection from `ip`; `None` when it holds `max` already.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<AddressSlot> {
        let ip = canonical(ip);
        let mut open = self.open.lock();
        let n = open.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(AddressSlot { of: self.clone(), ip })
    }
}

/// One connection counted against its address; released when dropped.
pub struct AddressSlot {
    of: Arc<PerAddress>,
    ip: IpAddr,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self.of.open.lock();
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn blocks_parse_and_contain() {
        let c = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(c.contains(ip("10.1.200.3")));
        assert!(!c.contains(ip("10.2.0.1")));
        assert!(c.contains(ip("::ffff:10.1.0.9")), "IPv4-mapped");
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        assert!(Cidr::parse("127.0.0.1").unwrap().contains(ip("127.0.0.1")));
        assert!(!Cidr::parse("127.0.0.1").unwrap().contains(ip("127.0.0.2")));
        assert!(Cidr::parse("fd00::/8").unwrap().contains(ip("fd12::1")));
        for bad in ["10.0.0.0/33", "10.0.0.0/", "10.0.0.0/+8", "nope", "::/129"] {
            assert_eq!(Cidr::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_client_is_the_last_untrusted_forwarded_address_behind_a_trusted_peer() {
        let t = TrustedProxies::new(vec![Cidr::parse("10.0.0.0/8").unwrap()]);
        let proxy = ip("10.0.0.5");
        assert_eq!(t.client(proxy, Some("1.1.1.1, 2.2.2.2, 10.0.0.7")), ip("2.2.2.2"));
        assert_eq!(t.client(proxy, Some("2.2.2.2:4711")), ip("2.2.2.2"));
        assert_eq!(t.client(proxy, None), proxy, "no header: the proxy itself");
        assert_eq!(t.client(proxy, Some("10.0.0.8, 10.0.0.9")), ip("10.0.0.8"), "all trusted: the first");
        assert_eq!(t.client(proxy, Some("1.1.1.1, garbage")), proxy, "a forged entry ends the walk");
        assert_eq!(t.client(ip("3.3.3.3"), Some("1.1.1.1")), ip("3.3.3.3"), "an untrusted peer's header is ignored");
    }

    #[test]
    fn an_address_holds_at_most_its_share() {
        let p = PerAddress::new(2);
        let a = p.admit(ip("1.1.1.1")).unwrap();
        let _b = p.admit(ip("1.1.1.1")).unwrap();
        assert!(p.admit(ip("1.1.1.1")).is_none());
        assert!(p.admit(ip("1.1.1.2")).is_some(), "another address has its own");
        drop(a);
        assert!(p.admit(ip("1.1.1.1")).is_some());
    }
}
