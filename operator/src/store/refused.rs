//! Node tokens recently refused (docs/behaviour.md#hardening). With several replicas an
//! unknown token is looked up in the database (the node may have joined on another replica a
//! moment ago); a token that matched no node there is remembered for [`REMEMBER`], so a
//! stranger repeating it costs no query, and at most [`LOOKUPS`] look-ups run at once, so a
//! flood of distinct bad tokens waits its turn instead of taking the pool's connections.
//!
//! Remembering a refusal is safe: a token exists only once its join committed, and a join
//! answers the node only then, so a token refused now was refused by every replica.

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, SemaphorePermit};

/// How long a refused token is answered without asking the database again.
pub const REMEMBER: Duration = Duration::from_secs(10);
/// Refused tokens remembered at most (48 bytes each): past it the expired ones go, and when a
/// flood of distinct tokens left none expired, all of them (each cost a query anyway).
const MOST: usize = 10_000;
/// Database look-ups of unknown tokens at once.
pub const LOOKUPS: usize = 4;

pub struct RefusedTokens {
    /// Token hash → when it was refused.
    seen: Mutex<FxHashMap<[u8; 32], Instant>>,
    lookups: Semaphore,
}

impl Default for RefusedTokens {
    fn default() -> Self {
        RefusedTokens { seen: Mutex::default(), lookups: Semaphore::new(LOOKUPS) }
    }
}

impl RefusedTokens {
    /// Whether this token hash was refused within [`REMEMBER`].
    pub fn refused_recently(&self, hash: &[u8; 32], now: Instant) -> bool {
        self.seen.lock().get(hash).is_some_and(|at| now.duration_since(*at) < REMEMBER)
    }

    pub fn remember(&self, hash: [u8; 32], now: Instant) {
        let mut seen = self.seen.lock();
        if seen.len() >= MOST {
            seen.retain(|_, at| now.duration_since(*at) < REMEMBER);
            if seen.len() >= MOST {
                seen.clear();
            }
        }
        seen.insert(hash, now);
    }

    /// A turn to look a token up in the database; waits while [`LOOKUPS`] others run.
    pub async fn turn(&self) -> Option<SemaphorePermit<'_>> {
        self.lookups.acquire().await.ok()
    }

    /// How many refused tokens are remembered (for tests and the size bound).
    pub fn len(&self) -> usize {
        self.seen.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_remembered_for_ten_seconds_and_the_memory_is_bounded() {
        let r = RefusedTokens::default();
        let t0 = Instant::now();
        r.remember([1; 32], t0);
        assert!(r.refused_recently(&[1; 32], t0 + Duration::from_secs(9)));
        assert!(!r.refused_recently(&[1; 32], t0 + REMEMBER));
        assert!(!r.refused_recently(&[2; 32], t0));
        for i in 0..(MOST as u32 + 5) {
            let mut h = [0; 32];
            h[..4].copy_from_slice(&i.to_le_bytes());
            r.remember(h, t0);
        }
        assert!(r.len() <= MOST, "{}", r.len());
    }
}
