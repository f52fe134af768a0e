//! Day-two operations through the API (docs/behaviour.md#node-lifecycle, docs/behaviour.md#why-an-agent-is-where-it-is and docs/behaviour.md#events): cordon, drain, uncordon and delete
//! as placement, PATs, node tokens and the event history see them; the lifecycle surviving a
//! restart; a drain that blocks and one forced; paging of the list routes.

mod support;

use serde_json::{json, Value};
use support::*;

/// Where each placed replica is: (agent, node id) → count.
async fn placed_on(admin: &Admin) -> Vec<(String, String, u64)> {
    let mut v: Vec<_> = admin
        .placements()
        .await
        .into_iter()
        .filter(|p| p["status"] == "placed")
        .map(|p| {
            (
                p["agentKey"].as_str().unwrap().into(),
                p["nodeId"].as_str().unwrap().into(),
                p["replicas"].as_u64().unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

fn count_on(placed: &[(String, String, u64)], node: &str) -> u64 {
    placed.iter().filter(|p| p.1 == node).map(|p| p.2).sum()
}

async fn node_view(admin: &Admin, node: &str) -> Value {
    let (s, v) = admin.get(&format!("/api/v1/nodes/{node}")).await;
    assert_eq!(s, 200, "{v}");
    v
}

async fn event_kinds(admin: &Admin, query: &str) -> Vec<String> {
    let (s, v) = admin.get(&format!("/api/v1/events?{query}")).await;
    assert_eq!(s, 200, "{v}");
    v["items"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap().to_string()).collect()
}

/// PATs issued for a node, by its name in the PAT's description: (agent, revoked).
fn pats_for(dk: &fleet_devkit::Devkit, node: &str) -> Vec<(String, bool)> {
    let on = format!("on node {node}");
    dk.pats()
        .into_iter()
        .filter(|p| p.description.ends_with(&on))
        .map(|p| (p.agent_key.unwrap_or_default(), p.revoked))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cordon_drain_uncordon_and_delete_a_node() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = in_process_config(&dk, dir.path());
    let running = fleet_controller::server::start(cfg.clone()).await.unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:admin"], 3600));
    let announce = json!({"executorKinds": ["k"], "capacity": {"slots": 8}});
    let mut a = TestNode::new(&url, "n-a", announce.clone());
    let mut b = TestNode::new(&url, "n-b", announce.clone());
    a.join(&admin.join_key().await).await;
    b.join(&admin.join_key().await).await;
    let online = keep_reporting(vec![a.clone(), b.clone()]);
    dk.put_agent(agent("x", "k", 2));
    dk.put_agent(agent("y", "k", 1));
    let first = eventually(20, "x and y placed", || async {
        let p = placed_on(&admin).await;
        (p.iter().map(|x| x.2).sum::<u64>() == 3).then_some(p)
    })
    .await;
    assert!(count_on(&first, &a.id) > 0, "a holds a replica: {first:?}");

    // Cordon (by name): what is there stays, nothing new comes.
    let (s, v) = admin.post("/api/v1/nodes/n-a:cordon", json!({})).await;
    assert_eq!((s.as_u16(), &v["schedulable"], &v["drain"]), (200, &json!(false), &Value::Null), "{v}");
    dk.put_agent(agent("z", "k", 2));
    let p = eventually(20, "z placed", || async {
        let p = placed_on(&admin).await;
        p.iter().any(|x| x.0 == "z" && x.2 == 2).then_some(p)
    })
    .await;
    assert!(p.iter().all(|x| x.0 != "z" || x.1 == b.id), "z avoids the cordoned node: {p:?}");
    assert_eq!(count_on(&p, &a.id), count_on(&first, &a.id), "a keeps its replicas");
    let on_a_before = pats_for(&dk, "n-a");

    // Drain: everything moves to b with new PATs; a's PATs are revoked after the node's stop
    // window; the drain reports done and the node stays cordoned.
    let (s, v) = admin.post(&format!("/api/v1/nodes/{}:drain", a.id), json!({})).await;
    assert_eq!(s, 202, "{v}");
    assert_eq!(v["drain"]["force"], false);
    let done = eventually(20, "the drain done", || async {
        let v = node_view(&admin, "n-a").await;
        (v["drain"]["remaining"] == 0).then_some(v)
    })
    .await;
    assert_eq!(done["schedulable"], false);
    assert_eq!(done["drain"]["blocked"], json!([]));
    assert_eq!(count_on(&placed_on(&admin).await, &a.id), 0);
    eventually(20, "new PATs for the moved agents on n-b", || async {
        let on_b = pats_for(&dk, "n-b");
        on_a_before.iter().all(|(agent, _)| on_b.iter().any(|(x, r)| x == agent && !r)).then_some(())
    })
    .await;
    eventually(45, "n-a's PATs revoked after the stop window", || async {
        pats_for(&dk, "n-a").iter().all(|(_, revoked)| *revoked).then_some(())
    })
    .await;
    // Events are written within a second of happening.
    let want = |have: &[String], kinds: &[&str]| kinds.iter().all(|k| have.iter().any(|h| h == k));
    eventually(5, "n-a's lifecycle events", || async {
        let kinds = event_kinds(&admin, "node=n-a").await;
        want(&kinds, &["node_joined", "node_cordoned", "node_draining", "node_drained"]).then_some(())
    })
    .await;
    eventually(5, "x's moves and revocation in its events", || async {
        let kinds = event_kinds(&admin, "agent=x").await;
        want(&kinds, &["replica_placed", "replica_moved", "pat_issued", "pat_revoked"]).then_some(())
    })
    .await;

    // Uncordon: eligible again; a new agent spreads to it (most free slots).
    let (s, v) = admin.post("/api/v1/nodes/n-a:uncordon", json!({})).await;
    assert_eq!((s.as_u16(), &v["schedulable"], &v["drain"]), (200, &json!(true), &Value::Null), "{v}");
    dk.put_agent(agent("w", "k", 1));
    eventually(20, "w on n-a", || async {
        placed_on(&admin).await.iter().any(|x| x.0 == "w" && x.1 == a.id).then_some(())
    })
    .await;

    // The lifecycle is stored: cordoned before a restart, cordoned after.
    admin.post("/api/v1/nodes/n-a:cordon", json!({})).await;
    online.abort();
    running.shutdown().await;
    let running = fleet_controller::server::start(cfg).await.unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, admin.token.clone());
    let (a, b) = (TestNode { url: url.clone(), ..a }, TestNode { url: url.clone(), ..b });
    let _online = keep_reporting(vec![a.clone(), b.clone()]);
    assert_eq!(node_view(&admin, "n-a").await["schedulable"], false, "cordon survives a restart");
    admin.post("/api/v1/nodes/n-a:uncordon", json!({})).await;

    // Delete b: its token stops working at once, its PATs are revoked now, its replicas move,
    // its name is free.
    let on_b: Vec<String> = pats_for(&dk, "n-b").into_iter().filter(|p| !p.1).map(|p| p.0).collect();
    assert!(!on_b.is_empty());
    let (s, body) = admin.delete("/api/v1/nodes/n-b").await;
    assert_eq!(s, 204, "{body}");
    assert_eq!(b.desired(None, 0).await.0, 401, "the deleted node's token is refused");
    eventually(5, "every PAT of n-b revoked at once", || async {
        pats_for(&dk, "n-b").iter().all(|(_, revoked)| *revoked).then_some(())
    })
    .await;
    eventually(20, "b's replicas on a", || async {
        let p = placed_on(&admin).await;
        (count_on(&p, &b.id) == 0 && p.iter().map(|x| x.2).sum::<u64>() == 6).then_some(())
    })
    .await;
    assert_eq!(admin.get("/api/v1/nodes/n-b").await.0, 404);
    assert_eq!(admin.delete("/api/v1/nodes/n-b").await.0, 404);
    let mut again = TestNode::new(&url, "n-b", announce);
    again.join(&admin.join_key().await).await;
    assert_ne!(again.id, b.id, "a new node under the freed name");
    eventually(5, "node_deleted", || async {
        event_kinds(&admin, &format!("node={}", b.id)).await.contains(&"node_deleted".to_string()).then_some(())
    })
    .await;
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_with_nowhere_to_go_blocks_and_force_unbinds() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:admin"], 3600));
    let mut a = TestNode::new(&url, "n-a", json!({"executorKinds": ["k"], "capacity": {"slots": 2}}));
    let mut b = TestNode::new(&url, "n-b", json!({"executorKinds": ["k"], "capacity": {"slots": 1}}));
    a.join(&admin.join_key().await).await;
    b.join(&admin.join_key().await).await;
    let _online = keep_reporting(vec![a.clone(), b.clone()]);
    dk.put_agent(agent("x", "k", 2));
    eventually(20, "x on a", || async { (count_on(&placed_on(&admin).await, &a.id) == 2).then_some(()) }).await;

    admin.post("/api/v1/nodes/n-a:drain", json!({})).await;
    let v = eventually(20, "one replica moved, one blocked", || async {
        let v = node_view(&admin, "n-a").await;
        (v["drain"]["remaining"] == 1).then_some(v)
    })
    .await;
    let blocked = v["drain"]["blocked"].as_array().unwrap();
    assert_eq!(blocked.len(), 1, "{v}");
    assert_eq!(blocked[0]["agentKey"], "x");
    assert_eq!(count_on(&placed_on(&admin).await, &b.id), 1);

    // Force: the blocked replica is unbound; the agent waits, and says why.
    let (s, v) = admin.post("/api/v1/nodes/n-a:drain", json!({"force": true})).await;
    assert_eq!((s.as_u16(), &v["drain"]["force"]), (202, &json!(true)), "{v}");
    eventually(20, "the forced drain done", || async {
        (node_view(&admin, "n-a").await["drain"]["remaining"] == 0).then_some(())
    })
    .await;
    let (s, why) = admin.get("/api/v1/agents/x/placement?nodes=true").await;
    assert_eq!(s, 200, "{why}");
    assert_eq!(why["reason"]["code"], "no_capacity", "{why}");
    let f = |name: &str| why["filters"].as_array().unwrap().iter().find(|f| f["filter"] == name).unwrap().clone();
    assert_eq!((f("schedulable")["before"].as_u64(), f("schedulable")["excluded"].as_u64()), (Some(2), Some(1)));
    assert_eq!(f("capacity")["exhausted"]["slots"], 1);
    let verdicts = why["nodes"].as_array().unwrap();
    assert_eq!(verdicts[0]["detail"], "draining");
    assert_eq!(verdicts[1]["detail"], "short of slots");
    assert_eq!(admin.get("/api/v1/agents/nope/placement").await.0, 404);
    assert_eq!(admin.get("/api/v1/agents/x/placement?nodes=maybe").await.0, 400);
    assert_eq!(admin.post("/api/v1/nodes/n-a:explode", json!({})).await.0, 404);
    assert_eq!(admin.post("/api/v1/nodes/nope:cordon", json!({})).await.0, 404);
    let (s, v) = admin.post("/api/v1/nodes/n-a:drain", json!({"force": "yes"})).await;
    assert_eq!(s, 400, "{v}");
    running.shutdown().await;
}

/// `limit` and `cursor` page every list route; the pages together are the unpaged list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_routes_page_with_limit_and_cursor() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:admin"], 3600));
    let mut nodes = Vec::new();
    for i in 0..5 {
        let mut n = TestNode::new(&url, &format!("n-{i}"), json!({"executorKinds": ["k"], "capacity": {"slots": 4}}));
        n.join(&admin.join_key().await).await;
        nodes.push(n);
    }
    let _online = keep_reporting(nodes.clone());
    for i in 0..7 {
        dk.put_agent(agent(&format!("a-{i}"), "k", 2));
    }
    eventually(20, "all placed", || async {
        let p = admin.placements().await;
        (p.iter().filter(|x| x["status"] == "placed").map(|x| x["replicas"].as_u64().unwrap()).sum::<u64>() == 14)
            .then_some(())
    })
    .await;
    for (path, page) in [("/api/v1/nodes", 2), ("/api/v1/placements", 3), ("/api/v1/events", 4)] {
        let (_, whole) = admin.get(path).await;
        assert!(whole.get("nextCursor").is_none(), "{path} without limit is one answer");
        let whole = whole["items"].as_array().unwrap().clone();
        let mut paged = Vec::new();
        let mut cursor = String::new();
        loop {
            let q = if cursor.is_empty() { format!("?limit={page}") } else { format!("?limit={page}&cursor={cursor}") };
            let (s, v) = admin.get(&format!("{path}{q}")).await;
            assert_eq!(s, 200, "{v}");
            let items = v["items"].as_array().unwrap();
            assert!(items.len() <= page);
            paged.extend(items.iter().cloned());
            match v["nextCursor"].as_str() {
                Some(c) => cursor = c.to_string(),
                None => break,
            }
        }
        if path == "/api/v1/events" {
            // New events may land between the calls: the pages hold at least the whole list.
            assert!(paged.len() >= whole.len() && paged[..whole.len()] == whole[..], "{path}");
        } else {
            assert_eq!(paged, whole, "{path}: the pages are the list");
        }
        assert!(paged.len() > page, "{path}: more than one page");
    }
    let (s, v) = admin.get("/api/v1/nodes?limit=0").await;
    assert_eq!((s.as_u16(), v["message"].as_str()), (400, Some("limit: must be 1–5000")));
    let (s, v) = admin.get("/api/v1/placements?limit=2&cursor=!!").await;
    assert_eq!(s, 400, "{v}");
    running.shutdown().await;
}

/// `FLEET_NODE_GC_SECONDS`: a node offline longer than this is deleted as by `DELETE`; one
/// that keeps reporting stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_nodes_are_collected_after_the_gc_period() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = in_process_config(&dk, dir.path());
    cfg.node_gc_after = Some(std::time::Duration::from_secs(2));
    let running = fleet_controller::server::start(cfg).await.unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:admin"], 3600));
    let announce = json!({"executorKinds": ["k"], "capacity": {"slots": 2}});
    let (mut gone, mut stays) =
        (TestNode::new(&url, "n-gone", announce.clone()), TestNode::new(&url, "n-stays", announce));
    gone.join(&admin.join_key().await).await;
    stays.join(&admin.join_key().await).await;
    let _online = keep_reporting(vec![stays.clone()]);
    // n-gone never reports: offline after 3 s, deleted 2 s later.
    eventually(20, "n-gone collected", || async { (admin.get("/api/v1/nodes/n-gone").await.0 == 404).then_some(()) })
        .await;
    assert_eq!(gone.desired(None, 0).await.0, 401);
    assert_eq!(admin.get("/api/v1/nodes/n-stays").await.0, 200, "a reporting node stays");
    eventually(5, "the reason in the events", || async {
        let (_, v) = admin.get(&format!("/api/v1/events?node={}", gone.id)).await;
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| {
                e["kind"] == "node_deleted"
                    && e["message"].as_str().unwrap_or("").contains("offline longer than FLEET_NODE_GC_SECONDS=2")
            })
            .then_some(())
    })
    .await;
    running.shutdown().await;
}

/// docs/behaviour.md#spread-and-priority through the API, with nodes that follow the node
/// protocol: a full fleet, an agent of higher priority arrives and takes the room of the
/// lowest; the preempted agent waits as `pending`/`preempted`, an event names who took its
/// room, the newcomer gets its own PAT and the preempted replica's PAT is revoked; fewer
/// replicas of the newcomer give the room back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_priority_agent_takes_the_room_of_the_lowest_and_gives_it_back() {
    use support::sim::SimNode;
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:admin"], 3600));
    let mut nodes = Vec::new();
    for name in ["n-a", "n-b", "n-c"] {
        let mut n = TestNode::new(&url, name, json!({"executorKinds": ["k"], "capacity": {"slots": 1}}));
        n.join(&admin.join_key().await).await;
        nodes.push(SimNode::start(n, Default::default()));
    }
    let prioritised = |key: &str, replicas: u32, priority: i64| {
        with(agent(key, "k", replicas), |a| a["placement"]["priority"] = json!(priority))
    };
    dk.put_agents(vec![prioritised("batch", 1, -5), prioritised("steady", 2, 0)]);
    let runs = |nodes: &[SimNode], key: &str| -> usize {
        nodes.iter().map(|n| n.running.lock().iter().filter(|((a, _), v)| a == key && v.2 == "running").count()).sum()
    };
    eventually(30, "the fleet full: batch 1 and steady 2 running", || async {
        (runs(&nodes, "batch") == 1 && runs(&nodes, "steady") == 2).then_some(())
    })
    .await;
    let batch_pats = || dk.pats().into_iter().filter(|p| p.agent_key.as_deref() == Some("batch")).collect::<Vec<_>>();
    assert_eq!(batch_pats().iter().filter(|p| !p.revoked).count(), 1);

    dk.put_agent(prioritised("urgent", 1, 10));
    eventually(30, "urgent running in batch's room", || async {
        (runs(&nodes, "urgent") == 1 && runs(&nodes, "batch") == 0).then_some(())
    })
    .await;
    assert_eq!(runs(&nodes, "steady"), 2, "a priority above the lowest's takes only the lowest's room");
    let status = eventually(20, "batch pending, preempted", || async {
        dk.status("batch").filter(|s| s["phase"] == "pending" && s["reason"]["code"] == "preempted")
    })
    .await;
    assert_eq!(status["readyReplicas"], 0, "{status}");
    let (s, events) = admin.get("/api/v1/events?agent=batch").await;
    assert_eq!(s, 200);
    let preempted: Vec<&Value> =
        events["items"].as_array().unwrap().iter().filter(|e| e["kind"] == "replica_preempted").collect();
    assert_eq!(preempted.len(), 1, "{events}");
    let msg = preempted[0]["message"].as_str().unwrap();
    assert!(msg.contains("urgent") && msg.contains("priority 10"), "the event names who took the room: {msg}");
    let (_, why) = admin.get("/api/v1/agents/batch/placement").await;
    assert_eq!(why["reason"]["code"], "preempted", "{why}");
    assert!(why["hint"].as_str().unwrap().contains("higher-priority"), "{why}");
    assert_eq!(why["priority"], -5, "{why}");
    // No PAT shortcut: the newcomer has its own, and the preempted replica's is revoked after
    // its drain window.
    let urgent = dk.pats().into_iter().filter(|p| p.agent_key.as_deref() == Some("urgent")).collect::<Vec<_>>();
    assert_eq!(urgent.len(), 1);
    assert!(!urgent[0].revoked);
    assert!(batch_pats().iter().all(|p| p.token != urgent[0].token));
    eventually(60, "batch's PAT revoked", || async { batch_pats().iter().all(|p| p.revoked).then_some(()) }).await;

    // Fewer replicas of the newcomer: the room comes back to the preempted agent.
    dk.edit_agent("urgent", |a| a["placement"]["replicas"] = json!(0));
    eventually(30, "batch running again", || async { (runs(&nodes, "batch") == 1).then_some(()) }).await;
    eventually(20, "batch running in the CP", || async { dk.status("batch").filter(|s| s["phase"] == "running") })
        .await;
    let ctx = running.ctx.clone().expect("the leader's context");
    eventually(20, "a clean audit", || async {
        fleet_controller::reconcile::pass::audit::audit(&ctx).await.unwrap().is_empty().then_some(())
    })
    .await;
    drop(nodes);
    running.shutdown().await;
}
