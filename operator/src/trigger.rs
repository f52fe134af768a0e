//! What wakes the reconcile pass, and what says whether it still runs. Both are shared by the
//! pass loop and the HTTP side, which knows nothing else of the reconciler: a join or a
//! report kicks the trigger, `/readyz` reads the pass clock.

use std::sync::atomic::{AtomicI64, Ordering};
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
}

impl PassClock {
    /// Ready while the last pass finished within 3 × the reconcile period + 30 s.
    pub fn new(reconcile_every: Duration, now_ms: i64) -> PassClock {
        PassClock { finished_ms: AtomicI64::new(now_ms), limit: 3 * reconcile_every + Duration::from_secs(30) }
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
}
