//! What wakes the reconcile pass, and what says whether it still runs. Both are shared by the
//! pass loop and the HTTP side, which knows nothing else of the reconciler: a join or a
//! report kicks the trigger, `/readyz` reads the pass clock.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

/// Wakes the pass loop; permits coalesce, so a burst of kicks yields one pass.
#[derive(Default)]
pub struct Trigger(Notify);

impl Trigger {
    pub fn kick(&self) {
        self.0.notify_one();
    }

    pub async fn notified(&self) {
        self.0.notified().await
    }
}

/// When the last pass finished, for `/readyz` (docs/behaviour.md#high-availability): a controller whose passes
/// stopped is not ready, so an orchestrator stops sending it traffic and can restart it.
pub struct PassClock {
    finished_ms: AtomicI64,
    limit: Duration,
    /// The number of the pass that began last, and of the last one that committed: what a
    /// pass began after has seen is stored once the second reaches it.
    begun: AtomicU64,
    committed: AtomicU64,
    /// When (ms) the latest CP read whose result a pass has committed began; 0 before the
    /// first (docs/behaviour.md#rolling-out-a-change, `cpReadAt`).
    cp_read_ms: AtomicI64,
}

impl PassClock {
    /// Ready while the last pass finished within 3 × the reconcile period + 30 s.
    pub fn new(reconcile_every: Duration, now_ms: i64) -> PassClock {
        PassClock {
            finished_ms: AtomicI64::new(now_ms),
            limit: 3 * reconcile_every + Duration::from_secs(30),
            begun: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            cp_read_ms: AtomicI64::new(0),
        }
    }

    /// A CP read that began at `began_ms` is reflected: what it brought, a pass committed.
    pub fn cp_read(&self, began_ms: i64) {
        self.cp_read_ms.fetch_max(began_ms, Ordering::SeqCst);
    }

    /// When the latest CP read a pass has committed began, once there is one.
    pub fn cp_read_ms(&self) -> Option<i64> {
        Some(self.cp_read_ms.load(Ordering::SeqCst)).filter(|ms| *ms > 0)
    }

    /// A pass begins; returns its number.
    pub fn begin(&self) -> u64 {
        self.begun.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Pass `n` committed what it decided.
    pub fn committed(&self, n: u64, now_ms: i64) {
        self.committed.fetch_max(n, Ordering::SeqCst);
        self.finished(now_ms);
    }

    /// The number of the pass that began last.
    pub fn last_begun(&self) -> u64 {
        self.begun.load(Ordering::SeqCst)
    }

    /// Waits until a pass numbered above `n` has committed; false after `limit`.
    pub async fn committed_after(&self, n: u64, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        while self.committed.load(Ordering::SeqCst) <= n {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    pub fn finished(&self, now_ms: i64) {
        self.finished_ms.store(now_ms, Ordering::Relaxed);
    }

    /// `Err(age)` when the last pass finished longer ago than the limit.
    pub fn check(&self, now_ms: i64) -> Result<(), Duration> {
        let age = Duration::from_millis((now_ms - self.finished_ms.load(Ordering::Relaxed)).max(0) as u64);
        if age > self.limit {
            Err(age)
        } else {
            Ok(())
        }
    }

    pub fn limit(&self) -> Duration {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pass_clock_is_ready_until_three_periods_and_thirty_seconds_pass() {
        let c = PassClock::new(Duration::from_secs(5), 0);
        assert_eq!(c.limit(), Duration::from_secs(45));
        assert!(c.check(45_000).is_ok());
        assert_eq!(c.check(45_001), Err(Duration::from_millis(45_001)));
        c.finished(40_000);
        assert!(c.check(85_000).is_ok(), "a finished pass makes it ready again");
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_pass_begun_after_counts_as_committed_after() {
        let c = PassClock::new(Duration::from_secs(5), 0);
        let running = c.begin();
        let seen = c.last_begun();
        c.committed(running, 1);
        assert!(!c.committed_after(seen, Duration::from_secs(1)).await, "the pass under way began before");
        let next = c.begin();
        c.committed(next, 2);
        assert!(c.committed_after(seen, Duration::from_secs(1)).await);
    }
}
