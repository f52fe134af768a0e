//! The Kubernetes mirror against a real `kube-apiserver` (docs/behaviour.md#kubernetes-mirror),
//! read back with the real `kubectl`: the controller binary with `FLEET_KUBERNETES_MIRROR=true`
//! creates and updates its objects, takes back every hand edit (spec, status, labels, deletes)
//! and owns every status field it shows, deletes a vanished node's object, shows a node
//! offline, refreshes `lastSeenAt` at most once a minute; two controllers share a namespace
//! without touching each other's objects; a missing namespace or a refusing RBAC is one error
//! line while the fleet runs on; `kubectl get` prints the columns.
//!
//! The tests of this file share one API server, each in a namespace of its own; the ones that
//! kill the API server are in `k8s_outage.rs`. Without a `kube-apiserver` they skip, saying how
//! to get one (CONTRIBUTING.md#kubernetes-against-a-real-api-server).

mod support;

use fleet_devkit::kube::KubeApiServer;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::kube::*;
use support::*;

fn announce(slots: u32) -> Value {
    json!({"labels": [], "executorKinds": ["k"], "capacity": {"slots": slots}, "secrets": []})
}

/// A controller with its own devkit and store, mirroring into `namespace`.
struct Fleet {
    dk: fleet_devkit::Devkit,
    ctl: ControllerProcess,
    admin: Admin,
    _dir: tempfile::TempDir,
}

impl Fleet {
    async fn start(k: &KubeApiServer, namespace: &str, agents: &[(&str, u32)]) -> Fleet {
        Self::start_with(k, namespace, agents, &[]).await
    }

    async fn start_with(k: &KubeApiServer, namespace: &str, agents: &[(&str, u32)], extra: &[(&str, &str)]) -> Fleet {
        let dk = devkit().await;
        for (key, replicas) in agents {
            dk.put_agent(agent(key, "k", *replicas));
        }
        let dir = tempfile::tempdir().unwrap();
        let mut env = mirror_env(&dk, dir.path(), k, namespace);
        env.extend(extra.iter().map(|(a, b)| (a.to_string(), b.to_string())));
        let ctl = ControllerProcess::spawn(env, dir.path().join("controller.log")).await;
        let admin = Admin::new(&ctl.url, dk.mint("fleet", &["fleet:admin"], 3600));
        Fleet { dk, ctl, admin, _dir: dir }
    }

    async fn join(&self, name: &str, slots: u32) -> TestNode {
        let mut n = TestNode::new(&self.ctl.url, name, announce(slots));
        n.join(&self.admin.join_key().await).await;
        n
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("==== controller log\n{}", self.ctl.log_text());
        }
    }
}

/// The lines of the controller's metrics that contain `needle`.
async fn metric_lines(listen: &str, needle: &str) -> Vec<String> {
    let text = reqwest::get(format!("http://{listen}/metrics")).await.unwrap().text().await.unwrap();
    text.lines().filter(|l| l.contains(needle)).map(str::to_string).collect()
}

/// Every mirror object of the namespace with its uid.
fn all_uids(k: &KubeApiServer, ns: &str) -> std::collections::BTreeMap<String, String> {
    let mut all = uids(k, ns, "fleetnodes");
    all.extend(uids(k, ns, "fleetplacements"));
    all
}

fn status_of(k: &KubeApiServer, ns: &str, what: &str) -> Option<Value> {
    get(k, ns, what).map(|o| o["status"].clone())
}

/// Show 1 of the issue, and every hand edit put back: status fields added by another field
/// manager (`reason`, `rollout`, `drainBlocked`), a spec edit, a label removed, an object
/// deleted; then a node offline and a vanished node's objects deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mirror_follows_the_store_and_takes_back_every_hand_edit() {
    let Some(k) = shared("the mirror against a real API server") else { return };
    let ns = k.namespace("life");
    let f = Fleet::start(k, &ns, &[("coder", 2)]).await;
    let node = f.join("gpu-1", 4).await;
    let reporting = reporting(vec![node.clone()]);
    let placed = until(30, "FleetPlacement coder.gpu-1 placed with 2 replicas", || {
        status_of(k, &ns, "fleetplacement/coder.gpu-1").filter(|s| s["replicas"] == 2 && s["status"] == "placed")
    })
    .await;
    assert_eq!(placed["node"], "gpu-1");
    let fnode = until(30, "FleetNode gpu-1 online, 2/4", || {
        get(k, &ns, "fleetnode/gpu-1").filter(|o| o["status"]["slots"] == "2/4" && o["status"]["status"] == "online")
    })
    .await;
    assert_eq!(fnode["spec"]["nodeId"], node.id.as_str());
    let fleet_label =
        fnode["metadata"]["labels"]["fleet.taimen.dev/fleet"].as_str().expect("the fleet label").to_string();
    assert_eq!(fnode["metadata"]["labels"]["app.kubernetes.io/managed-by"], "fleet-controller");

    // Status fields another field manager adds are taken back within a mirror period.
    kubectl(
        k,
        &ns,
        &[
            "patch",
            "fleetplacement",
            "coder.gpu-1",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"reason":"hand-made","rollout":"halted"}}"#,
        ],
    );
    kubectl(
        k,
        &ns,
        &[
            "patch",
            "fleetnode",
            "gpu-1",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"drainBlocked":7}}"#,
        ],
    );
    let hand_edited = Instant::now();
    let p = until(10, "reason and rollout taken back", || {
        get(k, &ns, "fleetplacement/coder.gpu-1")
            .filter(|o| o["status"].get("reason").is_none() && o["status"].get("rollout").is_none())
    })
    .await;
    let n = until(10, "drainBlocked taken back", || {
        get(k, &ns, "fleetnode/gpu-1").filter(|o| o["status"].get("drainBlocked").is_none())
    })
    .await;
    eprintln!("hand-made status fields taken back after {:?}", hand_edited.elapsed());
    assert_eq!(status_managers(&p), ["fleet-controller"], "only the controller owns the status: {p}");
    assert_eq!(status_managers(&n), ["fleet-controller"], "only the controller owns the status: {n}");
    assert_eq!(p["status"], placed, "the status is exactly the store's again");
    eprintln!("{}", kubectl(k, &ns, &["get", "fleetplacement", "coder.gpu-1", "-o", "yaml", "--show-managed-fields"]));

    // A spec edit and a label removed are put back; a label of someone else's is left.
    kubectl(k, &ns, &["patch", "fleetnode", "gpu-1", "--type=merge", "-p", r#"{"spec":{"nodeId":"forged"}}"#]);
    kubectl(k, &ns, &["label", "fleetnode", "gpu-1", "app.kubernetes.io/managed-by-", "team=infra"]);
    let back = until(10, "spec and label put back", || {
        get(k, &ns, "fleetnode/gpu-1").filter(|o| {
            o["spec"]["nodeId"] == node.id.as_str()
                && o["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "fleet-controller"
        })
    })
    .await;
    assert_eq!(back["metadata"]["labels"]["team"], "infra", "another's label is theirs");
    assert_eq!(back["metadata"]["labels"]["fleet.taimen.dev/fleet"], fleet_label.as_str());

    // A mirror deleted by hand comes back, a new object.
    let old_uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    kubectl(k, &ns, &["delete", "fleetplacement", "coder.gpu-1"]);
    let again = until(10, "coder.gpu-1 made again", || {
        get(k, &ns, "fleetplacement/coder.gpu-1").filter(|o| o["status"]["replicas"] == 2)
    })
    .await;
    assert_ne!(again["metadata"]["uid"], old_uid.as_str(), "a new object");

    // Silence: offline within the threshold (3 s) and a round.
    drop(reporting);
    until(15, "gpu-1 offline", || status_of(k, &ns, "fleetnode/gpu-1").filter(|s| s["status"] == "offline")).await;

    // The node deleted: its FleetNode and its placement's object go; the agent waits.
    let (s, v) = f.admin.delete("/api/v1/nodes/gpu-1").await;
    assert!(s.is_success(), "{s} {v}");
    until(15, "gpu-1's objects deleted, coder pending", || {
        let gone = get(k, &ns, "fleetnode/gpu-1").is_none() && get(k, &ns, "fleetplacement/coder.gpu-1").is_none();
        (gone && status_of(k, &ns, "fleetplacement/coder.pending").is_some()).then_some(())
    })
    .await;
    let log = f.ctl.log_text();
    assert_eq!(lines_with(&log, " ERROR "), 0, "{log}");
}

/// docs/behaviour.md#kubernetes-mirror and #busy-replicas: a FleetPlacement shows its busy
/// replicas (`busyReplicas`, the BUSY column, and each one's lease end to the minute) and
/// owns both fields whether any replica is busy or not: a hand edit of either is taken back,
/// and `fleet-controller` stays the status's only manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placement_shows_its_busy_replicas_and_owns_the_fields() {
    let Some(k) = shared("the mirror against a real API server") else { return };
    let ns = k.namespace("busy");
    let f = Fleet::start(k, &ns, &[("coder", 2)]).await;
    let node = f.join("gpu-1", 4).await;
    let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let until_ms = fleet_controller::clock::now_ms() + 3_600_000;
    let lease = fleet_controller::clock::rfc3339_ms(until_ms);
    let flag = busy.clone();
    let _reporting = Reporting(tokio::spawn(async move {
        loop {
            let mut body = node.report_body(&[("coder", 0, "running", 1), ("coder", 1, "running", 1)]);
            if flag.load(std::sync::atomic::Ordering::SeqCst) {
                body["replicas"][1]["busyUntil"] = json!(lease);
            }
            let _ = tokio::time::timeout(Duration::from_secs(2), node.put_observed(&body)).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }));
    let minute = fleet_controller::clock::rfc3339_ms((until_ms + 59_999) / 60_000 * 60_000);
    let shown = until(30, "coder.gpu-1 with replica 1 busy", || {
        status_of(k, &ns, "fleetplacement/coder.gpu-1").filter(|s| s["busyReplicas"] == 1)
    })
    .await;
    assert_eq!(shown["busy"], json!([{"replica": 1, "until": minute}]), "{shown}");
    let out = kubectl(k, &ns, &["get", "fleetplacements"]);
    eprintln!("$ kubectl get fleetplacements\n{out}");
    assert_eq!(table(&out).iter().find(|r| r["NAME"] == "coder.gpu-1").unwrap()["BUSY"], "1", "{out}");
    let forge = |patch: &str| {
        kubectl(
            k,
            &ns,
            &["patch", "fleetplacement", "coder.gpu-1", "--subresource=status", "--type=merge", "-p", patch],
        )
    };
    let owned = |what: &str, want: Value| {
        let what = what.to_string();
        let ns = ns.clone();
        async move {
            // Only the controller owns the status once the value is back.
            until(10, &what, || {
                get(k, &ns, "fleetplacement/coder.gpu-1")
                    .filter(|o| o["status"]["busyReplicas"] == want && status_managers(o) == ["fleet-controller"])
            })
            .await
        }
    };
    forge(r#"{"status":{"busyReplicas":5,"busy":[]}}"#);
    let o = owned("a forged busy count taken back", json!(1)).await;
    assert_eq!(o["status"]["busy"], shown["busy"], "{o}");
    busy.store(false, std::sync::atomic::Ordering::SeqCst);
    let o = owned("idle: 0 busy, written", json!(0)).await;
    assert_eq!(o["status"]["busy"], json!([]), "the empty list is written, not left out: {o}");
    forge(r#"{"status":{"busyReplicas":3,"busy":[{"replica":0,"until":"2030-01-01T00:00:00Z"}]}}"#);
    let o = owned("a forged busy count on an idle placement taken back", json!(0)).await;
    assert_eq!(o["status"]["busy"], json!([]), "{o}");
    let log = f.ctl.log_text();
    assert_eq!(lines_with(&log, " ERROR "), 0, "{log}");
}

/// docs/behaviour.md#kubernetes-mirror: `lastSeenAt` alone refreshes an object at most once a
/// minute, however often the node reports (every 500 ms here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_seen_is_refreshed_at_most_once_a_minute() {
    let Some(k) = shared("the mirror against a real API server") else { return };
    let ns = k.namespace("seen");
    let f = Fleet::start(k, &ns, &[]).await;
    let node = f.join("steady", 2).await;
    let _reporting = reporting(vec![node]);
    let first = until(30, "FleetNode steady", || status_of(k, &ns, "fleetnode/steady")).await;
    let mut changes = vec![(Instant::now(), first["lastSeenAt"].as_str().unwrap().to_string())];
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(75) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let seen = status_of(k, &ns, "fleetnode/steady").unwrap()["lastSeenAt"].as_str().unwrap().to_string();
        if seen != changes.last().unwrap().1 {
            changes.push((Instant::now(), seen));
        }
    }
    let gaps: Vec<Duration> = changes.windows(2).map(|w| w[1].0 - w[0].0).collect();
    eprintln!("lastSeenAt changed {} times in 75 s, after {gaps:?}", changes.len() - 1);
    assert!(!gaps.is_empty(), "refreshed within 75 s: {changes:?}");
    assert!(gaps.iter().all(|g| *g >= Duration::from_secs(58)), "at most once a minute: {gaps:?}");
}

/// Show 2 of the issue: two controllers, each with its own store, mirror into one namespace;
/// for a minute each one's objects keep their uid and both sets stay. A name both want (an
/// agent pending in both fleets) stays with the first, and the other says whose it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_controllers_share_a_namespace_and_each_keeps_its_own() {
    let Some(k) = shared("the mirror against a real API server") else { return };
    let ns = k.namespace("two");
    let a = Fleet::start(k, &ns, &[("coder", 1), ("waiting", 9)]).await;
    let _na = reporting(vec![a.join("node-a", 2).await]);
    let want_a = ["node-a", "coder.node-a", "waiting.node-a", "waiting.pending"];
    let owned = until(30, "fleet A's objects", || {
        let all = all_uids(k, &ns);
        want_a.iter().all(|n| all.contains_key(*n)).then_some(all)
    })
    .await;
    let b = Fleet::start(k, &ns, &[("coder", 1), ("waiting", 9)]).await;
    let _nb = reporting(vec![b.join("node-b", 2).await]);
    let want: Vec<&str> = want_a.iter().copied().chain(["node-b", "coder.node-b", "waiting.node-b"]).collect();
    let before = until(30, "both fleets' objects", || {
        let all = all_uids(k, &ns);
        want.iter().all(|n| all.contains_key(*n)).then_some(all)
    })
    .await;
    assert_eq!(before["waiting.pending"], owned["waiting.pending"], "the shared name stays with fleet A");
    // Each may have deleted its own short-lived objects before (an agent pending until its node
    // joined); from here on nothing is deleted.
    let listens = [a.ctl.env["FLEET_METRICS_LISTEN"].clone(), b.ctl.env["FLEET_METRICS_LISTEN"].clone()];
    let deletes = |i: usize| metric_lines(&listens[i], "op=\"delete\"");
    let deleted_before = (deletes(0).await, deletes(1).await);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = all_uids(k, &ns);
        for name in &want {
            assert_eq!(now.get(*name), before.get(*name), "{name} kept its uid after {:?}", start.elapsed());
        }
    }
    let log_b = b.ctl.log_text();
    let taken = "FleetPlacement \"waiting.pending\" exists in namespace";
    assert_eq!(lines_with(&log_b, taken), 1, "said once:\n{log_b}");
    assert!(log_b.contains("and it belongs to fleet"), "{log_b}");
    assert_eq!((deletes(0).await, deletes(1).await), deleted_before, "nothing deleted in the minute");
    for f in [&a, &b] {
        let log = f.ctl.log_text();
        assert_eq!(lines_with(&log, " ERROR "), 0, "{log}");
    }
}

/// A namespace that does not exist is one error line naming the fix; the fleet places and
/// serves meanwhile; once the namespace exists the mirror starts by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_namespace_is_one_error_line_and_the_fleet_runs_on() {
    let Some(k) = shared("the mirror against a real API server") else { return };
    let ns = format!("absent-{}", std::process::id());
    let f = Fleet::start(k, &ns, &[("coder", 1)]).await;
    let _n = reporting(vec![f.join("gpu-1", 2).await]);
    eventually(30, "coder placed without the mirror", || async {
        f.admin.placements().await.iter().any(|i| i["agentKey"] == "coder" && i["status"] == "placed").then_some(())
    })
    .await;
    let ready = reqwest::get(format!("{}/readyz", f.ctl.url)).await.unwrap().status();
    assert_eq!(ready, 200, "the controller is ready without its mirror");
    // Two re-checks later it is still one line.
    tokio::time::sleep(Duration::from_secs(21)).await;
    let log = f.ctl.log_text();
    let line = format!("namespace \"{ns}\" does not exist: create it (`kubectl create namespace {ns}`)");
    assert_eq!(lines_with(&log, &line), 1, "{log}");
    assert_eq!(lines_with(&log, " ERROR "), 1, "{log}");
    k.kubectl_ok(&["create", "namespace", &ns]);
    until(30, "the mirror starts once the namespace exists", || status_of(k, &ns, "fleetplacement/coder.gpu-1")).await;
}

/// A ServiceAccount whose Role lacks verbs the mirror uses: one error line naming them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_account_without_the_verbs_is_one_error_line_naming_them() {
    let Some(k) = shared("the mirror against a real API server") else { return };
    let ns = k.namespace("rbac");
    k.apply(&format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: reader, namespace: {ns}}}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: reader, namespace: {ns}}}\n\
         rules: [{{apiGroups: [fleet.taimen.dev], resources: [fleetnodes, fleetplacements], verbs: [get, list, watch]}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: reader, namespace: {ns}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: reader}}\n\
         subjects: [{{kind: ServiceAccount, name: reader, namespace: {ns}}}]\n"
    ));
    let token = k.service_account_token(&ns, "reader");
    let kubeconfig = k.kubeconfig_for_token(&format!("reader-{ns}"), &token, &ns).unwrap();
    let kc = kubeconfig.display().to_string();
    let f = Fleet::start_with(k, &ns, &[("coder", 1)], &[("KUBECONFIG", kc.as_str())]).await;
    let _n = reporting(vec![f.join("gpu-1", 2).await]);
    let log = until(30, "the error line", || {
        let log = f.ctl.log_text();
        log.contains("may not create fleetnodes").then_some(log)
    })
    .await;
    assert!(
        log.contains(
            "may not create fleetnodes, patch fleetnodes, delete fleetnodes, patch fleetnodes/status, create \
                      fleetplacements, patch fleetplacements, delete fleetplacements, patch fleetplacements/status in \
                      namespace"
        ),
        "{log}"
    );
    assert!(log.contains("the chart's Role does with mirror.enabled=true"), "{log}");
    assert_eq!(lines_with(&log, " ERROR "), 1, "{log}");
    assert!(uids(k, &ns, "fleetplacements").is_empty(), "nothing written");
}

/// The real `kubectl get` of both kinds, with their columns; `-o wide` adds the node's real
/// name beside a hashed object name, its kinds and the fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_shows_the_fleet_at_a_glance() {
    let Some(k) = shared("the mirror against a real API server") else { return };
    let ns = k.namespace("columns");
    let f = Fleet::start(k, &ns, &[("coder", 2)]).await;
    f.dk.put_agent(with(agent("reviewer", "k", 3), |a| a["placement"]["requires"] = json!(["gpu"])));
    let mut edge = TestNode::new(&f.ctl.url, "edge-", json!({"executorKinds": ["other"], "capacity": {"slots": 2}}));
    edge.join(&f.admin.join_key().await).await;
    let _n = reporting(vec![f.join("gpu-1", 4).await, edge]);
    until(30, "coder placed on gpu-1", || status_of(k, &ns, "fleetplacement/coder.gpu-1")).await;
    // A drain with nowhere to go: both of coder's replicas stay, blocked.
    let (s, v) = f.admin.post("/api/v1/nodes/gpu-1:drain", json!({})).await;
    assert!(s.is_success(), "{s} {v}");
    until(30, "gpu-1 draining in the mirror, two replicas blocked", || {
        status_of(k, &ns, "fleetnode/gpu-1")
            .filter(|s| s["scheduling"] == "draining (2 left)" && s["drainBlocked"] == 2)
    })
    .await;
    let hashed = fleet_controller::k8s::names::node_object("edge-");
    let nodes = until(30, "both nodes listed", || {
        let out = kubectl(k, &ns, &["get", "fleetnodes"]);
        out.contains(&hashed).then_some(out)
    })
    .await;
    eprintln!("$ kubectl get fleetnodes\n{nodes}");
    let rows = table(&nodes);
    let cols: Vec<&str> = rows[0].keys().map(String::as_str).collect();
    let mut want = vec!["AGE", "HEALTH", "LAST SEEN", "NAME", "SCHEDULING", "SLOTS", "STATUS", "VERSION"];
    assert_eq!(cols, want, "{nodes}");
    let gpu = rows.iter().find(|r| r["NAME"] == "gpu-1").unwrap();
    let got: Vec<&str> = ["STATUS", "HEALTH", "SCHEDULING", "SLOTS", "VERSION"].map(|c| gpu[c].as_str()).to_vec();
    assert_eq!(got, ["online", "ok", "draining (2 left)", "2/4", "test"], "{nodes}");
    let wide = kubectl(k, &ns, &["get", "fleetnodes", "-o", "wide"]);
    eprintln!("$ kubectl get fleetnodes -o wide\n{wide}");
    let rows = table(&wide);
    want.extend(["DRAIN BLOCKED", "FLEET", "KINDS", "NODE"]);
    want.sort();
    assert_eq!(rows[0].keys().map(String::as_str).collect::<Vec<_>>(), want, "{wide}");
    let edge = rows.iter().find(|r| r["NAME"] == hashed).unwrap();
    assert_eq!(edge["NODE"], "edge-", "the node's real name beside its hashed object name: {wide}");
    assert!(edge["KINDS"].contains("other") && !edge["FLEET"].is_empty(), "{wide}");
    let gpu = rows.iter().find(|r| r["NAME"] == "gpu-1").unwrap();
    assert_eq!((gpu["NODE"].as_str(), gpu["DRAIN BLOCKED"].as_str()), ("gpu-1", "2"), "{wide}");
    assert_eq!(gpu["FLEET"], edge["FLEET"], "one fleet");
    let places = until(30, "the placements listed", || {
        let out = kubectl(k, &ns, &["get", "fleetplacements"]);
        out.contains("reviewer.pending").then_some(out)
    })
    .await;
    eprintln!("$ kubectl get fleetplacements\n{places}");
    let rows = table(&places);
    let cols: Vec<&str> = rows[0].keys().map(String::as_str).collect();
    assert_eq!(cols, ["AGE", "AGENT", "BUSY", "NAME", "NODE", "REASON", "REPLICAS", "ROLLOUT", "STATUS"], "{places}");
    let row = |name: &str| {
        let r = rows.iter().find(|r| r["NAME"] == name).unwrap();
        ["AGENT", "NODE", "REPLICAS", "BUSY", "STATUS", "REASON", "ROLLOUT"].map(|c| r[c].clone())
    };
    assert_eq!(row("reviewer.pending"), ["reviewer", "", "3", "0", "pending", "no_executor_kind", ""], "{places}");
    assert_eq!(row("coder.gpu-1"), ["coder", "gpu-1", "2", "0", "placed", "", ""], "{places}");
    let both = kubectl(k, &ns, &["get", "fleet"]);
    assert!(
        both.contains("fleetnode.fleet.taimen.dev/gpu-1")
            && both.contains("fleetplacement.fleet.taimen.dev/coder.gpu-1"),
        "{both}"
    );
}

/// Show 5 of the issue: `fleet-controller dev` with `FLEET_KUBERNETES_MIRROR=true` mirrors the
/// dev fleet into the cluster `KUBECONFIG` names, and says where in its printout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_controller_dev_mirrors_its_fleet() {
    use tokio::io::AsyncBufReadExt;
    let Some(k) = shared("the mirror against a real API server") else { return };
    let ns = k.namespace("dev");
    let dir = tempfile::tempdir().unwrap();
    let api = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(dir.path().join("dev.log")).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fleet-controller"))
        .arg("dev")
        .arg("--dir")
        .arg(dir.path().join("dev"))
        .args(["--listen", &api, "--metrics-listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--devkit-listen", &format!("127.0.0.1:{}", free_port())])
        .env_clear()
        .env("HOME", dir.path())
        .env("FLEET_KUBERNETES_MIRROR", "true")
        .env("FLEET_KUBERNETES_NAMESPACE", &ns)
        .env("KUBECONFIG", k.kubeconfig())
        .stdout(std::process::Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut printout = String::new();
    let key = loop {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await.unwrap().unwrap().unwrap();
        printout.push_str(&line);
        printout.push('\n');
        if let Some(key) = line.strip_prefix("Join key (one use, 1 h): ") {
            break key.to_string();
        }
    };
    eprintln!("{printout}");
    let target = format!("Kubernetes mirror     FleetNode and FleetPlacement objects in namespace {ns} at {}", k.url());
    assert!(printout.contains(&target), "{printout}");
    assert!(printout.contains(&format!("kubectl -n {ns} get fleetnodes,fleetplacements")), "{printout}");
    let mut node = TestNode::new(
        &format!("http://{api}"),
        "dev-node",
        json!({"executorKinds": ["claude-code"], "capacity": {"slots": 4}}),
    );
    node.join(&key).await;
    let _reporting = reporting(vec![node]);
    let out = until(30, "the dev fleet in kubectl", || {
        let out = kubectl(k, &ns, &["get", "fleetnodes,fleetplacements"]);
        [
            "fleetnode.fleet.taimen.dev/dev-node",
            "fleetplacement.fleet.taimen.dev/coder.dev-node",
            "fleetplacement.fleet.taimen.dev/reviewer.dev-node",
        ]
        .iter()
        .all(|n| out.contains(n))
        .then_some(out)
    })
    .await;
    eprintln!("$ kubectl -n {ns} get fleetnodes,fleetplacements\n{out}");
    let _ = child.kill().await;
}
