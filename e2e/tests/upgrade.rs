//! Upgrades restart nothing, and a store moves from SQLite to PostgreSQL without a join by hand
//! (docs/operations.md#versions-and-upgrades, docs/operations.md#from-sqlite-to-postgresql-and-back),
//! with the real binaries and real agent containers on Docker:
//!
//! - `fleet-node` stopped and started again on another build adopts every running container:
//!   the container ids and start times are unchanged, no PAT is issued again, and the CP never
//!   shows a phase other than `running` after the agents first ran;
//! - the controller stopped and started again on another build on the same store recreates no
//!   container either;
//! - a single controller's SQLite store copied into PostgreSQL with `store copy`, then three
//!   replicas serving it behind one address: the nodes reconnect with their old tokens and no
//!   container restarts.
//!
//! The other build is the previous release's binaries when `FLEET_PREV_BIN` names them
//! (`scripts/build-release.sh`, `.ci/run` builds them), else the binaries of the `e2e` images
//! (built without the default features, unlike the test build): either way a different
//! executable, which the tests show by its SHA-256.

mod support;

use fleet_e2e::{docker_available, ensure_fleet_images, ensure_test_images};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use support::*;

/// The other build of `name`: the previous release's, or the e2e image's.
fn other_build(name: &str, dir: &Path) -> PathBuf {
    if let Some(prev) = std::env::var_os("FLEET_PREV_BIN") {
        let path = PathBuf::from(prev).join(name);
        assert!(path.exists(), "FLEET_PREV_BIN has no {name}: {}", path.display());
        return path;
    }
    ensure_fleet_images();
    let image = format!("{name}:e2e");
    let out = Command::new("docker").args(["create", &image]).output().unwrap();
    assert!(out.status.success(), "docker create {image}: {}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let path = dir.join(format!("{name}-e2e-image"));
    let cp = Command::new("docker").args(["cp", &format!("{id}:/{name}"), path.to_str().unwrap()]).status().unwrap();
    let _ = Command::new("docker").args(["rm", "-f", &id]).output();
    assert!(cp.success(), "docker cp the {name} binary out of {image}");
    path
}

/// The SHA-256 and `--version` of a binary.
fn identity(bin: &Path) -> (String, String) {
    let sum = Command::new("sha256sum").arg(bin).output().unwrap();
    let sum = String::from_utf8_lossy(&sum.stdout).split_whitespace().next().unwrap_or("").to_string();
    let v = Command::new(bin).arg("--version").output().unwrap();
    (sum, String::from_utf8_lossy(&v.stdout).trim().to_string())
}

/// Two builds that really differ, said on stderr.
fn two_builds(name: &str, a: &Path, b: &Path) {
    let (ia, ib) = (identity(a), identity(b));
    eprintln!("{name} before: {} sha256 {} ({})", ia.1, ia.0, a.display());
    eprintln!("{name} after:  {} sha256 {} ({})", ib.1, ib.0, b.display());
    assert_ne!(ia.0, ib.0, "the upgrade must run another build of {name}");
}

/// Each container's id and the time it started, by name.
fn containers(names: &[String]) -> BTreeMap<String, (String, String)> {
    names
        .iter()
        .map(|n| {
            let c = container(n).unwrap_or_else(|| panic!("no container {n}"));
            assert_eq!(c["State"]["Running"], true, "{n} runs");
            (n.clone(), (c["Id"].as_str().unwrap().to_string(), c["State"]["StartedAt"].as_str().unwrap().to_string()))
        })
        .collect()
}

/// The CP's statuses of `agent` from the first `running` on are all `running`.
fn always_running_since_up(f: &Fleet, agent: &str) {
    let history = f.devkit.status_history(agent);
    let phases: Vec<&str> = history.iter().map(|s| s["phase"].as_str().unwrap_or("")).collect();
    let up = phases.iter().position(|p| *p == "running").unwrap_or_else(|| panic!("{agent}: never running"));
    assert!(phases[up..].iter().all(|p| *p == "running"), "{agent}: phases {phases:?}");
}

const AGENTS: [&str; 3] = ["alpha", "beta", "gamma"];

/// The node talks to the engine itself, not through a docker-guard: the previous release's
/// node refuses a `node.yaml` naming `guardDir`, and these tests start the node's binary
/// directly, so no guard would be listening. (The guard's own upgrade is docs/operations.md's
/// compose recipe: both containers from one image.)
const ON_THE_ENGINE: &str = "dockerUrl: unix:///var/run/docker.sock\n";

/// Three agents of one replica running on `node`, started with `node_bin`.
async fn three_agents_on(
    f: &Fleet,
    node: &mut NodeDir,
    node_bin: &Path,
) -> (BTreeMap<String, (String, String)>, usize) {
    for a in AGENTS {
        f.devkit.put_agent(agent(a, 1));
    }
    let cfg = node.config().display().to_string();
    let env: HashMap<String, String> = [("RUST_LOG".to_string(), "info".to_string())].into();
    node.proc = Some(Proc::spawn(node_bin, &["--config", &cfg], &env, &node.root.join("node.log")));
    for a in AGENTS {
        f.status_where(a, 90, &format!("{a} running"), |s| s["phase"] == "running").await;
    }
    let names: Vec<String> = AGENTS.iter().map(|a| node.container(a, 0)).collect();
    (containers(&names), f.devkit.pats().len())
}

/// Nothing was recreated, no PAT issued, and the CP saw `running` throughout.
fn nothing_restarted(f: &Fleet, before: &BTreeMap<String, (String, String)>, pats: usize) {
    let names: Vec<String> = before.keys().cloned().collect();
    assert_eq!(&containers(&names), before, "the same containers, never restarted");
    assert_eq!(f.devkit.pats().len(), pats, "no PAT issued again");
    assert!(f.devkit.pats().iter().all(|p| !p.revoked), "none revoked");
    for a in AGENTS {
        always_running_since_up(f, a);
    }
}

/// The node has reported with the build now running, a few periods after it started.
async fn reported_by(f: &Fleet, node: &NodeDir, version: &str) {
    let v = version.split_whitespace().last().unwrap_or("").to_string();
    eventually(60, "a report from the new build", || async {
        let n = f.node_view(&node.name).await?;
        (n["version"] == v.as_str() && n["status"] == "online").then_some(())
    })
    .await;
    // Three report periods of the new build: time to adopt, or to recreate if it were to.
    tokio::time::sleep(Duration::from_secs(16)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_started_again_on_another_build_adopts_every_container() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let f = Fleet::start("up-node").await;
    let mut node = f.node("n1", ON_THE_ENGINE).await;
    // This node runs as root. Its kind names the user its containers ran as before this
    // release: one that names none runs them as 65534:65534 now, not as root, and an upgrade
    // recreates them once (docs/operations.md#versions-and-upgrades).
    let yaml = std::fs::read_to_string(node.config()).unwrap();
    std::fs::write(node.config(), yaml.replace("dataPath: /data,", "dataPath: /data, user: \"0:0\",")).unwrap();
    let (old, new) = (other_build("fleet-node", f.dir.path()), bin("fleet-node"));
    two_builds("fleet-node", &old, &new);
    let (before, pats) = three_agents_on(&f, &mut node, &old).await;

    // SIGTERM: the node stops, its containers run on; then the other build starts.
    let status = node.proc.as_mut().unwrap().term();
    assert!(status.success(), "the node stops cleanly on SIGTERM: {status}\n{}", node.log());
    assert_eq!(containers(&before.keys().cloned().collect::<Vec<_>>()), before, "the containers outlive the node");
    let old_log = node.log().len();
    node.start();
    reported_by(&f, &node, &identity(&new).1).await;
    let new_log = node.log()[old_log..].to_string();
    eprintln!("the new build's log:\n{new_log}");
    nothing_restarted(&f, &before, pats);
    assert!(!new_log.contains("started up-node-"), "the new build started no container:\n{new_log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_controller_started_again_on_another_build_recreates_no_container() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let mut f = Fleet::new("up-ctl").await;
    let (old, new) = (other_build("fleet-controller", f.dir.path()), bin("fleet-controller"));
    two_builds("fleet-controller", &old, &new);
    let log = f.dir.path().join("controller-old.log");
    let mut ctl = Proc::spawn(&old, &["serve"], &f.env, &log);
    eventually(60, "the old controller healthy", || async {
        reqwest::get(format!("{}/healthz", f.url)).await.ok().filter(|r| r.status() == 200)
    })
    .await;
    let mut node = f.node("n1", ON_THE_ENGINE).await;
    let (before, pats) = three_agents_on(&f, &mut node, &bin("fleet-node")).await;

    // Stop, new binary, start, on the same store (one replica: the chart's Recreate).
    assert!(ctl.term().success(), "the old controller stops on SIGTERM:\n{}", ctl.log_text());
    f.start_controller().await;
    eventually(60, "the node served by the new controller", || async {
        let n = f.node_view(&node.name).await?;
        (n["status"] == "online").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(16)).await;
    nothing_restarted(&f, &before, pats);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sqlite_store_copied_into_postgres_is_served_by_three_replicas_with_nothing_restarted() {
    if !docker_available() || !fleet_devkit::postgres::usable("the store copy into PostgreSQL") {
        return;
    }
    ensure_test_images();
    let pg = fleet_devkit::postgres::Postgres::start().unwrap();
    let mut f = Fleet::new("up-copy").await;
    let spread = Spread::start(vec![f.env["FLEET_LISTEN"].clone()]).await;
    f.public_url = spread.url.clone();
    f.start_controller().await;
    let mut node = f.node("n1", ON_THE_ENGINE).await;
    let (before, pats) = three_agents_on(&f, &mut node, &bin("fleet-node")).await;
    let token = std::fs::read_to_string(node.root.join("state/token")).unwrap();

    // The single controller stops; its store goes to PostgreSQL; three replicas serve it.
    f.controller.as_mut().unwrap().term();
    let db = pg.database().unwrap();
    let sqlite = format!("sqlite://{}/fleet.sqlite", f.env["FLEET_DATA_DIR"]);
    let out =
        Command::new(bin("fleet-controller")).args(["store", "copy", "--from", &sqlite, "--to", &db]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("every table checked alike") && text.contains("nodes"), "{text}");
    let mut replicas = Vec::new();
    for i in 0..3 {
        replicas.push(replica(&f, &db, i));
    }
    for (_, addr) in &replicas {
        eventually(60, "a replica healthy", || async {
            reqwest::get(format!("http://{addr}/healthz")).await.ok().filter(|r| r.status() == 200)
        })
        .await;
    }
    spread.set(replicas.iter().map(|r| r.1.clone()).collect());
    f.url = spread.url.clone();
    eventually(60, "the node served by the replicas", || async {
        let n = f.node_view(&node.name).await?;
        (n["status"] == "online").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(16)).await;
    nothing_restarted(&f, &before, pats);
    assert_eq!(std::fs::read_to_string(node.root.join("state/token")).unwrap(), token, "its old token, no join");
    assert_eq!(node.log().matches("joined the fleet").count(), 1, "joined once, before the copy");
}

/// Replica `i` on `db`: its process and its address.
fn replica(f: &Fleet, db: &str, i: usize) -> (Proc, String) {
    let (port, mport) = (free_port(), free_port());
    let mut env = f.env.clone();
    let name = format!("rep-{i}");
    env.insert("FLEET_LISTEN".into(), format!("127.0.0.1:{port}"));
    env.insert("FLEET_METRICS_LISTEN".into(), format!("127.0.0.1:{mport}"));
    env.insert("FLEET_ADVERTISE_URL".into(), format!("http://127.0.0.1:{port}"));
    env.insert("FLEET_DATA_DIR".into(), f.dir.path().join(&name).display().to_string());
    env.insert("FLEET_DATABASE_URL".into(), db.to_string());
    env.insert("FLEET_REPLICA_NAME".into(), name.clone());
    env.insert("FLEET_REPLICA_SECRET".into(), "upgrade-test-replica-secret-0123456789".into());
    env.insert("FLEET_LEADER_LEASE_SECONDS".into(), "5".into());
    let log = f.dir.path().join(format!("{name}.log"));
    (Proc::spawn(&bin("fleet-controller"), &["serve"], &env, &log), format!("127.0.0.1:{port}"))
}
