//! Outgoing calls fenced by the lease (docs/behaviour.md#high-availability): on PostgreSQL the
//! leader calls IAM, the CP or the Kubernetes API only while its lease surely runs — by its own
//! monotonic clock since the last renewal, for at least the call's timeout — and while its
//! lock's session answered a moment ago. A replica not sure that it leads calls nothing, so a
//! leader paused past its lease wakes silent. Every call names the replica that made it
//! (`x-fleet-replica`) and when the gate let it start (`x-fleet-call-at`, milliseconds since
//! the Unix epoch, to the microsecond), for the platform's logs.

use super::error::PlatformError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest any outgoing call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// A call is not started with less lease than this left.
pub const MIN_CALL: Duration = Duration::from_secs(2);
/// A call is started only this soon after the leader's lock was last seen held.
pub const LOCK_FRESH: Duration = Duration::from_millis(750);

/// How often a waiting worker looks at the gate again (the lock is checked every 250 ms).
const OPEN_POLL: Duration = Duration::from_millis(20);

/// Whether this replica may call out now, and for how long.
#[derive(Debug)]
pub struct CallGate {
    replica: String,
    /// SQLite: the one replica always leads.
    always: bool,
    base: Instant,
    /// Milliseconds after `base` until which the lease surely runs; 0: closed.
    lease_until: AtomicU64,
    /// Milliseconds after `base` when the lock's session last answered.
    lock_seen: AtomicU64,
}

impl CallGate {
    /// The only replica (SQLite): every call may be made.
    pub fn always(replica: &str) -> Arc<CallGate> {
        Arc::new(CallGate::new(replica, true))
    }

    /// A replica on PostgreSQL: closed until a term opens it.
    pub fn leased(replica: &str) -> Arc<CallGate> {
        Arc::new(CallGate::new(replica, false))
    }

    fn new(replica: &str, always: bool) -> CallGate {
        // Well before any instant the leader records (a renewal sent a moment ago).
        let now = Instant::now();
        let base = now.checked_sub(Duration::from_secs(3600)).unwrap_or(now);
        CallGate {
            replica: replica.to_string(),
            always,
            base,
            lease_until: AtomicU64::new(0),
            lock_seen: AtomicU64::new(0),
        }
    }

    fn ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_millis() as u64 + 1
    }

    /// The lease runs surely until `until` (a renewal sent at `s` runs to `s + TTL`).
    pub fn lease_runs_until(&self, until: Instant) {
        self.lease_until.store(self.ms(until), Ordering::SeqCst);
    }

    /// The lock's session answered at `at`.
    pub fn lock_seen(&self, at: Instant) {
        self.lock_seen.store(self.ms(at), Ordering::SeqCst);
    }

    /// The term ended: nothing more is called.
    pub fn close(&self) {
        self.lease_until.store(0, Ordering::SeqCst);
        self.lock_seen.store(0, Ordering::SeqCst);
    }

    /// The timeout a call starting now may have, or why it may not start.
    pub fn permit(&self, service: &'static str) -> Result<Duration, PlatformError> {
        if self.always {
            return Ok(CALL_TIMEOUT);
        }
        let now = self.ms(Instant::now());
        let lease_left = Duration::from_millis(self.lease_until.load(Ordering::SeqCst).saturating_sub(now));
        let lock_age = Duration::from_millis(now.saturating_sub(self.lock_seen.load(Ordering::SeqCst)));
        if lease_left < MIN_CALL || lock_age > LOCK_FRESH {
            return Err(PlatformError::NotLeading { service });
        }
        Ok(lease_left.min(CALL_TIMEOUT))
    }

    /// Returns once a call could start: a leader's workers wait out a lock check that came
    /// late (a busy moment) here, where calling at once would fail every queued item together
    /// and send each into its backoff. Never returns on a replica that does not lead; its
    /// workers run only in a term and end with it.
    pub async fn opened(&self) {
        while self.permit("any").is_err() {
            tokio::time::sleep(OPEN_POLL).await;
        }
    }

    /// `req` with the timeout the gate allows and this replica's name, or why it is not sent.
    pub fn admit(
        &self,
        service: &'static str,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::RequestBuilder, PlatformError> {
        let timeout = self.permit(service)?;
        let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_micros();
        let at = format!("{}.{:03}", at / 1000, at % 1000);
        Ok(req.timeout(timeout).header("x-fleet-replica", &self.replica).header("x-fleet-call-at", at))
    }
}

/// [`CallGate::admit`] in a request's builder chain.
pub trait Gated: Sized {
    fn gated(self, gate: &CallGate, service: &'static str) -> Result<Self, PlatformError>;
}

impl Gated for reqwest::RequestBuilder {
    fn gated(self, gate: &CallGate, service: &'static str) -> Result<Self, PlatformError> {
        gate.admit(service, self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_go_out_only_inside_the_lease_with_the_lock_fresh() {
        let g = CallGate::leased("r1");
        assert_eq!(g.permit("CP"), Err(PlatformError::NotLeading { service: "CP" }), "closed until a term");
        let now = Instant::now();
        g.lease_runs_until(now + Duration::from_secs(15));
        g.lock_seen(now);
        let t = g.permit("CP").unwrap();
        assert!(
            t <= Duration::from_secs(15) && t > Duration::from_secs(14),
            "the call's timeout fits the lease: {t:?}"
        );
        g.lease_runs_until(now + Duration::from_millis(1500));
        assert!(g.permit("CP").is_err(), "too little lease left to start a call");
        g.lease_runs_until(now + Duration::from_secs(60));
        assert_eq!(g.permit("IAM").unwrap(), CALL_TIMEOUT, "never longer than the client's timeout");
        g.lock_seen(now - Duration::from_secs(1));
        assert!(g.permit("IAM").is_err(), "the lock not seen lately");
        g.lock_seen(now);
        g.close();
        assert!(g.permit("IAM").is_err(), "closed when the term ends");
        assert_eq!(CallGate::always("one").permit("CP").unwrap(), CALL_TIMEOUT);
    }

    #[tokio::test]
    async fn a_worker_waits_for_the_gate_to_open() {
        let g = Arc::new(CallGate::leased("r1"));
        let now = Instant::now();
        g.lease_runs_until(now + Duration::from_secs(15));
        g.lock_seen(now - Duration::from_secs(1));
        let waiting = tokio::spawn({
            let g = g.clone();
            async move { g.opened().await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "the lock was not seen lately: it waits");
        g.lock_seen(Instant::now());
        tokio::time::timeout(Duration::from_secs(2), waiting).await.expect("open once the lock answered").unwrap();
    }

    #[test]
    fn an_admitted_call_names_its_replica_and_when_it_was_let_start() {
        let g = CallGate::always("r7");
        let ms =
            || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as f64 / 1e3;
        let before = ms();
        let req = g.admit("CP", reqwest::Client::new().get("http://cp.invalid/")).unwrap().build().unwrap();
        let after = ms();
        assert_eq!(req.headers()["x-fleet-replica"], "r7");
        let at = req.headers()["x-fleet-call-at"].to_str().unwrap();
        assert_eq!(at.split('.').nth(1).map(str::len), Some(3), "to the microsecond: {at}");
        let at: f64 = at.parse().unwrap();
        assert!(before <= at && at <= after, "{before} <= {at} <= {after}");
        assert_eq!(req.timeout(), Some(&CALL_TIMEOUT));
    }
}
