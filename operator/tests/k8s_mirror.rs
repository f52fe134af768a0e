//! The Kubernetes mirror's requests, against a fake API server behind kube's `tower-test`
//! mock service (`support::fake_kube`, which keeps the objects): each test asserts the exact
//! requests — create, then a status apply carrying the object's uid; a status write only on a
//! change; nothing while unchanged; put back after a delete or a hand edit; a status another
//! manager added to taken back; deletes of vanished objects by uid; another fleet's object
//! left alone; backoff; the rate bound; and the start-up check's messages. What the real API
//! server makes of these requests is tested in `k8s_real.rs`.

mod support;

use fleet_api::{Capacity, Health, NodeStatus, NodeView, PlacementStatus, PlacementView};
use fleet_controller::k8s::belief::Seen;
use fleet_controller::k8s::check::{check, CheckError};
use fleet_controller::k8s::desired::{self, Wanted};
use fleet_controller::k8s::health::Health as MirrorHealth;
use fleet_controller::k8s::kind::Kind;
use fleet_controller::k8s::mirror::{Mirror, WRITE_BURST};
use fleet_controller::metrics::Metrics;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use support::fake_kube::{self, Call, Server};

const FLEET: &str = "f1";

fn mirror() -> (Mirror, Arc<Mutex<Server>>) {
    let (client, server) = fake_kube::client();
    let metrics = Arc::new(Metrics::default());
    (Mirror::new(client, "fleet", FLEET, metrics.clone(), MirrorHealth::new(metrics)), server)
}

fn take(server: &Arc<Mutex<Server>>) -> Vec<Call> {
    std::mem::take(&mut server.lock().calls)
}

fn shorts(calls: &[Call]) -> Vec<String> {
    calls.iter().map(Call::short).collect()
}

/// The object the fake server holds, as a watch would show it.
fn stored(server: &Arc<Mutex<Server>>, plural: &str, name: &str) -> kube::api::DynamicObject {
    let v = server.lock().objects[&(plural.to_string(), name.to_string())].clone();
    serde_json::from_value(v).unwrap()
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
        maintenance_windows: Vec::new(),
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
    desired::wanted_from(&nodes, || views.iter().cloned(), &Default::default(), &Default::default())
}

const T0: &str = "2026-11-30T10:00:00.000Z";
const T1: &str = "2026-11-30T10:00:20.000Z";

#[tokio::test]
async fn creates_then_applies_the_status_by_uid_then_writes_nothing_while_unchanged() {
    let (mut m, server) = mirror();
    let w =
        wanted(vec![node("n-1", "gpu-1", 4, T0)], vec![placed("coder", "n-1", 2), pending("reviewer", 1, "no_node")]);
    assert_eq!(m.sync(&w).await, 6);
    let calls = take(&server);
    assert_eq!(
        shorts(&calls),
        [
            "POST fleetnodes",
            "PATCH fleetnodes/gpu-1/status",
            "POST fleetplacements",
            "PATCH fleetplacements/coder.gpu-1/status",
            "POST fleetplacements",
            "PATCH fleetplacements/reviewer.pending/status",
        ]
    );
    let obj = &calls[0].body;
    assert_eq!(obj["apiVersion"], "fleet.taimen.dev/v1alpha1");
    assert_eq!(obj["kind"], "FleetNode");
    assert_eq!(
        obj["metadata"]["labels"],
        json!({"app.kubernetes.io/managed-by": "fleet-controller", "fleet.taimen.dev/fleet": FLEET})
    );
    assert_eq!(obj["spec"], json!({"nodeId": "n-1"}));
    assert!(calls[0].query.contains("fieldManager=fleet-controller"), "{}", calls[0].query);
    let status_write = &calls[1];
    assert_eq!(status_write.content_type, "application/apply-patch+yaml");
    assert!(status_write.query.contains("fieldManager=fleet-controller") && status_write.query.contains("force=true"));
    assert_eq!(status_write.body["metadata"]["uid"], "uid-1", "the status lands only on the object just made");
    let st = &status_write.body["status"];
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
        &json!({"agentKey":"coder","revision":3,"node":"gpu-1","nodeId":"n-1","replicas":2,"status":"placed",
                "busyReplicas":0,"busy":[]}),
        "the busy fields are written when empty too: they are the controller's"
    );
    let q = &calls[5].body["status"];
    assert_eq!(
        q,
        &json!({"agentKey":"reviewer","revision":1,"replicas":1,"status":"pending","reason":"no_node",
                "busyReplicas":0,"busy":[]})
    );

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

#[tokio::test]
async fn puts_back_a_mirror_deleted_or_edited_by_hand() {
    let (mut m, server) = mirror();
    let w = wanted(vec![node("n-1", "gpu-1", 4, T0)], vec![]);
    m.sync(&w).await;
    take(&server);
    let original = stored(&server, "fleetnodes", "gpu-1");

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

    // An edit into another shape altogether (a required field removed), or a label removed, is
    // put back by an apply of the spec and labels.
    let mut broken = original.clone();
    broken.data["spec"] = json!({"somethingElse": 1});
    m.seen(Kind::Node, Seen::Applied(Box::new(broken)));
    m.sync(&w).await;
    assert_eq!(shorts(&take(&server)), ["PATCH fleetnodes/gpu-1"]);
    let mut unlabelled = original.clone();
    unlabelled.metadata.labels.as_mut().unwrap().remove("fleet.taimen.dev/fleet");
    m.seen(Kind::Node, Seen::Applied(Box::new(unlabelled)));
    m.sync(&w).await;
    let calls = take(&server);
    assert_eq!(shorts(&calls), ["PATCH fleetnodes/gpu-1"]);
    assert_eq!(calls[0].body["metadata"]["labels"]["fleet.taimen.dev/fleet"], FLEET);
    assert_eq!(calls[0].body["metadata"]["uid"], "uid-1");

    // Someone deletes it: made again.
    server.lock().objects.clear();
    m.seen(Kind::Node, Seen::Deleted("gpu-1".into()));
    assert_eq!(m.sync(&w).await, 2);
    let calls = take(&server);
    assert_eq!(shorts(&calls), ["POST fleetnodes", "PATCH fleetnodes/gpu-1/status"]);
    assert_eq!(calls[1].body["metadata"]["uid"], "uid-2", "the new object's uid");
}

/// docs/behaviour.md#kubernetes-mirror: a status field the store does not want, added by
/// another manager, is taken back by an apply with `null` in it, then one without it.
#[tokio::test]
async fn a_status_field_another_manager_added_is_taken_back_in_two_applies() {
    let (mut m, server) = mirror();
    let w = wanted(vec![node("n-1", "gpu-1", 4, T0)], vec![placed("coder", "n-1", 1)]);
    m.sync(&w).await;
    take(&server);
    let mut edited = stored(&server, "fleetplacements", "coder.gpu-1");
    edited.data["status"]["reason"] = json!("hand-made");
    edited.data["status"]["rollout"] = json!("halted");
    m.seen(Kind::Placement, Seen::Applied(Box::new(edited)));
    assert_eq!(m.sync(&w).await, 2);
    let calls = take(&server);
    assert_eq!(
        shorts(&calls),
        ["PATCH fleetplacements/coder.gpu-1/status", "PATCH fleetplacements/coder.gpu-1/status"]
    );
    assert_eq!(calls[0].body["status"]["reason"], Value::Null);
    assert_eq!(calls[0].body["status"]["rollout"], Value::Null);
    assert!(calls[0].body["status"].get("reason").is_some(), "present, as null");
    assert!(calls[1].body["status"].get("reason").is_none() && calls[1].body["status"].get("rollout").is_none());
    assert_eq!(m.sync(&w).await, 0, "the answer shows the store's status: done");
}

#[tokio::test]
async fn deletes_mirrors_of_vanished_nodes_and_placements_by_uid_and_leftovers_found_at_start() {
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
    assert_eq!(calls[1].body["preconditions"]["uid"], "uid-2", "only the object it made");
    assert_eq!(m.sync(&w).await, 0);

    // After a restart the watch lists a mirror of a node that no longer exists: deleted.
    let (mut m, server) = mirror();
    let stale: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "fleet.taimen.dev/v1alpha1", "kind": "FleetNode",
        "metadata": {"name": "old-host", "namespace": "fleet", "uid": "u-old",
                     "labels": {"app.kubernetes.io/managed-by": "fleet-controller", "fleet.taimen.dev/fleet": FLEET}},
        "spec": {"nodeId": "n-9"}
    }))
    .unwrap();
    server.lock().objects.insert(("fleetnodes".into(), "old-host".into()), serde_json::to_value(&stale).unwrap());
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
    take(&server);
    let gpu1 = stored(&server, "fleetnodes", "gpu-1");
    // gpu-2 vanished from the cluster without a delete event reaching us.
    server.lock().objects.remove(&("fleetnodes".to_string(), "gpu-2".to_string()));
    m.seen(Kind::Node, Seen::Relist);
    m.seen(Kind::Node, Seen::Applied(Box::new(gpu1)));
    m.seen(Kind::Node, Seen::RelistDone);
    m.sync(&w).await;
    assert_eq!(shorts(&take(&server)), ["POST fleetnodes", "PATCH fleetnodes/gpu-2/status"]);
}

/// Objects belong to one fleet: a name taken by another fleet's object is left alone (and
/// waits on its backoff), while an old mirror of Fleet's without a fleet label is adopted.
#[tokio::test]
async fn another_fleets_object_is_left_alone_and_an_unlabelled_one_adopted() {
    let (mut m, server) = mirror();
    let theirs = json!({"apiVersion": "fleet.taimen.dev/v1alpha1", "kind": "FleetNode",
        "metadata": {"name": "gpu-1", "uid": "theirs", "labels": {"app.kubernetes.io/managed-by": "fleet-controller", "fleet.taimen.dev/fleet": "other"}},
        "spec": {"nodeId": "x"}});
    let old = json!({"apiVersion": "fleet.taimen.dev/v1alpha1", "kind": "FleetNode",
        "metadata": {"name": "gpu-2", "uid": "old", "labels": {"app.kubernetes.io/managed-by": "fleet-controller"}},
        "spec": {"nodeId": "n-2"}});
    server.lock().objects.insert(("fleetnodes".into(), "gpu-1".into()), theirs.clone());
    server.lock().objects.insert(("fleetnodes".into(), "gpu-2".into()), old);
    let w = wanted(vec![node("n-1", "gpu-1", 4, T0), node("n-2", "gpu-2", 4, T0)], vec![]);
    m.sync(&w).await;
    assert_eq!(
        shorts(&take(&server)),
        ["POST fleetnodes", "GET fleetnodes/gpu-1", "POST fleetnodes", "GET fleetnodes/gpu-2"]
    );
    m.sync(&w).await;
    let calls = take(&server);
    assert_eq!(shorts(&calls), ["PATCH fleetnodes/gpu-2", "PATCH fleetnodes/gpu-2/status"], "adopted, and gpu-1 waits");
    assert_eq!(calls[0].body["metadata"]["labels"]["fleet.taimen.dev/fleet"], FLEET);
    assert_eq!(calls[0].body["metadata"]["uid"], "old");
    assert_eq!(server.lock().objects[&("fleetnodes".to_string(), "gpu-1".to_string())], theirs, "untouched");
    // Not wanted any more: this fleet deletes its own only.
    m.sync(&wanted(vec![], vec![])).await;
    assert_eq!(shorts(&take(&server)), ["DELETE fleetnodes/gpu-2"]);
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
    assert_eq!(m.sync(&wanted(nodes(4), vec![])).await, 5, "gpu-1's create refused, the others written");
    assert_eq!(
        shorts(&take(&server)),
        [
            "POST fleetnodes",
            "POST fleetnodes",
            "PATCH fleetnodes/gpu-2/status",
            "POST fleetnodes",
            "PATCH fleetnodes/gpu-3/status"
        ]
    );
    // While gpu-1 waits, a change of gpu-2 is written and gpu-1 is not asked again.
    m.sync(&wanted(nodes(8), vec![])).await;
    assert_eq!(shorts(&take(&server)), ["PATCH fleetnodes/gpu-2/status"]);
    // Refused again after its first backoff (1 s): it waits twice as long.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    m.sync(&wanted(nodes(8), vec![])).await;
    assert_eq!(shorts(&take(&server)), ["POST fleetnodes"]);
    server.lock().refuse = None;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(m.sync(&wanted(nodes(8), vec![])).await, 0, "still within its doubled backoff");
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    m.sync(&wanted(nodes(8), vec![])).await;
    assert_eq!(shorts(&take(&server)), ["POST fleetnodes", "PATCH fleetnodes/gpu-1/status"]);
}

#[tokio::test]
async fn a_large_fleet_is_written_at_a_bounded_rate() {
    let (mut m, server) = mirror();
    let nodes = (0..150).map(|i| node(&format!("n-{i}"), &format!("host-{i:03}"), 4, T0)).collect();
    let w = wanted(nodes, vec![]);
    let first = m.sync(&w).await;
    assert!(first as f64 <= WRITE_BURST, "one round wrote {first}");
    let mut calls = take(&server);
    assert_eq!(calls.len(), first);
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
    calls.extend(take(&server));
    let statuses: std::collections::HashSet<_> =
        calls.iter().filter(|c| c.method == "PATCH").map(Call::short).collect();
    assert_eq!(statuses.len(), 150, "no status written twice");
}

/// docs/behaviour.md#kubernetes-mirror: the start-up check names what is wrong and the fix.
#[tokio::test]
async fn the_start_up_check_names_each_misconfiguration_and_its_fix() {
    let (client, server) = fake_kube::client();
    check(&client, "fleet").await.unwrap();
    let calls = take(&server);
    assert_eq!(calls.iter().filter(|c| c.path.ends_with("selfsubjectaccessreviews")).count(), 14, "7 verbs on 2 kinds");
    assert!(calls.last().unwrap().query.contains("dryRun=All"), "a dry-run create proves the namespace");
    let misconfigured = |e: CheckError| match e {
        CheckError::Misconfigured(m) => m,
        e => panic!("not a misconfiguration: {e}"),
    };
    server.lock().denied = vec!["delete".into()];
    let e = misconfigured(check(&client, "fleet").await.unwrap_err());
    assert!(e.contains("may not delete fleetnodes, delete fleetplacements in namespace \"fleet\""), "{e}");
    assert!(e.contains("the chart's Role does with mirror.enabled=true"), "{e}");
    server.lock().denied.clear();
    server.lock().namespace_missing = true;
    let e = misconfigured(check(&client, "fleet").await.unwrap_err());
    assert!(e.contains("namespace \"fleet\" does not exist: create it (`kubectl create namespace fleet`)"), "{e}");
    server.lock().fail_with = Some(404);
    let e = misconfigured(check(&client, "fleet").await.unwrap_err());
    assert!(e.contains("the FleetNode CRD (fleetnodes.fleet.taimen.dev) is not installed"), "{e}");
    assert!(e.contains("kubectl apply --server-side -f crds/"), "{e}");
    server.lock().fail_with = Some(503);
    assert!(matches!(check(&client, "fleet").await, Err(CheckError::Unreachable(_))));
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
/// not complete (the `Rollout` printer column), and a change of it is a status write — taking
/// the field back when the rollout ends.
#[tokio::test]
async fn a_placement_shows_its_agents_rollout_while_it_is_not_complete() {
    let (mut m, server) = mirror();
    let nodes = vec![node("n-1", "gpu-1", 4, T0)];
    let views = [placed("coder", "n-1", 2), placed("reviewer", "n-1", 1)];
    let rollouts: rustc_hash::FxHashMap<String, &'static str> = [("coder".to_string(), "halted")].into_iter().collect();
    let w = desired::wanted_from(&nodes, || views.iter().cloned(), &rollouts, &Default::default());
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
    let w = desired::wanted_from(&nodes, || views.iter().cloned(), &Default::default(), &Default::default());
    m.sync(&w).await;
    let calls = take(&server);
    assert_eq!(
        shorts(&calls),
        ["PATCH fleetplacements/coder.gpu-1/status", "PATCH fleetplacements/coder.gpu-1/status"],
        "the rollout ended: its field nulled, then dropped"
    );
    assert!(calls[1].body["status"].get("rollout").is_none());
}

/// docs/behaviour.md#kubernetes-mirror: a FleetPlacement counts its busy replicas (the `Busy`
/// printer column) and lists each with its lease's end rounded up to the minute; both fields
/// are always written, so an idle placement's status says 0 and [] in one apply.
#[tokio::test]
async fn a_placement_shows_its_busy_replicas() {
    let (mut m, server) = mirror();
    let nodes = vec![node("n-1", "gpu-1", 4, T0)];
    let views = [placed("coder", "n-1", 3)];
    let until = fleet_controller::clock::parse_rfc3339_ms("2026-11-30T10:41:20.000Z").unwrap();
    let busy: desired::BusyReplicas =
        [(("coder".to_string(), "n-1".to_string()), vec![(2, until), (0, until)])].into_iter().collect();
    let w = desired::wanted_from(&nodes, || views.iter().cloned(), &Default::default(), &busy);
    m.sync(&w).await;
    let calls = take(&server);
    let status = calls.iter().find(|c| c.short() == "PATCH fleetplacements/coder.gpu-1/status").unwrap();
    assert_eq!(status.body["status"]["busyReplicas"], 2);
    assert_eq!(
        status.body["status"]["busy"],
        json!([{"replica": 0, "until": "2026-11-30T10:42:00Z"}, {"replica": 2, "until": "2026-11-30T10:42:00Z"}])
    );
    let w = desired::wanted_from(&nodes, || views.iter().cloned(), &Default::default(), &Default::default());
    m.sync(&w).await;
    let calls = take(&server);
    assert_eq!(shorts(&calls), ["PATCH fleetplacements/coder.gpu-1/status"], "idle again: one apply");
    assert_eq!((&calls[0].body["status"]["busyReplicas"], &calls[0].body["status"]["busy"]), (&json!(0), &json!([])));
}
