//! The controller with devkit over real HTTP on 127.0.0.1, the controller as a real process:
//! placement per docs/behaviour.md#placement, long-poll wake-ups, liveness and moves, CP statuses, and a
//! `SIGKILL` + restart that loses nothing and marks no node offline by itself.

mod support;

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Duration;
use support::*;

/// Placements as (agent, node name or "-", replicas, status, reason) for comparison.
fn summary(items: &[Value], names: &[(&str, &str)]) -> BTreeSet<(String, String, u64, String, String)> {
    items
        .iter()
        .map(|i| {
            let node = i["nodeId"]
                .as_str()
                .map(|id| {
                    names.iter().find(|(nid, _)| *nid == id).map(|(_, n)| n.to_string()).unwrap_or(id.to_string())
                })
                .unwrap_or("-".into());
            (
                i["agentKey"].as_str().unwrap().to_string(),
                node,
                i["replicas"].as_u64().unwrap(),
                i["status"].as_str().unwrap().to_string(),
                i["reason"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn row(a: &str, n: &str, r: u64, s: &str, why: &str) -> (String, String, u64, String, String) {
    (a.into(), n.into(), r, s.into(), why.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_places_wakes_moves_reports_and_survives_sigkill() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let env = env_for(&dk, dir.path(), free_port(), free_port());
    let log = dir.path().join("controller.log");
    let mut ctl = ControllerProcess::spawn(env.clone(), log.clone()).await;
    let admin = Admin::new(&ctl.url, dk.mint("fleet", &["fleet:admin"], 3600));

    // No node yet: an agent waits with no_node, and the CP hears it.
    dk.put_agent(agent("early", "claude-code", 1));
    eventually(15, "early waiting for a node in the CP", || async {
        dk.status("early").filter(|s| s["phase"] == "waiting_for_node" && s["reason"]["code"] == "no_node")
    })
    .await;
    dk.remove_agent("early");

    // Three nodes with different labels, kinds, images, capacity and secrets.
    let mut a = TestNode::new(
        &ctl.url,
        "n-a",
        json!({"labels": ["repos"], "executorKinds": ["claude-code"], "capacity": {"slots": 3}, "secrets": ["github-token"]}),
    );
    let mut b = TestNode::new(
        &ctl.url,
        "n-b",
        json!({"labels": [], "executorKinds": ["claude-code", "observer"], "executorImages": {"observer": ["obs/mail:1.*"]},
               "capacity": {"slots": 2}, "secrets": []}),
    );
    let mut c = TestNode::new(
        &ctl.url,
        "n-c",
        json!({"labels": ["repos"], "executorKinds": ["claude-code"], "capacity": {"slots": 1}, "secrets": []}),
    );
    for n in [&mut a, &mut b, &mut c] {
        let key = admin.join_key().await;
        n.join(&key).await;
    }
    let names = [(a.id.as_str(), "n-a"), (b.id.as_str(), "n-b"), (c.id.as_str(), "n-c")];
    let nodes = admin.nodes().await;
    assert_eq!(nodes.len(), 3);
    let nb = nodes.iter().find(|n| n["name"] == "n-b").unwrap();
    assert_eq!(nb["status"], "online");
    assert_eq!(nb["executorImages"]["observer"], json!(["obs/mail:1.*"]));
    assert_eq!(nodes.iter().find(|n| n["name"] == "n-a").unwrap()["secrets"], json!(["github-token"]));
    let (ra, rb, rc) = (Reporter::start(a.clone()), Reporter::start(b.clone()), Reporter::start(c.clone()));

    // All agents appear at once, so placement of new replicas is exactly the order of docs/behaviour.md#placement.
    let alpha = agent("alpha", "claude-code", 2);
    let beta = with(agent("beta", "claude-code", 1), |v| v["placement"]["requires"] = json!(["repos"]));
    let delta = with(agent("delta", "claude-code", 1), |v| v["placement"]["secrets"] = json!(["github-token"]));
    let eps = agent("eps", "unknown-kind", 1);
    let gamma = with(agent("gamma", "observer", 1), |v| v["executor"]["image"] = json!("obs/mail:1.4.2"));
    let img = with(agent("img", "observer", 1), |v| v["executor"]["image"] = json!("obs/other:1"));
    let sec = with(agent("sec", "claude-code", 1), |v| v["placement"]["secrets"] = json!(["nope"]));
    let zeta = with(agent("zeta", "claude-code", 1), |v| v["placement"]["requires"] = json!(["gpu"]));
    dk.put_agents(vec![alpha, beta, delta, eps, gamma, img, sec, zeta]);
    // alpha#0 → n-a (3 free); alpha#1 → n-a (tie 2/2 with n-b, by name); beta → n-a (tie with n-c,
    // by name); delta: only n-a has the secret and it is full; gamma → the only observer node.
    let expected: BTreeSet<_> = [
        row("alpha", "n-a", 2, "placed", ""),
        row("beta", "n-a", 1, "placed", ""),
        row("delta", "-", 1, "pending", "no_capacity"),
        row("eps", "-", 1, "pending", "no_executor_kind"),
        row("gamma", "n-b", 1, "placed", ""),
        row("img", "-", 1, "pending", "image_not_allowed"),
        row("sec", "-", 1, "pending", "no_secret"),
        row("zeta", "-", 1, "pending", "no_label"),
    ]
    .into();
    eventually(15, "placements per docs/behaviour.md#placement", || async {
        let got = summary(&admin.placements().await, &names);
        (got == expected).then_some(())
    })
    .await;

    // Desired states carry PATs sealed to their node: they open with that node's key only,
    // and equal what IAM issued.
    let da = eventually(15, "n-a's desired state with alpha and beta", || async {
        let (_, d) = a.desired(None, 0).await;
        let keys: Vec<_> =
            d["agents"].as_array()?.iter().map(|x| x["agentKey"].as_str().unwrap().to_string()).collect();
        (keys == ["alpha", "beta"]).then_some(d)
    })
    .await;
    assert_eq!(da["agents"][0]["replicaIndexes"], json!([0, 1]));
    let pat = a.open_pat(&da, "alpha").expect("n-a opens its PAT");
    assert!(dk.pats().iter().any(|p| p.token == pat && p.agent_key.as_deref() == Some("alpha") && !p.revoked));
    assert!(b.open_pat(&da, "alpha").is_none(), "another node's key cannot open it");

    // A change that concerns n-b wakes n-b's poll promptly (the tick is an hour); n-c's stays held.
    let gb = eventually(15, "n-b has gamma", || async {
        let (_, d) = b.desired(None, 0).await;
        (d["agents"][0]["agentKey"] == "gamma").then(|| d["generation"].as_u64().unwrap())
    })
    .await;
    let gc = c.generation().await;
    let (pb, pc) = (b.clone(), c.clone());
    let poll_b = tokio::spawn(async move { pb.desired(Some(gb), 30).await });
    let poll_c = tokio::spawn(async move { pc.desired(Some(gc), 30).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!poll_b.is_finished() && !poll_c.is_finished(), "both polls are held");
    dk.edit_agent("gamma", |v| v["revision"] = json!(2));
    let (status, woke) = tokio::time::timeout(Duration::from_secs(15), poll_b).await.expect("n-b woke").unwrap();
    assert_eq!(status, 200);
    assert!(woke["generation"].as_u64().unwrap() > gb);
    assert_eq!(woke["agents"][0]["revision"], 2);
    assert!(!poll_c.is_finished(), "n-c's poll is untouched by a change that is not its own");
    poll_c.abort();

    // Reports become statuses in the CP.
    ra.set(&[("alpha", 0, "running", 1), ("alpha", 1, "running", 1), ("beta", 0, "running", 1)]);
    rb.set(&[("gamma", 0, "running", 2)]);
    let st =
        eventually(15, "alpha running in the CP", || async { dk.status("alpha").filter(|s| s["phase"] == "running") })
            .await;
    assert_eq!((st["readyReplicas"].as_u64(), st["desiredReplicas"].as_u64()), (Some(2), Some(2)));
    assert_eq!(st["observedRevision"], 1);
    assert_eq!(st["node"], "n-a");
    assert_eq!(st["replicas"].as_array().unwrap().len(), 2);
    assert_eq!(st["replicas"][1]["state"], "running");
    eventually(15, "gamma running at revision 2", || async {
        dk.status("gamma").filter(|s| s["phase"] == "running" && s["observedRevision"] == 2)
    })
    .await;
    for (agent, code) in [("delta", "no_capacity"), ("eps", "no_executor_kind"), ("zeta", "no_label")] {
        let s = dk.status(agent).unwrap_or_else(|| panic!("status of {agent}"));
        assert_eq!(
            (s["phase"].as_str(), s["reason"]["code"].as_str()),
            (Some("waiting_for_node"), Some(code)),
            "{agent}"
        );
    }
    // Unchanged bodies are not sent again.
    let sent = dk.status_history("alpha").len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(dk.status_history("alpha").len(), sent, "the same status is not re-sent");

    // n-a falls silent: offline after the threshold; alpha moves with new PATs; beta has
    // nowhere to go (only n-c has repos, and it fills up) and stays bound: node_unavailable.
    ra.paused.store(true, Ordering::SeqCst);
    eventually(15, "n-a offline", || async {
        admin.nodes().await.iter().any(|n| n["name"] == "n-a" && n["status"] == "offline").then_some(())
    })
    .await;
    // The pass says so when the node crosses its threshold (3 s here), with its silence.
    eventually(10, "the offline log line", || async {
        let log = ctl.log_text();
        let line = log.lines().find(|l| l.contains("node n-a is offline (last report "))?;
        line.contains("s ago)").then_some(())
    })
    .await;
    let moved: BTreeSet<_> = [
        row("alpha", "n-b", 1, "placed", ""),
        row("alpha", "n-c", 1, "placed", ""),
        row("beta", "n-a", 1, "pending", "node_unavailable"),
        row("delta", "-", 1, "pending", "no_secret"),
        row("eps", "-", 1, "pending", "no_executor_kind"),
        row("gamma", "n-b", 1, "placed", ""),
        row("img", "-", 1, "pending", "image_not_allowed"),
        row("sec", "-", 1, "pending", "no_secret"),
        row("zeta", "-", 1, "pending", "no_label"),
    ]
    .into();
    eventually(15, "replicas moved off n-a", || async {
        (summary(&admin.placements().await, &names) == moved).then_some(())
    })
    .await;
    eventually(15, "beta node_unavailable in the CP", || async {
        dk.status("beta").filter(|s| s["phase"] == "node_unavailable")
    })
    .await;
    let db = eventually(15, "alpha's PAT on n-b", || async {
        let (_, d) = b.desired(None, 0).await;
        b.open_pat(&d, "alpha").map(|_| d)
    })
    .await;
    let new_pat = b.open_pat(&db, "alpha").unwrap();
    assert_ne!(new_pat, pat, "the move gave n-b a new PAT");
    eventually(15, "alpha's old PAT revoked", || async {
        dk.pats().iter().any(|p| p.token == pat && p.revoked).then_some(())
    })
    .await;

    // SIGKILL the controller, stay down longer than the offline threshold, restart.
    let before_nodes: BTreeSet<(String, String)> =
        admin.nodes().await.iter().map(|n| (n["id"].to_string(), n["name"].to_string())).collect();
    let before_placements = summary(&admin.placements().await, &names);
    let (gb, gc) = (b.generation().await, c.generation().await);
    rb.paused.store(true, Ordering::SeqCst);
    rc.paused.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(700)).await; // let the flusher persist the last reports
    ctl.kill9();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let ctl = ControllerProcess::spawn(env.clone(), log.clone()).await;
    let after = admin.nodes().await;
    let after_nodes: BTreeSet<(String, String)> =
        after.iter().map(|n| (n["id"].to_string(), n["name"].to_string())).collect();
    assert_eq!(after_nodes, before_nodes, "nodes are back");
    for n in &after {
        assert_eq!(n["status"], "online", "the outage alone marks no node offline: {n}");
    }
    assert_eq!(b.generation().await, gb, "n-b's token works and its generation is back, unchanged");
    assert_eq!(c.generation().await, gc);
    let after_placements = summary(&admin.placements().await, &names);
    for r in before_placements.iter().filter(|r| r.0 == "alpha" || r.0 == "gamma") {
        assert!(after_placements.contains(r), "placement {r:?} is back after restart: {after_placements:?}");
    }
    rb.paused.store(false, Ordering::SeqCst);
    rc.paused.store(false, Ordering::SeqCst);
    // Generations never go backwards, and the reconciler runs again after the restart.
    dk.edit_agent("gamma", |v| v["revision"] = json!(3));
    eventually(15, "n-b gets revision 3 after the restart", || async {
        let (_, d) = b.desired(None, 0).await;
        (d["agents"].as_array()?.iter().any(|x| x["agentKey"] == "gamma" && x["revision"] == 3)
            && d["generation"].as_u64()? > gb)
            .then_some(())
    })
    .await;
    drop(ctl);
}
