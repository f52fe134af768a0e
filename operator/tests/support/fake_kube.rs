//! A fake Kubernetes API server behind kube's `tower-test` mock service, for the mirror's
//! request-level tests (`k8s_mirror.rs`): it records every request and keeps the objects, so
//! it answers creates, server-side applies (with their `uid` precondition), gets, lists,
//! deletes (with theirs) and access reviews the way the API server does, as far as the mirror
//! reads the answers. It models no field managers: what they do is tested against a real API
//! server (`k8s_real.rs`).

use http::{Request, Response};
use kube::client::Body;
use kube::Client;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct Call {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: Value,
}

impl Call {
    /// `POST fleetnodes`, `PATCH fleetnodes/gpu-1/status`…
    pub fn short(&self) -> String {
        let p = self.path.trim_start_matches("/apis/fleet.taimen.dev/v1alpha1/namespaces/fleet/");
        format!("{} {p}", self.method)
    }
}

/// How it answers: `fail_with` makes every request fail with that code, `refuse` every
/// request about the object of that name with 422, `denied` the access reviews of those verbs.
#[derive(Default)]
pub struct Server {
    pub calls: Vec<Call>,
    pub fail_with: Option<u16>,
    pub refuse: Option<String>,
    pub denied: Vec<String>,
    pub namespace_missing: bool,
    /// `(plural, name)` → object.
    pub objects: BTreeMap<(String, String), Value>,
    uids: u64,
}

fn status(code: u16, reason: &str, message: &str, details: Value) -> (u16, Value) {
    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                      "reason": reason, "code": code, "details": details});
    (code, body)
}

impl Server {
    fn answer(&mut self, c: &Call) -> (u16, Value) {
        if let Some(code) = self.fail_with {
            return status(code, "InternalError", "injected failure", json!({}));
        }
        if c.path.ends_with("/selfsubjectaccessreviews") {
            let verb = c.body["spec"]["resourceAttributes"]["verb"].as_str().unwrap_or_default().to_string();
            return (
                201,
                json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                                "spec": c.body["spec"], "status": {"allowed": !self.denied.contains(&verb)}}),
            );
        }
        // /apis/fleet.taimen.dev/v1alpha1/namespaces/fleet/<plural>[/<name>[/status]]
        let parts: Vec<&str> = c.path.split('/').collect();
        let plural = parts.get(6).copied().unwrap_or_default().to_string();
        let name = parts.get(7).map(|s| s.to_string());
        if self.refuse.is_some()
            && (name == self.refuse || c.body["metadata"]["name"].as_str() == self.refuse.as_deref())
        {
            return status(422, "Invalid", "refused", json!({"name": self.refuse, "kind": plural}));
        }
        match (c.method.as_str(), name) {
            ("GET", None) => {
                let items: Vec<Value> =
                    self.objects.iter().filter(|(k, _)| k.0 == plural).map(|(_, o)| o.clone()).collect();
                (
                    200,
                    json!({"apiVersion": "fleet.taimen.dev/v1alpha1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items}),
                )
            }
            ("POST", None) => self.create(c, plural),
            ("GET", Some(n)) => match self.objects.get(&(plural.clone(), n.clone())) {
                Some(o) => (200, o.clone()),
                None => not_found(&plural, &n),
            },
            ("PATCH", Some(n)) => self.patch(c, plural, n, parts.get(8) == Some(&"status")),
            ("DELETE", Some(n)) => self.delete(c, plural, n),
            _ => status(405, "MethodNotAllowed", "no", json!({})),
        }
    }

    fn create(&mut self, c: &Call, plural: String) -> (u16, Value) {
        if self.namespace_missing {
            return status(
                404,
                "NotFound",
                "namespaces \"fleet\" not found",
                json!({"name": "fleet", "kind": "namespaces"}),
            );
        }
        let name = c.body["metadata"]["name"].as_str().unwrap_or_default().to_string();
        if self.objects.contains_key(&(plural.clone(), name.clone())) {
            return status(409, "AlreadyExists", "already exists", json!({"name": name, "kind": plural}));
        }
        let mut obj = c.body.clone();
        if c.query.contains("dryRun") {
            return (201, obj);
        }
        self.uids += 1;
        obj["metadata"]["uid"] = json!(format!("uid-{}", self.uids));
        obj["metadata"]["namespace"] = json!("fleet");
        self.objects.insert((plural, name), obj.clone());
        (201, obj)
    }

    fn patch(&mut self, c: &Call, plural: String, name: String, status_only: bool) -> (u16, Value) {
        let key = (plural.clone(), name.clone());
        let uid = c.body["metadata"]["uid"].as_str();
        let Some(old) = self.objects.get(&key).cloned() else {
            return if uid.is_some() {
                status(409, "Conflict", "uid mismatch", json!({"name": name, "kind": plural}))
            } else {
                not_found(&plural, &name)
            };
        };
        if uid.is_some_and(|u| old["metadata"]["uid"] != u) {
            return status(422, "Invalid", "metadata.uid: field is immutable", json!({"name": name, "kind": plural}));
        }
        let mut obj = old;
        if status_only {
            obj["status"] = c.body["status"].clone();
        } else if c.content_type == "application/apply-patch+yaml" {
            obj["spec"] = c.body["spec"].clone();
            let labels = c.body["metadata"]["labels"].as_object().cloned().unwrap_or_default();
            for (k, v) in labels {
                obj["metadata"]["labels"][k] = v;
            }
        }
        self.objects.insert(key, obj.clone());
        (200, obj)
    }

    fn delete(&mut self, c: &Call, plural: String, name: String) -> (u16, Value) {
        let key = (plural.clone(), name.clone());
        let Some(old) = self.objects.get(&key) else { return not_found(&plural, &name) };
        let want = &c.body["preconditions"]["uid"];
        if !want.is_null() && &old["metadata"]["uid"] != want {
            return status(409, "Conflict", "precondition failed", json!({"name": name, "kind": plural}));
        }
        self.objects.remove(&key);
        (200, json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200}))
    }
}

fn not_found(plural: &str, name: &str) -> (u16, Value) {
    status(404, "NotFound", &format!("{plural} {name:?} not found"), json!({"name": name, "kind": plural}))
}

/// A kube client whose requests the returned server answers.
pub fn client() -> (Client, Arc<Mutex<Server>>) {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = Arc::new(Mutex::new(Server::default()));
    let s = server.clone();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap();
            let call = Call {
                method: parts.method.to_string(),
                path: parts.uri.path().to_string(),
                query: parts.uri.query().unwrap_or("").to_string(),
                content_type: parts
                    .headers
                    .get("content-type")
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default(),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            };
            let (code, answer) = {
                let mut s = s.lock();
                s.calls.push(call.clone());
                s.answer(&call)
            };
            send.send_response(
                Response::builder().status(code).body(Body::from(serde_json::to_vec(&answer).unwrap())).unwrap(),
            );
        }
    });
    (Client::new(svc, "fleet"), server)
}
