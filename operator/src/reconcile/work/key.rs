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
}

/// When a PAT is due for rotation: less than min(2 days, TTL/3) before expiry. TTL is the
/// lifetime IAM actually granted when that is shorter than the one asked for (IAM may cap).
pub fn rotate_at_ms(c: &Cred, ttl_ms: i64) -> i64 {
    let granted = (c.expires_ms - c.issued_ms).max(0);
    let margin = (2 * 86_400_000i64).min(ttl_ms.min(granted) / 3);
    c.expires_ms - margin
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
        }
    }
}
