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
/// not grown page by page: at 20,000 agents doubling left 32,768 places beside the old list.
/// A longer or shorter list than expected is still read whole.
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
    let tokens = Arc::new(TokenSource::new(
        http.clone(),
        &dk.url,
        Some(creds),
        fleet_controller::platform::CallGate::always("test"),
    ));
    let cp = CpClient::new(http, &dk.url, tokens, fleet_controller::platform::CallGate::always("test"));
    // The expected length is the length of the list in force.
    let read = |previous: Vec<fleet_controller::model::Agent>| {
        let cp = &cp;
        async move {
            match cp.list_agents(None, &Arc::new(previous)).await.unwrap() {
                AgentsFetch::List { agents, .. } => agents,
                AgentsFetch::NotModified => panic!("304 without an ETag"),
            }
        }
    };
    let grown = read(vec![]).await;
    assert!(grown.len() == 50 && grown.capacity() > 50, "without an expectation it grows as read");
    let agents = read(grown.clone()).await;
    assert_eq!((agents.len(), agents.capacity()), (50, 50), "sized once, for the expected length");
    assert_eq!(read(grown[..10].to_vec()).await.len(), 50, "a longer list than expected is read whole");
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
/// 20,000 agents is ~10 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_agent_list_is_let_go() {
    let (dk, _dir, running) = with_two_agents().await;
    let ctx = running.ctx.clone().unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:read", "fleet:admin"], 3600));
    admin.join_one_node_until_placed(&url, 2).await;
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

/// docs/behaviour.md#wrong-input-never-stops-an-agent: `drainSeconds: -1` on a running agent
/// keeps it placed, clamped to 0 in the desired state, its PAT live, and the field counted;
/// an item that becomes unparseable keeps its last good version in force until a good one
/// comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_input_never_stops_a_running_agent() {
    let (dk, _dir, running) = with_two_agents().await;
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:read", "fleet:admin"], 3600));
    let mut node = TestNode::new(&url, "n1", json!({"executorKinds": ["k"], "capacity": {"slots": 4}}));
    node.join(&admin.join_key().await).await;
    // Online throughout (the test controller's offline threshold is 3 s).
    let alive = keep_reporting(vec![node.clone()]);
    let a1_in_desired = |revision: u64| {
        let node = &node;
        async move {
            node.report(&[]).await;
            let (_, d) = node.desired(None, 0).await;
            let a1 = d["agents"].as_array()?.iter().find(|a| a["agentKey"] == "a1")?.clone();
            (a1["revision"] == revision && node.open_pat(&d, "a1").is_some()).then_some(a1)
        }
    };
    eventually(15, "a1 placed with its PAT", || a1_in_desired(1)).await;
    let live_pats = || dk.pats().iter().filter(|p| p.agent_key.as_deref() == Some("a1") && !p.revoked).count();
    assert_eq!(live_pats(), 1);
    let metric = |name: &str| {
        let url = format!("http://{}/metrics", running.metrics_addr);
        let name = format!("{name} ");
        async move {
            let text = reqwest::get(url).await.unwrap().text().await.unwrap();
            text.lines().find_map(|l| l.strip_prefix(&name)).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0)
        }
    };

    dk.edit_agent("a1", |a| {
        a["drainSeconds"] = json!(-1);
        a["revision"] = json!(2);
    });
    let a1 = eventually(15, "a1 at revision 2 in the desired state", || a1_in_desired(2)).await;
    assert_eq!(a1["drainSeconds"], 0, "clamped to 0: {a1}");
    assert_eq!(metric("fleet_agent_fields_replaced_total").await, 1, "the field is counted once");
    assert_eq!(metric("fleet_agents_skipped_total").await, 0, "the item is not skipped");

    // An item that does not even say its state: the last good version (revision 2) stays.
    dk.edit_agent("a1", |a| {
        a["state"] = json!(7);
        a["revision"] = json!(3);
    });
    eventually(15, "the broken item read", || async {
        (metric("fleet_agents_skipped_total").await == 1).then_some(())
    })
    .await;
    // Two passes later nothing has moved.
    tokio::time::sleep(Duration::from_secs(2)).await;
    eventually(5, "a1 still at revision 2", || a1_in_desired(2)).await;
    let p = admin.placements().await;
    assert!(p.iter().any(|i| i["agentKey"] == "a1" && i["status"] == "placed" && i["revision"] == 2), "{p:?}");

    dk.edit_agent("a1", |a| {
        a["state"] = json!("running");
        a["drainSeconds"] = json!(30);
        a["revision"] = json!(4);
    });
    let a1 = eventually(15, "a good item taken again", || a1_in_desired(4)).await;
    assert_eq!(a1["drainSeconds"], 30);
    assert_eq!(live_pats(), 1, "no PAT was revoked or issued again: {:?}", dk.pats());
    alive.abort();
}
