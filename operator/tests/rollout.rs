//! Progressive delivery through the API (docs/behaviour.md#rolling-out-a-change), with nodes
//! that follow the node protocol as fleet-node does: each applies its desired state, takes a
//! moment to start a container of a new template, reports it running with the template's
//! `specId` — or crash-looping, for an image the test calls bad. The Docker end-to-end suite
//! (`e2e/tests/rollout.rs`) runs the same rollouts on real containers.

mod support;

use fleet_controller::server::Running as Server;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use support::sim::SimNode;
use support::*;

struct Fleet {
    admin: Admin,
    nodes: Vec<SimNode>,
    joined: Vec<TestNode>,
    bad: Arc<Mutex<HashSet<String>>>,
}

impl Fleet {
    /// Joins one more node, of `slots` slots, crash-looping the images in `bad`.
    async fn join(&mut self, url: &str, name: &str, slots: u32, bad: Arc<Mutex<HashSet<String>>>) {
        self.join_starting_in(url, name, slots, bad, support::sim::START).await;
    }

    /// As [`Fleet::join`], the node's containers taking `start` to come up.
    async fn join_starting_in(
        &mut self,
        url: &str,
        name: &str,
        slots: u32,
        bad: Arc<Mutex<HashSet<String>>>,
        start: Duration,
    ) {
        let announce =
            json!({"executorKinds": ["k"], "executorImages": {"k": ["agent:*"]}, "capacity": {"slots": slots}});
        let mut n = TestNode::new(url, name, announce);
        n.join(&self.admin.join_key().await).await;
        self.joined.push(n.clone());
        self.nodes.push(SimNode::start_with(n, bad, support::sim::PERIOD, start));
    }

    /// Stops the nodes and the controller, starts the controller again on the same store, and
    /// the nodes against it with the containers they had.
    async fn restart(self, running: Server, cfg: &fleet_controller::config::Config) -> (Fleet, Server) {
        for n in &self.nodes {
            n.task.abort();
        }
        running.shutdown().await;
        let mut cfg2 = cfg.clone();
        cfg2.listen = "127.0.0.1:0".parse().unwrap();
        let running = fleet_controller::server::start(cfg2).await.unwrap();
        let url = format!("http://{}", running.addr);
        let nodes: Vec<SimNode> = self
            .joined
            .iter()
            .zip(&self.nodes)
            .map(|(n, sim)| {
                let again = SimNode::start(TestNode { url: url.clone(), ..n.clone() }, sim.bad.clone());
                let mut had = sim.running.lock().clone();
                // A container the node was starting when it stopped is started again.
                for v in had.values_mut().filter(|v| v.2 == "starting") {
                    v.0.clear();
                }
                *again.running.lock() = had;
                again
            })
            .collect();
        let admin = Admin::new(&url, self.admin.token.clone());
        (Fleet { admin, nodes, joined: self.joined.clone(), bad: self.bad.clone() }, running)
    }

    fn down(&self) -> usize {
        self.nodes.iter().map(SimNode::down).sum()
    }

    fn images(&self) -> Vec<String> {
        let mut v: Vec<String> = self.nodes.iter().flat_map(SimNode::images).collect();
        v.sort();
        v
    }

    async fn rollout(&self, agent: &str) -> Value {
        let (s, v) = self.admin.get(&format!("/api/v1/agents/{agent}/rollout")).await;
        assert_eq!(s, 200, "{v}");
        v
    }

    /// Samples the nodes every 50 ms until `done` says so, returning the most replicas seen
    /// down at once.
    async fn watch_until(&self, secs: u64, what: &str, mut done: impl FnMut(&Value) -> bool, agent: &str) -> usize {
        let until = std::time::Instant::now() + Duration::from_secs(secs);
        let mut worst = 0;
        loop {
            worst = worst.max(self.down());
            let v = self.rollout(agent).await;
            if done(&v) {
                return worst;
            }
            assert!(std::time::Instant::now() < until, "timed out waiting for {what}: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Four nodes, one agent of four replicas (one per node), its policy as given.
async fn fleet(dk: &fleet_devkit::Devkit, url: &str, policy: Value) -> Fleet {
    let admin = Admin::new(url, dk.mint("fleet", &["fleet:admin"], 3600));
    let mut f = Fleet { admin, nodes: Vec::new(), joined: Vec::new(), bad: Default::default() };
    for i in 0..4 {
        let bad = f.bad.clone();
        f.join(url, &format!("n-{i}"), 1, bad).await;
    }
    let a = with(agent("coder", "k", 4), |a| {
        a["executor"]["image"] = json!("agent:1");
        a["placement"]["rollout"] = policy;
    });
    dk.put_agent(a);
    eventually(30, "four replicas running agent:1", || async {
        (f.images() == vec!["agent:1"; 4] && f.down() == 0).then_some(())
    })
    .await;
    f
}

/// `coder`, as many replicas of `agent:1` as n-0 (the one node) has slots, its policy as
/// given, every replica running.
async fn one_node_fleet(dk: &fleet_devkit::Devkit, url: &str, replicas: usize, policy: Value) -> Fleet {
    let admin = Admin::new(url, dk.mint("fleet", &["fleet:admin"], 3600));
    let mut f = Fleet { admin, nodes: Vec::new(), joined: Vec::new(), bad: Default::default() };
    let bad = f.bad.clone();
    f.join(url, "n-0", replicas as u32, bad).await;
    dk.put_agent(with(agent("coder", "k", replicas as u32), |a| {
        a["executor"]["image"] = json!("agent:1");
        a["placement"]["rollout"] = policy;
    }));
    eventually(30, "every replica running agent:1", || async {
        (f.images() == vec!["agent:1"; replicas] && f.down() == 0).then_some(())
    })
    .await;
    f
}

/// An hour from now, as a busy lease says it.
fn an_hour() -> String {
    fleet_controller::clock::rfc3339_ms(fleet_controller::clock::now_ms() + 3_600_000)
}

/// Replica `replica` of `coder` on n-0 says it is busy for an hour, and the view shows it.
async fn busy_for_an_hour(f: &Fleet, replica: u32) {
    f.nodes[0].busy.lock().insert(("coder".into(), replica), an_hour());
    eventually(10, "the busy lease seen", || async {
        let (_, v) = f.admin.get("/api/v1/agents/coder/placement").await;
        v["replicas"][replica as usize]["busyUntil"].as_str().map(|_| ())
    })
    .await;
}

/// The agent's rollout events, once the history has `last` (events are written each second).
async fn kinds_until(admin: &Admin, last: &str) -> Vec<String> {
    eventually(10, &format!("a {last} event"), || async {
        let k = kinds(admin).await;
        k.iter().any(|k| k == last).then_some(k)
    })
    .await
}

async fn kinds(admin: &Admin) -> Vec<String> {
    let (s, v) = admin.get("/api/v1/events?agent=coder").await;
    assert_eq!(s, 200, "{v}");
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .filter(|k| k.starts_with("rollout_"))
        .collect()
}

/// Show 1 on the node protocol: a new image reaches the four replicas one at a time, never
/// more than one down, and the rollout completes with its events in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_image_reaches_replicas_one_budget_at_a_time() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let f = fleet(&dk, &url, json!({"maxUnavailable": 1, "minReadySeconds": 1})).await;
    let v = f.rollout("coder").await;
    assert_eq!(v["state"], "complete", "{v}");
    assert_eq!(v["previous"], Value::Null, "{v}");

    dk.edit_agent("coder", |a| {
        a["executor"]["image"] = json!("agent:2");
        a["revision"] = json!(2);
    });
    let worst = f
        .watch_until(
            60,
            "the rollout to complete",
            |v| v["state"] == "complete" && v["target"]["image"] == "agent:2",
            "coder",
        )
        .await;
    assert!(worst <= 1, "{worst} replicas were down at once with maxUnavailable 1");
    assert_eq!(f.images(), vec!["agent:2"; 4]);
    let v = f.rollout("coder").await;
    assert_eq!((v["updatedReplicas"].as_u64(), v["readyReplicas"].as_u64()), (Some(4), Some(4)), "{v}");
    assert_eq!(v["previous"]["image"], "agent:1", "{v}");
    assert_eq!(v["budget"], 1);
    let k = kinds_until(&f.admin, "rollout_completed").await;
    let steps = k.iter().filter(|k| *k == "rollout_step").count();
    assert_eq!(k.first().map(String::as_str), Some("rollout_started"), "{k:?}");
    assert_eq!(k.last().map(String::as_str), Some("rollout_completed"), "{k:?}");
    assert_eq!(steps, 4, "one step a node: {k:?}");
    let (s, list) = f.admin.get("/api/v1/rollouts").await;
    assert_eq!((s.as_u16(), list["items"].as_array().map(Vec::len)), (200, Some(0)), "{list}");
    drop(f);
    running.shutdown().await;
}

/// docs/behaviour.md#rolling-out-a-change, change then watch: a view taken right after a
/// change in the CP may still show the previous rollout, and says so — its `cpReadAt` is
/// not after its `asOf`; the first view that reflects a later read has the change as its
/// target. And the pass that ends a rollout writes its event: a reader who sees the view say
/// `complete` (or `halted`) finds `rollout_completed` (`rollout_halted`) at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_says_which_cp_read_it_reflects_and_an_ended_rollout_has_its_event() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let f = fleet(&dk, &url, json!({"maxUnavailable": 1, "minReadySeconds": 1})).await;
    dk.edit_agent("coder", |a| {
        a["executor"]["image"] = json!("agent:2");
        a["revision"] = json!(2);
    });
    let first = f.rollout("coder").await;
    let as_of = instant(&first["asOf"]);
    let reflecting = eventually(10, "a view reflecting a CP read after the change", || async {
        let v = f.rollout("coder").await;
        (v["cpReadAt"].is_string() && instant(&v["cpReadAt"]) > as_of).then_some(v)
    })
    .await;
    assert_eq!(reflecting["target"]["image"], "agent:2", "{reflecting}");
    assert_eq!(reflecting["target"]["revision"], 2, "{reflecting}");

    let ended = |state: &'static str| move |v: &Value| v["state"] == state;
    f.watch_until(60, "the rollout to complete", ended("complete"), "coder").await;
    let k = kinds(&f.admin).await;
    assert_eq!(k.last().map(String::as_str), Some("rollout_completed"), "in the history at once: {k:?}");

    f.bad.lock().insert("agent:bad".into());
    dk.edit_agent("coder", |a| a["executor"]["image"] = json!("agent:bad"));
    f.watch_until(60, "the rollout to halt", ended("halted"), "coder").await;
    let k = kinds(&f.admin).await;
    assert_eq!(k.last().map(String::as_str), Some("rollout_halted"), "in the history at once: {k:?}");
    drop(f);
    running.shutdown().await;
}

/// A controller that has not read the CP yet (here: the CP is down) shows the last read its
/// store has, the one the controller before it noted, and moves on once it reads the CP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_shows_the_stored_cp_read_until_its_own() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = in_process_config(&dk, dir.path());
    let running = fleet_controller::server::start(cfg.clone()).await.unwrap();
    dk.put_agent(with(agent("coder", "k", 1), |a| a["executor"]["image"] = json!("agent:1")));
    let admin = Admin::new(&format!("http://{}", running.addr), dk.mint("fleet", &["fleet:admin"], 3600));
    let view = || async {
        let (s, v) = admin.get("/api/v1/agents/coder/rollout").await;
        (s == 200).then_some(v)
    };
    eventually(10, "a CP read with coder in it", || async { view().await.filter(|v| v["cpReadAt"].is_string()) }).await;
    running.shutdown().await;

    dk.set_faults(fleet_devkit::Faults { cp_down: true, ..Default::default() });
    let running = fleet_controller::server::start(cfg).await.unwrap();
    let admin = Admin::new(&format!("http://{}", running.addr), admin.token.clone());
    let view = || async {
        let (s, v) = admin.get("/api/v1/agents/coder/rollout").await;
        assert_eq!(s, 200, "{v}");
        v
    };
    let stored = view().await;
    assert!(stored["cpReadAt"].is_string(), "the stored read: {stored}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(view().await["cpReadAt"], stored["cpReadAt"], "no read of its own while the CP is down");

    dk.set_faults(fleet_devkit::Faults::default());
    let as_of = instant(&view().await["asOf"]);
    eventually(10, "a read of its own", || async { (instant(&view().await["cpReadAt"]) > as_of).then_some(()) }).await;
    running.shutdown().await;
}

/// An instant of the rollout view (RFC 3339 with milliseconds), in ms.
fn instant(v: &Value) -> i64 {
    let s = v.as_str().unwrap_or_else(|| panic!("an instant: {v}"));
    fleet_controller::clock::parse_rfc3339_ms(s).unwrap_or_else(|| panic!("RFC 3339: {s}"))
}

/// The budget holds per replica: two replicas of an agent on one node, `maxUnavailable: 1`,
/// step one at a time (the node is sent one entry a template), never both down at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_one_node_step_one_at_a_time() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let f = one_node_fleet(&dk, &url, 2, json!({"maxUnavailable": 1, "minReadySeconds": 1})).await;
    dk.edit_agent("coder", |a| a["executor"]["image"] = json!("agent:2"));
    let mut split_seen = false;
    let worst = f
        .watch_until(
            60,
            "the rollout to complete",
            |v| {
                split_seen |= v["updatedReplicas"] == 1;
                v["state"] == "complete" && v["target"]["image"] == "agent:2"
            },
            "coder",
        )
        .await;
    assert!(worst <= 1, "{worst} replicas of one node were down at once with maxUnavailable 1");
    assert!(split_seen, "one replica was updated before the other");
    assert_eq!(f.images(), vec!["agent:2"; 2]);
    let k = kinds_until(&f.admin, "rollout_completed").await;
    assert_eq!(k.iter().filter(|k| *k == "rollout_step").count(), 2, "one step a replica: {k:?}");
    drop(f);
    running.shutdown().await;
}

/// A pass in which a rollout's counts move but no node's step or readiness does publishes the
/// new counts with the node list the record had, not a copy of it: a pass looks at every
/// rollout under way, and a copy each time is what the allocator churned on at full scale
/// (docs/performance.md#bodies-let-go-once-served-the-ninth-run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_that_move_alone_keep_the_rollouts_node_list() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let ctx = running.ctx.clone().unwrap();
    let url = format!("http://{}", running.addr);
    let f = fleet(&dk, &url, json!({"maxUnavailable": 1, "minReadySeconds": 1})).await;
    let (s, v) = f.admin.post("/api/v1/agents/coder/rollout:pause", json!({})).await;
    assert_eq!(s, 200, "{v}");
    dk.edit_agent("coder", |a| a["executor"]["image"] = json!("agent:2"));
    let key: fleet_controller::model::Id = "coder".into();
    let record = || ctx.store.read().rollout(&key).cloned();
    let before = eventually(20, "a paused rollout, every replica ready on agent:1", || async {
        let v = f.rollout("coder").await;
        let r = record()?;
        (v["state"] == "paused" && r.counts.ready == 4 && r.nodes.len() == 4).then_some(r)
    })
    .await;

    // One replica on the old template stops running: the ready count moves, no step does.
    if let Some(e) = f.nodes[0].running.lock().values_mut().next() {
        e.2 = "crashloop".into();
    }
    let after =
        eventually(20, "the ready count down by one", || async { record().filter(|r| r.counts.ready == 3) }).await;
    assert!(!Arc::ptr_eq(&before, &after), "the new counts are a new record");
    assert_eq!(before.nodes, after.nodes);
    assert_eq!(before.nodes.as_ptr(), after.nodes.as_ptr(), "and it shares the node list it had");
    assert_eq!(f.images(), vec!["agent:1"; 4], "paused: no step");
    drop(f);
    running.shutdown().await;
}

/// Show 2 on the node protocol: an image that crash-loops halts the rollout at its first
/// replica; undo brings that one back; with `onFailure: revert` the same happens by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_image_halts_at_the_first_replica_and_undo_or_revert_brings_it_back() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let f = fleet(&dk, &url, json!({"maxUnavailable": 1, "minReadySeconds": 1})).await;
    f.bad.lock().insert("agent:bad".into());
    dk.edit_agent("coder", |a| a["executor"]["image"] = json!("agent:bad"));
    f.watch_until(60, "the rollout to halt", |v| v["state"] == "halted", "coder").await;
    let v = f.rollout("coder").await;
    assert_eq!(v["failed"][0]["node"], "n-0", "{v}");
    assert!(v["failed"][0]["reason"].as_str().unwrap().starts_with("crashloop"), "{v}");
    assert_eq!(v["updatedReplicas"], 1, "{v}");
    let mut images = f.images();
    images.dedup();
    assert_eq!(f.images(), vec!["agent:1", "agent:1", "agent:1", "agent:bad"]);
    let (s, list) = f.admin.get("/api/v1/rollouts").await;
    assert_eq!((s.as_u16(), list["items"][0]["state"].as_str()), (200, Some("halted")), "{list}");
    let m = reqwest::get(format!("http://{}/metrics", running.metrics_addr)).await.unwrap().text().await.unwrap();
    assert!(m.contains("fleet_rollouts{state=\"halted\"} 1"), "{m}");
    assert!(m.contains("fleet_rollout_replicas_updated_total 1"), "{m}");

    let (s, v) = f.admin.post("/api/v1/agents/coder/rollout:undo", json!({})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["target"]["image"], "agent:1", "{v}");
    f.watch_until(60, "the undo to complete", |v| v["state"] == "complete", "coder").await;
    assert_eq!(f.images(), vec!["agent:1"; 4]);
    kinds_until(&f.admin, "rollout_halted").await;

    // The same with onFailure: revert, and no command (another bad image: the CP must send
    // another template for the undone target to give way).
    f.bad.lock().insert("agent:bad2".into());
    dk.edit_agent("coder", |a| {
        a["placement"]["rollout"]["onFailure"] = json!("revert");
        a["executor"]["image"] = json!("agent:bad2");
        a["revision"] = json!(7);
    });
    f.watch_until(60, "the rollout to revert", |v| v["state"] == "reverted", "coder").await;
    eventually(30, "the failed replica back on agent:1", || async {
        (f.images() == vec!["agent:1"; 4] && f.down() == 0).then_some(())
    })
    .await;
    kinds_until(&f.admin, "rollout_reverted").await;
    drop(f);
    running.shutdown().await;
}

/// Pause holds the steps taken; resume goes on; restart recreates every replica in steps;
/// undo without a previous template is `409 no_previous_template`; an invalid policy field
/// falls back with `policyError`; an unknown agent is `404`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_restart_and_the_orders_errors() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let f = fleet(&dk, &url, json!({"maxUnavailable": 1, "minReadySeconds": 1, "canary": -2})).await;
    let (s, v) = f.admin.post("/api/v1/agents/coder/rollout:undo", json!({})).await;
    assert_eq!((s.as_u16(), v["error"].as_str()), (409, Some("no_previous_template")), "{v}");
    let (s, v) = f.admin.post("/api/v1/agents/nobody/rollout:pause", json!({})).await;
    assert_eq!(s, 404, "{v}");
    let (s, v) = f.admin.post("/api/v1/agents/coder/rollout:explode", json!({})).await;
    assert_eq!(s, 404, "{v}");

    let (s, v) = f.admin.post("/api/v1/agents/coder/rollout:pause", json!({})).await;
    assert_eq!((s.as_u16(), v["state"].as_str()), (200, Some("complete")), "{v}");
    dk.edit_agent("coder", |a| a["executor"]["image"] = json!("agent:3"));
    let v = eventually(20, "a paused rollout", || async {
        let v = f.rollout("coder").await;
        (v["state"] == "paused" && v["target"]["image"] == "agent:3").then_some(v)
    })
    .await;
    assert!(v["policyError"].as_str().unwrap().contains("placement.rollout.canary"), "{v}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(f.images(), vec!["agent:1"; 4], "paused: no step");
    let (s, v) = f.admin.post("/api/v1/agents/coder/rollout:resume", json!({})).await;
    assert_eq!((s.as_u16(), v["state"].as_str()), (200, Some("progressing")), "{v}");
    let worst = f.watch_until(60, "the resumed rollout", |v| v["state"] == "complete", "coder").await;
    assert!(worst <= 1, "{worst}");
    assert_eq!(f.images(), vec!["agent:3"; 4]);

    let before = f
        .nodes
        .iter()
        .flat_map(|n| n.running.lock().values().map(|v| v.0.clone()).collect::<Vec<_>>())
        .collect::<Vec<_>>();
    let (s, v) = f.admin.post("/api/v1/agents/coder/rollout:restart", json!({})).await;
    assert_eq!((s.as_u16(), v["state"].as_str()), (200, Some("progressing")), "{v}");
    let worst = f.watch_until(60, "the restart", |v| v["state"] == "complete", "coder").await;
    assert!(worst <= 1, "{worst}");
    let after = f
        .nodes
        .iter()
        .flat_map(|n| n.running.lock().values().map(|v| v.0.clone()).collect::<Vec<_>>())
        .collect::<Vec<_>>();
    assert!(before.iter().zip(&after).all(|(b, a)| a != b), "every replica has a new template: {before:?} {after:?}");
    assert_eq!(f.images(), vec!["agent:3"; 4], "nothing else changed");
    let k = kinds_until(&f.admin, "rollout_completed").await;
    for kind in ["rollout_paused", "rollout_resumed", "rollout_started", "rollout_completed"] {
        assert!(k.contains(&kind.to_string()), "{kind} in {k:?}");
    }
    drop(f);
    running.shutdown().await;
}

/// Show 6 (SQLite): a rollout in progress survives a restart of the controller: it resumes
/// where it stood, and no replica is updated twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_in_progress_survives_a_restart() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = in_process_config(&dk, dir.path());
    let running = fleet_controller::server::start(cfg.clone()).await.unwrap();
    let url = format!("http://{}", running.addr);
    let f = fleet(&dk, &url, json!({"maxUnavailable": 1, "minReadySeconds": 3})).await;
    dk.edit_agent("coder", |a| a["executor"]["image"] = json!("agent:2"));
    let two = |v: &Value| v["target"]["image"] == "agent:2" && v["updatedReplicas"].as_u64() >= Some(2);
    f.watch_until(30, "two replicas updated", two, "coder").await;
    kinds_until(&f.admin, "rollout_step").await;
    let (f, running) = f.restart(running, &cfg).await;
    let (s, v) = f.admin.get("/api/v1/agents/coder/rollout").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!((v["state"].as_str(), v["target"]["image"].as_str()), (Some("progressing"), Some("agent:2")), "{v}");
    assert!(v["updatedReplicas"].as_u64() >= Some(2), "the steps taken stand: {v}");
    // The nodes came back (their containers still run) and the rollout goes on to the end.
    f.watch_until(60, "the rollout to complete after the restart", |v| v["state"] == "complete", "coder").await;
    assert_eq!(f.images(), vec!["agent:2"; 4]);
    kinds_until(&f.admin, "rollout_completed").await;
    let (s, v) = f.admin.get("/api/v1/events?agent=coder").await;
    assert_eq!(s, 200);
    let mut stepped: Vec<&str> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "rollout_step")
        .map(|e| e["node"].as_str().unwrap())
        .collect();
    stepped.sort();
    assert_eq!(stepped, vec!["n-0", "n-1", "n-2", "n-3"], "each node stepped once, across the restart");
    drop(f);
    running.shutdown().await;
}

/// Show 4 on the node protocol: two nodes drained at once with `maxUnavailable: 1` → the
/// replicas move one at a time (the one waiting is listed as blocked with `reason: budget`),
/// and each keeps running on its draining node until its new node runs it: the agent never
/// has fewer than its four replicas running. (The old container's stop with the agent's
/// `drainSeconds` is the node's: `plan::tests::the_drain_labels_the_container…`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_moves_replicas_within_the_budget_make_before_break() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let mut f = fleet(&dk, &url, json!({"maxUnavailable": 1})).await;
    // Room to move to: two empty nodes, slow to start a container, so that the replica the
    // budget holds waits there seconds (the checks below sample every 50 ms).
    for i in 4..6 {
        let bad = f.bad.clone();
        f.join_starting_in(&url, &format!("n-{i}"), 2, bad, Duration::from_secs(3)).await;
    }
    let running_now = |f: &Fleet| -> usize {
        f.nodes.iter().map(|n| n.running.lock().values().filter(|v| v.2 == "running").count()).sum()
    };
    // Both at once: asked one after the other, the first move could be over before the second
    // drain starts, and nothing would wait for the budget.
    let (first, second) = tokio::join!(
        f.admin.post("/api/v1/nodes/n-0:drain", json!({})),
        f.admin.post("/api/v1/nodes/n-1:drain", json!({}))
    );
    for (s, v) in [first, second] {
        assert_eq!(s, 202, "{v}");
    }
    let (mut fewest, mut most_down, mut saw_budget) = (usize::MAX, 0, false);
    // What the samples saw, for the message if the budget's wait went unseen.
    let (mut samples, mut slowest, mut reasons) = (0, Duration::ZERO, std::collections::BTreeSet::new());
    let until = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let sampled = std::time::Instant::now();
        samples += 1;
        fewest = fewest.min(running_now(&f));
        most_down = most_down.max(f.down());
        let (a, b) = (node_view(&f.admin, "n-0").await, node_view(&f.admin, "n-1").await);
        let blocked: Vec<&Value> =
            [&a, &b].iter().flat_map(|v| v["drain"]["blocked"].as_array().unwrap().iter()).collect();
        saw_budget |= blocked.iter().any(|x| x["reason"] == "budget" && x["agentKey"] == "coder");
        reasons.extend(blocked.iter().map(|x| x["reason"].to_string()));
        slowest = slowest.max(sampled.elapsed());
        if a["drain"]["remaining"] == 0 && b["drain"]["remaining"] == 0 {
            break;
        }
        assert!(std::time::Instant::now() < until, "the drains did not finish: {a} {b}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        saw_budget,
        "the replica waiting for the budget was listed with reason budget ({samples} samples, the slowest {slowest:?}; \
         reasons seen: {reasons:?}; at most {most_down} starting at once)"
    );
    assert!(most_down <= 1, "{most_down} new replicas were starting at once with maxUnavailable 1");
    assert!(fewest >= 4, "a replica stopped before its new node ran it: {fewest} running at one point");
    eventually(10, "the old replicas let go on n-0 and n-1", || async {
        (f.nodes[0].running.lock().is_empty() && f.nodes[1].running.lock().is_empty()).then_some(())
    })
    .await;
    let on_new: usize = f.nodes[4..].iter().map(|n| n.running.lock().len()).sum();
    assert_eq!(on_new, 2, "the two moved replicas run on the new nodes");
    let ctx = running.ctx.clone().expect("the leader's context");
    eventually(20, "a clean audit", || async {
        let diffs = fleet_controller::reconcile::pass::audit::audit(&ctx).await.unwrap();
        diffs.is_empty().then_some(())
    })
    .await;
    drop(f);
    running.shutdown().await;
}

async fn node_view(admin: &Admin, name: &str) -> Value {
    let (s, v) = admin.get(&format!("/api/v1/nodes/{name}")).await;
    assert_eq!(s, 200, "{v}");
    v
}

/// docs/behaviour.md#rolling-out-a-change: a PAT rotation recreates the container, so it is a
/// step in the budget. IAM grants 45 s PATs here, so the four nodes' PATs, issued together,
/// fall due together (30 s after their issue); with `maxUnavailable: 1` no more than one
/// replica is ever recreated at once, and every node still gets its new PAT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pat_rotations_are_steps_in_the_budget() {
    let dk = devkit().await;
    dk.set_faults(fleet_devkit::Faults { pat_lifetime_seconds: Some(45), ..Default::default() });
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let f = fleet(&dk, &url, json!({"maxUnavailable": 1, "minReadySeconds": 0})).await;
    let creds = |f: &Fleet| -> Vec<String> {
        f.nodes.iter().flat_map(|n| n.running.lock().values().map(|v| v.0.clone()).collect::<Vec<_>>()).collect()
    };
    let mut seen: Vec<HashSet<String>> = vec![HashSet::new(); 4];
    let mut worst = 0;
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < until && !seen.iter().all(|s| s.len() >= 2) {
        worst = worst.max(f.down());
        for (i, c) in creds(&f).into_iter().enumerate().take(4) {
            seen[i].insert(c);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen.iter().all(|s| s.len() >= 2), "every node's PAT rotated: {seen:?}");
    assert!(worst <= 1, "{worst} replicas were recreated at once for their PATs with maxUnavailable 1");
    drop(f);
    running.shutdown().await;
}

/// Make-before-break across a restart (SQLite): a replica a drain moved whose new node cannot
/// run it yet keeps running on its draining node — and still does after `kill`-and-start of the
/// controller, which reads the move in flight back from the store. Once the new node runs it,
/// the old node lets it go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_in_flight_survives_a_restart() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = in_process_config(&dk, dir.path());
    let running = fleet_controller::server::start(cfg.clone()).await.unwrap();
    let url = format!("http://{}", running.addr);
    let mut f = fleet(&dk, &url, json!({"maxUnavailable": 1})).await;
    // The node to move to crash-loops every image until the test lets it run them.
    let broken: Arc<Mutex<HashSet<String>>> = Arc::new(Mutex::new(["agent:1".to_string()].into()));
    f.join(&url, "n-4", 2, broken.clone()).await;
    let (s, v) = f.admin.post("/api/v1/nodes/n-0:drain", json!({})).await;
    assert_eq!(s, 202, "{v}");
    eventually(20, "the replica on n-4, crash-looping", || async {
        f.nodes[4].running.lock().values().any(|v| v.2 == "crashloop").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(f.nodes[0].running.lock().len(), 1, "the old replica keeps running on n-0");

    let (f, running) = f.restart(running, &cfg).await;
    let nodes = &f.nodes;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(nodes[0].running.lock().len(), 1, "after the restart the old replica still runs on n-0");

    broken.lock().clear();
    // The new node runs it once it is recreated (a new PAT or template would do; here the
    // test restarts it by hand, as a crash-looping container restarts).
    for v in nodes[4].running.lock().values_mut() {
        v.2 = "running".into();
    }
    eventually(20, "n-0 lets the old replica go", || async { nodes[0].running.lock().is_empty().then_some(()) }).await;
    drop(f);
    running.shutdown().await;
}

/// The view of an agent at rest shows the policy the controller would use: its own fields
/// over the configured defaults (`FLEET_ROLLOUT_*`), not the built-in ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_view_at_rest_uses_the_configured_defaults() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = in_process_config(&dk, dir.path());
    cfg.rollout.max_unavailable = fleet_api::rollout::MaxUnavailable::Count(3);
    cfg.rollout.min_ready_seconds = 7;
    let running = fleet_controller::server::start(cfg).await.unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:admin"], 3600));
    dk.put_agent(agent("plain", "k", 4));
    dk.put_agent(with(agent("own", "k", 4), |a| a["placement"]["rollout"] = json!({"minReadySeconds": 1})));
    let view = |key: &'static str| {
        let admin = &admin;
        async move {
            eventually(20, "the agent listed", || async {
                let (s, v) = admin.get(&format!("/api/v1/agents/{key}/rollout")).await;
                (s == 200).then_some(v)
            })
            .await
        }
    };
    let plain = view("plain").await;
    assert_eq!(
        (&plain["policy"]["maxUnavailable"], &plain["policy"]["minReadySeconds"]),
        (&json!(3), &json!(7)),
        "{plain}"
    );
    assert_eq!(plain["budget"], 3, "{plain}");
    let own = view("own").await;
    assert_eq!((&own["policy"]["maxUnavailable"], &own["policy"]["minReadySeconds"]), (&json!(3), &json!(1)), "{own}");
    running.shutdown().await;
}

/// A replica drained twice in a row (its first old node still stopping it when its second
/// node drains): both old nodes let go of the agent once their drains are over, and the pass's
/// memory stays what a pass from scratch would derive (the audit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_drained_twice_lets_go_of_both_old_nodes() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let mut f = fleet(&dk, &url, json!({"maxUnavailable": 1})).await;
    for i in 4..6 {
        let bad = f.bad.clone();
        f.join(&url, &format!("n-{i}"), 1, bad).await;
    }
    let ctx = running.ctx.clone().expect("the leader's context");
    let audited = |what: &'static str| {
        let ctx = ctx.clone();
        async move {
            eventually(20, what, || async {
                fleet_controller::reconcile::pass::audit::audit(&ctx).await.unwrap().is_empty().then_some(())
            })
            .await
        }
    };
    let (s, v) = f.admin.post("/api/v1/nodes/n-0:drain", json!({})).await;
    assert_eq!(s, 202, "{v}");
    eventually(20, "the replica running on n-4", || async {
        f.nodes[4].running.lock().values().any(|v| v.2 == "running").then_some(())
    })
    .await;
    // n-0 is still stopping its old copy (the agent's drainSeconds): drain n-4 now.
    let (s, v) = f.admin.post("/api/v1/nodes/n-4:drain", json!({})).await;
    assert_eq!(s, 202, "{v}");
    eventually(20, "the replica running on n-5", || async {
        f.nodes[5].running.lock().values().any(|v| v.2 == "running").then_some(())
    })
    .await;
    audited("a clean audit while both old nodes let go").await;
    let holds = |i: usize| {
        let n = f.joined[i].clone();
        async move {
            let (_, d) = n.desired(None, 0).await;
            d["agents"].as_array().is_some_and(|a| !a.is_empty())
        }
    };
    eventually(30, "n-0 and n-4 without the agent", || async { (!holds(0).await && !holds(4).await).then_some(()) })
        .await;
    audited("a clean audit at the end").await;
    drop(f);
    running.shutdown().await;
}

/// The image of each replica of `coder` on a simulated node, by replica.
fn image_by_replica(n: &SimNode) -> Vec<(u32, String)> {
    n.running.lock().iter().filter(|((a, _), _)| a == "coder").map(|((_, i), e)| (*i, e.1.clone())).collect()
}

/// One node, three replicas, `maxUnavailable: 1`, replica 1 busy (docs/behaviour.md#busy-replicas):
/// a new image reaches replicas 0 and 2 first, one at a time, waits for 1 — the view names it
/// and an event says so — and updates it once it says it is idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_replica_is_updated_last_once_it_is_idle() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let f = one_node_fleet(&dk, &url, 3, json!({"maxUnavailable": 1, "minReadySeconds": 1})).await;
    busy_for_an_hour(&f, 1).await;
    dk.edit_agent("coder", |a| a["executor"]["image"] = json!("agent:2"));
    let v = eventually(60, "0 and 2 updated, 1 waited for", || async {
        let v = f.rollout("coder").await;
        let images = image_by_replica(&f.nodes[0]);
        let done = images == vec![(0, "agent:2".into()), (1, "agent:1".into()), (2, "agent:2".into())];
        (done && f.down() == 0 && v["waiting"][0]["replica"] == 1).then_some(v)
    })
    .await;
    assert_eq!((v["state"].as_str(), v["waiting"][0]["reason"].as_str()), (Some("progressing"), Some("busy")), "{v}");
    eventually(10, "the wait's event", || async {
        kinds_all(&f.admin).await.contains(&"disruption_waiting".to_string()).then_some(())
    })
    .await;
    f.nodes[0].busy.lock().clear();
    f.watch_until(30, "the idle replica updated", |v| v["state"] == "complete", "coder").await;
    assert_eq!(f.images(), vec!["agent:2"; 3]);
    drop(f);
    running.shutdown().await;
}

/// A busy replica holds a step at most `maxBusySeconds`: then it is updated, busy or not, and
/// an event says the hold expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_replica_holds_a_step_at_most_max_busy_seconds() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let f = fleet(&dk, &url, json!({"maxUnavailable": 1, "minReadySeconds": 1, "maxBusySeconds": 3})).await;
    for n in &f.nodes {
        n.busy.lock().insert(("coder".into(), n.running.lock().keys().next().unwrap().1), an_hour());
    }
    eventually(10, "the busy leases seen", || async {
        let (_, v) = f.admin.get("/api/v1/agents/coder/placement").await;
        v["replicas"].as_array()?.iter().all(|r| r["busyUntil"].is_string()).then_some(())
    })
    .await;
    dk.edit_agent("coder", |a| a["executor"]["image"] = json!("agent:2"));
    let worst = f.watch_until(90, "the rollout past every hold", |v| v["state"] == "complete", "coder").await;
    assert!(worst <= 1, "{worst}");
    // Events are written each second: the last ones may follow the view.
    let kinds = eventually(10, "the events written", || async {
        let k = kinds_all(&f.admin).await;
        k.contains(&"rollout_completed".to_string()).then_some(k)
    })
    .await;
    assert_eq!(kinds.iter().filter(|k| *k == "busy_hold_expired").count(), 4, "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| *k == "disruption_waiting").count(), 4, "each wait said once: {kinds:?}");
    drop(f);
    running.shutdown().await;
}

/// Every event kind of `coder`, oldest first.
async fn kinds_all(admin: &Admin) -> Vec<String> {
    let (_, v) = admin.get("/api/v1/events?agent=coder").await;
    v["items"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap().to_string()).collect()
}

/// A drain's idle replicas move first, one at a time with `maxUnavailable: 1`; a busy one
/// stays, listed with reason `busy`, and moves once it is idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_moves_idle_replicas_first_and_the_busy_one_when_idle() {
    let (dk, dir) = (devkit().await, tempfile::tempdir().unwrap());
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let f = busy_drain_fleet(&dk, &url, json!({"maxUnavailable": 1, "minReadySeconds": 1})).await;
    f.admin.post("/api/v1/nodes/n-0:drain", json!({})).await;
    let v = eventually(60, "the idle replicas moved, the busy one held", || async {
        let v = node_view(&f.admin, "n-0").await;
        let held = v["drain"]["blocked"].as_array()?.iter().any(|b| b["replica"] == 1 && b["reason"] == "busy");
        (held && v["drain"]["remaining"] == 1 && f.nodes[1].running.lock().len() == 2).then_some(v)
    })
    .await;
    assert!(f.nodes[0].running.lock().contains_key(&("coder".into(), 1)), "the busy replica runs on: {v}");
    eventually(10, "the drain's wait said", || async {
        kinds_all(&f.admin).await.contains(&"disruption_waiting".to_string()).then_some(())
    })
    .await;
    f.nodes[0].busy.lock().clear();
    eventually(30, "the idle replica moved", || async {
        (node_view(&f.admin, "n-0").await["drain"]["remaining"] == 0).then_some(())
    })
    .await;
    assert!(!kinds_all(&f.admin).await.contains(&"busy_hold_expired".to_string()));
    drop(f);
    running.shutdown().await;
}

/// A drain holds a busy replica at most `maxBusySeconds` from its start: then it moves, busy
/// or not, and `busy_hold_expired` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_holds_a_busy_replica_at_most_max_busy_seconds() {
    let (dk, dir) = (devkit().await, tempfile::tempdir().unwrap());
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let policy = json!({"maxUnavailable": 1, "minReadySeconds": 1, "maxBusySeconds": 8});
    let f = busy_drain_fleet(&dk, &url, policy).await;
    let started = std::time::Instant::now();
    f.admin.post("/api/v1/nodes/n-0:drain", json!({})).await;
    eventually(60, "every replica off the draining node", || async {
        (node_view(&f.admin, "n-0").await["drain"]["remaining"] == 0).then_some(())
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_secs(7),
        "the busy replica moved before its hold: {:?}",
        started.elapsed()
    );
    let kinds = eventually(10, "the hold's end said", || async {
        let k = kinds_all(&f.admin).await;
        k.contains(&"busy_hold_expired".to_string()).then_some(k)
    })
    .await;
    assert_eq!(kinds.iter().filter(|k| *k == "disruption_waiting").count(), 1, "{kinds:?}");
    drop(f);
    running.shutdown().await;
}

/// `coder`, 3 replicas on n-0 with replica 1 busy for an hour, and an empty n-1 to drain to.
async fn busy_drain_fleet(dk: &fleet_devkit::Devkit, url: &str, policy: Value) -> Fleet {
    let mut f = one_node_fleet(dk, url, 3, policy).await;
    let bad = f.bad.clone();
    f.join(url, "n-1", 3, bad).await;
    busy_for_an_hour(&f, 1).await;
    f
}

/// A PAT rotation waits for a busy replica on its node while the other nodes' go; close to
/// its expiry it goes anyway, before the PAT expires, and the wait was said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pat_rotation_waits_for_a_busy_replica_until_its_expiry_is_near() {
    let dk = devkit().await;
    dk.set_faults(fleet_devkit::Faults { pat_lifetime_seconds: Some(45), ..Default::default() });
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let f = fleet(&dk, &url, json!({"maxUnavailable": 1, "minReadySeconds": 0})).await;
    let cred_of = |n: &SimNode| n.running.lock().values().next().map(|v| v.0.clone());
    let first: Vec<Option<String>> = f.nodes.iter().map(cred_of).collect();
    let busy_key = f.nodes[0].running.lock().keys().next().cloned().unwrap();
    f.nodes[0].busy.lock().insert(busy_key, an_hour());
    eventually(60, "the other nodes' PATs rotated", || async {
        f.nodes[1..].iter().zip(&first[1..]).all(|(n, c)| cred_of(n) != *c).then_some(())
    })
    .await;
    assert_eq!(cred_of(&f.nodes[0]), first[0], "the busy replica's PAT waits");
    let started = std::time::Instant::now();
    eventually(40, "the busy node's PAT rotated before it expired", || async {
        (cred_of(&f.nodes[0]) != first[0]).then_some(())
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(40));
    let (_, v) = f.admin.get("/api/v1/events?agent=coder").await;
    let said = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["kind"] == "disruption_waiting" && e["message"].as_str().unwrap_or("").contains("PAT rotation"));
    assert!(said, "the rotation's wait is an event: {v}");
    drop(f);
    running.shutdown().await;
}

/// Replicas are numbered: a scale-down from 3 to 2 removes replica 2. Busy, it keeps running
/// (and the wait is an event) until it says it is idle, then stops; the other two never stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_down_waits_for_the_removed_replica_while_it_is_busy() {
    let (dk, dir) = (devkit().await, tempfile::tempdir().unwrap());
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let f = one_node_fleet(&dk, &url, 3, json!({"maxUnavailable": 1})).await;
    busy_for_an_hour(&f, 2).await;
    dk.edit_agent("coder", |a| a["placement"]["replicas"] = json!(2));
    eventually(10, "the scale-down's wait said", || async {
        kinds_all(&f.admin).await.contains(&"disruption_waiting".to_string()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(f.nodes[0].running.lock().len(), 3, "the busy replica runs on");
    f.nodes[0].busy.lock().clear();
    eventually(30, "the idle replica 2 stopped", || async {
        let reps: Vec<u32> = f.nodes[0].running.lock().keys().map(|k| k.1).collect();
        (reps == [0, 1]).then_some(())
    })
    .await;
    assert!(!kinds_all(&f.admin).await.contains(&"busy_hold_expired".to_string()));
    drop(f);
    running.shutdown().await;
}
