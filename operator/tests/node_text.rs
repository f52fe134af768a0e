//! What a node writes, in the controller's log (docs/behaviour.md#hardening): a node's replica
//! message reaches a rollout's halt reason and its log line, and a newline in it must not start
//! a line of its own — a node could otherwise forge any line, `became the leader` included.

mod support;

use parking_lot::Mutex;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use support::*;

const FORGED: &str = "2026-12-07T12:00:00.000000Z  INFO fleet_controller::leader: became the leader (epoch 999)";

/// What the node reports of its one replica: its template, state and message.
type Reported = Arc<Mutex<(String, &'static str, Value)>>;

/// Reports `reported` every 300 ms, as fleet-node would.
fn keep_reporting(n: TestNode, reported: Reported) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let (spec, state, message) = reported.lock().clone();
            let mut body = n.report_body(&[]);
            body["replicas"] = json!([{"agentKey": "coder", "replica": 0, "state": state, "revision": 1,
                "restarts": 0, "specId": spec, "message": message}]);
            n.put_observed(&body).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

async fn spec_id(n: &TestNode, not: &str) -> String {
    eventually(30, "a desired template", || async {
        let (_, d) = n.desired(None, 0).await;
        d["agents"][0]["specId"].as_str().filter(|s| *s != not).map(str::to_string)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newline_in_a_node_s_message_is_escaped_in_the_controller_s_log() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let env = env_for(&dk, dir.path(), free_port(), free_port());
    let ctl = ControllerProcess::spawn(env, dir.path().join("controller.log")).await;
    let admin = Admin::new(&ctl.url, dk.mint("fleet", &["fleet:admin"], 3600));
    let announce = json!({"executorKinds": ["k"], "executorImages": {"k": ["agent:*"]}, "capacity": {"slots": 2}});
    let mut n = TestNode::new(&ctl.url, "n-1", announce);
    n.join(&admin.join_key().await).await;
    dk.put_agent(with(agent("coder", "k", 1), |a| {
        a["executor"]["image"] = json!("agent:1");
        a["placement"]["rollout"] = json!({"minReadySeconds": 1});
    }));
    let first = spec_id(&n, "").await;
    let reported: Reported = Arc::new(Mutex::new((first.clone(), "running", Value::Null)));
    let reporter = keep_reporting(n.clone(), reported.clone());
    eventually(30, "the agent running", || async {
        let (_, v) = admin.get("/api/v1/agents/coder/rollout").await;
        (v["readyReplicas"] == 1).then_some(())
    })
    .await;

    // A new image, which the node says crash-loops, with a message that holds a whole log line.
    dk.edit_agent("coder", |a| a["executor"]["image"] = json!("agent:2"));
    let second = spec_id(&n, &first).await;
    *reported.lock() = (second, "crashloop", json!(format!("exited with code 1\n{FORGED}")));
    let v = eventually(30, "the rollout halted", || async {
        let (_, v) = admin.get("/api/v1/agents/coder/rollout").await;
        (v["state"] == "halted").then_some(v)
    })
    .await;
    assert!(v["failed"][0]["reason"].as_str().unwrap().contains(FORGED), "the API keeps the node's words: {v}");
    reporter.abort();

    let log = eventually(10, "the halt logged", || async {
        let log = ctl.log_text();
        log.contains("rollout_halted").then_some(log)
    })
    .await;
    assert!(!log.lines().any(|l| l.starts_with(FORGED)), "a node forged a line of the controller's log:\n{log}");
    let halted = log.lines().find(|l| l.contains("rollout_halted")).unwrap();
    assert!(halted.contains(&format!("exited with code 1\\n{FORGED}")), "escaped on the halt's own line: {halted}");
}
