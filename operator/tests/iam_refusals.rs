//! IAM refusing (docs/behaviour.md#identity-and-pats): `403`, `422 invalid_scope_ceiling`, `422 expiry_too_long` keep
//! that agent `pending` with `identity_pending` and the error in the message, while other
//! agents are unaffected; `service` agents are never touched; `placement: none` agents get a
//! principal and no PAT.

mod support;

use fleet_devkit::Faults;
use serde_json::json;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_reported_per_agent() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = in_process_config(&dk, dir.path());
    // `control-plane:admin` is a scope no audience admits in IAM.
    cfg.token_scopes = vec!["control-plane:read".into(), "control-plane:admin".into()];
    let running = fleet_controller::server::start(cfg).await.unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:admin"], 3600));
    let mut node = TestNode::new(&url, "n1", json!({"executorKinds": ["k"], "capacity": {"slots": 10}}));
    node.join(&admin.join_key().await).await;
    let reporter = keep_reporting(vec![node.clone()]);

    // One agent whose ceiling keeps only the admissible scope, one that asks for the bad one.
    let mut good = agent("good", "k", 1);
    good["identity"]["iam"] = json!({"scopeCeiling": ["control-plane:read"]});
    let bad = agent("bad", "k", 1);
    let mut svc = agent("svc", "k", 1);
    svc["identity"]["kind"] = json!("service");
    let mut none = agent("idonly", "k", 1);
    none["placement"] = json!("none");
    dk.put_agents(vec![good, bad, svc, none]);

    let s = eventually(20, "bad is identity_pending with invalid_scope_ceiling", || async {
        dk.status("bad")
            .filter(|s| s["reason"]["message"].as_str().is_some_and(|m| m.contains("invalid_scope_ceiling")))
    })
    .await;
    assert_eq!(s["reason"]["code"], "identity_pending");
    eventually(20, "good has its PAT", || async {
        let (_, d) = node.desired(None, 0).await;
        d["agents"].as_array()?.iter().any(|a| a["agentKey"] == "good").then_some(())
    })
    .await;
    eventually(20, "idonly has a principal bound in the CP", || async { dk.identity("idonly") }).await;
    assert!(dk.identity("svc").is_none(), "service agents are never touched");
    assert!(dk.status("svc").is_none() && dk.status("idonly").is_none(), "no status for service or placement none");
    let pats = dk.pats();
    assert!(pats.iter().all(|p| p.agent_key.as_deref() != Some("idonly") && p.agent_key.as_deref() != Some("svc")));
    let (_, d) = node.desired(None, 0).await;
    let keys: Vec<_> = d["agents"].as_array().unwrap().iter().map(|a| a["agentKey"].as_str().unwrap()).collect();
    assert_eq!(keys, ["good"]);

    // 422 expiry_too_long: IAM's cap below the controller's TTL.
    dk.state.lock().max_ttl_seconds = 3600;
    dk.put_agent(agent("long", "k", 1));
    let s = eventually(20, "long is identity_pending with expiry_too_long", || async {
        dk.status("long").filter(|s| s["reason"]["message"].as_str().is_some_and(|m| m.contains("expiry_too_long")))
    })
    .await;
    assert_eq!(s["phase"], "pending");
    dk.state.lock().max_ttl_seconds = 604_800;

    // 403: the service account lacks iam:agents.
    dk.set_faults(Faults { iam_forbidden: true, ..Default::default() });
    dk.put_agent(agent("denied", "k", 1));
    // The first status says the identity is being created; then IAM's refusal shows.
    let s = eventually(20, "denied is identity_pending with the 403", || async {
        dk.status("denied").filter(|s| s["reason"]["message"].as_str().is_some_and(|m| m.contains("403")))
    })
    .await;
    assert_eq!(s["reason"]["code"], "identity_pending");
    let (_, d) = node.desired(None, 0).await;
    assert!(d["agents"].as_array().unwrap().iter().any(|a| a["agentKey"] == "good"), "others unaffected");
    dk.set_faults(Faults::default());
    reporter.abort();
    running.shutdown().await;
}
