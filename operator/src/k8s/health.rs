//! Whether the API server answers the mirror, as its log and metrics say (docs/behaviour.md#kubernetes-mirror): one
//! `WARN` line when it stops answering, one `INFO` line when it answers again (how long it was
//! gone, how many calls failed), and the calls in between at `DEBUG` — an API server down for
//! an hour is two lines, not thousands. `fleet_mirror_up` is 1 while the mirror's calls are
//! answered and its checks pass; `fleet_mirror_api_failures_total` counts every failed call.

use crate::metrics::Metrics;
use std::sync::Arc;
use std::time::Instant;

pub struct Health {
    metrics: Arc<Metrics>,
    /// Since when calls fail, and how many have.
    down: Option<(Instant, u64)>,
}

impl Health {
    pub fn new(metrics: Arc<Metrics>) -> Health {
        metrics.mirror_up.set(0);
        Health { metrics, down: None }
    }

    /// A call failed because the server did not answer (or answered as a whole: 5xx, 429).
    pub fn failed(&mut self, what: &str, error: &dyn std::fmt::Display) {
        self.metrics.mirror_api_failures.inc();
        self.metrics.mirror_up.set(0);
        match self.down.as_mut() {
            Some((_, n)) => {
                *n += 1;
                tracing::debug!(%error, "{what} failed again; the mirror keeps retrying");
            }
            None => {
                self.down = Some((Instant::now(), 1));
                tracing::warn!(%error, "the Kubernetes API server does not answer ({what} failed); the mirror retries with \
                    backoff and catches up when it answers again — the fleet goes on without it");
            }
        }
    }

    /// A call was answered: says so once after failures.
    pub fn answered(&mut self) {
        if let Some((since, failed)) = self.down.take() {
            tracing::info!(
                down_s = since.elapsed().as_secs(),
                failed_calls = failed,
                "the Kubernetes API server answers again; the mirror catches up"
            );
        }
        self.metrics.mirror_up.set(1);
    }

    /// The mirror is not mirroring (misconfigured, or this replica does not lead).
    pub fn idle(&self) {
        self.metrics.mirror_up.set(0);
    }

    pub fn is_down(&self) -> bool {
        self.down.is_some()
    }
}

/// The log filter: `RUST_LOG` (default `info`) with kube's own client and watcher logs turned
/// down unless `RUST_LOG` names them — they log every failed connection at `ERROR` and every
/// ended watch at `WARN`, which the mirror says once itself, with what it does about it.
pub fn log_filter(rust_log: Option<&str>) -> String {
    let base = rust_log.map(str::trim).filter(|s| !s.is_empty()).unwrap_or("info");
    if base.contains("kube") {
        base.to_string()
    } else {
        format!("{base},kube_client=off,kube_runtime=error")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubes_own_logs_are_off_unless_asked_for() {
        assert_eq!(log_filter(None), "info,kube_client=off,kube_runtime=error");
        assert_eq!(log_filter(Some("debug")), "debug,kube_client=off,kube_runtime=error");
        assert_eq!(log_filter(Some("info,kube_client=debug")), "info,kube_client=debug");
    }

    #[test]
    fn an_outage_is_counted_and_ends_once() {
        let metrics = Arc::new(Metrics::default());
        let mut h = Health::new(metrics.clone());
        for _ in 0..3 {
            h.failed("listing fleetnodes", &"connection refused");
        }
        assert!(h.is_down());
        assert_eq!(metrics.mirror_api_failures.get(), 3);
        assert_eq!(metrics.mirror_up.get(), 0);
        h.answered();
        assert!(!h.is_down());
        assert_eq!(metrics.mirror_up.get(), 1);
    }
}
