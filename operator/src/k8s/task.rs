//! The mirror's task (docs/behaviour.md#kubernetes-mirror). It runs beside the leader's work,
//! never inside it: the pass, PATs, statuses and the lease never wait for the API server, and
//! an API server that is down, refuses, or was never set up costs the fleet nothing.
//!
//! - At process start — on every replica, leader or not, so HA and a single replica say the
//!   same — it checks the cluster (`check`). A misconfiguration is one `ERROR` line naming the
//!   fix; the controller runs on without the mirror and checks again every [`RECHECK`], and
//!   mirrors once it is fixed. A server that does not answer is retried on a backoff.
//! - While this replica leads it watches this fleet's objects and, every [`SYNC_PERIOD`],
//!   writes what differs from the store (`mirror`); when it stops leading it forgets what it
//!   believed and stops watching. A cluster that refuses the mirror as a whole meanwhile (its
//!   CRDs deleted, RBAC withdrawn) sends it back to the check.

use super::check::{check, CheckError};
use super::desired;
use super::health::Health;
use super::kind::Kind;
use super::mirror::Mirror;
use super::watch::{events, Watched};
use crate::config::KubernetesConfig;
use crate::leader::Role;
use crate::metrics::Metrics;
use crate::platform::CallGate;
use crate::store::Store;
use futures::stream::{BoxStream, SelectAll};
use futures::StreamExt;
use kube::Client;
use std::sync::Arc;
use std::time::Duration;

/// How often the mirror compares the store with what it believes the API server shows.
pub const SYNC_PERIOD: Duration = Duration::from_secs(2);
/// How often a misconfigured mirror checks again.
pub const RECHECK: Duration = Duration::from_secs(10);
/// The longest wait between checks of a server that does not answer.
const UNANSWERED_MAX: Duration = Duration::from_secs(8);

/// What the task needs.
pub struct Setup {
    pub cfg: KubernetesConfig,
    pub store: Arc<Store>,
    pub role: Arc<Role>,
    pub gate: Arc<CallGate>,
    pub metrics: Arc<Metrics>,
    pub offline_after: Duration,
}

/// The client for the cluster the configuration names, and the namespace the mirrors live in.
pub async fn connect(cfg: &KubernetesConfig) -> Result<(Client, String, String), String> {
    let config = kube::Config::infer().await.map_err(|e| {
        format!("no Kubernetes client configuration (the pod's ServiceAccount, or a kubeconfig in KUBECONFIG): {e}")
    })?;
    let namespace = cfg.namespace.clone().unwrap_or_else(|| config.default_namespace.clone());
    let url = config.cluster_url.to_string().trim_end_matches('/').to_string();
    let client = Client::try_from(config).map_err(|e| format!("cannot build the Kubernetes client: {e}"))?;
    Ok((client, namespace, url))
}

/// Runs the mirror for as long as the process runs.
pub async fn run(s: Setup) {
    let fleet_id = fleet_id(&s).await;
    let mut health = Health::new(s.metrics.clone());
    let mut said: Option<String> = None;
    let mut refusal: Option<String> = None;
    let mut wait = Duration::from_millis(500);
    loop {
        let (client, namespace, url) = match ready(&s.cfg, &mut health).await {
            Ok(ready) => ready,
            Err(CheckError::Misconfigured(why)) => {
                if said.as_deref() != Some(why.as_str()) {
                    tracing::error!(
                        "the Kubernetes mirror is off (FLEET_KUBERNETES_MIRROR=true): {why}; the fleet runs \
                        without it, and it checks again every {} s",
                        RECHECK.as_secs()
                    );
                    said = Some(why);
                }
                tokio::time::sleep(RECHECK).await;
                continue;
            }
            Err(CheckError::Unreachable(why)) => {
                health.failed("the mirror's start-up check", &why);
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(UNANSWERED_MAX);
                continue;
            }
        };
        wait = Duration::from_millis(500);
        said = None;
        health.answered();
        tracing::info!(%namespace, server = %url, fleet = %fleet_id, "Kubernetes mirror on: FleetNode and FleetPlacement \
            objects follow the store");
        let began = std::time::Instant::now();
        let (why, h) = session(&s, client, &namespace, &fleet_id, health).await;
        health = h;
        if began.elapsed() > RECHECK * 6 {
            refusal = None;
        }
        refused(&mut refusal, why).await;
    }
}

/// The cluster refused the mirror as a whole while it ran: said once per reason (again only
/// after a session that ran a minute), and checked again after [`RECHECK`] — a refusal the
/// check does not see (a webhook, a quota) would otherwise restart the mirror every round.
async fn refused(said: &mut Option<String>, why: String) {
    if said.as_deref() != Some(why.as_str()) {
        tracing::warn!(error = %why, "the API server refuses the Kubernetes mirror; checking its configuration again \
            in {} s", RECHECK.as_secs());
        *said = Some(why);
    }
    tokio::time::sleep(RECHECK).await;
}

async fn ready(cfg: &KubernetesConfig, health: &mut Health) -> Result<(Client, String, String), CheckError> {
    let (client, namespace, url) = connect(cfg).await.map_err(CheckError::Misconfigured)?;
    health.idle();
    check(&client, &namespace).await?;
    Ok((client, namespace, url))
}

/// `FLEET_ID`, else the id kept in the store (retried while the store does not answer).
async fn fleet_id(s: &Setup) -> String {
    if let Some(id) = &s.cfg.fleet_id {
        return id.clone();
    }
    loop {
        match s.store.fleet_id().await {
            Ok(id) => return id,
            Err(e) => tracing::warn!(error = %e, "cannot read the fleet id from the store; the mirror waits"),
        }
        tokio::time::sleep(RECHECK).await;
    }
}

type Watches = SelectAll<BoxStream<'static, (Kind, Watched)>>;

/// Mirrors until the cluster refuses the mirror as a whole; returns why, and the health.
async fn session(s: &Setup, client: Client, namespace: &str, fleet_id: &str, health: Health) -> (String, Health) {
    let mut mirror = Mirror::new(client.clone(), namespace, fleet_id, s.metrics.clone(), health);
    mirror.gate = Some(s.gate.clone());
    let mut watches: Option<Watches> = None;
    let mut tick = tokio::time::interval(SYNC_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            Some((kind, w)) = next(&mut watches) => watched(&mut mirror, kind, w),
            _ = tick.tick() => {
                if !s.role.leading() {
                    if watches.take().is_some() {
                        mirror.forget();
                    }
                    mirror.health.idle();
                    continue;
                }
                if watches.is_none() {
                    watches = Some(start_watches(&client, namespace, fleet_id));
                }
                let snap = desired::snapshot(&s.store.read(), crate::clock::now_ms(), s.offline_after);
                let n = mirror.sync(&desired::wanted(snap)).await;
                if n > 0 {
                    tracing::debug!(writes = n, "mirror round");
                }
            }
        }
        if let Some(why) = mirror.refused.take() {
            return (why, mirror.health);
        }
    }
}

fn start_watches(client: &Client, namespace: &str, fleet_id: &str) -> Watches {
    futures::stream::select_all(Kind::ALL.map(|k| events(client.clone(), namespace, fleet_id, k).boxed()))
}

async fn next(watches: &mut Option<Watches>) -> Option<(Kind, Watched)> {
    match watches {
        Some(w) => w.next().await,
        None => std::future::pending().await,
    }
}

fn watched(mirror: &mut Mirror, kind: Kind, w: Watched) {
    match w {
        Watched::Seen(ev) => {
            mirror.answered();
            mirror.seen(kind, ev);
        }
        Watched::Expired => tracing::debug!(kind = kind.name(), "the watch expired (410); relisting"),
        Watched::Refused(why) => mirror.refused = Some(why),
        Watched::Unanswered(why) => mirror.health.failed(&format!("watching {}", kind.plural()), &why),
    }
}
