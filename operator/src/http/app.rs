//! What every route shares: the store, the metrics, the reconciler as the HTTP side knows it,
//! the admin-token keys, the throttle on failed joins, the budget for strangers' buffers and
//! the proxies whose `X-Forwarded-For` is believed.

use super::auth::Jwks;
use super::forward::Forwarder;
use super::peers::TrustedProxies;
use super::strangers::Strangers;
use super::throttle::JoinThrottle;
use crate::metrics::Metrics;
use crate::store::Store;
use crate::trigger::{PassClock, Trigger};
use std::net::IpAddr;
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
    /// The rollout policy's defaults (`FLEET_ROLLOUT_*`), for the view of an agent at rest.
    pub rollout_defaults: fleet_api::rollout::RolloutDefaults,
}

pub struct App {
    pub store: Arc<Store>,
    pub metrics: Arc<Metrics>,
    /// What the HTTP side sees of the reconciler; `None` in the not-configured mode (no
    /// client credentials), where no pass runs.
    pub reconciler: Option<Reconciler>,
    pub jwks: Arc<Jwks>,
    pub offline_after: Duration,
    /// Where unauthenticated buffers of the API port come from (`FLEET_UNAUTH_BUFFER_BYTES`).
    pub strangers: Arc<Strangers>,
    /// `FLEET_TRUSTED_PROXIES`.
    pub proxies: TrustedProxies,
    failed_joins: JoinThrottle,
}

/// What guards the API port against clients without credentials (docs/behaviour.md#hardening).
pub struct Guards {
    pub strangers: Arc<Strangers>,
    pub proxies: TrustedProxies,
}

impl App {
    pub fn new(
        store: Arc<Store>,
        metrics: Arc<Metrics>,
        reconciler: Option<Reconciler>,
        jwks: Arc<Jwks>,
        offline_after: Duration,
        guards: Guards,
    ) -> Arc<App> {
        let Guards { strangers, proxies } = guards;
        let failed_joins = JoinThrottle::default();
        Arc::new(App { store, metrics, reconciler, jwks, offline_after, strangers, proxies, failed_joins })
    }

    fn second() -> u64 {
        (crate::clock::now_ms() / 1000) as u64
    }

    /// Whether failed joins from `client` in this second already reached the limit.
    pub fn joins_throttled(&self, client: Option<IpAddr>) -> bool {
        self.failed_joins.throttled(client, Self::second())
    }

    pub fn note_failed_join(&self, client: Option<IpAddr>) {
        self.failed_joins.note_failed(client, Self::second())
    }

    pub fn kick(&self) {
        if let Some(r) = &self.reconciler {
            r.trigger.kick();
        }
    }
}
