//! When a retired pair's PAT is revoked (docs/behaviour.md#identity-and-pats): the agent left that node's
//! desired state, so the node stops its container with a 30 s timeout whatever the agent's
//! `drainSeconds`; the PAT lives exactly that long — not the 5 s an agent with
//! `drainSeconds: 5` would suggest (its last run could not report), nor the 600 s of one with
//! `drainSeconds: 600` (a PAT nobody runs with).

mod support;

use serde_json::json;
use std::time::{Duration, Instant};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_pat_is_revoked_after_the_node_s_stop_timeout_not_drain_seconds() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:admin"], 3600));
    let mut n = TestNode::new(&url, "n-a", json!({"executorKinds": ["k"], "capacity": {"slots": 4}}));
    n.join(&admin.join_key().await).await;
    let _online = keep_reporting(vec![n.clone()]);
    dk.put_agent(with(agent("short", "k", 1), |a| a["drainSeconds"] = json!(5)));
    dk.put_agent(with(agent("long", "k", 1), |a| a["drainSeconds"] = json!(600)));
    let live = |key: &str| dk.pats().into_iter().find(|p| p.agent_key.as_deref() == Some(key));
    eventually(20, "both PATs issued", || async { (live("short").is_some() && live("long").is_some()).then_some(()) })
        .await;

    for key in ["short", "long"] {
        dk.edit_agent(key, |a| a["state"] = json!("stopped"));
    }
    let stopped = Instant::now();
    let mut revoked_after: [Option<Duration>; 2] = [None, None];
    while revoked_after.iter().any(Option::is_none) {
        assert!(stopped.elapsed() < Duration::from_secs(50), "not revoked within 50 s: {revoked_after:?}");
        for (i, key) in ["short", "long"].into_iter().enumerate() {
            if revoked_after[i].is_none() && live(key).is_some_and(|p| p.revoked) {
                revoked_after[i] = Some(stopped.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for (key, after) in ["short", "long"].into_iter().zip(revoked_after) {
        let after = after.unwrap();
        // The pass sees the stop within a CP watch (2 s); the revoke is due 30 s later.
        assert!(after >= Duration::from_secs(30), "{key}: revoked after {after:?}, before the node's 30 s stop");
        assert!(after <= Duration::from_secs(40), "{key}: revoked after {after:?}");
    }
    running.shutdown().await;
}
