//! The Kubernetes mirror against kube's mock-service pattern: a `tower_test` pair stands in
//! for the API server, records every request the mirror makes and answers it the way the API
//! server would (server-side apply echoes the object; delete answers a Status). Each test
//! asserts the exact requests: create, update on change, nothing when unchanged, put back
//! after a delete or an edit by hand, delete of vanished objects, backoff, the rate bound,
//! and the start-up check of the CRDs.

mod support;

use fleet_api::{Capacity, Health, NodeStatus, NodeView, PlacementStatus, PlacementView};
use fleet_controller::k8s::desired::{self, Wanted};
use fleet_controller::k8s::mirror::{Kind, Mirror, Seen, WRITE_BURST};
use fleet_controller::metrics::Metrics;
use http::{Request, Response};
use kube::client::Body;
use kube::Client;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug, Clone)]
struct Call {
    method: String,
    path: String,
    query: String,
    content_type: String,
    body: Value,
}

impl Call {
    fn short(&self) -> String {
        let p = self.path.trim_start_matches("/apis/fleet.taimen.dev/v1alpha1/namespaces/fleet/");
        format!("{} {p}", self.method)
    }
}

/// How the fake API server answers: by default like a real one; `fail_with` makes every
/// request fail with that code, `refuse` every request for the object of that name with 422
/// (the answer to an object the API server finds invalid).
#[derive(Default)]
struct Server {
    calls: Vec<Call>,
    fail_with: Option<u16>,
    refuse: Option<String>,
}

fn mirror() -> (Mirror, Arc<Mutex<Server>>) {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = Arc::new(Mutex::new(Server::default()));
    let s = server.clone();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let call = Call {
                method: parts.method.to_string(),
                path: parts.uri.path().to_string(),
                query: parts.uri.query().unwrap_or("").to_string(),
                content_type: parts
                    .headers
                    .get("content-type")
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default(),
                body: body.clone(),
            };
            let fail = {
                let mut s = s.lock();
                s.calls.push(call.clone());
                let refused = s.refuse.as_ref().is_some_and(|n| call.path.split('/').nth(7) == Some(n.as_str()));
                if refused {
                    Some(422)
                } else {
                    s.fail_with
                }
            };
            let (code, answer) = support::kube_answer(&call.method, &call.path, body, fail);
            send.send_response(
                Response::builder().status(code).body(Body::from(serde_json::to_vec(&answer).unwrap())).unwrap(),
            );
        }
    });
    let client = Client::new(svc, "fleet");
    (Mirror::new(client, "fleet", Arc::new(Metrics::default())), server)
}

fn take(server: &Arc<Mutex<Server>>) -> Vec<Call> {
    std::mem::take(&mut server.lock().calls)
}

fn shorts(calls: &[Call]) -> Vec<String> {
    calls.iter().map(Call::short).collect()
}

fn node(id: &str, name: &str, slots: u32, seen: &str) -> NodeView {
    NodeView {
        id: id.into(),
        name: name.into(),
        labels: vec!["gpu".into()],
        executor_kinds: vec!["claude".into()],
        executor_images: BTreeMap::new(),
        capacity: Capacity { slots, cpus: Some(4.0), memory_mb: None },
        secrets: vec![],
        executor_secrets: BTreeMap::new(),
        allowed_labels: None,
        allowed_kinds: None,
        refused_facts: Default::default(),
        health: Health::Ok,
        status: NodeStatus::Online,
        last_seen_at: seen.into(),
        version: "0.1.0".into(),
        slots_used: 0,
        schedulable: true,
        drain: None,
    }
}

fn placed(agent: &str, node_id: &str, replicas: u32) -> PlacementView {
    PlacementView {
        agent_key: agent.into(),
        revision: 3,
        node_id: Some(node_id.into()),
        replicas,
        status: PlacementStatus::Placed,
        reason: None,
    }
}

fn pending(agent: &str, replicas: u32, reason: &str) -> PlacementView {
    PlacementView {
        agent_key: agent.into(),
        revision: 1,
        node_id: None,
        replicas,
        status: PlacementStatus::Pending,
        reason: Some(reason.into()),
    }
}

fn wanted(nodes: Vec<NodeView>, views: Vec<PlacementView>) -> Wanted {
    desired::wanted_from(&nodes, || views.iter().cloned(), &Default::default())
}

const T0: &str = "2026-11-30T10:00:00.000Z";
const T1: &str = "2026-11-30T10:00:20.000Z";

#[tokio::test]
async fn creates_with_server_side_apply_then_writes_nothing_while_unchanged() {
    let (mut m, server) = mirror();
    let w =
        wanted(vec![node("n-1", "gpu-1", 4, T0)], vec![placed("coder", "n-1", 2), pending("reviewer", 1, "no_node")]);
    assert_eq!(m.sync(&w).await, 6);
    let calls = take(&server);
    assert_eq!(
        shorts(&calls),
        [
            "PATCH fleetnodes/gpu-1",
            "PATCH fleetnodes/gpu-1/status",
            "PATCH fleetplacements/coder.gpu-1",
            "PATCH fleetplacements/coder.gpu-1/status",
            "PATCH fleetplacements/reviewer.pending",
            "PATCH fleetplacements/reviewer.pending/status",
        ]
    );
    for c in &calls {
        assert_eq!(c.content_type, "application/apply-patch+yaml", "{}", c.short());
        assert!(c.query.contains("fieldManager=fleet-controller") && c.query.contains("force=true"), "{}", c.query);
    }
    let obj = &calls[0].body;
    assert_eq!(obj["apiVersion"], "fleet.taimen.dev/v1alpha1");
    assert_eq!(obj["kind"], "FleetNode");
    assert_eq!(obj["metadata"]["labels"]["app.kubernetes.io/managed-by"], "fleet-controller");
    assert_eq!(obj["spec"], json!({"nodeId": "n-1"}));
    let st = &calls[1].body["status"];
    assert_eq!(st["name"], "gpu-1");
    assert_eq!(st["status"], "online");
    assert_eq!(st["health"], "ok");
    assert_eq!(st["slots"], "2/4", "two replicas placed of four slots");
    assert_eq!(st["placedReplicas"], 2);
    assert_eq!(st["lastSeenAt"], T0);
    assert_eq!(st["capacity"], json!({"slots": 4, "cpus": 4.0}));
    let p = &calls[3].body["status"];
    assert_eq!(
        p,
        &json!({"agentKey":"coder","revision":3,"node":"gpu-1","nodeId":"n-1","replicas":2,"status":"placed"})
    );
    let q = &calls[5].body["status"];
    assert_eq!(q, &json!({"agentKey":"reviewer","revision":1,"replicas":1,"status":"pending","reason":"no_node"}));

    // The same store again: no request at all.
    assert_eq!(m.sync(&w).await, 0);
    // A newer lastSeenAt alone waits for the once-a-minute refresh.
    let w2 =
        wanted(vec![node("n-1", "gpu-1", 4, T1)], vec![placed("coder", "n-1", 2), pending("reviewer", 1, "no_node")]);
    assert_eq!(m.sync(&w2).await, 0);
    assert!(take(&server).is_empty());
}

#[tokio::test]
async fn a_change_writes_only_the_status_that_changed() {
    let (mut m, server) = mirror();
    let w = wanted(vec![node("n-1", "gpu-1", 4, T0), node("n-2", "gpu-2", 2, T0)], vec![placed("coder", "n-1", 1)]);
    m.sync(&w).await;
    take(&server);
    let mut degraded = node("n-2", "gpu-2", 2, T1);
    degraded.health = Health::Degraded;
    degraded.status = NodeStatus::Offline;
    let w = wanted(vec![node("n-1", "gpu-1", 4, T0), degraded], vec![placed("coder", "n-1", 3)]);
    assert_eq!(m.sync(&w).await, 3);
    let calls = take(&server);
    assert_eq!(
        shorts(&calls),
        ["PATCH fleetnodes/gpu-1/status", "PATCH fleetnodes/gpu-2/status", "PATCH fleetplacements/coder.gpu-1/status"]
    );
    assert_eq!(calls[0].body["status"]["slots"], "3/4");
    assert_eq!(calls[1].body["status"]["health"], "degraded");
    assert_eq!(calls[1].body["status"]["status"], "offline");
    assert_eq!(calls[1].body["status"]["lastSeenAt"], T1, "a real change carries the newest lastSeenAt along");
    assert_eq!(calls[2].body["status"]["replicas"], 3);
}

fn as_seen(call_spec: &Call, call_status: &Call, name: &str) -> kube::api::DynamicObject {
    let mut v = call_spec.body.clone();
    v["status"] = call_status.body["status"].clone();
    v["metadata"]["name"] = json!(name);
    serde_json::from_value(v).unwrap()
}

#[tokio::test]
async fn puts_back_a_mirror_deleted_or_edited_by_hand() {
    let (mut m, server) = mirror();
    let w = wanted(vec![node("n-1", "gpu-1", 4, T0)], vec![]);
    m.sync(&w).await;
    let created = take(&server);
    let original = as_seen(&created[0], &created[1], "gpu-1");

    // The watch echoes our own write: nothing to do.
    m.seen(Kind::Node, Seen::Applied(Box::new(original.clone())));
    assert_eq!(m.sync(&w).await, 0);

    // Someone edits the status by hand: the status is put back, the spec left alone.
    let mut edited = original.clone();
    edited.data["status"]["status"] = json!("offline");
    m.seen(Kind::Node, Seen::Applied(Box::new(edited)));
    assert_eq!(m.sync(&w).await, 1);
    let calls = take(&server);
    assert_eq!(shorts(&calls), ["PATCH fleetnodes/gpu-1/status"]);
    assert_eq!(calls[0].body["status"]["status"], "online");

    // An edit into another shape altogether (a required field removed) is put back too.
    let mut broken = original.clone();
    broken.data["spec"] = json!({"somethingElse": 1});
    m.seen(Kind::Node, Seen::Applied(Box::new(broken)));
    m.sync(&w).await;
    assert_eq!(shorts(&take(&server)), ["PATCH fleetnodes/gpu-1"]);

    // Someone deletes it: both writes again.
    m.seen(Kind::Node, Seen::Deleted("gpu-1".into()));
    assert_eq!(m.sync(&w).await, 2);
    assert_eq!(shorts(&take(&server)), ["PATCH fleetnodes/gpu-1", "PATCH fleetnodes/gpu-1/status"]);
}

#[tokio::test]
async fn deletes_mirrors_of_vanished_nodes_and_placements_and_leftovers_found_at_start() {
    let (mut m, server) = mirror();
    let w = wanted(
        vec![node("n-1", "gpu-1", 4, T0), node("n-2", "gpu-2", 4, T0)],
        vec![placed("coder", "n-1", 1), placed("coder", "n-2", 1)],
    );
    m.sync(&w).await;
    take(&server);
    let w = wanted(vec![node("n-1", "gpu-1", 4, T0)], vec![placed("coder", "n-1", 2)]);
    m.sync(&w).await;
    let calls = take(&server);
    assert_eq!(
        shorts(&calls),
        [
            "PATCH fleetnodes/gpu-1/status",
            "DELETE fleetnodes/gpu-2",
            "PATCH fleetplacements/coder.gpu-1/status",
            "DELETE fleetplacements/coder.gpu-2"
        ]
    );
    assert_eq!(calls[0].body["status"]["slots"], "2/4", "gpu-1 now holds both replicas");
    assert_eq!(m.sync(&w).await, 0);

    // After a restart the watch lists a mirror of a node that no longer exists: deleted.
    let (mut m, server) = mirror();
    let stale: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "fleet.taimen.dev/v1alpha1", "kind": "FleetNode",
        "metadata": {"name": "old-host", "namespace": "fleet"},
        "spec": {"nodeId": "n-9"}
    }))
    .unwrap();
    m.seen(Kind::Node, Seen::Relist);
    m.seen(Kind::Node, Seen::Applied(Box::new(stale)));
    m.seen(Kind::Node, Seen::RelistDone);
    let w = wanted(vec![], vec![]);
    m.sync(&w).await;
    assert_eq!(shorts(&take(&server)), ["DELETE fleetnodes/old-host"]);
}

#[tokio::test]
async fn a_relist_forgets_mirrors_deleted_while_the_watch_was_down() {
    let (mut m, server) = mirror();
    let w = wanted(vec![node("n-1", "gpu-1", 4, T0), node("n-2", "gpu-2", 4, T0)], vec![]);
    m.sync(&w).await;
    let c = take(&server);
    let gpu1 = as_seen(&c[0], &c[1], "gpu-1");
    // gpu-2 vanished from the cluster without a delete event reaching us.
    m.seen(Kind::Node, Seen::Relist);
    m.seen(Kind::Node, Seen::Applied(Box::new(gpu1)));
    m.seen(Kind::Node, Seen::RelistDone);
    m.sync(&w).await;
    assert_eq!(shorts(&take(&server)), ["PATCH fleetnodes/gpu-2", "PATCH fleetnodes/gpu-2/status"]);
}

#[tokio::test]
async fn an_api_error_backs_off_and_the_write_is_retried_after() {
    let (mut m, server) = mirror();
    server.lock().fail_with = Some(500);
    let w = wanted(vec![node("n-1", "gpu-1", 4, T0), node("n-2", "gpu-2", 4, T0)], vec![]);
    assert_eq!(m.sync(&w).await, 1, "the first failure stops the round");
    assert_eq!(take(&server).len(), 1);
    assert_eq!(m.sync(&w).await, 0, "backing off: no request");
    assert!(take(&server).is_empty());
    server.lock().fail_with = None;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(m.sync(&w).await, 4, "after the backoff everything is written");
}

/// One object the API server refuses is retried on its own backoff: every other object is
/// still written, in the same round and in the rounds after, and the refused one is not asked
/// again before its backoff ends.
#[tokio::test]
async fn an_object_the_api_server_refuses_holds_back_no_other() {
    let (mut m, server) = mirror();
    server.lock().refuse = Some("gpu-1".into());
    let nodes = |slots| vec![node("n-1", "gpu-1", 4, T0), node("n-2", "gpu-2", slots, T0), node("n-3", "gpu-3", 4, T0)];
    assert_eq!(m.sync(&wanted(nodes(4), vec![])).await, 5, "gpu-1's apply refused, the others written");
    assert_eq!(
        shorts(&take(&server)),
        [
            "PATCH fleetnodes/gpu-1",
            "PATCH fleetnodes/gpu-2",
            "PATCH fleetnodes/gpu-2/status",
            "PATCH fleetnodes/gpu-3",
            "PATCH fleetnodes/gpu-3/status"
        ]
    );
    // While gpu-1 waits, a change of gpu-2 is written and gpu-1 is not asked again.
    m.sync(&wanted(nodes(8), vec![])).await;
    let calls = shorts(&take(&server));
    assert!(!calls.is_empty() && calls.iter().all(|c| c.contains("gpu-2")), "{calls:?}");
    // Refused again after its first backoff (1 s): it waits twice as long.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    m.sync(&wanted(nodes(8), vec![])).await;
    assert_eq!(shorts(&take(&server)), ["PATCH fleetnodes/gpu-1"]);
    server.lock().refuse = None;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(m.sync(&wanted(nodes(8), vec![])).await, 0, "still within its doubled backoff");
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    m.sync(&wanted(nodes(8), vec![])).await;
    assert_eq!(shorts(&take(&server)), ["PATCH fleetnodes/gpu-1", "PATCH fleetnodes/gpu-1/status"]);
}

#[tokio::test]
async fn a_large_fleet_is_written_at_a_bounded_rate() {
    let (mut m, server) = mirror();
    let nodes = (0..150).map(|i| node(&format!("n-{i}"), &format!("host-{i:03}"), 4, T0)).collect();
    let w = wanted(nodes, vec![]);
    let first = m.sync(&w).await;
    assert!(first as f64 <= WRITE_BURST, "one round wrote {first}");
    assert_eq!(take(&server).len(), first);
    // The rest follows in later rounds, without rewriting what is done.
    let mut total = first;
    for _ in 0..40 {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        total += m.sync(&w).await;
        if total == 300 {
            break;
        }
    }
    assert_eq!(total, 300);
    let calls = take(&server);
    let distinct: std::collections::HashSet<_> = calls.iter().map(Call::short).collect();
    assert_eq!(distinct.len(), calls.len(), "no object written twice");
}

#[tokio::test]
async fn start_up_check_says_when_the_crds_are_missing_or_forbidden() {
    let (m, server) = mirror();
    m.check().await.unwrap();
    assert_eq!(shorts(&take(&server)), ["GET fleetnodes", "GET fleetplacements"]);
    server.lock().fail_with = Some(404);
    let e = m.check().await.unwrap_err().to_string();
    assert!(e.contains("the FleetNode CRD (fleetnodes.fleet.taimen.dev) is not installed"), "{e}");
    assert!(e.contains("fleet-controller crds | kubectl apply -f -"), "{e}");
    server.lock().fail_with = Some(403);
    let e = m.check().await.unwrap_err().to_string();
    assert!(e.contains("may not list fleetnodes in namespace \"fleet\""), "{e}");
}

#[test]
fn names_follow_the_spec() {
    let w = wanted(
        vec![node("n-1", "Bad_Name", 1, T0), node("n-2", "ok.host", 1, T0)],
        vec![placed("coder", "n-2", 1), {
            let mut s = pending("old", 0, "x");
            s.status = PlacementStatus::Stopped;
            s.reason = None;
            s
        }],
    );
    let names: Vec<_> = w.nodes.iter().map(|n| n.name.as_str()).collect();
    assert!(names[0].starts_with("node-") && names[1] == "ok.host", "{names:?}");
    let p: Vec<_> = w.placements.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(p, ["coder.ok.host", "old.stopped"]);
}

/// docs/behaviour.md#kubernetes-mirror: a FleetPlacement carries its agent's rollout while it is
/// not complete (the `Rollout` printer column), and a change of it is a status write.
#[tokio::test]
async fn a_placement_shows_its_agents_rollout_while_it_is_not_complete() {
    let (mut m, server) = mirror();
    let nodes = vec![node("n-1", "gpu-1", 4, T0)];
    let views = [placed("coder", "n-1", 2), placed("reviewer", "n-1", 1)];
    let rollouts: rustc_hash::FxHashMap<String, &'static str> = [("coder".to_string(), "halted")].into_iter().collect();
    let w = desired::wanted_from(&nodes, || views.iter().cloned(), &rollouts);
    m.sync(&w).await;
    let calls = take(&server);
    let status = |name: &str| {
        calls
            .iter()
            .find(|c| c.short() == format!("PATCH fleetplacements/{name}/status"))
            .map(|c| c.body["status"].clone())
    };
    assert_eq!(status("coder.gpu-1").unwrap()["rollout"], "halted");
    assert!(status("reviewer.gpu-1").unwrap().get("rollout").is_none());
    let w = desired::wanted_from(&nodes, || views.iter().cloned(), &Default::default());
    m.sync(&w).await;
    assert_eq!(shorts(&take(&server)), ["PATCH fleetplacements/coder.gpu-1/status"], "the rollout ended");
}
