//! What a node may claim (docs/behaviour.md#what-a-node-may-claim), through the API as an admin
//! and a node use it: a join key with `allowedLabels` or `allowedKinds`, a node claiming more,
//! what is refused in its view and its events, an agent that therefore does not move there,
//! `PUT /api/v1/nodes/{id}/allowed` letting it, a key without allowances unchanged, and secrets
//! matched per kind (docs/behaviour.md#secrets).

mod support;

use serde_json::{json, Value};
use support::*;

async fn key_with(admin: &Admin, body: Value) -> String {
    let (s, v) = admin.post("/api/v1/join-keys", body).await;
    assert_eq!(s, 201, "{v}");
    v["joinKey"].as_str().unwrap().to_string()
}

async fn node_view(admin: &Admin, node: &str) -> Value {
    let (s, v) = admin.get(&format!("/api/v1/nodes/{node}")).await;
    assert_eq!(s, 200, "{v}");
    v
}

async fn put_allowed(admin: &Admin, node: &str, body: Value) -> (u16, Value) {
    let r = admin
        .http
        .put(format!("{}/api/v1/nodes/{node}/allowed", admin.url))
        .bearer_auth(&admin.token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

/// The node an agent's replicas are placed on, by id; `None` while it waits.
async fn placed_node(admin: &Admin, agent: &str) -> Option<String> {
    admin
        .placements()
        .await
        .into_iter()
        .find(|p| p["agentKey"] == agent && p["status"] == "placed")
        .map(|p| p["nodeId"].as_str().unwrap().to_string())
}

/// The agent's waiting reason from its placement explanation, once a pass has looked at it.
async fn waiting_reason(admin: &Admin, agent: &str) -> Option<(String, Value)> {
    let (s, v) = admin.get(&format!("/api/v1/agents/{agent}/placement?nodes=true")).await;
    (s == 200 && v["phase"] == "waiting_for_node").then(|| (v["reason"]["code"].as_str().unwrap().to_string(), v))
}

/// `node_facts_refused` events of a node: their messages.
async fn refused_events(admin: &Admin, node: &str) -> Vec<String> {
    let (s, v) = admin.get(&format!("/api/v1/events?node={node}")).await;
    assert_eq!(s, 200, "{v}");
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "node_facts_refused")
        .map(|e| e["message"].as_str().unwrap().to_string())
        .collect()
}

fn requiring(key: &str, kind: &str, requires: &[&str], secrets: &[&str]) -> Value {
    with(agent(key, kind, 1), |a| {
        a["placement"]["requires"] = json!(requires);
        a["placement"]["secrets"] = json!(secrets);
    })
}

/// Show line 3 of the issue: a node joined with `allowedLabels: [zone=*]` that adds `gpu` has it
/// refused (view, event), and a `requires: [gpu]` agent does not move there until an admin
/// allows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_outside_the_allowance_is_refused_and_never_attracts_an_agent() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:admin"], 3600));

    let (s, v) = admin.post("/api/v1/join-keys", json!({"allowedLabels": ["zone=*", "Bad"]})).await;
    assert_eq!((s.as_u16(), &v["error"]), (400, &json!("invalid_request")), "{v}");
    assert!(v["message"].as_str().unwrap().starts_with("allowedLabels[1]: "), "{v}");

    let key = key_with(&admin, json!({"allowedLabels": ["zone=*"]})).await;
    // Joined with what node.yaml said then; `gpu` was added to node.yaml afterwards.
    let mut n =
        TestNode::new(&url, "n-zone", json!({"labels": ["zone=eu"], "executorKinds": ["k"], "capacity": {"slots": 4}}));
    n.join(&key).await;
    n.announce["labels"] = json!(["gpu", "zone=eu"]);
    let online = keep_reporting(vec![n.clone()]);

    let view = eventually(10, "gpu refused in the node view", || async {
        let v = node_view(&admin, "n-zone").await;
        (v["refusedFacts"]["labels"] == json!(["gpu"])).then_some(v)
    })
    .await;
    assert_eq!(view["labels"], json!(["zone=eu"]), "only the allowed label is the node's: {view}");
    assert_eq!(view["allowedLabels"], json!(["zone=*"]), "{view}");
    assert!(view.get("allowedKinds").is_none(), "kinds are not limited: {view}");
    let listed = admin.nodes().await;
    assert_eq!(listed[0]["refusedFacts"]["labels"], json!(["gpu"]), "the list shows it too");

    dk.put_agent(requiring("trainer", "k", &["gpu"], &[]));
    dk.put_agent(requiring("zoned", "k", &["zone=eu"], &[]));
    eventually(20, "zoned placed on n-zone", || async { (placed_node(&admin, "zoned").await? == n.id).then_some(()) })
        .await;
    let (reason, why) = eventually(20, "trainer waits", || waiting_reason(&admin, "trainer")).await;
    assert_eq!(reason, "no_label", "{why}");
    let verdict = &why["nodes"][0];
    let detail = json!("missing label gpu (claimed, refused by its allowance)");
    assert_eq!((&verdict["name"], &verdict["detail"]), (&json!("n-zone"), &detail), "{why}");
    // Reports keep claiming gpu: still refused, and the event is not repeated per report.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(placed_node(&admin, "trainer").await, None, "gpu never moves trainer onto n-zone");
    let events = eventually(5, "the refusal in the events", || async {
        let e = refused_events(&admin, "n-zone").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(events.len(), 1, "one event while the refused set stays the same: {events:?}");
    assert!(events[0].contains("labels gpu"), "{events:?}");

    // An admin allows it: at once, without waiting for a report.
    let (s, v) = put_allowed(&admin, "n-zone", json!({"allowedLabels": ["zone=*", "gpu"]})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!((&v["labels"], &v["refusedFacts"]["labels"]), (&json!(["gpu", "zone=eu"]), &json!([])), "{v}");
    eventually(20, "trainer placed on n-zone", || async {
        (placed_node(&admin, "trainer").await? == n.id).then_some(())
    })
    .await;

    let (s, v) = put_allowed(&admin, "nope", json!({})).await;
    assert_eq!((s, &v["error"]), (404, &json!("not_found")), "{v}");
    let (s, v) = put_allowed(&admin, "n-zone", json!({"allowedKinds": ["no kind"]})).await;
    assert_eq!((s, &v["error"]), (400, &json!("invalid_request")), "{v}");
    let (s, v) = put_allowed(&admin, "n-zone", json!({"allowedLabel": ["x"]})).await;
    assert_eq!((s, &v["error"]), (400, &json!("invalid_request")), "a strict body: {v}");
    online.abort();
    running.shutdown().await;
}

/// `allowedKinds` likewise, with the refused kind's image list and secrets gone with it; a key
/// without allowances is unchanged; and secrets are matched per kind: a kind that lists its
/// secrets is offered only those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinds_outside_the_allowance_and_secrets_per_kind() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:admin"], 3600));

    let key = key_with(&admin, json!({"allowedKinds": ["k"]})).await;
    let announce = json!({"executorKinds": ["k", "observer"], "executorImages": {"observer": ["obs/mail:1.*"]},
                          "capacity": {"slots": 4}, "secrets": ["github-token", "mail"],
                          "executorSecrets": {"observer": ["mail"]}});
    let mut n = TestNode::new(&url, "n-kinds", announce);
    n.join(&key).await;
    let mut open =
        TestNode::new(&url, "n-open", json!({"labels": ["ssd"], "executorKinds": ["k"], "capacity": {"slots": 4}}));
    open.join(&admin.join_key().await).await;
    let online = keep_reporting(vec![n.clone(), open.clone()]);

    let view = node_view(&admin, "n-kinds").await;
    assert_eq!(view["refusedFacts"], json!({"labels": [], "kinds": ["observer"]}), "refused from the join on: {view}");
    assert_eq!((&view["executorKinds"], &view["executorImages"]), (&json!(["k"]), &json!({})), "{view}");
    assert!(view.get("executorSecrets").is_none(), "the refused kind's secrets go with it: {view}");
    eventually(5, "the refusal at the join in the events", || async {
        let e = refused_events(&admin, "n-kinds").await;
        (e.len() == 1 && e[0].contains("kinds observer")).then_some(())
    })
    .await;

    dk.put_agent(requiring("mailer", "observer", &[], &["mail"]));
    dk.put_agent(requiring("snoop", "observer", &[], &["github-token"]));
    let (reason, why) = eventually(20, "mailer waits", || waiting_reason(&admin, "mailer")).await;
    assert_eq!(reason, "no_executor_kind", "observer is not n-kinds' kind: {why}");
    let on_n = why["nodes"].as_array().unwrap().iter().find(|v| v["name"] == "n-kinds").cloned().unwrap_or_default();
    assert_eq!(on_n["detail"], "no executor kind observer (claimed, refused by its allowance)", "{why}");

    let (s, v) = put_allowed(&admin, "n-kinds", json!({"allowedKinds": ["k", "observer"]})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["executorSecrets"], json!({"observer": ["mail"]}), "{v}");
    assert_eq!(v["executorImages"], json!({"observer": ["obs/mail:1.*"]}), "its images come back with it: {v}");
    eventually(20, "mailer placed on n-kinds", || async {
        (placed_node(&admin, "mailer").await? == n.id).then_some(())
    })
    .await;
    let (reason, why) = eventually(20, "snoop waits", || waiting_reason(&admin, "snoop")).await;
    assert_eq!(reason, "no_secret", "github-token is not offered to observer: {why}");

    // A key without allowances: the node claims what it likes, as before.
    let view = node_view(&admin, "n-open").await;
    assert_eq!((&view["labels"], &view["refusedFacts"]), (&json!(["ssd"]), &json!({"labels": [], "kinds": []})));
    assert!(view.get("allowedLabels").is_none() && view.get("allowedKinds").is_none(), "{view}");
    dk.put_agent(requiring("fast", "k", &["ssd"], &[]));
    eventually(20, "fast placed on n-open", || async { (placed_node(&admin, "fast").await? == open.id).then_some(()) })
        .await;
    assert!(refused_events(&admin, "n-open").await.is_empty());
    online.abort();
    running.shutdown().await;
}
