//! Reading agents from the CP (docs/behaviour.md#control-plane-calls-and-agent-descriptions, docs/behaviour.md#the-reconcile-pass step 1): every page followed, `If-None-Match`
//! honoured, invalid items skipped whole, and the last known list used — across a restart —
//! while the CP is down.

mod support;

use fleet_devkit::{Devkit, DevkitConfig, Faults};
use serde_json::json;
use std::time::Duration;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_etag_skips_and_outage_across_restart() {
    let dk = Devkit::start(DevkitConfig { page_size: 2, ..Default::default() }, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let keys = ["a1", "a2", "a3", "a4", "a5"];
    let mut items: Vec<_> = keys.iter().map(|k| agent(k, "k", 1)).collect();
    items.push(agent("Bad_Key", "k", 1));
    items.push(json!({"key": "broken", "revision": "three"}));
    dk.put_agents(items);
    let dir = tempfile::tempdir().unwrap();
    let cfg = in_process_config(&dk, dir.path());
    let running = fleet_controller::server::start(cfg.clone()).await.unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:read", "fleet:admin"], 3600));
    let mut node = TestNode::new(&url, "big", json!({"executorKinds": ["k"], "capacity": {"slots": 10}}));
    node.join(&admin.join_key().await).await;

    let placed = || async {
        let p = admin.placements().await;
        let placed: Vec<String> =
            p.iter().filter(|i| i["status"] == "placed").map(|i| i["agentKey"].as_str().unwrap().to_string()).collect();
        (placed == keys).then_some(p)
    };
    let p = eventually(15, "all five agents from three pages placed", placed).await;
    assert!(!p.iter().any(|i| i["agentKey"] == "Bad_Key" || i["agentKey"] == "broken"), "invalid items are skipped");
    let metrics = reqwest::get(format!("http://{}/metrics", running.metrics_addr)).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("fleet_agents_skipped_total 2"), "{metrics}");

    // With nothing changed, the CP answers 304 to the controller's If-None-Match.
    let before = (dk.calls("list_agents"), dk.calls("list_agents_304"));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(dk.calls("list_agents_304") > before.1, "the ETag is used");
    assert_eq!(dk.calls("list_agents"), before.0, "no full read of an unchanged list");
    eventually(15, "desired has five agents", || async {
        let (_, d) = node.desired(None, 0).await;
        (d["agents"].as_array()?.len() == 5).then_some(d)
    })
    .await;

    // A change of the list (a1 at revision 2, a6 new) is stored as that change: the list the
    // restart below reads back is the changed one.
    let keys = ["a1", "a2", "a3", "a4", "a5", "a6"];
    let mut changed: Vec<_> = keys.iter().map(|k| agent(k, "k", 1)).collect();
    changed[0]["revision"] = json!(2);
    dk.put_agents(changed);
    let desired = eventually(15, "desired has a1 at revision 2 and a6", || async {
        node.report(&[]).await;
        let (_, d) = node.desired(None, 0).await;
        let agents = d["agents"].as_array()?;
        let a1 = agents.iter().find(|a| a["agentKey"] == "a1")?;
        (a1["revision"] == 2 && agents.len() == 6).then_some(d)
    })
    .await;
    // The copy is written half a second after the pass starts.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The CP goes down and the controller restarts: the stored list keeps everything placed.
    dk.set_faults(Faults { cp_down: true, ..Default::default() });
    running.shutdown().await;
    let mut cfg2 = cfg.clone();
    cfg2.listen = "127.0.0.1:0".parse().unwrap();
    let running = fleet_controller::server::start(cfg2).await.unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, admin.token.clone());
    node.url = url.clone();
    assert!(node.report(&[]).await.is_success());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = admin.placements().await;
    let placed: Vec<_> =
        p.iter().filter(|i| i["status"] == "placed").map(|i| i["agentKey"].as_str().unwrap()).collect();
    assert_eq!(placed, keys, "last known list used while the CP is down");
    let (_, d) = node.desired(None, 0).await;
    assert_eq!(d, desired, "the node's desired state is unchanged");
    running.shutdown().await;
}

/// A list is read into a vector sized for the length the caller expects (the last list's),
/// not grown page by page: at 20,000 agents doubling left 32,768 places beside the old list
/// (issue #22). A longer or shorter list than expected is still read whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_is_read_into_a_vector_of_the_expected_length() {
    use fleet_controller::config::ClientCredentials;
    use fleet_controller::platform::cp::{AgentsFetch, CpClient};
    use fleet_controller::platform::token::TokenSource;
    use std::sync::Arc;

    let cfg = DevkitConfig { page_size: 7, ..Default::default() };
    let creds = ClientCredentials { client_id: cfg.client_id.clone(), client_secret: cfg.client_secret.clone() };
    let dk = Devkit::start(cfg, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    dk.put_agents((0..50).map(|i| agent(&format!("a{i:02}"), "k", 1)).collect());
    let http = reqwest::Client::new();
    let tokens = Arc::new(TokenSource::new(http.clone(), &dk.url, Some(creds)));
    let cp = CpClient::new(http, &dk.url, tokens);
    let read = |expected| {
        let cp = &cp;
        async move {
            match cp.list_agents(None, expected).await.unwrap() {
                AgentsFetch::List { agents, .. } => agents,
                AgentsFetch::NotModified => panic!("304 without an ETag"),
            }
        }
    };
    let agents = read(50).await;
    assert_eq!((agents.len(), agents.capacity()), (50, 50), "sized once, for the expected length");
    assert_eq!(read(10).await.len(), 50, "a longer list than expected is read whole");
    let grown = read(0).await;
    assert!(grown.len() == 50 && grown.capacity() > 50, "without an expectation it grows as read");
}

/// devkit listing agents a1 and a2 (kind `k`), and a controller in this process reading it.
async fn with_two_agents() -> (Devkit, tempfile::TempDir, fleet_controller::server::Running) {
    let dk = devkit().await;
    dk.put_agents(vec![agent("a1", "k", 1), agent("a2", "k", 1)]);
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    (dk, dir, running)
}

/// A list the CP replaced is let go once the pass has taken the new one: nothing (the pass's
/// memo, the watcher's write, a work item) keeps the old list alive beside it, which at
/// 20,000 agents is ~10 MB (issue #22).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_agent_list_is_let_go() {
    let (dk, _dir, running) = with_two_agents().await;
    let ctx = running.ctx.clone().unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:read", "fleet:admin"], 3600));
    let mut node = TestNode::new(&url, "n1", json!({"executorKinds": ["k"], "capacity": {"slots": 4}}));
    node.join(&admin.join_key().await).await;
    eventually(15, "both agents placed", || async {
        (admin.placements().await.iter().filter(|i| i["status"] == "placed").count() == 2).then_some(())
    })
    .await;
    let old = std::sync::Arc::downgrade(ctx.store.read().agents());
    dk.edit_agent("a1", |a| a["revision"] = json!(2));
    eventually(15, "the edit placed at revision 2", || async {
        let p = admin.placements().await;
        p.iter().any(|i| i["agentKey"] == "a1" && i["revision"] == 2).then_some(())
    })
    .await;
    eventually(10, "the old list let go", || async { (old.upgrade().is_none()).then_some(()) }).await;
}

/// A new ETag over the same agents is taken without replacing the registry's list: the pass
/// and its maps keep sharing the one list instead of a second copy of every agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_etag_over_the_same_agents_keeps_the_list() {
    let (dk, _dir, running) = with_two_agents().await;
    let ctx = running.ctx.clone().unwrap();
    let state = || ctx.store.read();
    eventually(15, "both agents read", || async { (state().agents().len() == 2).then_some(()) }).await;
    let (list, etag) = (state().agents().clone(), state().agents_etag().map(String::from));
    dk.touch();
    eventually(15, "the new ETag taken", || async { (state().agents_etag().map(String::from) != etag).then_some(()) })
        .await;
    assert!(std::sync::Arc::ptr_eq(&list, state().agents()), "the same list, not a copy of it");
    let reads = dk.calls("list_agents");
    dk.edit_agent("a1", |a| a["revision"] = json!(2));
    eventually(15, "an edit still replaces it", || async {
        (!std::sync::Arc::ptr_eq(&list, state().agents())).then_some(())
    })
    .await;
    assert!(dk.calls("list_agents") > reads);
}
