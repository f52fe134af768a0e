//! The Kubernetes mirror never costs the fleet (docs/behaviour.md#kubernetes-mirror), against a
//! real `kube-apiserver` each test starts for itself and kills: CRDs missing at start are one
//! error line and the mirror starts once they are applied (they apply without a warning,
//! client- and server-side, with `--validate=strict`); an API server killed and started
//! again is one line when it goes and one when it is back, the fleet places and issues PATs
//! meanwhile, and the mirror catches up; in HA, the leader killed while the API server is down
//! is replaced as fast as ever, and the new leader places and hands out PATs before the API
//! server returns.

mod support;

use fleet_devkit::kube::KubeApiServer;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::ha::{the_leader, LogsOnFailure, Replica, Service};
use support::kube::*;
use support::*;

fn announce() -> Value {
    json!({"labels": [], "executorKinds": ["k"], "capacity": {"slots": 4}, "secrets": []})
}

/// Whether `node`'s desired state carries `agent` with a PAT it can open.
async fn has_pat(node: &TestNode, agent: &str) -> bool {
    let Some((_, d)) = node.try_desired(None, 0).await else { return false };
    node.open_pat(&d, agent).is_some()
}

async fn metric(listen: &str, name: &str) -> Option<f64> {
    let text = reqwest::get(format!("http://{listen}/metrics")).await.ok()?.text().await.ok()?;
    let line = text.lines().find(|l| l.split(' ').next() == Some(name))?;
    line.rsplit(' ').next()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_crds_and_an_api_server_outage_cost_the_fleet_nothing() {
    let Some(mut k) = fleet_devkit::kube::own_or_skip("the API-server outage test") else { return };
    let ns = k.namespace("fleet");
    let dk = devkit().await;
    dk.put_agent(agent("coder", "k", 1));
    let dir = tempfile::tempdir().unwrap();
    let _logs = LogsOnFailure(dir.path().to_path_buf());
    let env = mirror_env(&dk, dir.path(), &k, &ns);
    let ctl = ControllerProcess::spawn(env.clone(), dir.path().join("controller.log")).await;
    let admin = Admin::new(&ctl.url, dk.mint("fleet", &["fleet:admin"], 3600));
    let mut node = TestNode::new(&ctl.url, "gpu-1", announce());
    node.join(&admin.join_key().await).await;
    let _reporting = reporting(vec![node.clone()]);
    eventually(30, "coder's PAT on gpu-1 without the CRDs", || async { has_pat(&node, "coder").await.then_some(()) })
        .await;
    let crd_line = "the FleetNode CRD (fleetnodes.fleet.taimen.dev) is not installed in the cluster: apply the CRDs \
                    (`kubectl apply --server-side -f crds/`";
    until(30, "the missing CRDs said", || ctl.log_text().contains(crd_line).then_some(())).await;
    // The CRDs apply without a warning, client-side and server-side, validated strictly.
    let file = dir.path().join("crds.yaml");
    std::fs::write(&file, crds()).unwrap();
    let file = file.display().to_string();
    for extra in [&[][..], &["--server-side"][..]] {
        let mut args = vec!["apply", "--validate=strict", "-f", file.as_str()];
        args.extend_from_slice(extra);
        let out = k.kubectl(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && err.trim().is_empty(), "kubectl {args:?}: {err}");
    }
    until(30, "the mirror starts once the CRDs are there", || get(&k, &ns, "fleetplacement/coder.gpu-1")).await;

    // The API server dies. The fleet goes on: a new agent placed with its PAT, a cordon.
    k.kill_apiserver();
    let down = Instant::now();
    dk.put_agent(agent("second", "k", 1));
    eventually(30, "second's PAT on gpu-1 while the API server is down", || async {
        has_pat(&node, "second").await.then_some(())
    })
    .await;
    let (s, v) = admin.post("/api/v1/nodes/gpu-1:cordon", json!({})).await;
    assert_eq!(s, 200, "{v}");
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(down.elapsed())).await;
    assert!(!k.kubectl(&["get", "ns"]).status.success(), "still down");
    k.start_apiserver().unwrap();
    let back = Instant::now();
    until(30, "the mirror caught up: gpu-1 cordoned, second placed", || {
        let cordoned = get(&k, &ns, "fleetnode/gpu-1").is_some_and(|o| o["status"]["scheduling"] == "cordoned");
        (cordoned && get(&k, &ns, "fleetplacement/second.gpu-1").is_some()).then_some(())
    })
    .await;
    eprintln!("caught up {:?} after the API server's return", back.elapsed());
    let log = ctl.log_text();
    assert_eq!(lines_with(&log, "the Kubernetes API server does not answer"), 1, "one line when it goes:\n{log}");
    assert_eq!(lines_with(&log, "the Kubernetes API server answers again"), 1, "one when it is back:\n{log}");
    assert_eq!(lines_with(&log, " ERROR "), 1, "the missing CRDs alone:\n{log}");
    let listen = &env["FLEET_METRICS_LISTEN"];
    assert!(metric(listen, "fleet_mirror_api_failures_total").await > Some(0.0));
    assert_eq!(metric(listen, "fleet_mirror_up").await, Some(1.0));
}

/// Show 3 of the issue: two replicas on PostgreSQL with the mirror on; the API server killed,
/// then the leader: the survivor leads within the usual takeover time and places a new agent
/// whose node gets its PAT while the API server is still down; the mirror catches up after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_with_the_api_server_down_places_and_hands_out_pats() {
    let Some(pg) = fleet_devkit::postgres::shared_or_skip("the HA test with the mirror") else { return };
    let Some(mut k) = fleet_devkit::kube::own_or_skip("the HA test with the mirror") else { return };
    k.apply(&crds());
    let ns = k.namespace("fleet");
    let db = pg.database().unwrap();
    let dk = devkit().await;
    dk.put_agent(agent("alpha", "k", 1));
    let dir = tempfile::tempdir().unwrap();
    let _logs = LogsOnFailure(dir.path().to_path_buf());
    let (p0, p1) = (free_port(), free_port());
    let svc = Service::start(&[p0, p1]).await;
    let mut replicas = Vec::new();
    for (name, port) in [("r0", p0), ("r1", p1)] {
        let extra = mirror_vars(&k, &ns, dir.path());
        replicas.push(Replica::spawn_with(&dk, dir.path(), &db, name, Some(3), port, &extra).await);
    }
    let first = the_leader(&replicas.iter().collect::<Vec<_>>(), 20).await;
    let admin = Admin::new(&svc.url(), dk.mint("fleet", &["fleet:admin"], 3600));
    let mut node = TestNode::new(&svc.url(), "n1", announce());
    node.join(&admin.join_key().await).await;
    let _reporting = reporting(vec![node.clone()]);
    until(30, "alpha mirrored", || get(&k, &ns, "fleetplacement/alpha.n1")).await;

    k.kill_apiserver();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = replicas.iter_mut().find(|r| r.name == first).unwrap();
    let leader_port: u16 = leader.proc.env["FLEET_LISTEN"].rsplit(':').next().unwrap().parse().unwrap();
    svc.set_ready(leader_port, false);
    leader.proc.kill9();
    let killed = Instant::now();
    let survivor = replicas.iter().find(|r| r.name != first).unwrap();
    // The lease is 3 s; a killed leader's lock passes at once, a hung one within the TTL + 2 s.
    the_leader(&[survivor], 5).await;
    let took = killed.elapsed();
    eprintln!("the survivor leads {took:?} after the leader's kill, with the API server down");
    dk.put_agent(agent("beta", "k", 1));
    eventually(30, "beta's PAT on n1 while the API server is down", || async {
        has_pat(&node, "beta").await.then_some(())
    })
    .await;
    assert!(!k.kubectl(&["get", "ns"]).status.success(), "the API server is still down");
    let log = survivor.proc.log_text();
    assert!(!log.contains("cannot start the leader's tasks"), "{log}");
    assert_eq!(lines_with(&log, "became the leader"), 1, "led once, and stayed: {log}");

    k.start_apiserver().unwrap();
    until(30, "the mirror caught up: beta mirrored by the survivor", || {
        get(&k, &ns, "fleetplacement/beta.n1").filter(|o| o["status"]["status"] == "placed")
    })
    .await;
    assert!(get(&k, &ns, "fleetplacement/alpha.n1").is_some(), "alpha's object kept");
}

fn mirror_vars(k: &KubeApiServer, ns: &str, dir: &std::path::Path) -> Vec<(&'static str, String)> {
    vec![
        ("FLEET_KUBERNETES_MIRROR", "true".into()),
        ("FLEET_KUBERNETES_NAMESPACE", ns.into()),
        ("KUBECONFIG", k.kubeconfig().display().to_string()),
        ("HOME", dir.display().to_string()),
    ]
}
