//! Disruptions that wait for the agent's work and the node's window, end to end
//! (docs/behaviour.md#busy-replicas, #maintenance-windows): the controller and one fleet-node
//! behind its own docker-guard as real processes on the one Docker engine, the devkit CP. A
//! replica says it is busy as an agent would, from inside its container (`docker exec`
//! writing `$FLEET_BUSY_FILE`); the test samples the engine itself every 200 ms. Each test's
//! fleet has its own prefix (`e2e62…`), so tests of other checkouts on the same engine are
//! not touched.

mod support;

use fleet_e2e::{docker_available, ensure_test_images, image};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::*;

/// The agent's containers on node `n` as the engine lists them: replica → (running, image).
fn replicas(n: &NodeDir, agent: &str) -> BTreeMap<u32, (bool, String)> {
    let own = format!("{}-{agent}-", n.prefix);
    let out = Command::new("docker")
        .args(["ps", "-a", "--filter", &format!("label=fleet.agent={agent}"), "--filter", &format!("name=^{own}")])
        .args(["--format", "{{.Names}} {{.State}} {{.Image}}"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let p: Vec<&str> = l.split_whitespace().collect();
            let replica = p.first()?.strip_prefix(&own)?.parse().ok()?;
            (p.len() == 3).then(|| (replica, (p[1] == "running", p[2].to_string())))
        })
        .collect()
}

/// How many of `count` replicas are not running on the engine now.
fn not_running(n: &NodeDir, agent: &str, count: u32) -> usize {
    let seen = replicas(n, agent);
    (0..count).filter(|r| !seen.get(r).is_some_and(|c| c.0)).count()
}

/// The replicas running `image` now.
fn running_image(n: &NodeDir, agent: &str, img: &str) -> Vec<u32> {
    replicas(n, agent).into_iter().filter(|(_, c)| c.0 && c.1 == img).map(|(r, _)| r).collect()
}

async fn rollout(f: &Fleet, agent: &str) -> Value {
    f.admin_get(&format!("/api/v1/agents/{agent}/rollout")).await
}

async fn events(f: &Fleet, agent: &str) -> Vec<Value> {
    f.admin_get(&format!("/api/v1/events?agent={agent}")).await["items"].as_array().cloned().unwrap_or_default()
}

async fn has_event(f: &Fleet, agent: &str, kind: &str) -> bool {
    events(f, agent).await.iter().any(|e| e["kind"] == kind)
}

fn now_secs() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// Runs `script` in the replica's container as its own user, as the agent would.
fn agent_says(n: &NodeDir, agent: &str, replica: u32, script: &str) {
    let out = Command::new("docker")
        .args(["exec", &n.container(agent, replica), "/bin/busybox", "sh", "-c", script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The replica writes "busy for `secs` more seconds" to its lease file.
fn busy_for(n: &NodeDir, agent: &str, replica: u32, secs: i64) {
    let script = format!(
        "echo $(( $(/bin/busybox date +%s) + {secs} )) > \"$FLEET_BUSY_FILE.tmp\" && /bin/busybox mv \"$FLEET_BUSY_FILE.tmp\" \"$FLEET_BUSY_FILE\""
    );
    agent_says(n, agent, replica, &script);
}

fn idle(n: &NodeDir, agent: &str, replica: u32) {
    agent_says(n, agent, replica, "/bin/busybox rm -f \"$FLEET_BUSY_FILE\"");
}

/// The replica's busyUntil as the controller shows it.
async fn busy_until(f: &Fleet, agent: &str, replica: u32) -> Option<String> {
    let v = f.admin_get(&format!("/api/v1/agents/{agent}/placement")).await;
    let r = v["replicas"].as_array()?.iter().find(|r| r["replica"] == replica)?.clone();
    r["busyUntil"].as_str().map(str::to_string)
}

/// One node (its `extra` node.yaml lines) running `agent` with `count` replicas on `sleep`,
/// all running as the controller knows it.
async fn one_node(f: &Fleet, extra: &str, agent: &str, count: u32, policy: Value) -> NodeDir {
    let mut n = f.node("n1", extra).await;
    n.start();
    let mut a = support::agent(agent, count);
    a["executor"]["image"] = json!(image("sleep"));
    a["placement"]["rollout"] = policy;
    f.devkit.put_agents(vec![a]);
    eventually(120, "the replicas running", || async {
        (running_image(&n, agent, &image("sleep")).len() == count as usize).then_some(())
    })
    .await;
    eventually(60, "the replicas reported running", || async {
        (rollout(f, agent).await["readyReplicas"] == count).then_some(())
    })
    .await;
    n
}

fn new_image(f: &Fleet, agent: &str, tag: &str, revision: u64, policy: Option<Value>) {
    f.devkit.edit_agent(agent, |a| {
        a["executor"]["image"] = json!(image(tag));
        a["revision"] = json!(revision);
        if let Some(p) = policy {
            a["placement"]["rollout"] = p;
        }
    });
}

/// What a rollout looked like on the engine, sampled every 200 ms: the order in which the
/// replicas came to run the new image, and the most not running at once.
#[derive(Debug, Default)]
struct Sampled {
    order: Vec<u32>,
    worst: usize,
}

impl Sampled {
    fn look(&mut self, n: &NodeDir, agent: &str, count: u32, img: &str) {
        self.worst = self.worst.max(not_running(n, agent, count));
        for r in running_image(n, agent, img) {
            if !self.order.contains(&r) {
                self.order.push(r);
            }
        }
    }
}

/// Replicas 0 and 2 updated first, one at a time, while replica 1 — busy, renewing its lease
/// as an agent does — is waited for (`disruption_waiting`); then a few passes more in which
/// it stays on the old image.
async fn idle_ones_first(f: &Fleet, n: &NodeDir, agent: &str, img: &str) -> Sampled {
    let mut seen = Sampled::default();
    let mut renewed = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(240);
    while !(seen.order.len() == 2 && has_event(f, agent, "disruption_waiting").await) {
        seen.look(n, agent, 3, img);
        assert!(!seen.order.contains(&1), "the busy replica was updated before the idle ones: {seen:?}");
        if renewed.elapsed() > Duration::from_secs(10) {
            busy_for(n, agent, 1, 60);
            renewed = Instant::now();
        }
        assert!(Instant::now() < deadline, "timed out: {seen:?} {}\n{}", rollout(f, agent).await, f.controller_log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(seen.order, vec![0, 2], "the idle replicas first, in order");
    seen
}

/// Samples until the rollout to `img` completes (or `secs` pass).
async fn until_complete(f: &Fleet, n: &NodeDir, agent: &str, img: &str, seen: &mut Sampled, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        seen.look(n, agent, 3, img);
        let v = rollout(f, agent).await;
        if v["state"] == "complete" && v["target"]["image"] == img {
            return;
        }
        assert!(Instant::now() < deadline, "timed out: {seen:?} {v}\n{}", f.controller_log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Show 1: replica 1 says it is busy for 60 s; a new image rolls replicas 0 and 2 first, one at
/// a time, then waits for 1 (`disruption_waiting`), and updates it once it says idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_updates_idle_replicas_first_and_waits_for_a_busy_one() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let f = Fleet::start("e2e62busy").await;
    let n = one_node(&f, "", "bz", 3, json!({"maxUnavailable": 1, "minReadySeconds": 2})).await;
    busy_for(&n, "bz", 1, 60);
    eventually(30, "replica 1 shown busy", || async { busy_until(&f, "bz", 1).await }).await;
    new_image(&f, "bz", "sleep2", 2, None);
    let mut seen = idle_ones_first(&f, &n, "bz", &image("sleep2")).await;
    for _ in 0..25 {
        seen.look(&n, "bz", 3, &image("sleep2"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(seen.order, vec![0, 2], "the busy replica is waited for");
    assert_eq!(rollout(&f, "bz").await["state"], "progressing");
    idle(&n, "bz", 1);
    let said_idle = Instant::now();
    until_complete(&f, &n, "bz", &image("sleep2"), &mut seen, 120).await;
    eprintln!("replica 1 updated {:?} after it said idle", said_idle.elapsed());
    assert_eq!(seen.order, vec![0, 2, 1]);
    assert!(seen.worst <= 1, "{} replicas were not running at once with maxUnavailable 1", seen.worst);
    assert!(!has_event(&f, "bz", "busy_hold_expired").await, "the hold did not expire: the replica went idle");
}

/// Show 1, with `maxBusySeconds: 20`: replica 1 stays busy, and the wait for it ends when its
/// hold of 20 s does (`busy_hold_expired`), not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_replica_is_waited_for_at_most_max_busy_seconds() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let f = Fleet::start("e2e62hold").await;
    let policy = json!({"maxUnavailable": 1, "minReadySeconds": 2, "maxBusySeconds": 20});
    let n = one_node(&f, "", "bh", 3, policy).await;
    busy_for(&n, "bh", 1, 3600);
    eventually(30, "replica 1 shown busy", || async { busy_until(&f, "bh", 1).await }).await;
    new_image(&f, "bh", "sleep2", 2, None);
    let mut seen = idle_ones_first(&f, &n, "bh", &image("sleep2")).await;
    until_complete(&f, &n, "bh", &image("sleep2"), &mut seen, 240).await;
    assert_eq!(seen.order, vec![0, 2, 1], "the busy replica last");
    assert!(seen.worst <= 1, "{} replicas were not running at once", seen.worst);
    let history = events(&f, "bh").await;
    let at = |kind: &str| history.iter().find(|e| e["kind"] == kind).cloned().unwrap_or_else(|| panic!("{kind}"));
    let (waiting, expired) = (at("disruption_waiting"), at("busy_hold_expired"));
    // The controller's own clock: the hold runs from the first wait to its expiry.
    let held = time_of(expired["at"].as_str().unwrap()) - time_of(waiting["at"].as_str().unwrap());
    eprintln!("replica 1 held {held} s (maxBusySeconds 20)");
    assert!(held >= 19, "the hold ended after {held} s, before maxBusySeconds: {waiting} {expired}");
    assert_eq!((waiting["replica"].clone(), expired["replica"].clone()), (json!(1), json!(1)), "{expired}");
    assert!(expired["message"].as_str().unwrap().contains("maxBusySeconds (20 s)"), "{expired}");
    assert!(busy_until(&f, "bh", 1).await.is_none(), "the new container starts idle");
}

/// Show 4: two replicas of one agent on one node, `maxUnavailable: 1`: never more than one of
/// them is not running on the engine, sampled every 200 ms through a rollout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_node_step_one_at_a_time() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let f = Fleet::start("e2e62pair").await;
    let n = one_node(&f, "", "rv", 2, json!({"maxUnavailable": 1, "minReadySeconds": 2})).await;
    new_image(&f, "rv", "sleep2", 2, None);
    let mut seen = Sampled::default();
    let done = |v: &Value| v["state"] == "complete" && v["target"]["image"] == image("sleep2").as_str();
    let deadline = Instant::now() + Duration::from_secs(180);
    while !done(&rollout(&f, "rv").await) {
        seen.look(&n, "rv", 2, &image("sleep2"));
        assert!(Instant::now() < deadline, "timed out: {seen:?} {}\n{}", rollout(&f, "rv").await, f.controller_log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    seen.look(&n, "rv", 2, &image("sleep2"));
    assert_eq!(seen.order.len(), 2, "both updated: {seen:?}");
    assert!(seen.worst <= 1, "{} of 2 replicas were not running at once with maxUnavailable 1", seen.worst);
}

/// Seconds into the five-minute cycle of `*/5 * * * *` (Paris is a whole number of hours from
/// UTC, so its five-minute marks are UTC's).
fn in_cycle(secs: i64) -> i64 {
    secs.rem_euclid(300)
}

/// Show 3: the node's window `*/5 * * * *` for 2 minutes in Europe/Paris. A change made while
/// it is closed makes no step until it opens — the view says `waiting_for_window` and the next
/// start — and no step starts while it is closed: three replicas with `minReadySeconds: 80`
/// fit two steps into a window, and the third waits for the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_step_starts_outside_the_node_s_window() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let f = Fleet::start("e2e62win").await;
    let window = "maintenanceWindows:\n  - {schedule: \"*/5 * * * *\", durationMinutes: 2, timeZone: Europe/Paris}\n";
    let n = one_node(&f, window, "wd", 3, json!({"maxUnavailable": 1, "minReadySeconds": 80})).await;

    // A closed moment with time before the next opening, wherever in the cycle the test began.
    eventually(300, "a closed moment", || async { (125..=250).contains(&in_cycle(now_secs())).then_some(()) }).await;
    let opens = now_secs() - in_cycle(now_secs()) + 300;
    new_image(&f, "wd", "sleep2", 2, None);
    let view = eventually(60, "the rollout waiting for the window", || async {
        let v = rollout(&f, "wd").await;
        (v["state"] == "waiting_for_window").then_some(v)
    })
    .await;
    let next = view["nextWindow"].as_str().expect("nextWindow in the view");
    let next = time_of(next);
    assert_eq!(next, opens, "the next start: {view}");
    while now_secs() < opens {
        assert!(running_image(&n, "wd", &image("sleep2")).is_empty(), "a step while the window was closed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let done = |v: &Value| v["state"] == "complete" && v["target"]["image"] == image("sleep2").as_str();
    let mut closed_wait_seen = false;
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        let v = rollout(&f, "wd").await;
        if done(&v) {
            break;
        }
        closed_wait_seen |= v["state"] == "waiting_for_window" && now_secs() >= opens + 120;
        assert!(Instant::now() < deadline, "timed out: {v}\n{}", f.controller_log());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let steps: Vec<i64> = events(&f, "wd")
        .await
        .iter()
        .filter(|e| e["kind"] == "rollout_step")
        .map(|e| time_of(e["at"].as_str().unwrap()))
        .collect();
    eprintln!("steps at {:?} s into their cycle", steps.iter().map(|s| in_cycle(*s)).collect::<Vec<_>>());
    assert!(!steps.is_empty(), "rollout_step events in the history");
    for s in &steps {
        assert!(in_cycle(*s) < 120, "a step started at {} s into the cycle, outside the window", in_cycle(*s));
    }
    assert!(steps.iter().any(|s| *s >= opens + 300), "the last step waited for the next window: {steps:?}");
    assert!(closed_wait_seen, "the rollout was seen waiting for the window after the first one closed");
}

/// Unix seconds of an RFC 3339 time.
fn time_of(rfc3339: &str) -> i64 {
    let out = Command::new("date").args(["-u", "-d", rfc3339, "+%s"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or_else(|_| panic!("not a time: {rfc3339}"))
}
