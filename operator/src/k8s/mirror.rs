//! The mirror's writes (docs/behaviour.md#kubernetes-mirror): each round plans what differs
//! between the store and the belief (`plan`) and writes it, as the rate allows.
//!
//! - An object is created with a plain create: one that exists already is this fleet's (its
//!   label), an old one of Fleet's without a fleet label (adopted), or another's — another
//!   fleet's, or not Fleet's at all — which is never touched: the name waits on its backoff and
//!   the log says whose it is. Every later write carries the object's `uid`, so it never lands
//!   on an object someone else made in between.
//! - Spec and labels, then the status, are written by server-side apply (field manager
//!   `fleet-controller`, forced); a status another manager added to is taken back
//!   (`fields`). The belief learns each answer.
//! - A write the API server refuses about that object (a 4xx such as `422` invalid or `409`
//!   conflict) puts that object on its own backoff (1 s doubling to 60 s) while every other is
//!   still written; a server that does not answer (unreachable, `5xx`, `429`) stops every
//!   write for a backoff; one that refuses the mirror as a whole (`401`, `403`, its CRD gone)
//!   ends the round and sends the task back to its start-up check.
//!
//! Writes are paced by a token bucket: 50 a second, at most 100 in one round.

use super::belief::{Belief, Seen};
use super::check::is_answer;
use super::crd::{FIELD_MANAGER, FLEET_LABEL, MANAGED_BY};
use super::desired::{Want, Wanted};
use super::fields::{drop_managers_patch, fleet_of, made_by_fleet, nulls_for_extras};
use super::health::Health;
use super::kind::Kind;
use super::plan::{plan, Op, StatusOp};
use crate::metrics::{Metrics, MirrorLabels};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use kube::Client;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Writes per second, steady, and the burst allowed after a quiet spell.
pub const WRITES_PER_SECOND: f64 = 50.0;
pub const WRITE_BURST: f64 = 100.0;
const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// The longest a server that does not answer is left alone: the watches' retry (8 s) usually
/// ends a backoff sooner, since a watch that answers again ends it.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
const REFUSED_MAX: Duration = Duration::from_secs(60);

/// How a write failed.
enum Failed {
    /// The answer is about this object (invalid, conflict, gone, another's).
    Object(String),
    /// The server did not answer, or answered for everyone (5xx, 429).
    Unanswered(kube::Error),
    /// The cluster refuses the mirror itself (401, 403, its CRD gone).
    Refused(String),
}

fn failed(e: kube::Error) -> Failed {
    match &e {
        kube::Error::Api(s) if [401, 403].contains(&s.code) => Failed::Refused(e.to_string()),
        // A 404 without an object's name: the resource type itself is gone.
        kube::Error::Api(s) if s.code == 404 && s.details.as_ref().is_none_or(|d| d.name.is_empty()) => {
            Failed::Refused(format!("{e} (are the CRDs still installed?)"))
        }
        _ if is_answer(&e) => Failed::Object(e.to_string()),
        _ => Failed::Unanswered(e),
    }
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
    fleet_id: String,
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
    pub health: Health,
    /// Set when the cluster refused the mirror as a whole: the task checks again.
    pub refused: Option<String>,
}

impl Mirror {
    pub fn new(client: Client, namespace: &str, fleet_id: &str, metrics: Arc<Metrics>, health: Health) -> Mirror {
        Mirror {
            client,
            namespace: namespace.to_string(),
            fleet_id: fleet_id.to_string(),
            nodes: Belief::default(),
            placements: Belief::default(),
            bucket: Bucket { tokens: WRITE_BURST, at: Instant::now() },
            backoff: None,
            health,
            metrics,
            requests: 0,
            gate: None,
            refused: None,
        }
    }

    pub fn api(&self, kind: Kind) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.namespace, &kind.resource())
    }

    fn belief(&mut self, kind: Kind) -> &mut Belief {
        match kind {
            Kind::Node => &mut self.nodes,
            Kind::Placement => &mut self.placements,
        }
    }

    /// Feeds a watch event into the belief.
    pub fn seen(&mut self, kind: Kind, event: Seen) {
        let id = self.fleet_id.clone();
        self.belief(kind).seen(kind, event, (&id, FIELD_MANAGER));
    }

    /// The watches answer again: writes need not wait for their backoff.
    pub fn answered(&mut self) {
        self.backoff = None;
        self.health.answered();
    }

    /// Forgets what it believed (this replica stopped leading).
    pub fn forget(&mut self) {
        self.nodes.clear();
        self.placements.clear();
    }

    fn learn(&mut self, kind: Kind, obj: &DynamicObject, status_written: bool) {
        let id = self.fleet_id.clone();
        self.belief(kind).learn(kind, obj, (&id, FIELD_MANAGER), status_written);
    }

    fn uid(&mut self, kind: Kind, name: &str) -> Option<String> {
        self.belief(kind).shown.get(name).and_then(|s| s.uid.clone())
    }

    /// One round: writes what differs, as far as the rate allows; the rest waits for the
    /// next round. Returns the number of write requests made. The bucket is refilled once,
    /// at the round's start, so one round writes at most [`WRITE_BURST`].
    pub async fn sync(&mut self, wanted: &Wanted) -> usize {
        let now = Instant::now();
        if self.backoff.is_some_and(|(until, _)| now < until) || self.refused.is_some() {
            return 0;
        }
        let before = self.requests;
        for (kind, items) in [(Kind::Node, &wanted.nodes), (Kind::Placement, &wanted.placements)] {
            let ops = plan(self.belief(kind), items, now);
            for (name, op) in ops {
                let gated = self.gate.as_ref().is_some_and(|g| g.permit("Kubernetes").is_err());
                if gated || !self.bucket.take(now, op.cost() as f64) {
                    return self.requests - before;
                }
                if !self.run(kind, items, name, op).await {
                    return self.requests - before;
                }
            }
        }
        self.requests - before
    }

    /// Runs one op; `false` ends the round.
    async fn run(&mut self, kind: Kind, items: &[Want], name: String, op: Op) -> bool {
        let result = match op {
            Op::Delete { uid } => self.delete(kind, &name, uid).await,
            Op::Write { idx, create, spec, status } => self.write(kind, &items[idx], create, spec, status).await,
        };
        match result {
            Ok(()) => {
                self.backoff = None;
                self.health.answered();
                self.belief(kind).refused.remove(&name);
                true
            }
            Err(Failed::Object(why)) => {
                self.health.answered();
                self.refuse(kind, name, &why);
                true
            }
            Err(Failed::Unanswered(e)) => {
                let delay = self.backoff.map_or(BACKOFF_MIN, |(_, d)| (d * 2).min(BACKOFF_MAX));
                self.health.failed(&format!("writing {} {name}", kind.name()), &e);
                self.backoff = Some((Instant::now() + delay, delay));
                false
            }
            Err(Failed::Refused(why)) => {
                self.refused = Some(why);
                false
            }
        }
    }

    /// The API server refused this object: it waits for its own backoff, the others go on.
    /// Said at `WARN` the first time, at `DEBUG` while it keeps being refused.
    fn refuse(&mut self, kind: Kind, name: String, why: &str) {
        let b = self.belief(kind);
        let last = b.refused.get(&name).map(|(_, d)| *d);
        let delay = last.map_or(BACKOFF_MIN, |d| (d * 2).min(REFUSED_MAX));
        if last.is_none() {
            tracing::warn!(kind = kind.name(), object = %name, error = %why, "the API server refused this mirror; \
                retrying it alone later, the others go on");
        } else {
            tracing::debug!(kind = kind.name(), object = %name, error = %why, retry_in_s = delay.as_secs(), "refused again");
        }
        b.refused.insert(name, (Instant::now() + delay, delay));
    }

    async fn write(&mut self, kind: Kind, w: &Want, create: bool, spec: bool, status: StatusOp) -> Result<(), Failed> {
        if create && !self.create(kind, w).await? {
            return Ok(());
        }
        if spec {
            self.apply_spec(kind, w).await?;
        }
        match status {
            StatusOp::Keep => Ok(()),
            StatusOp::Apply => self.apply_status(kind, w, &w.status).await,
            StatusOp::TakeBack => self.take_back(kind, w).await,
        }
    }

    fn object(&mut self, kind: Kind, name: &str, uid: Option<String>, part: (&str, &Value)) -> Value {
        let ar = kind.resource();
        let labels = json!({ MANAGED_BY.0: MANAGED_BY.1, FLEET_LABEL: self.fleet_id });
        let mut metadata = json!({ "name": name, "labels": labels });
        if let Some(uid) = uid {
            metadata["uid"] = json!(uid);
        }
        json!({ "apiVersion": ar.api_version, "kind": ar.kind, "metadata": metadata, part.0: part.1 })
    }

    /// Creates the object; `Ok(false)` when the name is taken by an object that is not this
    /// fleet's to write (it waits on its backoff, said once).
    async fn create(&mut self, kind: Kind, w: &Want) -> Result<bool, Failed> {
        let body: DynamicObject = serde_json::from_value(self.object(kind, &w.name, None, ("spec", &w.spec)))
            .expect("a mirror object is an object");
        let pp = PostParams { dry_run: false, field_manager: Some(FIELD_MANAGER.into()) };
        let r = self.api(kind).create(&pp, &body).await;
        self.count(kind, "create", &r);
        match r {
            Ok(obj) => {
                self.learn(kind, &obj, false);
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => self.existing(kind, &w.name).await,
            Err(e) => Err(failed(e)),
        }
    }

    /// The name exists: this fleet's (believed from now on), an old mirror of Fleet's with no
    /// fleet label (adopted: the next apply labels it), or another's (left alone).
    async fn existing(&mut self, kind: Kind, name: &str) -> Result<bool, Failed> {
        let r = self.api(kind).get(name).await;
        self.count(kind, "get", &r);
        let obj = r.map_err(failed)?;
        let owner = fleet_of(&obj).map(str::to_string);
        if owner.as_deref() == Some(self.fleet_id.as_str()) || (owner.is_none() && made_by_fleet(&obj)) {
            self.learn(kind, &obj, false);
            return Ok(false);
        }
        let whose = match owner {
            Some(other) => format!("it belongs to fleet {other:?} (its {FLEET_LABEL} label)"),
            None => "it was not made by Fleet".to_string(),
        };
        Err(Failed::Object(format!(
            "{} {name:?} exists in namespace {:?} and {whose}: this fleet leaves it alone and does not mirror its own \
             object of that name; give each fleet its own namespace (FLEET_KUBERNETES_NAMESPACE)",
            kind.name(),
            self.namespace
        )))
    }

    async fn apply_spec(&mut self, kind: Kind, w: &Want) -> Result<(), Failed> {
        let uid = self.uid(kind, &w.name);
        let body = self.object(kind, &w.name, uid, ("spec", &w.spec));
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        let r = self.api(kind).patch(&w.name, &pp, &Patch::Apply(&body)).await;
        self.count(kind, "apply", &r);
        self.after_write(kind, &w.name, r, false)
    }

    async fn apply_status(&mut self, kind: Kind, w: &Want, status: &Value) -> Result<(), Failed> {
        let uid = self.uid(kind, &w.name);
        let ar = kind.resource();
        let mut body =
            json!({ "apiVersion": ar.api_version, "kind": ar.kind, "metadata": {"name": w.name}, "status": status });
        if let Some(uid) = uid {
            body["metadata"]["uid"] = json!(uid);
        }
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        let r = self.api(kind).patch_status(&w.name, &pp, &Patch::Apply(&body)).await;
        self.count(kind, "apply_status", &r);
        self.after_write(kind, &w.name, r, true)
    }

    /// Learns the answer; an object gone (`404`) or made again by someone else (`409`, or
    /// `422` on its `uid`) is forgotten, so the next round creates it.
    fn after_write(
        &mut self,
        kind: Kind,
        name: &str,
        r: kube::Result<DynamicObject>,
        status: bool,
    ) -> Result<(), Failed> {
        match r {
            Ok(obj) => {
                self.learn(kind, &obj, status);
                Ok(())
            }
            Err(e) => {
                if matches!(&e, kube::Error::Api(s) if [404, 409, 422].contains(&s.code)) {
                    self.belief(kind).shown.remove(name);
                }
                Err(failed(e))
            }
        }
    }

    /// The status with `null` in the optional fields another manager added, then without them;
    /// then the other managers still listed for the status are dropped. Still not the store's
    /// after that: the object waits on its backoff rather than being written every round.
    async fn take_back(&mut self, kind: Kind, w: &Want) -> Result<(), Failed> {
        let present = self.belief(kind).shown.get(&w.name).map_or(0, |s| s.optional);
        if present & !w.optional != 0 {
            self.apply_status(kind, w, &nulls_for_extras(kind, &w.status, present)).await?;
        }
        self.apply_status(kind, w, &w.status).await?;
        let foreign = self.belief(kind).shown.get(&w.name).map(|s| s.foreign.clone()).unwrap_or_default();
        if !foreign.is_empty() {
            self.drop_managers(kind, &w.name, &foreign).await?;
        }
        match self.belief(kind).shown.get(&w.name) {
            Some(s) if s.optional & !w.optional != 0 || !s.foreign.is_empty() => {
                Err(Failed::Object("the status still holds fields of other managers after taking it back".into()))
            }
            _ => Ok(()),
        }
    }

    /// Removes other managers' entries from `managedFields` (a JSON patch of the object, each
    /// removal guarded by a test of the entry's manager and the object's uid).
    async fn drop_managers(&mut self, kind: Kind, name: &str, foreign: &[(usize, String)]) -> Result<(), Failed> {
        let mut patch = drop_managers_patch(foreign);
        if let (Some(uid), Some(ops)) = (self.uid(kind, name), patch.as_array_mut()) {
            ops.insert(0, json!({"op": "test", "path": "/metadata/uid", "value": uid}));
        }
        let api = self.api(kind);
        let url = format!("{}/{name}?fieldManager={FIELD_MANAGER}", api.resource_url());
        let req = axum::http::Request::patch(url)
            .header(axum::http::header::CONTENT_TYPE, "application/json-patch+json")
            .body(serde_json::to_vec(&patch).expect("a JSON patch serialises"))
            .expect("a valid request");
        let r = self.client.request::<DynamicObject>(req).await;
        self.count(kind, "drop_managers", &r);
        self.after_write(kind, name, r, false)
    }

    async fn delete(&mut self, kind: Kind, name: &str, uid: Option<String>) -> Result<(), Failed> {
        let dp =
            DeleteParams { preconditions: Some(Preconditions { uid, resource_version: None }), ..Default::default() };
        let r = self.api(kind).delete(name, &dp).await;
        self.count(kind, "delete", &r);
        match r {
            Ok(_) => {}
            // Gone already, or made again by someone else since: either way not ours to delete.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(failed(e)),
        }
        self.belief(kind).shown.remove(name);
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
