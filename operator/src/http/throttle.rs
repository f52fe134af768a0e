//! The throttle on failed joins (docs/behaviour.md#joining): at most
//! [`MAX_FAILED_JOINS_PER_SECOND`] a second per client address, so a stranger guessing join
//! keys from one address is answered `429` while a node joining from another is not. IPv6
//! clients count by their /64, which one host usually holds whole. Only the current second is
//! kept; past [`MAX_ADDRESSES`] addresses in one second, the rest share one count.

use super::limits::MAX_FAILED_JOINS_PER_SECOND;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::net::IpAddr;

/// Addresses counted apart within one second.
const MAX_ADDRESSES: usize = 4096;

/// The bucket of an address: itself, its /64 for IPv6, or the shared one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Bucket {
    V4(u32),
    V6(u64),
    Shared,
}

fn bucket(ip: Option<IpAddr>) -> Bucket {
    match ip {
        Some(IpAddr::V4(v4)) => Bucket::V4(v4.into()),
        Some(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => Bucket::V4(v4.into()),
            None => Bucket::V6((u128::from(v6) >> 64) as u64),
        },
        None => Bucket::Shared,
    }
}

#[derive(Default)]
pub struct JoinThrottle {
    /// The second counted and the failed joins in it per bucket.
    failed: Mutex<(u64, FxHashMap<Bucket, u32>)>,
}

impl JoinThrottle {
    /// Whether failed joins from `client` in second `now` already reached the limit.
    pub fn throttled(&self, client: Option<IpAddr>, now: u64) -> bool {
        let g = self.failed.lock();
        g.0 == now && g.1.get(&Self::key(&g.1, bucket(client))).is_some_and(|n| *n >= MAX_FAILED_JOINS_PER_SECOND)
    }

    pub fn note_failed(&self, client: Option<IpAddr>, now: u64) {
        let mut g = self.failed.lock();
        if g.0 != now {
            g.0 = now;
            g.1.clear();
        }
        let key = Self::key(&g.1, bucket(client));
        *g.1.entry(key).or_insert(0) += 1;
    }

    /// `b`, or the shared bucket once the second's map is full.
    fn key(counts: &FxHashMap<Bucket, u32>, b: Bucket) -> Bucket {
        if counts.len() >= MAX_ADDRESSES && !counts.contains_key(&b) {
            Bucket::Shared
        } else {
            b
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn failed_joins_count_per_address_and_second() {
        let t = JoinThrottle::default();
        for _ in 0..MAX_FAILED_JOINS_PER_SECOND {
            assert!(!t.throttled(ip("10.0.0.1"), 7));
            t.note_failed(ip("10.0.0.1"), 7);
        }
        assert!(t.throttled(ip("10.0.0.1"), 7));
        assert!(!t.throttled(ip("10.0.0.2"), 7), "another address is not throttled");
        assert!(!t.throttled(ip("10.0.0.1"), 8), "a new second");
    }

    #[test]
    fn ipv6_counts_by_its_64() {
        let t = JoinThrottle::default();
        for i in 0..MAX_FAILED_JOINS_PER_SECOND {
            t.note_failed(ip(&format!("2001:db8:0:1::{i:x}")), 1);
        }
        assert!(t.throttled(ip("2001:db8:0:1::ffff"), 1));
        assert!(!t.throttled(ip("2001:db8:0:2::1"), 1));
    }
}
