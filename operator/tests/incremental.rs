//! The incremental pass held to a from-scratch recompute. After every step of a scripted
//! fleet history — joins, agents added, edited, stopped and removed, capacity running out,
//! a node's labels changing, reports of running and crash-looping replicas, a node going
//! silent and coming back, PATs issued and retired, a restart — `audit::audit` (placement,
//! placed pairs, every desired state, every status, the placement items, the gauges, live
//! credentials and their scheduled rotations) must find nothing the passes left stale. Each
//! step also checks the change it made took effect, so an audit that compares nothing
//! cannot pass.

mod support;

use fleet_controller::reconcile::pass::audit::audit;
use fleet_controller::reconcile::work::Ctx;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use support::*;

/// Waits until the audit is clean (the passes may still be catching up); panics with what
/// it still finds after 20 s.
async fn audited(ctx: &Ctx, step: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let diffs = audit(ctx).await.expect("the audit reads the credentials' boxes");
        if diffs.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "after {step}: the incremental pass left {diffs:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// (agent, status) → replicas, with the node's name where there is one.
async fn placed(admin: &Admin, names: &BTreeMap<String, String>) -> BTreeMap<(String, String, String), u64> {
    admin
        .placements()
        .await
        .iter()
        .map(|i| {
            let node = i["nodeId"].as_str().map(|id| names[id].clone()).unwrap_or_else(|| "-".into());
            let key = (i["agentKey"].as_str().unwrap().to_string(), node, i["status"].as_str().unwrap().to_string());
            (key, i["replicas"].as_u64().unwrap())
        })
        .collect()
}

/// Makes each node report its desired replicas in `state`.
async fn report_desired(nodes: &[TestNode], reporters: &[Reporter], state: &str) {
    for (n, r) in nodes.iter().zip(reporters) {
        let (_, d) = n.desired(None, 0).await;
        let mut list = Vec::new();
        for a in d["agents"].as_array().unwrap() {
            for i in a["replicaIndexes"].as_array().unwrap() {
                list.push((
                    a["agentKey"].as_str().unwrap().to_string(),
                    i.as_u64().unwrap() as u32,
                    a["revision"].as_u64().unwrap(),
                ));
            }
        }
        let refs: Vec<(&str, u32, &str, u64)> = list.iter().map(|(a, i, v)| (a.as_str(), *i, state, *v)).collect();
        r.set(&refs);
    }
}

fn status_phase(dk: &fleet_devkit::Devkit, key: &str) -> Option<String> {
    dk.status(key).and_then(|s| s["phase"].as_str().map(str::to_string))
}

/// devkit and a controller in this process, with its registry, URL and an admin client.
struct InProcess {
    dk: fleet_devkit::Devkit,
    dir: tempfile::TempDir,
    running: fleet_controller::server::Running,
    ctx: std::sync::Arc<Ctx>,
    url: String,
    admin: Admin,
}

async fn in_process() -> InProcess {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let ctx = running.ctx.clone().unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:admin"], 3600));
    InProcess { dk, dir, running, ctx, url, admin }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incremental_passes_match_a_full_recompute_through_a_fleet_history() {
    let InProcess { dk, dir, running, ctx, url, admin } = in_process().await;

    // Five nodes: two with gpu, one of another kind, one holding a secret.
    let specs = [
        ("n1", json!({"labels": ["gpu"], "executorKinds": ["k"], "capacity": {"slots": 2}, "secrets": []})),
        ("n2", json!({"labels": ["gpu"], "executorKinds": ["k"], "capacity": {"slots": 2}, "secrets": []})),
        ("n3", json!({"labels": [], "executorKinds": ["k"], "capacity": {"slots": 2}, "secrets": []})),
        ("n4", json!({"labels": [], "executorKinds": ["other"], "capacity": {"slots": 2}, "secrets": []})),
        ("n5", json!({"labels": [], "executorKinds": ["k"], "capacity": {"slots": 1}, "secrets": ["s1"]})),
    ];
    let mut nodes = Vec::new();
    for (name, announce) in specs {
        let mut n = TestNode::new(&url, name, announce);
        n.join(&admin.join_key().await).await;
        nodes.push(n);
    }
    let names: BTreeMap<String, String> = nodes.iter().map(|n| (n.id.clone(), n.name.clone())).collect();
    let mut reporters: Vec<Reporter> = nodes.iter().map(|n| Reporter::start(n.clone())).collect();
    audited(&ctx, "the joins").await;

    // Agents: 2 + 2 (gpu) + 1 + 3 replicas of kind k on 7 slots, so one replica waits.
    dk.put_agents(vec![
        agent("a1", "k", 2),
        with(agent("a2", "k", 2), |v| v["placement"]["requires"] = json!(["gpu"])),
        agent("a3", "other", 1),
        with(agent("a4", "k", 1), |v| v["placement"]["secrets"] = json!(["s1"])),
        agent("a5", "k", 3),
    ]);
    eventually(20, "a5 has one replica waiting for capacity", || async {
        let p = placed(&admin, &names).await;
        (p.get(&("a5".into(), "-".into(), "pending".into())) == Some(&1)).then_some(())
    })
    .await;
    audited(&ctx, "adding agents").await;
    eventually(20, "every PAT issued", || async {
        let st = ctx.store.read();
        let pairs: std::collections::HashSet<_> =
            st.outcome().bindings.iter().map(|(a, _, n)| (a.clone(), n.clone())).collect();
        let live = st.live_creds().count();
        (live == pairs.len() && live > 0).then_some(())
    })
    .await;
    audited(&ctx, "issuing PATs").await;

    // The nodes report what they were given as running: statuses reach the CP.
    report_desired(&nodes, &reporters, "running").await;
    eventually(20, "a1 running in the CP", || async {
        (status_phase(&dk, "a1").as_deref() == Some("running")).then_some(())
    })
    .await;
    audited(&ctx, "running reports").await;

    // A revision bump (no placement change) reaches a1's nodes with a new generation.
    let a1_node = nodes
        .iter()
        .find(|n| n.id == ctx.store.read().outcome().bindings.of_agent("a1").next().unwrap().1.to_string())
        .unwrap()
        .clone();
    let before = a1_node.generation().await;
    dk.edit_agent("a1", |a| a["revision"] = json!(2));
    eventually(20, "a1's node gets revision 2", || async {
        let (_, d) = a1_node.desired(None, 0).await;
        let rev = d["agents"].as_array()?.iter().find(|a| a["agentKey"] == "a1")?["revision"].as_u64()?;
        (rev == 2 && d["generation"].as_u64()? > before).then_some(())
    })
    .await;
    audited(&ctx, "a revision bump").await;

    // a2 now requires a label no node has: unplaced, its PATs retired; a5's waiting replica
    // takes a freed slot.
    dk.edit_agent("a2", |a| a["placement"]["requires"] = json!(["gpu", "zone=x"]));
    eventually(20, "a2 waits with no_label and a5 is whole", || async {
        let p = placed(&admin, &names).await;
        let a2 = p.get(&("a2".into(), "-".into(), "pending".into())) == Some(&2);
        let a5_waiting = p.keys().any(|(a, n, _)| a == "a5" && n == "-");
        (a2 && !a5_waiting).then_some(())
    })
    .await;
    audited(&ctx, "a requirement no node meets").await;

    // Stop a3, remove a4.
    dk.edit_agent("a3", |a| a["state"] = json!("stopped"));
    dk.remove_agent("a4");
    eventually(20, "a3 stopped and a4 gone", || async {
        let p = placed(&admin, &names).await;
        let a3 = p.contains_key(&("a3".into(), "-".into(), "stopped".into()));
        let a4 = p.keys().any(|(a, _, _)| a == "a4");
        (a3 && !a4).then_some(())
    })
    .await;
    audited(&ctx, "stopping and removing agents").await;

    // n3 now announces zone=x and gpu, and two more slots (its own are taken): a2 fits there.
    reporters[2].paused.store(true, Ordering::SeqCst);
    let mut n3 = nodes[2].clone();
    n3.announce["labels"] = json!(["gpu", "zone=x"]);
    n3.announce["capacity"] = json!({"slots": 4});
    reporters[2] = Reporter::start(n3.clone());
    nodes[2] = n3;
    eventually(20, "a2 placed on n3", || async {
        let p = placed(&admin, &names).await;
        p.keys().any(|(a, n, s)| a == "a2" && n == "n3" && s == "placed").then_some(())
    })
    .await;
    audited(&ctx, "a node's labels changing").await;

    // A replica crash-loops.
    report_desired(&nodes, &reporters, "running").await;
    let crash_node = nodes.iter().position(|n| n.name == "n1").unwrap();
    report_desired(&nodes[crash_node..crash_node + 1], &reporters[crash_node..crash_node + 1], "crashloop").await;
    let crashing: Vec<String> = reporters[crash_node].replicas.lock().iter().map(|r| r.0.clone()).collect();
    assert!(!crashing.is_empty(), "n1 runs something");
    eventually(20, "a crash-looping agent in the CP", || async {
        crashing.iter().any(|a| status_phase(&dk, a).as_deref() == Some("crash_looping")).then_some(())
    })
    .await;
    audited(&ctx, "a crash loop").await;

    // n1 goes silent: offline after 3 s, its replicas move or wait.
    report_desired(&nodes, &reporters, "running").await;
    reporters[crash_node].paused.store(true, Ordering::SeqCst);
    eventually(20, "nothing placed on n1", || async {
        let p = placed(&admin, &names).await;
        (!p.keys().any(|(_, n, s)| n == "n1" && s == "placed")).then_some(())
    })
    .await;
    audited(&ctx, "a node going offline").await;

    // n1 comes back.
    reporters[crash_node].paused.store(false, Ordering::SeqCst);
    eventually(20, "n1 online again", || async {
        let nodes = admin.nodes().await;
        nodes.iter().any(|n| n["name"] == "n1" && n["status"] == "online").then_some(())
    })
    .await;
    audited(&ctx, "a node coming back").await;

    // A restart on the same data and address: the first pass is a full one, and it must
    // schedule every PAT's rotation again (the work queue lives in memory).
    let addr = running.addr;
    let (n2_generation, _) = ctx.store.desired_body(&nodes[1].id.as_str().into()).unwrap();
    running.shutdown().await;
    // A pass stores its desired bodies a chunk of nodes at a time after its other rows; a
    // kill between two chunks leaves a node with its old body and that body's input hash.
    // Said here of n2: an empty body, and a hash its inputs do not have.
    let db =
        sqlx::SqlitePool::connect(&format!("sqlite://{}", dir.path().join("fleet.sqlite").display())).await.unwrap();
    let unwritten = sqlx::query("UPDATE desired SET agents = '[]', input_hash = 1 WHERE node_id = ?")
        .bind(&nodes[1].id)
        .execute(&db)
        .await
        .unwrap();
    assert_eq!(unwritten.rows_affected(), 1);
    db.close().await;
    let mut cfg = in_process_config(&dk, dir.path());
    cfg.listen = addr;
    let running = fleet_controller::server::start(cfg).await.unwrap();
    let ctx = running.ctx.clone().unwrap();
    eventually(20, "the restarted controller has its placements", || async {
        (!ctx.store.read().outcome().bindings.is_empty()).then_some(())
    })
    .await;
    audited(&ctx, "a restart").await;
    // The audit found n2's agents in its desired state; under a new generation, so n2 takes it.
    // (Asked of the registry: the test node's pooled connection may still reach the
    // controller shut down in this process.)
    let (rebuilt, _) = ctx.store.desired_body(&nodes[1].id.as_str().into()).unwrap();
    assert!(rebuilt > n2_generation, "n2's body is built again: generation {rebuilt}, was {n2_generation}");
    running.shutdown().await;
}

/// A desired body and the sealed boxes it carries are held in memory only until the body is
/// served: then the registry keeps the PAT's id alone, and a node that lost the answer, as
/// the node's next desired state, has the box read back from the database — the same
/// ciphertext, opened by the node's key to the same PAT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_body_and_its_pats_box_are_let_go_and_read_back_when_asked_again() {
    let InProcess { dk, dir: _dir, running, ctx, url, admin } = in_process().await;
    let mut node = TestNode::new(&url, "n1", json!({"executorKinds": ["k"], "capacity": {"slots": 4}}));
    node.join(&admin.join_key().await).await;
    let _reporter = Reporter::start(node.clone());
    let ciphertext_of = |d: &serde_json::Value, agent: &str| {
        let a = d["agents"].as_array()?.iter().find(|a| a["agentKey"] == agent)?;
        a["identity"]["credential"]["ciphertext"].as_str().map(str::to_string)
    };

    dk.put_agent(agent("a1", "k", 1));
    let first = eventually(20, "a1's PAT in n1's desired state", || async {
        let (_, d) = node.desired(None, 0).await;
        ciphertext_of(&d, "a1").map(|_| d)
    })
    .await;
    let pat = node.open_pat(&first, "a1").expect("n1's key opens a1's PAT");
    let pair: (fleet_controller::model::Id, fleet_controller::model::Id) = ("a1".into(), node.id.as_str().into());
    let has_box = || ctx.store.read().live_cred(&pair).map(|c| c.sealed.has_box());
    assert_eq!(has_box(), Some(false), "served: the database keeps the box");
    let generation = first["generation"].as_u64().unwrap();
    let node_id: fleet_controller::model::Id = node.id.as_str().into();
    assert_eq!(ctx.store.desired_body(&node_id), Some((generation, None)), "served: the body is let go too");

    // The answer was lost: the node asks as if it had nothing and is served the same
    // generation, read back.
    let (status, again) = node.desired(None, 0).await;
    assert_eq!(status, reqwest::StatusCode::OK);
    assert_eq!(again, first, "the stored body, as it was served");
    let (status, _) = node.desired(Some(generation), 0).await;
    assert_eq!(status, reqwest::StatusCode::NOT_MODIFIED);

    // A second agent changes n1's desired state: a1's box comes back from the database.
    let a2: (fleet_controller::model::Id, fleet_controller::model::Id) = ("a2".into(), node.id.as_str().into());
    let a2_has_box = || ctx.store.read().live_cred(&a2).map(|c| c.sealed.has_box());
    dk.put_agent(agent("a2", "k", 1));
    eventually(20, "a2's PAT issued and held for n1", || async { (a2_has_box() == Some(true)).then_some(()) }).await;
    let second = eventually(20, "a2's PAT beside a1's", || async {
        let (_, d) = node.desired(Some(generation), 0).await;
        ciphertext_of(&d, "a2").map(|_| d)
    })
    .await;
    assert_eq!(ciphertext_of(&second, "a1"), ciphertext_of(&first, "a1"), "the stored box, as it was served");
    assert_eq!(node.open_pat(&second, "a1"), Some(pat));
    assert!(node.open_pat(&second, "a2").is_some());
    assert_eq!(has_box(), Some(false));
    assert_eq!(a2_has_box(), Some(false), "a2's box goes once n1 was served it too");
    running.shutdown().await;
}
