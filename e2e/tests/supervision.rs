//! Supervision of the real node binary (docs/behaviour.md#hardening): when its supervisor loop or its loop
//! talking to the controller (the exchange, or the pull and report loops) ends, `fleet-node` exits non-zero naming the loop, so an orchestrator
//! restarts it; restarted, it carries on with its saved state. Loops are ended through the
//! test-only failpoints (`FLEET_FAILPOINTS`). The controller's side is in
//! `operator/tests/supervision.rs`.

mod support;

use fleet_e2e::{docker_available, ensure_test_images};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_loop_that_ends_takes_the_node_down_naming_it() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let f = Fleet::start("e2esv").await;
    let mut n = f.node("n1", "").await;
    let points = n.root.join("failpoints");
    std::fs::create_dir(&points).unwrap();
    let points_env = points.display().to_string();
    for name in ["supervisor", "controller"] {
        n.start_with(&[("FLEET_FAILPOINTS", &points_env)]);
        eventually(30, "online", || async { f.node_view(&n.name).await.filter(|v| v["status"] == "online") }).await;
        std::fs::write(points.join(format!("end-{name}")), "").unwrap();
        let status = n.proc.as_mut().unwrap().exited(20).await;
        assert_eq!(status.code(), Some(1), "{name}: exits non-zero");
        let line = format!("the node's {name} loop ended; exiting so that it is restarted");
        assert!(n.log().contains(&line), "{name}: the log names it:\n{}", n.log());
        std::fs::remove_file(points.join(format!("end-{name}"))).unwrap();
        n.proc = None;
    }
    // Restarted, it needs no join key: its state directory holds its credential. node.yaml
    // is read at start: a label added while it was down reaches the controller now
    // (docs/troubleshooting.md, "an edit of node.yaml is not seen").
    std::fs::remove_file(n.root.join("join-key")).unwrap();
    let yaml = std::fs::read_to_string(n.config()).unwrap() + "labels: [edited]\n";
    std::fs::write(n.config(), yaml).unwrap();
    assert_eq!(f.node_view(&n.name).await.unwrap()["labels"], serde_json::json!([]));
    let before = f.node_view(&n.name).await.unwrap()["lastSeenAt"].clone();
    n.start();
    eventually(30, "reporting again, with the edited labels", || async {
        f.node_view(&n.name).await.filter(|v| {
            v["status"] == "online" && v["lastSeenAt"] != before && v["labels"] == serde_json::json!(["edited"])
        })
    })
    .await;
    assert_eq!(n.log().matches("joined the fleet as").count(), 1, "joined once:\n{}", n.log());
}
