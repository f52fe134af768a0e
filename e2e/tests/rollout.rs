//! Progressive delivery end to end (docs/behaviour.md#rolling-out-a-change): the controller
//! and four fleet-nodes as real processes on the one Docker engine (each its own
//! `containerPrefix`), an agent of four replicas (one a node). The test samples the engine
//! itself, every 200 ms, for how many of the agent's containers are not running.

mod support;

use fleet_e2e::{docker_available, ensure_test_images, image};
use serde_json::{json, Value};
use std::process::Command;
use std::time::{Duration, Instant};
use support::*;

/// The agent's containers in this test's fleet as the engine lists them: (name, running,
/// image, id). Fleets of tests running at once have their own prefixes.
fn containers(prefix: &str, agent: &str) -> Vec<(String, bool, String, String)> {
    let out = Command::new("docker")
        .args(["ps", "-a", "--filter", &format!("label=fleet.agent={agent}"), "--filter", &format!("name=^{prefix}-")])
        .args(["--format", "{{.Names}} {{.State}} {{.Image}} {{.ID}}"])
        .output()
        .unwrap();
    let mut v: Vec<_> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let p: Vec<&str> = l.split_whitespace().collect();
            (p.len() == 4).then(|| (p[0].to_string(), p[1] == "running", p[2].to_string(), p[3].to_string()))
        })
        .collect();
    v.sort();
    v
}

/// How many of `replicas` replicas are not running now: each node's container of the agent
/// counts once, missing or stopped or not yet started.
fn not_running(f: &Fleet, nodes: &[NodeDir], agent: &str) -> usize {
    let list = containers(&f.prefix, agent);
    nodes.iter().filter(|n| !list.iter().any(|c| c.0.starts_with(&format!("{}-{agent}-", n.prefix)) && c.1)).count()
}

fn images(f: &Fleet, agent: &str) -> Vec<String> {
    containers(&f.prefix, agent).into_iter().filter(|c| c.1).map(|c| c.2).collect()
}

async fn rollout(f: &Fleet, agent: &str) -> Value {
    f.admin_get(&format!("/api/v1/agents/{agent}/rollout")).await
}

/// Samples the engine every 200 ms until the rollout view satisfies `done`; returns the most
/// replicas seen not running at once.
async fn sample_until(
    f: &Fleet,
    nodes: &[NodeDir],
    agent: &str,
    secs: u64,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> usize {
    let until = Instant::now() + Duration::from_secs(secs);
    let mut worst = 0;
    loop {
        worst = worst.max(not_running(f, nodes, agent));
        let v = rollout(f, agent).await;
        if done(&v) {
            return worst;
        }
        assert!(Instant::now() < until, "timed out waiting for {what}: {v}\n{}", f.controller_log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn roll_agent(image_tag: &str, policy: Value) -> Value {
    let mut a = agent("roll", 4);
    a["executor"]["image"] = json!(image(image_tag));
    a["placement"]["rollout"] = policy;
    a
}

/// Four one-slot nodes (their `extra` node.yaml lines) running `roll` on `sleep`.
async fn four_nodes(f: &Fleet, extra: &str, policy: Value) -> Vec<NodeDir> {
    let mut nodes = Vec::new();
    for i in 0..4 {
        let mut n = f.node_sized(&format!("n{i}"), 1, extra).await;
        n.start();
        nodes.push(n);
    }
    f.devkit.put_agents(vec![roll_agent("sleep", policy)]);
    eventually(90, "four replicas running", || async {
        (images(f, "roll") == vec![image("sleep"); 4] && not_running(f, &nodes, "roll") == 0).then_some(())
    })
    .await;
    // Running as the controller knows it (the nodes' reports follow every 5 s): a rollout of
    // an agent with no replica known ready would update all at once.
    eventually(30, "four replicas reported running", || async {
        (rollout(f, "roll").await["readyReplicas"] == 4).then_some(())
    })
    .await;
    nodes
}

async fn event_kinds(f: &Fleet, agent: &str) -> Vec<String> {
    let v = f.admin_get(&format!("/api/v1/events?agent={agent}")).await;
    v["items"].as_array().into_iter().flatten().filter_map(|e| e["kind"].as_str().map(str::to_string)).collect()
}

fn fleetctl(f: &Fleet, args: &[&str]) -> std::process::Output {
    Command::new(bin("fleetctl"))
        .env("FLEET_URL", &f.url)
        .env("FLEET_TOKEN", &f.admin_token)
        .args(args)
        .output()
        .unwrap()
}

/// Show 1 and 5: a new image reaches the four replicas with never more than one of them not
/// running, each new container running before the next old one stops; `rollout:restart`
/// then recreates every container (new ids), one budget at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_image_rolls_out_one_replica_at_a_time_on_the_engine() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let f = Fleet::start("e2erl").await;
    let nodes = four_nodes(&f, "", json!({"maxUnavailable": 1, "minReadySeconds": 5})).await;
    f.devkit.edit_agent("roll", |a| {
        a["executor"]["image"] = json!(image("sleep2"));
        a["revision"] = json!(2);
    });
    let complete = |v: &Value| v["state"] == "complete" && v["target"]["image"] == image("sleep2").as_str();
    let worst = sample_until(&f, &nodes, "roll", 180, "the rollout to complete", complete).await;
    assert!(worst <= 1, "{worst} replicas were not running at once with maxUnavailable 1");
    assert_eq!(images(&f, "roll"), vec![image("sleep2"); 4]);
    let kinds = eventually(10, "rollout_completed in the history", || async {
        let k = event_kinds(&f, "roll").await;
        k.iter().any(|k| k == "rollout_completed").then_some(k)
    })
    .await;
    let rollout: Vec<&String> = kinds.iter().filter(|k| k.starts_with("rollout_")).collect();
    assert_eq!(rollout.first().map(|k| k.as_str()), Some("rollout_started"), "{kinds:?}");
    assert_eq!(rollout.iter().filter(|k| **k == "rollout_step").count(), 4, "{kinds:?}");
    assert_eq!(rollout.last().map(|k| k.as_str()), Some("rollout_completed"), "{kinds:?}");

    let before: Vec<String> = containers(&f.prefix, "roll").into_iter().map(|c| c.3).collect();
    let out = fleetctl(&f, &["rollout", "restart", "roll"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let worst = sample_until(&f, &nodes, "roll", 180, "the restart to complete", |v| v["state"] == "complete").await;
    assert!(worst <= 1, "{worst} replicas were not running at once during the restart");
    let after: Vec<String> = containers(&f.prefix, "roll").into_iter().map(|c| c.3).collect();
    assert_eq!(after.len(), 4);
    assert!(after.iter().all(|id| !before.contains(id)), "every container is new: {before:?} → {after:?}");
    assert_eq!(images(&f, "roll"), vec![image("sleep2"); 4], "nothing else changed");
}

/// Show 2: an image that exits 1 at once crash-loops on the first replica it reaches; the
/// rollout halts and the other three keep the old image; `fleetctl rollout undo` brings the
/// first back. With `onFailure: revert` the same happens without a command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_image_halts_after_one_replica_and_undo_brings_it_back() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let f = Fleet::start("e2erh").await;
    let nodes = four_nodes(&f, "", json!({"maxUnavailable": 1, "minReadySeconds": 3})).await;
    f.devkit.edit_agent("roll", |a| a["executor"]["image"] = json!(image("exit1")));
    let worst = sample_until(&f, &nodes, "roll", 180, "the halt", |v| v["state"] == "halted").await;
    assert!(worst <= 1, "{worst}");
    let v = rollout(&f, "roll").await;
    assert!(v["failed"][0]["reason"].as_str().unwrap().starts_with("crashloop"), "{v}");
    assert_eq!(v["updatedReplicas"], 1, "{v}");
    let running: Vec<String> = images(&f, "roll");
    assert_eq!(running, vec![image("sleep"); 3], "the other three still run the old image");
    let st = fleetctl(&f, &["rollout", "status", "roll"]);
    assert_eq!(st.status.code(), Some(1), "halted exits 1: {}", String::from_utf8_lossy(&st.stdout));

    let out = fleetctl(&f, &["rollout", "undo", "roll"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    eventually(120, "all four back on the old image", || async {
        (images(&f, "roll") == vec![image("sleep"); 4] && not_running(&f, &nodes, "roll") == 0).then_some(())
    })
    .await;

    // onFailure: revert, and another template of the crashing image (the CP must send
    // another template for the undone target to give way): reverted without a command.
    f.devkit.edit_agent("roll", |a| {
        a["placement"]["rollout"]["onFailure"] = json!("revert");
        a["placement"]["resources"] = json!({"memoryMb": 64});
        a["revision"] = json!(9);
    });
    let worst = sample_until(&f, &nodes, "roll", 180, "the revert", |v| v["state"] == "reverted").await;
    assert!(worst <= 1, "{worst}");
    eventually(120, "the reverted replica back on the old image", || async {
        (images(&f, "roll") == vec![image("sleep"); 4] && not_running(&f, &nodes, "roll") == 0).then_some(())
    })
    .await;
    let kinds = eventually(10, "rollout_reverted in the history", || async {
        let k = event_kinds(&f, "roll").await;
        k.iter().any(|k| k == "rollout_reverted").then_some(k)
    })
    .await;
    assert!(kinds.iter().any(|k| k == "rollout_halted"), "{kinds:?}");
}

/// Show 3: with `checkBeforeStop: true` an image the engine does not have stops no container:
/// the replica reports `update_blocked: No such image: …` and the rollout halts. With the
/// default the seed's rule stands — stop, then `start failed: …` — and the halt keeps it to
/// one budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_missing_on_the_engine_halts_with_or_without_check_before_stop() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let missing = format!("{}-nowhere", image("sleep"));
    for (prefix, extra) in [("e2erc", "checkBeforeStop: true\n"), ("e2erd", "")] {
        let f = Fleet::start(prefix).await;
        let nodes = four_nodes(&f, extra, json!({"maxUnavailable": 1, "minReadySeconds": 3})).await;
        let ids: Vec<String> = containers(&f.prefix, "roll").into_iter().map(|c| c.3).collect();
        let m = missing.clone();
        f.devkit.edit_agent("roll", move |a| a["executor"]["image"] = json!(m));
        let worst = sample_until(&f, &nodes, "roll", 120, "the halt", |v| v["state"] == "halted").await;
        let v = rollout(&f, "roll").await;
        let reason = v["failed"][0]["reason"].as_str().unwrap_or_default().to_string();
        if extra.is_empty() {
            assert!(reason.starts_with("start failed: ") && reason.contains(&missing), "{v}");
            assert_eq!(worst, 1, "one budget: {v}");
            assert_eq!(images(&f, "roll"), vec![image("sleep"); 3], "three untouched");
        } else {
            assert_eq!(reason, format!("update_blocked: No such image: {missing}"), "{v}");
            assert_eq!(worst, 0, "no container was stopped");
            let now: Vec<String> = containers(&f.prefix, "roll").into_iter().map(|c| c.3).collect();
            assert_eq!(now, ids, "the same four containers run");
        }
        drop(nodes);
        drop(f);
    }
}

/// The engine's `kill` events of one container since `since` (unix seconds): (ns, signal).
fn kills(id: &str, since: i64) -> Vec<(i64, String)> {
    let out = Command::new("docker")
        .args(["events", "--since", &since.to_string(), "--until", &(now_s() + 1).to_string()])
        .args(["--filter", &format!("container={id}"), "--filter", "event=kill"])
        .args(["--format", "{{.TimeNano}} {{index .Actor.Attributes \"signal\"}}"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (t, sig) = l.split_once(' ')?;
            Some((t.parse().ok()?, sig.to_string()))
        })
        .collect()
}

fn now_s() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

/// Show 4: two nodes drained at once with `maxUnavailable: 1` → the replicas move one at a
/// time (the one waiting listed as blocked with `reason: budget`), each new container runs
/// before its old one stops (the engine never shows fewer than four running), and the old
/// container — an agent that ignores SIGTERM — is stopped with the agent's `drainSeconds`
/// (4 s between the engine's TERM and KILL, not the 30 s of an agent gone from the node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_moves_one_replica_at_a_time_make_before_break_on_the_engine() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let f = Fleet::start("e2edr").await;
    let mut nodes = Vec::new();
    for i in 0..4 {
        let mut n = f.node_sized(&format!("n{i}"), 1, "").await;
        n.start();
        nodes.push(n);
    }
    let mut a = agent("drn", 4);
    a["executor"]["image"] = json!(image("ignore-term"));
    a["drainSeconds"] = json!(4);
    a["placement"]["rollout"] = json!({"maxUnavailable": 1});
    f.devkit.put_agents(vec![a]);
    let running = |f: &Fleet| containers(&f.prefix, "drn").into_iter().filter(|c| c.1).count();
    eventually(90, "four replicas reported running", || async {
        (running(&f) == 4 && rollout(&f, "drn").await["readyReplicas"] == 4).then_some(())
    })
    .await;
    for i in 4..6 {
        let mut n = f.node_sized(&format!("n{i}"), 2, "").await;
        n.start();
        nodes.push(n);
    }
    eventually(30, "the new nodes online", || async {
        let (a, b) = (f.node_view(&nodes[4].name).await?, f.node_view(&nodes[5].name).await?);
        (a["status"] == "online" && b["status"] == "online").then_some(())
    })
    .await;
    let old: Vec<String> = containers(&f.prefix, "drn")
        .into_iter()
        .filter(|c| {
            c.0.starts_with(&format!("{}-", nodes[0].prefix)) || c.0.starts_with(&format!("{}-", nodes[1].prefix))
        })
        .map(|c| c.3)
        .collect();
    assert_eq!(old.len(), 2, "one replica on each node to drain");
    let since = now_s();
    for n in &nodes[..2] {
        let out = fleetctl(&f, &["drain", &n.name]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let (mut fewest, mut saw_budget) = (usize::MAX, false);
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        fewest = fewest.min(running(&f));
        let (a, b) = (f.node_view(&nodes[0].name).await.unwrap(), f.node_view(&nodes[1].name).await.unwrap());
        for v in [&a, &b] {
            saw_budget |= v["drain"]["blocked"].as_array().into_iter().flatten().any(|x| x["reason"] == "budget");
        }
        let gone = containers(&f.prefix, "drn").iter().all(|c| !old.contains(&c.3));
        if a["drain"]["remaining"] == 0 && b["drain"]["remaining"] == 0 && gone {
            break;
        }
        assert!(Instant::now() < until, "the drains did not finish: {a} {b}\n{}", f.controller_log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(saw_budget, "the replica waiting for the budget was listed with reason budget");
    assert!(fewest >= 4, "an old container stopped before its replica ran elsewhere: {fewest} running at one point");
    let on_new = containers(&f.prefix, "drn")
        .into_iter()
        .filter(|c| c.1 && nodes[4..].iter().any(|n| c.0.starts_with(&format!("{}-", n.prefix))))
        .count();
    assert_eq!(on_new, 2, "the two moved replicas run on the new nodes");
    for id in &old {
        let k = kills(id, since);
        let term = k.iter().find(|x| x.1 == "15").map(|x| x.0);
        let kill = k.iter().find(|x| x.1 == "9").map(|x| x.0);
        let (Some(term), Some(kill)) = (term, kill) else { panic!("TERM then KILL for {id}: {k:?}") };
        let waited = Duration::from_nanos((kill - term) as u64);
        assert!(
            waited >= Duration::from_millis(3500) && waited < Duration::from_secs(20),
            "the old container was stopped with {waited:?}, not the agent's 4 s"
        );
    }
}
