//! The keys of the reconciler's work items, one per object a side call is about, and when a
//! PAT's rotation is due.

use crate::store::{Cred, Id};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum WorkKey {
    /// Ensure the agent's IAM principal exists and the CP knows it.
    Identity(Id),
    /// Ensure the (agent, node) pair has a live PAT sealed to the node; rotate when due.
    Pat(Id, Id),
    /// Revoke one credential once its grace has passed.
    Revoke(Id),
    /// Send the agent's current status to the CP.
    Status(Id),
    /// Find, by their idempotency keys, the PATs of a pair the store does not place but whose
    /// node, ahead of a restored store, runs the agent — and revoke them
    /// (docs/behaviour.md#a-store-older-than-the-fleet).
    Sweep(Id, Id),
}

/// When a PAT is due for rotation: less than min(2 days, TTL/3) before expiry — the
/// rotation window — at a point drawn once per PAT between 100 % and 90 % of that window
/// before expiry (docs/behaviour.md#identity-and-pats), so PATs issued in one pass do not all
/// rotate, and restart their containers, in one pass days later. The draw is a hash of the
/// credential's id: the same on every replica and after a restart, with nothing stored. TTL
/// is the lifetime IAM actually granted when that is shorter than the one asked for (IAM may
/// cap).
pub fn rotate_at_ms(c: &Cred, ttl_ms: i64) -> i64 {
    let granted = (c.expires_ms - c.issued_ms).max(0);
    let window = (2 * 86_400_000i64).min(ttl_ms.min(granted) / 3);
    c.expires_ms - window + spread(&c.id(), window / 10)
}

/// A point in `0..=span` drawn from `id`: FNV-1a, then splitmix64's finaliser so ids that
/// differ in a character or two land far apart; stable across versions and processes.
fn spread(id: &str, span: i64) -> i64 {
    if span <= 0 {
        return 0;
    }
    let mut h = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    (h % (span as u64 + 1)) as i64
}

/// When a freshly issued PAT's rotation is scheduled: at its rotation instant, but not within
/// a second of its issue (a PAT IAM granted for less than that would be reissued in a loop).
pub fn first_rotation_ms(c: &Cred, ttl_ms: i64) -> i64 {
    rotate_at_ms(c, ttl_ms).max(c.issued_ms + 1000)
}

impl WorkKey {
    /// The kind, as the work metrics and spans name it.
    pub fn kind(&self) -> &'static str {
        match self {
            WorkKey::Identity(_) => "identity",
            WorkKey::Pat(..) => "pat",
            WorkKey::Revoke(_) => "revoke",
            WorkKey::Status(_) => "status",
            WorkKey::Sweep(..) => "sweep",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Sealed;

    fn cred(id: &str, issued_ms: i64, expires_ms: i64) -> Cred {
        Cred {
            sealed: Sealed::stored(id),
            n: 1,
            principal_id: "p".into(),
            expires_ms,
            issued_ms,
            revoke_ms: crate::store::MaybeMs::NONE,
        }
    }

    /// PATs issued together rotate spread over the last tenth of their window, each at a
    /// point of its own that does not move between calls.
    #[test]
    fn pats_issued_together_rotate_spread_over_a_tenth_of_their_window() {
        let week = 7 * 86_400_000i64;
        let window = 2 * 86_400_000i64;
        let due: Vec<i64> = (0..1000).map(|i| rotate_at_ms(&cred(&format!("cred_{i:032x}"), 0, week), week)).collect();
        assert!(
            due.iter().all(|d| (week - window..=week - window * 9 / 10).contains(d)),
            "inside the window's first tenth"
        );
        let (lo, hi) = (*due.iter().min().unwrap(), *due.iter().max().unwrap());
        assert!(hi - lo > window / 10 * 9 / 10, "spread over the tenth: {}", hi - lo);
        // 4.8 hours for 1,000 PATs: their restarts fall in nearly as many seconds.
        let distinct: std::collections::HashSet<i64> = due.iter().map(|d| d / 1000).collect();
        assert!(distinct.len() > 900, "not all at once: {} distinct seconds", distinct.len());
        let c = cred("cred_a", 0, week);
        assert_eq!(rotate_at_ms(&c, week), rotate_at_ms(&c, week), "drawn once");
        // A PAT IAM granted for an hour: its window is 20 minutes, spread over two.
        let short = rotate_at_ms(&cred("cred_b", 0, 3_600_000), week);
        assert!((2_400_000..=2_520_000).contains(&short), "{short}");
    }
}
