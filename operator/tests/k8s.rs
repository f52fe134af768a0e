//! Kubernetes as the operator meets it: the checked-in CRDs match the Rust types (drift
//! fails here), `fleet-controller crds` prints them, and the controller binary with
//! `FLEET_KUBERNETES_MIRROR=true` talks to an API server named by a kubeconfig — refusing to
//! start when the CRDs are missing, and otherwise writing a `FleetNode` for a node that joins
//! and a `FleetPlacement` for its agent. No API server can run on these machines, so a small
//! HTTP server on a real socket plays one: it records requests and answers list, watch,
//! server-side apply and delete the way the API server does.

mod support;

use axum::extract::{Request, State};
use axum::response::IntoResponse;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use support::*;

fn crds_file() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds/fleet.taimen.dev.yaml")).unwrap()
}

#[test]
fn checked_in_crds_match_the_rust_types() {
    let generated = fleet_controller::k8s::crd::crds_yaml();
    assert!(
        generated == crds_file(),
        "crds/fleet.taimen.dev.yaml is stale: run `cargo run -p fleet-controller -- crds > crds/fleet.taimen.dev.yaml`"
    );
    let chart_copy = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/fleet-controller/files/crds/fleet.taimen.dev.yaml"),
    )
    .unwrap();
    assert!(
        chart_copy == generated,
        "the chart's CRDs are stale: cp crds/fleet.taimen.dev.yaml charts/fleet-controller/files/crds/"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleet-controller")).arg("crds").output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), generated);
}

#[test]
fn crds_declare_names_scope_status_and_printer_columns() {
    let docs: Vec<Value> = crds_file()
        .split("\n---\n")
        .skip(1)
        .map(|d| serde_json::to_value(serde_yaml::from_str::<serde_yaml::Value>(d).unwrap()).unwrap())
        .collect();
    assert_eq!(docs.len(), 2);
    let cols = |d: &Value| -> Vec<String> {
        d["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect()
    };
    for (d, name, short) in
        [(&docs[0], "fleetnodes.fleet.taimen.dev", "fnode"), (&docs[1], "fleetplacements.fleet.taimen.dev", "fplace")]
    {
        assert_eq!(d["metadata"]["name"], name);
        assert_eq!(d["spec"]["group"], "fleet.taimen.dev");
        assert_eq!(d["spec"]["scope"], "Namespaced");
        assert_eq!(d["spec"]["names"]["shortNames"], json!([short]));
        let v = &d["spec"]["versions"][0];
        assert_eq!(v["name"], "v1alpha1");
        assert_eq!(v["served"], true);
        assert_eq!(v["storage"], true);
        assert_eq!(v["subresources"]["status"], json!({}));
    }
    assert_eq!(cols(&docs[0]), ["Status", "Health", "Scheduling", "Slots", "Version", "Last Seen", "Age"]);
    assert_eq!(cols(&docs[1]), ["Agent", "Node", "Replicas", "Status", "Reason", "Rollout", "Age"]);
}

#[derive(Default)]
struct FakeApi {
    calls: Vec<(String, String, Value)>,
    crds_missing: bool,
}

async fn api_server(State(s): State<Arc<Mutex<FakeApi>>>, req: Request) -> axum::response::Response {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let watch = req.uri().query().unwrap_or("").contains("watch=true");
    let bytes = axum::body::to_bytes(req.into_body(), 1 << 20).await.unwrap();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let missing = {
        let mut s = s.lock();
        s.calls.push((method.clone(), path.clone(), body.clone()));
        s.crds_missing
    };
    let json = |code: u16, v: Value| {
        (axum::http::StatusCode::from_u16(code).unwrap(), [("content-type", "application/json")], v.to_string())
            .into_response()
    };
    if watch && !missing {
        // A watch that stays quiet for a while, as a real one does when nothing changes.
        tokio::time::sleep(std::time::Duration::from_secs(20)).await;
        return json(200, Value::Null);
    }
    let (code, answer) = kube_answer(&method, &path, body, missing.then_some(404));
    json(code, answer)
}

async fn fake_api(missing: bool) -> (String, Arc<Mutex<FakeApi>>) {
    let state = Arc::new(Mutex::new(FakeApi { crds_missing: missing, ..Default::default() }));
    let app = axum::Router::new().fallback(api_server).with_state(state.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (url, state)
}

fn kubeconfig(dir: &Path, server: &str) -> String {
    let p = dir.join("kubeconfig");
    std::fs::write(
        &p,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {server}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: fleet\ncurrent-context: fake\nusers:\n- name: fake\n  user:\n    token: test\n"
        ),
    )
    .unwrap();
    p.display().to_string()
}

/// Runs `fleet-controller serve` with `env`, expects it to exit with an error, returns stderr.
async fn serve_fails(env: &std::collections::HashMap<String, String>) -> String {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fleet-controller"))
        .arg("serve")
        .env_clear()
        .envs(env)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirror_on_refuses_to_start_without_the_crds() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let (url, _api) = fake_api(true).await;
    let mut env = env_for(&dk, dir.path(), free_port(), free_port());
    env.insert("FLEET_KUBERNETES_MIRROR".into(), "true".into());
    env.insert("KUBECONFIG".into(), kubeconfig(dir.path(), &url));
    let err = serve_fails(&env).await;
    assert!(err.contains("the FleetNode CRD (fleetnodes.fleet.taimen.dev) is not installed in the cluster"), "{err}");

    // And with no cluster at all, the error says so instead of a stack of kube internals.
    env.insert("KUBECONFIG".into(), dir.path().join("none").display().to_string());
    env.insert("HOME".into(), dir.path().display().to_string());
    let err = serve_fails(&env).await;
    assert!(err.contains("FLEET_KUBERNETES_MIRROR=true but no Kubernetes API is reachable"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirror_on_writes_a_fleetnode_and_a_fleetplacement_for_a_joined_node() {
    let dk = devkit().await;
    dk.put_agent(agent("coder", "claude-code", 2));
    let dir = tempfile::tempdir().unwrap();
    let (url, api) = fake_api(false).await;
    let mut env = env_for(&dk, dir.path(), free_port(), free_port());
    env.insert("FLEET_KUBERNETES_MIRROR".into(), "true".into());
    env.insert("KUBECONFIG".into(), kubeconfig(dir.path(), &url));
    let ctl = ControllerProcess::spawn(env, dir.path().join("c.log")).await;
    let admin = Admin::new(&ctl.url, dk.mint("fleet", &["fleet:admin"], 3600));
    let mut n = TestNode::new(
        &ctl.url,
        "gpu-1",
        json!({"labels": [], "executorKinds": ["claude-code"], "capacity": {"slots": 4}, "secrets": []}),
    );
    n.join(&admin.join_key().await).await;
    let _reports = keep_reporting(vec![n]);

    let status_of = |path: &str| {
        let api = api.clone();
        let path = path.to_string();
        move || {
            let s = api.lock();
            s.calls
                .iter()
                .rev()
                .find(|(m, p, _)| m == "PATCH" && p.ends_with(&path))
                .map(|(_, _, b)| b["status"].clone())
        }
    };
    let node = eventually(30, "FleetNode gpu-1 status written", {
        let f = status_of("/fleetnodes/gpu-1/status");
        move || {
            let v = f();
            async move { v.filter(|s| s["slots"] == "2/4") }
        }
    })
    .await;
    assert_eq!(node["status"], "online");
    assert_eq!(node["name"], "gpu-1");
    let p = eventually(30, "FleetPlacement coder.gpu-1 status written", {
        let f = status_of("/fleetplacements/coder.gpu-1/status");
        move || {
            let v = f();
            async move { v }
        }
    })
    .await;
    assert_eq!(p["replicas"], 2);
    assert_eq!(p["status"], "placed");
    let calls = api.lock().calls.clone();
    assert!(
        calls.iter().any(|(m, p, _)| m == "GET" && p.ends_with("/namespaces/fleet/fleetnodes")),
        "CRD check listed the namespace"
    );
    let node_writes = calls.iter().filter(|(m, p, _)| m == "PATCH" && p.contains("/fleetnodes/gpu-1")).count();
    // Reports keep coming every second; the mirror does not turn them into writes.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let later = api.lock().calls.iter().filter(|(m, p, _)| m == "PATCH" && p.contains("/fleetnodes/gpu-1")).count();
    assert_eq!(later, node_writes, "no write while only lastSeenAt moves");
}
