//! Crash safety of the controller (hardening): `SIGKILL` during bursts of joins and reports,
//! 20 times over one data directory. Every join the controller acknowledged (201) is there
//! after the restart with a working token, no node name appears twice, no more nodes exist
//! than joins were attempted, and SQLite's integrity check passes at the end. And what a
//! killed controller or a failed pass had read but not acted on is acted on after it.

mod support;

use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;
use support::*;

/// A controller process's environment (its data under `dir`) with a failpoint directory of
/// its own: the environment, that directory and the log's path.
fn env_with_failpoints(
    dk: &fleet_devkit::Devkit,
    dir: &std::path::Path,
) -> (HashMap<String, String>, PathBuf, PathBuf) {
    let failpoints = dir.join("fp");
    std::fs::create_dir_all(&failpoints).unwrap();
    let mut env = env_for(dk, &dir.join("data"), free_port(), free_port());
    env.insert("FLEET_FAILPOINTS".into(), failpoints.display().to_string());
    (env, failpoints, dir.join("c.log"))
}

/// Two nodes of kind `k` that run `agent:*` images, joined, with `slots` each.
async fn join_two(url: &str, admin: &Admin, slots: u32) -> Vec<TestNode> {
    let announce = json!({"executorKinds": ["k"], "executorImages": {"k": ["agent:*"]}, "capacity": {"slots": slots}});
    let mut nodes = Vec::new();
    for i in 0..2 {
        let mut n = TestNode::new(url, &format!("n-{i}"), announce.clone());
        n.join(&admin.join_key().await).await;
        nodes.push(n);
    }
    nodes
}

/// The images the simulated nodes run, sorted.
fn images(sims: &[support::sim::SimNode]) -> Vec<String> {
    let mut v: Vec<String> = sims.iter().flat_map(support::sim::SimNode::images).collect();
    v.sort();
    v
}

/// Passes that failed at the `fail-pass` failpoint so far, by the controller's log.
fn failed_passes(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log).unwrap_or_default().matches("the fail-pass failpoint is set").count()
}

/// With every pass failing at the `fail-pass` failpoint, the CP changes `keys`' image to
/// `agent:2` (revision 2); returns once the watcher has read it and two more passes failed.
async fn change_image_while_passes_fail(
    dk: &fleet_devkit::Devkit,
    failpoints: &std::path::Path,
    log: &std::path::Path,
    keys: &[&str],
) {
    std::fs::write(failpoints.join("fail-pass"), "").unwrap();
    let listed = dk.calls("list_agents");
    for key in keys {
        dk.edit_agent(key, |a| {
            a["executor"]["image"] = json!("agent:2");
            a["revision"] = json!(2);
        });
    }
    eventually(10, "the watcher read the change", || async { (dk.calls("list_agents") > listed).then_some(()) }).await;
    // The pass the change kicked, and the ones that start over after it, fail.
    let seen = failed_passes(log);
    eventually(15, "two more failed passes", || async { (failed_passes(log) >= seen + 2).then_some(()) }).await;
}

async fn try_join(http: &reqwest::Client, n: &TestNode, key: &str) -> Option<(String, String)> {
    let r = http.post(format!("{}/api/v1/nodes:join", n.url)).json(&n.join_body(key)).send().await.ok()?;
    if r.status() != 201 {
        return None;
    }
    let v: serde_json::Value = r.json().await.ok()?;
    Some((v["nodeId"].as_str()?.to_string(), v["nodeToken"].as_str()?.to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_join_and_report_bursts_loses_no_join() {
    let dk = devkit().await;
    dk.put_agent(agent("coder", "claude-code", 3));
    let dir = tempfile::tempdir().unwrap();
    let env = env_for(&dk, dir.path(), free_port(), free_port());
    let log = dir.path().join("c.log");
    let mut ctl = ControllerProcess::spawn(env.clone(), log.clone()).await;
    let token = dk.mint("fleet", &["fleet:admin"], 3600);
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let announce = json!({"labels": [], "executorKinds": ["claude-code"], "capacity": {"slots": 2}, "secrets": []});
    let mut acknowledged: Vec<TestNode> = Vec::new();
    let mut attempted = 0;
    for round in 0..20u64 {
        let admin = Admin::new(&ctl.url, token.clone());
        let mut burst = Vec::new();
        for i in 0..6 {
            let key = admin.join_key().await;
            burst.push((TestNode::new(&ctl.url, &format!("r{round}-n{i}"), announce.clone()), key));
        }
        attempted += burst.len();
        // Joins and reports race the kill.
        let joins = burst.into_iter().map(|(mut n, key)| {
            let http = http.clone();
            tokio::spawn(async move {
                let got = try_join(&http, &n, &key).await;
                got.map(|(id, token)| {
                    n.id = id;
                    n.token = token;
                    n
                })
            })
        });
        let joins: Vec<_> = joins.collect();
        let reporters: Vec<_> = acknowledged
            .iter()
            .map(|n| {
                let n = TestNode { http: http.clone(), ..n.clone() };
                tokio::spawn(async move {
                    for _ in 0..5 {
                        let _ = n.report(&[]).await;
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(5 + (round * 23) % 60)).await;
        ctl.kill9();
        for j in joins {
            if let Some(n) = j.await.unwrap() {
                acknowledged.push(n);
            }
        }
        for r in reporters {
            let _ = r.await;
        }
        ctl = ControllerProcess::spawn(env.clone(), log.clone()).await;
        let admin = Admin::new(&ctl.url, token.clone());
        let nodes = admin.nodes().await;
        let mut names = HashSet::new();
        for n in &nodes {
            assert!(names.insert(n["name"].as_str().unwrap().to_string()), "round {round}: duplicate node {n}");
        }
        assert!(nodes.len() <= attempted, "round {round}: {} nodes from {attempted} joins", nodes.len());
        let ids: HashMap<&str, &serde_json::Value> = nodes.iter().map(|n| (n["id"].as_str().unwrap(), n)).collect();
        for n in &acknowledged {
            let stored =
                ids.get(n.id.as_str()).unwrap_or_else(|| panic!("round {round}: acknowledged join of {} lost", n.name));
            assert_eq!(stored["name"], n.name.as_str());
        }
    }
    // Every acknowledged node's token still works after 20 kills.
    let ctl_url = ctl.url.clone();
    for n in &acknowledged {
        let n = TestNode { url: ctl_url.clone(), ..n.clone() };
        assert_eq!(n.report(&[]).await, 204, "{} reports with its token", n.name);
    }
    eprintln!("acknowledged {} of {attempted} joins", acknowledged.len());
    assert!(acknowledged.len() >= 20, "the bursts got joins through: {}", acknowledged.len());
    assert!(acknowledged.len() < attempted, "the kills landed inside bursts: some joins went unanswered");
    ctl.kill9();
    let db =
        sqlx::SqlitePool::connect(&format!("sqlite://{}", dir.path().join("fleet.sqlite").display())).await.unwrap();
    let (check,): (String,) = sqlx::query_as("PRAGMA integrity_check").fetch_one(&db).await.unwrap();
    assert_eq!(check, "ok");
    let (count,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM nodes").fetch_one(&db).await.unwrap();
    let (distinct,): (i64,) = sqlx::query_as("SELECT COUNT(DISTINCT name) FROM nodes").fetch_one(&db).await.unwrap();
    assert_eq!(count, distinct, "no duplicate node rows");
    assert!(count as usize >= acknowledged.len());
}

/// A template change the controller read from the CP but had not yet acted on when it was
/// killed is acted on after the restart: the agent list (and its ETag) is stored only once a
/// pass has committed what it made of it, so the restarted controller sees the change again
/// and rolls it out. (Stored before, the list hid the change behind its ETag and the replicas
/// kept the old image for good — found by the fault suite.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_change_read_but_not_acted_on_before_a_kill_is_rolled_out_after_it() {
    use support::sim::SimNode;
    let dk = devkit().await;
    dk.put_agent(with(agent("coder", "k", 1), |a| a["executor"]["image"] = json!("agent:1")));
    let dir = tempfile::tempdir().unwrap();
    let (env, failpoints, log) = env_with_failpoints(&dk, dir.path());
    let mut ctl = ControllerProcess::spawn(env.clone(), log.clone()).await;
    let admin = Admin::new(&ctl.url, dk.mint("fleet", &["fleet:admin"], 3600));
    let announce = json!({"executorKinds": ["k"], "executorImages": {"k": ["agent:*"]}, "capacity": {"slots": 1}});
    let mut n = TestNode::new(&ctl.url, "n-0", announce);
    n.join(&admin.join_key().await).await;
    let sim = SimNode::start(n.clone(), Default::default());
    let images = |sim: &SimNode| sim.images();
    eventually(30, "agent:1 running", || async { (images(&sim) == ["agent:1"]).then_some(()) }).await;
    // A first rollout, to its end: the agent has a rollout on record, whose target its
    // replicas run.
    dk.edit_agent("coder", |a| {
        a["executor"]["image"] = json!("agent:2");
        a["revision"] = json!(2);
    });
    eventually(30, "agent:2 running", || async { (images(&sim) == ["agent:2"]).then_some(()) }).await;

    // Passes stop; the CP changes the image again; the watcher reads it and kicks a pass that
    // never comes. Then the controller dies.
    std::fs::write(failpoints.join("stall-pass"), "").unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listed = dk.calls("list_agents");
    dk.edit_agent("coder", |a| {
        a["executor"]["image"] = json!("agent:3");
        a["revision"] = json!(3);
    });
    eventually(10, "the watcher read the change", || async { (dk.calls("list_agents") > listed).then_some(()) }).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    ctl.kill9();
    drop(sim);
    std::fs::remove_file(failpoints.join("stall-pass")).unwrap();

    let ctl = ControllerProcess::spawn(env, log).await;
    let sim = SimNode::start(TestNode { url: ctl.url.clone(), ..n }, Default::default());
    eventually(30, "agent:3 running after the restart", || async { (images(&sim) == ["agent:3"]).then_some(()) }).await;
}

/// A template change whose pass failed is still a change to the pass after it: the failed
/// pass read the new list and dropped the one it replaced, keeping only what the changed
/// agents were, and the next pass (which starts over) starts the rollout from that — one
/// replica at a time, from the old image — instead of handing every node the new one at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_change_whose_pass_failed_is_rolled_out_by_the_next_pass() {
    use support::sim::SimNode;
    let dk = devkit().await;
    dk.put_agent(with(agent("coder", "k", 2), |a| {
        a["executor"]["image"] = json!("agent:1");
        a["placement"]["rollout"] = json!({"maxUnavailable": 1, "minReadySeconds": 1});
    }));
    let dir = tempfile::tempdir().unwrap();
    let (env, failpoints, log) = env_with_failpoints(&dk, dir.path());
    let ctl = ControllerProcess::spawn(env, log.clone()).await;
    let admin = Admin::new(&ctl.url, dk.mint("fleet", &["fleet:admin"], 3600));
    let sims: Vec<SimNode> =
        join_two(&ctl.url, &admin, 1).await.into_iter().map(|n| SimNode::start(n, Default::default())).collect();
    eventually(30, "agent:1 on both nodes", || async { (images(&sims) == ["agent:1"; 2]).then_some(()) }).await;

    change_image_while_passes_fail(&dk, &failpoints, &log, &["coder"]).await;
    assert_eq!(images(&sims), ["agent:1"; 2], "a failed pass hands no node anything");
    std::fs::remove_file(failpoints.join("fail-pass")).unwrap();

    let rollout = || async {
        let (s, v) = admin.get("/api/v1/agents/coder/rollout").await;
        assert_eq!(s, 200, "{v}");
        v
    };
    let v = eventually(30, "the rollout of agent:2 complete", || async {
        let v = rollout().await;
        (v["state"] == "complete" && v["target"]["image"] == "agent:2").then_some(v)
    })
    .await;
    assert_eq!(v["previous"]["image"], "agent:1", "the rollout started from the old template: {v}");
    assert_eq!(images(&sims), ["agent:2"; 2]);
    let (s, events) = admin.get("/api/v1/events?agent=coder").await;
    assert_eq!(s, 200, "{events}");
    let steps = events["items"].as_array().unwrap().iter().filter(|e| e["kind"] == "rollout_step").count();
    assert_eq!(steps, 2, "one step a node: {events}");
}

/// The list the CP replaced is let go as the pass that reads the new one starts, not when a
/// pass commits: with every pass failing, nothing keeps the old list (~9 MB at 20,000
/// agents) beside the new one, and once passes succeed again the change is placed. The only
/// in-process controller of this file, so the process's failpoint directory is its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_agent_list_is_let_go_while_passes_fail() {
    let dir = tempfile::tempdir().unwrap();
    let failpoints = dir.path().join("fp");
    std::fs::create_dir_all(&failpoints).unwrap();
    std::env::set_var("FLEET_FAILPOINTS", &failpoints);
    let dk = devkit().await;
    dk.put_agents(vec![agent("a1", "k", 1), agent("a2", "k", 1)]);
    let running = fleet_controller::server::start(in_process_config(&dk, &dir.path().join("data"))).await.unwrap();
    let ctx = running.ctx.clone().unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:read", "fleet:admin"], 3600));
    admin.join_one_node_until_placed(&url, 2).await;

    std::fs::write(failpoints.join("fail-pass"), "").unwrap();
    let old = std::sync::Arc::downgrade(ctx.store.read().agents());
    let failed = ctx.metrics.pass_errors.get();
    dk.edit_agent("a1", |a| a["revision"] = json!(2));
    let replaced = || old.upgrade().is_none_or(|l| !std::sync::Arc::ptr_eq(&l, ctx.store.read().agents()));
    eventually(15, "the new list read", || async { replaced().then_some(()) }).await;
    eventually(15, "two more failed passes", || async { (ctx.metrics.pass_errors.get() >= failed + 2).then_some(()) })
        .await;
    eventually(10, "the old list let go while no pass commits", || async { old.upgrade().is_none().then_some(()) })
        .await;
    let p = admin.placements().await;
    assert!(p.iter().all(|i| i["revision"] == 1), "nothing committed the edit yet: {p:?}");

    std::fs::remove_file(failpoints.join("fail-pass")).unwrap();
    eventually(15, "the edit placed at revision 2", || async {
        let p = admin.placements().await;
        p.iter().any(|i| i["agentKey"] == "a1" && i["revision"] == 2).then_some(())
    })
    .await;
    running.shutdown().await;
}

/// A pass stores the rollouts it changed as its rollout phase goes (`FLEET_ROLLOUTS_AT_ONCE`
/// at a time), before it builds any desired state. One that fails after that leaves them
/// stored and shown, and hands no node anything; after a `kill -9` the controller goes on
/// from them — the same rollouts, not new ones — one replica of each agent at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollouts_stored_by_a_pass_that_then_failed_go_on_after_a_kill() {
    use support::sim::SimNode;
    let dk = devkit().await;
    let agents = ["a-0", "a-1", "a-2"];
    for key in agents {
        dk.put_agent(with(agent(key, "k", 2), |a| {
            a["executor"]["image"] = json!("agent:1");
            a["placement"]["rollout"] = json!({"maxUnavailable": 1, "minReadySeconds": 1});
        }));
    }
    let dir = tempfile::tempdir().unwrap();
    let (mut env, failpoints, log) = env_with_failpoints(&dk, dir.path());
    env.insert("FLEET_ROLLOUTS_AT_ONCE".into(), "2".into());
    let mut ctl = ControllerProcess::spawn(env.clone(), log.clone()).await;
    let admin = Admin::new(&ctl.url, dk.mint("fleet", &["fleet:admin"], 3600));
    let nodes = join_two(&ctl.url, &admin, 3).await;
    let sims: Vec<SimNode> = nodes.iter().map(|n| SimNode::start(n.clone(), Default::default())).collect();
    eventually(30, "agent:1 everywhere", || async { (images(&sims) == ["agent:1"; 6]).then_some(()) }).await;

    change_image_while_passes_fail(&dk, &failpoints, &log, &agents).await;
    assert_eq!(images(&sims), ["agent:1"; 6], "a failed pass hands no node anything");
    let mut started = Vec::new();
    for key in agents {
        let (s, v) = admin.get(&format!("/api/v1/agents/{key}/rollout")).await;
        assert_eq!(s, 200, "{v}");
        // The rollout's own record, not the view of a template no pass has taken yet.
        assert_eq!(v["state"], "progressing", "{v}");
        assert_eq!(v["previous"]["image"], "agent:1", "stored and shown before the pass failed: {v}");
        assert!(v["message"].is_null(), "{v}");
        assert_eq!(v["target"]["image"], "agent:2", "{v}");
        started.push(v["startedAt"].clone());
    }
    // The nodes keep running what they run while the controller is down, and come back to
    // it on the same address.
    ctl.kill9();
    std::fs::remove_file(failpoints.join("fail-pass")).unwrap();
    let ctl = ControllerProcess::spawn(env, log).await;
    let admin = Admin::new(&ctl.url, dk.mint("fleet", &["fleet:admin"], 3600));
    assert_eq!(ctl.url, nodes[0].url);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        // The budget: one replica of each agent down at a time — or the agent's replicas on
        // one node, which the step rule takes alone when they are more.
        for key in agents {
            let on_node = |s: &SimNode, down: bool| {
                s.running.lock().iter().filter(|((a, _), v)| a == key && (!down || v.2 != "running")).count()
            };
            let down: usize = sims.iter().map(|s| on_node(s, true)).sum();
            let budget = sims.iter().map(|s| on_node(s, false)).max().unwrap_or(0).max(1);
            assert!(down <= budget, "{down} replicas of {key} down at once (budget {budget})");
        }
        if images(&sims) == ["agent:2"; 6] && sims.iter().all(|s| s.down() == 0) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not every replica runs agent:2: {:?}", images(&sims));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (key, started) in agents.iter().zip(started) {
        let v = eventually(30, "the rollout complete", || async {
            let (s, v) = admin.get(&format!("/api/v1/agents/{key}/rollout")).await;
            (s == 200 && v["state"] == "complete").then_some(v)
        })
        .await;
        assert_eq!(v["startedAt"], started, "the rollout stored before the kill went on: {v}");
        assert_eq!(v["previous"]["image"], "agent:1", "{v}");
    }
}
