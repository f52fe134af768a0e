//! The mirror controller: projects the store into `FleetNode` / `FleetPlacement` objects with
//! server-side apply (docs/behaviour.md#kubernetes-mirror). The store stays the truth; the mirror keeps a *belief* of what
//! the API server holds — what it wrote, corrected by what its watches report — and each sync
//! writes only where the wanted object differs from that belief:
//!
//! - unknown to the belief → apply the object, then its status (create, or put back after a
//!   delete by hand, which the watch reported);
//! - spec or status (without `lastSeenAt`) differs → apply what differs (update on change, or
//!   put back a hand edit);
//! - only `lastSeenAt` differs → refresh at most once a minute;
//! - believed but no longer wanted → delete (vanished node or placement).
//!
//! Writes are paced by a token bucket, so a 10,000-node fleet never floods the API server. An
//! object the API server refuses (a 4xx about that object: invalid, conflict) is retried on its
//! own exponential backoff while every other object is still written; an error of the server
//! as a whole (unreachable, 5xx, throttled, forbidden) stops every write for a backoff. The mirror runs in its own task and
//! only takes the registry's read lock to compute what it wants, never across an `.await`.

use super::crd::{FleetNode, FleetNodeSpec, FleetNodeStatus, FleetPlacement, FleetPlacementSpec, FleetPlacementStatus};
use super::desired::{canonical, hash_json, status_key, Want, Wanted};
use crate::metrics::{Metrics, MirrorLabels};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::ApiResource;
use kube::Client;
use rustc_hash::FxHashMap;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The field manager of every write: `kubectl get -o yaml --show-managed-fields` names it.
pub const FIELD_MANAGER: &str = "fleet-controller";
/// Label on every mirror; the watches select on it.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "fleet-controller");
/// `lastSeenAt` alone refreshes a mirror at most this often.
pub const LAST_SEEN_REFRESH: Duration = Duration::from_secs(60);
/// Writes per second, steady, and the burst allowed after a quiet spell.
pub const WRITES_PER_SECOND: f64 = 50.0;
pub const WRITE_BURST: f64 = 100.0;
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// The next backoff after `last` (none: the first).
fn doubled(last: Option<Duration>) -> Duration {
    last.map_or(BACKOFF_MIN, |d| (d * 2).min(BACKOFF_MAX))
}

/// An answer about this object (invalid, conflict, gone), not about the server as a whole:
/// unreachable, 5xx, throttled (429) and unauthorised or forbidden (401, 403: every object
/// would get the same) stop every write instead.
fn refuses_the_object(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if (400..500).contains(&s.code) && ![401, 403, 429].contains(&s.code))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Node,
    Placement,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Node => "FleetNode",
            Kind::Placement => "FleetPlacement",
        }
    }

    pub fn plural(self) -> &'static str {
        match self {
            Kind::Node => "fleetnodes",
            Kind::Placement => "fleetplacements",
        }
    }

    pub fn resource(self) -> ApiResource {
        match self {
            Kind::Node => ApiResource::erase::<FleetNode>(&()),
            Kind::Placement => ApiResource::erase::<FleetPlacement>(&()),
        }
    }

    /// Canonical spec and status of an object read from the API server.
    fn canonical(self, obj: &DynamicObject) -> (Value, Value) {
        let spec = obj.data.get("spec");
        let status = obj.data.get("status");
        match self {
            Kind::Node => (canonical::<FleetNodeSpec>(spec), canonical::<FleetNodeStatus>(status)),
            Kind::Placement => (canonical::<FleetPlacementSpec>(spec), canonical::<FleetPlacementStatus>(status)),
        }
    }
}

/// What the mirror believes one object on the API server shows.
#[derive(Debug, Clone, PartialEq)]
struct Shown {
    spec: u64,
    status: u64,
    last_seen: Option<String>,
    /// When the status was last written (or first seen): paces `lastSeenAt` refreshes.
    at: Instant,
}

/// A watch event, reduced to what the mirror needs.
#[derive(Debug, Clone)]
pub enum Seen {
    /// The object exists with this content (added, modified, or listed).
    Applied(Box<DynamicObject>),
    Deleted(String),
    /// A relist begins; objects not listed before `RelistDone` are gone.
    Relist,
    RelistDone,
}

#[derive(Default)]
struct Belief {
    shown: FxHashMap<String, Shown>,
    relisted: Option<std::collections::HashSet<String>>,
    /// Objects the API server refused: not asked again before the instant, then with the
    /// delay doubled. Only wanted or believed objects keep an entry.
    refused: FxHashMap<String, (Instant, Duration)>,
}

enum Op {
    /// `idx` is the wanted item's position.
    Apply {
        idx: usize,
        spec: bool,
        status: bool,
    },
    Delete,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn take(&mut self, now: Instant, cost: f64) -> bool {
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * WRITES_PER_SECOND).min(WRITE_BURST);
        self.at = now;
        if self.tokens >= cost {
            self.tokens -= cost;
            true
        } else {
            false
        }
    }
}

pub struct Mirror {
    client: Client,
    namespace: String,
    nodes: Belief,
    placements: Belief,
    bucket: Bucket,
    backoff: Option<(Instant, Duration)>,
    metrics: Arc<Metrics>,
    /// Requests sent so far (what `sync` reports).
    requests: usize,
    /// The leader's call gate (docs/behaviour.md#high-availability): no write starts unless
    /// the lease surely runs. `None`: the caller decides (tests).
    pub gate: Option<Arc<crate::platform::CallGate>>,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("FLEET_KUBERNETES_MIRROR=true but the {kind} CRD ({plural}.fleet.taimen.dev) is not installed in the cluster: apply crds/ (`fleet-controller crds | kubectl apply -f -`) or install the chart with crds.install=true")]
    NotInstalled { kind: &'static str, plural: &'static str },
    #[error("FLEET_KUBERNETES_MIRROR=true but the service account may not list {plural} in namespace {namespace:?} ({message}): the chart's Role grants it when mirror.enabled=true")]
    Forbidden { plural: &'static str, namespace: String, message: String },
    #[error("FLEET_KUBERNETES_MIRROR=true but listing {plural} in namespace {namespace:?} failed: {message}")]
    Other { plural: &'static str, namespace: String, message: String },
}

impl Mirror {
    pub fn new(client: Client, namespace: &str, metrics: Arc<Metrics>) -> Mirror {
        Mirror {
            client,
            namespace: namespace.to_string(),
            nodes: Belief::default(),
            placements: Belief::default(),
            bucket: Bucket { tokens: WRITE_BURST, at: Instant::now() },
            backoff: None,
            metrics,
            requests: 0,
            gate: None,
        }
    }

    pub fn api(&self, kind: Kind) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.namespace, &kind.resource())
    }

    /// At start: both CRDs installed and listable in the namespace, or a clear error.
    pub async fn check(&self) -> Result<(), CheckError> {
        for kind in [Kind::Node, Kind::Placement] {
            match self.api(kind).list(&ListParams::default().limit(1)).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    return Err(CheckError::NotInstalled { kind: kind.name(), plural: kind.plural() })
                }
                Err(kube::Error::Api(s)) if s.code == 403 => {
                    return Err(CheckError::Forbidden {
                        plural: kind.plural(),
                        namespace: self.namespace.clone(),
                        message: s.message.clone(),
                    })
                }
                Err(e) => {
                    return Err(CheckError::Other {
                        plural: kind.plural(),
                        namespace: self.namespace.clone(),
                        message: e.to_string(),
                    })
                }
            }
        }
        Ok(())
    }

    fn belief(&mut self, kind: Kind) -> &mut Belief {
        match kind {
            Kind::Node => &mut self.nodes,
            Kind::Placement => &mut self.placements,
        }
    }

    /// Feeds a watch event into the belief. An object whose content differs from the belief
    /// (a hand edit, or an echo of an older write) replaces it, so the next sync puts the
    /// wanted content back; a delete forgets it, so the next sync recreates it.
    pub fn seen(&mut self, kind: Kind, event: Seen) {
        let now = Instant::now();
        let b = self.belief(kind);
        match event {
            Seen::Applied(obj) => {
                let Some(name) = obj.metadata.name.clone() else { return };
                let (spec, status) = kind.canonical(&obj);
                let (status_hash, last_seen) = status_key(&status);
                if let Some(r) = b.relisted.as_mut() {
                    r.insert(name.clone());
                }
                // `at` paces lastSeenAt refreshes from the last write, so an object already
                // believed keeps its own.
                let at = b.shown.get(&name).map_or(now, |old| old.at);
                b.shown.insert(name, Shown { spec: hash_json(&spec), status: status_hash, last_seen, at });
            }
            Seen::Deleted(name) => {
                b.shown.remove(&name);
            }
            Seen::Relist => b.relisted = Some(Default::default()),
            Seen::RelistDone => {
                if let Some(r) = b.relisted.take() {
                    b.shown.retain(|k, _| r.contains(k));
                }
            }
        }
    }

    /// One round: writes what differs, as far as the rate allows; the rest waits for the
    /// next round. Returns the number of write requests made.
    /// The bucket is refilled once, at the round's start, so one round writes at most
    /// [`WRITE_BURST`] however long its requests take.
    pub async fn sync(&mut self, wanted: &Wanted) -> usize {
        let now = Instant::now();
        if let Some((until, _)) = self.backoff {
            if now < until {
                return 0;
            }
        }
        let before = self.requests;
        for (kind, items) in [(Kind::Node, &wanted.nodes), (Kind::Placement, &wanted.placements)] {
            let ops = self.plan(kind, items, now);
            for (name, op) in ops {
                let cost = match op {
                    Op::Apply { spec, status, .. } => usize::from(spec) + usize::from(status),
                    Op::Delete => 1,
                };
                if !self.bucket.take(now, cost as f64)
                    || self.gate.as_ref().is_some_and(|g| g.permit("Kubernetes").is_err())
                {
                    return self.requests - before;
                }
                let result = match &op {
                    Op::Delete => self.delete(kind, &name).await,
                    Op::Apply { idx, spec, status } => self.apply(kind, &items[*idx], *spec, *status).await,
                };
                match result {
                    Ok(()) => {
                        self.backoff = None;
                        self.belief(kind).refused.remove(&name);
                    }
                    Err(e) if refuses_the_object(&e) => self.refused(kind, name, &e),
                    Err(e) => {
                        let delay = doubled(self.backoff.map(|(_, d)| d));
                        tracing::warn!(kind = kind.name(), object = %name, error = %e, retry_in_s = delay.as_secs(), "mirror write failed; backing off");
                        self.backoff = Some((Instant::now() + delay, delay));
                        return self.requests - before;
                    }
                }
            }
        }
        self.requests - before
    }

    /// The API server refused this object: it waits for its own backoff, the others go on.
    fn refused(&mut self, kind: Kind, name: String, e: &kube::Error) {
        let b = self.belief(kind);
        let delay = doubled(b.refused.get(&name).map(|(_, d)| *d));
        tracing::warn!(kind = kind.name(), object = %name, error = %e, retry_in_s = delay.as_secs(),
            "the API server refused this mirror; retrying it alone later, the others go on");
        b.refused.insert(name, (Instant::now() + delay, delay));
    }

    fn plan(&mut self, kind: Kind, items: &[Want], now: Instant) -> Vec<(String, Op)> {
        let b = self.belief(kind);
        let mut ops = Vec::new();
        let mut wanted_names = std::collections::HashSet::with_capacity(items.len());
        let waits = |b: &Belief, name: &str| b.refused.get(name).is_some_and(|(until, _)| now < *until);
        for (idx, w) in items.iter().enumerate() {
            wanted_names.insert(w.name.as_str());
            if waits(b, &w.name) {
                continue;
            }
            let op = match b.shown.get(&w.name) {
                None => Some(Op::Apply { idx, spec: true, status: true }),
                Some(s) if s.spec != w.spec_hash => {
                    Some(Op::Apply { idx, spec: true, status: s.status != w.status_hash })
                }
                Some(s) if s.status != w.status_hash => Some(Op::Apply { idx, spec: false, status: true }),
                Some(s) if s.last_seen != w.last_seen && now.duration_since(s.at) >= LAST_SEEN_REFRESH => {
                    Some(Op::Apply { idx, spec: false, status: true })
                }
                Some(_) => None,
            };
            if let Some(op) = op {
                ops.push((w.name.clone(), op));
            }
        }
        let mut gone: Vec<String> =
            b.shown.keys().filter(|k| !wanted_names.contains(k.as_str()) && !waits(b, k)).cloned().collect();
        gone.sort();
        ops.extend(gone.into_iter().map(|n| (n, Op::Delete)));
        let shown = &b.shown;
        b.refused.retain(|k, _| wanted_names.contains(k.as_str()) || shown.contains_key(k));
        ops
    }

    async fn apply(&mut self, kind: Kind, w: &Want, spec: bool, status: bool) -> Result<(), kube::Error> {
        let api = self.api(kind);
        let ar = kind.resource();
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        if spec {
            let body = json!({
                "apiVersion": ar.api_version,
                "kind": ar.kind,
                "metadata": { "name": w.name, "labels": { MANAGED_BY.0: MANAGED_BY.1 } },
                "spec": w.spec,
            });
            let r = api.patch(&w.name, &pp, &Patch::Apply(&body)).await;
            self.count(kind, "apply", &r);
            r?;
        }
        if status {
            let body = json!({ "apiVersion": ar.api_version, "kind": ar.kind, "status": w.status });
            let r = api.patch_status(&w.name, &pp, &Patch::Apply(&body)).await;
            self.count(kind, "apply_status", &r);
            if let Err(kube::Error::Api(s)) = &r {
                if s.code == 404 {
                    // Deleted between the two writes: forget it, the next round recreates it.
                    self.belief(kind).shown.remove(&w.name);
                    return Ok(());
                }
            }
            r?;
        }
        let b = self.belief(kind);
        match b.shown.get_mut(&w.name) {
            // Only the spec was written: the status stays as believed.
            Some(s) if !status => s.spec = w.spec_hash,
            _ => {
                let written = Shown {
                    spec: w.spec_hash,
                    status: w.status_hash,
                    last_seen: w.last_seen.clone(),
                    at: Instant::now(),
                };
                // A status not written is not known: 0 never matches, so the next round writes it.
                let shown = if status { written } else { Shown { status: 0, last_seen: None, ..written } };
                b.shown.insert(w.name.clone(), shown);
            }
        }
        tracing::debug!(kind = kind.name(), object = %w.name, spec, status, "mirror written");
        Ok(())
    }

    async fn delete(&mut self, kind: Kind, name: &str) -> Result<(), kube::Error> {
        let r = self.api(kind).delete(name, &DeleteParams::default()).await;
        self.count(kind, "delete", &r);
        match r {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
        self.belief(kind).shown.remove(name);
        tracing::debug!(kind = kind.name(), object = %name, "mirror deleted");
        Ok(())
    }

    fn count<T>(&mut self, kind: Kind, op: &'static str, r: &Result<T, kube::Error>) {
        self.requests += 1;
        let outcome = match r {
            Ok(_) => "ok".to_string(),
            Err(kube::Error::Api(s)) => s.code.to_string(),
            Err(_) => "error".to_string(),
        };
        self.metrics.mirror_writes.get_or_create(&MirrorLabels { kind: kind.name(), op, outcome }).inc();
    }
}
