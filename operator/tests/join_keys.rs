//! Join keys after they were issued (docs/behaviour.md#joining): listed without the key, revoked
//! by id, and a long-poll that outlives its token answers `401`, not the node's desired state.

mod support;

use serde_json::json;
use std::time::Duration;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_listed_without_the_key_and_revoked_by_id() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:admin"], 3600));
    let key = admin.join_key().await;
    let unused = admin.join_key().await;
    let mut n = TestNode::new(&url, "w1", json!({"capacity": {"slots": 1}}));
    n.join(&key).await;

    let (s, list) = admin.get("/api/v1/join-keys").await;
    assert_eq!(s, 200, "{list}");
    assert!(!list.to_string().contains(&key) && !list.to_string().contains(&unused), "never the key: {list}");
    let items = list["items"].as_array().unwrap();
    let used = items.iter().find(|k| k["state"] == "used").expect("the used key");
    assert_eq!(used["nodeId"], n.id.as_str());
    assert!(items.iter().any(|k| k["state"] == "unused"), "{list}");

    let reader = Admin::new(&url, dk.mint("fleet", &["fleet:read"], 3600));
    let id = items.iter().find(|k| k["state"] == "unused").unwrap()["id"].as_str().unwrap().to_string();
    assert_eq!(reader.delete(&format!("/api/v1/join-keys/{id}")).await.0, 403);
    assert_eq!(admin.delete(&format!("/api/v1/join-keys/{id}")).await.0, 204);
    let (s, v) = TestNode::new(&url, "w2", json!({"capacity": {"slots": 1}})).try_join(&unused).await;
    assert_eq!((s.as_u16(), v["error"].as_str()), (401, Some("join_key_invalid")), "revoked: {v}");
    let (s, v) = admin.delete("/api/v1/join-keys/0123456789abcdef").await;
    assert_eq!((s.as_u16(), v["error"].as_str()), (404, Some("not_found")));
    running.shutdown().await;
}

/// A long-poll held with a token that a re-join then replaced: when the desired state changes
/// it answers `401`, and the new token is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_held_with_a_replaced_token_is_not_answered_with_the_desired_state() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:admin"], 3600));
    let key = admin.join_key().await;
    let announce = json!({"executorKinds": ["k"], "capacity": {"slots": 2}});
    let mut n = TestNode::new(&url, "w1", announce);
    n.join(&key).await;
    let old = n.clone();
    let generation = old.generation().await;
    let held = tokio::spawn(async move { old.desired(Some(generation), 20).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    n.join(&key).await; // the first answer "lost": the same node, a new token
    dk.put_agent(agent("coder", "k", 1));
    n.report(&[]).await;
    let (status, body) = tokio::time::timeout(Duration::from_secs(25), held).await.unwrap().unwrap();
    assert_eq!(status, 401, "the old token's poll ended: {body}");
    let fresh = eventually(20, "the new token served", || async {
        let (s, d) = n.desired(None, 0).await;
        (s == 200 && d["agents"].as_array().is_some_and(|a| !a.is_empty())).then_some(d)
    })
    .await;
    assert_eq!(fresh["agents"][0]["agentKey"], "coder");
    running.shutdown().await;
}
