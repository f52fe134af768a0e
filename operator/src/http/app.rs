//! What every route shares: the store, the metrics, the reconciler as the HTTP side knows it,
//! the admin-token keys, and the throttle on failed joins.

use super::auth::Jwks;
use super::forward::Forwarder;
use super::limits::MAX_FAILED_JOINS_PER_SECOND;
use crate::metrics::Metrics;
use crate::store::Store;
use crate::trigger::{PassClock, Trigger};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

/// The reconciler as the HTTP side knows it: a trigger to kick, a clock to read, and whether
/// this replica leads (docs/behaviour.md#high-availability).
#[derive(Clone)]
pub struct Reconciler {
    pub trigger: Arc<Trigger>,
    pub pass_clock: Arc<PassClock>,
    pub role: Arc<crate::leader::Role>,
    /// Sends admin reads to the leader while this replica follows.
    pub forward: Forwarder,
    /// This replica's name (`FLEET_REPLICA_NAME`).
    pub replica: String,
}

pub struct App {
    pub store: Arc<Store>,
    pub metrics: Arc<Metrics>,
    /// What the HTTP side sees of the reconciler; `None` in the not-configured mode (no
    /// client credentials), where no pass runs.
    pub reconciler: Option<Reconciler>,
    pub jwks: Arc<Jwks>,
    pub offline_after: Duration,
    failed_joins: Mutex<(u64, u32)>,
}

impl App {
    pub fn new(
        store: Arc<Store>,
        metrics: Arc<Metrics>,
        reconciler: Option<Reconciler>,
        jwks: Arc<Jwks>,
        offline_after: Duration,
    ) -> Arc<App> {
        Arc::new(App { store, metrics, reconciler, jwks, offline_after, failed_joins: Mutex::new((0, 0)) })
    }

    fn second() -> u64 {
        (crate::clock::now_ms() / 1000) as u64
    }

    /// Whether failed joins in this second already reached the limit.
    pub fn joins_throttled(&self) -> bool {
        let g = self.failed_joins.lock();
        g.0 == Self::second() && g.1 >= MAX_FAILED_JOINS_PER_SECOND
    }

    pub fn note_failed_join(&self) {
        let mut g = self.failed_joins.lock();
        let now = Self::second();
        if g.0 != now {
            *g = (now, 0);
        }
        g.1 += 1;
    }

    pub fn kick(&self) {
        if let Some(r) = &self.reconciler {
            r.trigger.kick();
        }
    }
}
