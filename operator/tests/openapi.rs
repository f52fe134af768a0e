//! The API contract: `openapi/fleet.json` is what the code generates (regenerate with
//! `cargo run -p fleet-controller -- openapi > openapi/fleet.json`), it is served at
//! `/openapi.json` even when not configured, and real answers carry every required field.

mod support;

use serde_json::{json, Value};
use support::*;

fn checked_in() -> String {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../openapi/fleet.json");
    std::fs::read_to_string(p).expect("openapi/fleet.json is checked in")
}

#[test]
fn checked_in_contract_matches_the_code() {
    assert!(
        fleet_controller::http::openapi::document() == checked_in(),
        "openapi/fleet.json drifted from the code: cargo run -p fleet-controller -- openapi > openapi/fleet.json"
    );
}

fn required<'a>(doc: &'a Value, schema: &str) -> Vec<&'a str> {
    doc["components"]["schemas"][schema]["required"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_even_unconfigured_and_answers_conform() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = in_process_config(&dk, dir.path());
    cfg.credentials = None;
    let off = fleet_controller::server::start(cfg).await.unwrap();
    let served = reqwest::get(format!("http://{}/openapi.json", off.addr)).await.unwrap();
    assert_eq!(served.status(), 200);
    assert_eq!(served.text().await.unwrap(), checked_in());
    off.shutdown().await;

    let doc: Value = serde_json::from_str(&checked_in()).unwrap();
    for path in [
        "/healthz",
        "/api/v1/join-keys",
        "/api/v1/nodes",
        "/api/v1/nodes/{id}",
        "/api/v1/placements",
        "/api/v1/nodes:join",
        "/api/v1/nodes/me/desired",
        "/api/v1/nodes/me/observed",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path} is in the contract");
    }
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:admin"], 600));
    let mut node = TestNode::new(&url, "c1", json!({"executorKinds": ["k"], "capacity": {"slots": 1}}));
    node.join(&admin.join_key().await).await;
    dk.put_agent(agent("conform", "k", 1));
    let desired = eventually(20, "desired with an agent", || async {
        let (_, d) = node.desired(None, 0).await;
        (!d["agents"].as_array()?.is_empty()).then_some(d)
    })
    .await;
    let check = |schema: &str, v: &Value| {
        for f in required(&doc, schema) {
            assert!(v.get(f).is_some(), "{schema}.{f} is required by the contract: {v}");
        }
    };
    check("DesiredState", &desired);
    check("DesiredAgent", &desired["agents"][0]);
    check("DesiredIdentity", &desired["agents"][0]["identity"]);
    check("NodeView", &admin.nodes().await[0]);
    check("PlacementView", &admin.placements().await[0]);
    let (_, detail) = admin.get(&format!("/api/v1/nodes/{}", node.id)).await;
    check("NodeView", &detail);
    running.shutdown().await;
}
