//! Today's controller against what every earlier release left behind
//! (docs/operations.md#versions-and-upgrades): the corpus under `tests/corpus/<version>/`,
//! recorded by `scripts/record-corpus.sh` with that release's own binaries — its store, its
//! node's observed reports, its controller's desired states. Today's controller must migrate
//! and serve every older store, read every older report, and serve the older node itself,
//! replayed from the corpus with its own token and key.

mod support;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;
use support::*;

/// Every release's corpus directory, oldest version first.
fn releases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("release.json").exists())
        .collect();
    dirs.sort_by_key(|d| {
        d.file_name().unwrap().to_string_lossy().split('.').map(|p| p.parse::<u64>().unwrap_or(0)).collect::<Vec<_>>()
    });
    assert!(!dirs.is_empty(), "no release corpus under {}", root.display());
    dirs
}

fn json_of(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap().trim().to_string()
}

fn reports(dir: &Path) -> Vec<(PathBuf, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("reports")).unwrap().flatten().map(|e| e.path()).collect();
    files.sort();
    files.into_iter().map(|f| (f.clone(), json_of(&f))).collect()
}

/// The node of a release's corpus, speaking with its own token and key.
fn old_node(dir: &Path, url: &str) -> TestNode {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut n = TestNode::new(url, "corpus-node", json!({}));
    n.id = text(&dir.join("node/node-id"));
    n.token = text(&dir.join("node/token"));
    n.secret_key = b64.decode(text(&dir.join("node/node.key"))).unwrap().try_into().unwrap();
    n.public_key = b64.decode(text(&dir.join("node/node.pub"))).unwrap().try_into().unwrap();
    n
}

#[test]
fn todays_controller_reads_every_report_an_older_node_sent() {
    for dir in releases() {
        let all = reports(&dir);
        assert!(!all.is_empty(), "{}: no report recorded", dir.display());
        for (f, body) in all {
            let bytes = serde_json::to_vec(&body).unwrap();
            let r: fleet_api::ObservedReport =
                serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: refused: {e}", f.display()));
            fleet_api::validate::observed(&r).unwrap_or_else(|e| panic!("{}: refused: {e}", f.display()));
            assert_eq!(r.replicas.len(), body["replicas"].as_array().unwrap().len());
        }
    }
}

/// Each older store, copied, is migrated and served by today's controller; the older node,
/// replayed from the corpus, gets its desired state (with PATs its own key opens), its reports
/// are taken, and nothing it runs moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn todays_controller_migrates_and_serves_every_older_store_and_its_node() {
    for dir in releases() {
        eprintln!("release {}", dir.display());
        serves_the_store_of(&dir).await;
    }
}

async fn serves_the_store_of(dir: &Path) {
    let dk = devkit().await;
    for a in json_of(&dir.join("cp-agents.json"))["items"].as_array().unwrap() {
        dk.put_agent(a.clone());
    }
    let data = tempfile::tempdir().unwrap();
    std::fs::copy(dir.join("store.sqlite"), data.path().join("fleet.sqlite")).unwrap();
    let mut env = env_for(&dk, data.path(), free_port(), free_port());
    env.insert("FLEET_NODE_OFFLINE_SECONDS".into(), "60".into());
    let c = ControllerProcess::spawn(env, data.path().join("controller.log")).await;
    let admin = Admin::new(&c.url, dk.mint("fleet", &["fleet:admin"], 600));
    let node = old_node(dir, &c.url);
    let had = json_of(&dir.join("node/desired.json"));

    // Its desired state: as new as the one it has, every agent it runs, PATs it can open.
    let (s, desired) = node.desired(None, 0).await;
    assert_eq!(s, 200, "{desired}\n{}", c.log_text());
    assert!(desired["generation"].as_u64() >= had["generation"].as_u64(), "{desired}");
    let keys = |d: &Value| d["agents"].as_array().unwrap().iter().map(|a| a["agentKey"].clone()).collect::<Vec<_>>();
    assert_eq!(keys(&desired), keys(&had));
    for k in keys(&had) {
        assert!(node.open_pat(&desired, k.as_str().unwrap()).is_some(), "the node's key opens the PAT of {k}");
    }
    // Asked with the generation it has: nothing new.
    let (s, _) = node.desired(had["generation"].as_u64(), 0).await;
    assert_eq!(s, 304, "{}", c.log_text());

    // Its reports, as it sent them (a new boot of it, so none is taken as stale).
    for (f, mut body) in reports(dir) {
        body["bootId"] = json!(format!("replay-{}", f.file_name().unwrap().to_string_lossy()));
        assert_eq!(node.put_observed(&body).await, 204, "{}: {}", f.display(), c.log_text());
    }
    let (s, view) = admin.get(&format!("/api/v1/nodes/{}", node.id)).await;
    assert_eq!(s, 200, "{view}");
    let last = reports(dir).pop().unwrap().1;
    assert_eq!(view["status"], "online");
    assert_eq!(view["version"], last["version"]);
    assert_eq!(view["replicas"].as_array().unwrap().len(), last["replicas"].as_array().unwrap().len(), "{view}");

    // Nothing moved: every placed replica is on the node, as the older controller placed it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for p in admin.placements().await.iter().filter(|p| p["status"] != "stopped") {
        assert_eq!((p["status"].as_str(), p["nodeId"].as_str()), (Some("placed"), Some(node.id.as_str())), "{p}");
    }
    let (s, again) = node.desired(had["generation"].as_u64(), 0).await;
    assert_eq!(s, 304, "still nothing new for the node: {again}\n{}", c.log_text());
}
