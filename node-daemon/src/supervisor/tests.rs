//! One test per row of docs/behaviour.md#container-rules, on the fake runtime and tokio's paused clock.

use super::*;
use crate::runtime::fake::FakeRuntime;
use crate::runtime::{ContainerSpec, LABEL_MANAGED, LABEL_NODE, LABEL_REPLICA, LABEL_SPEC_ID};
use std::collections::BTreeMap;

const PREFIX: &str = "fleet";

fn spec(agent: &str, replica: u32, image: &str) -> ContainerSpec {
    let labels: BTreeMap<String, String> = [
        (LABEL_MANAGED, "1".to_string()),
        (LABEL_NODE, "w1".to_string()),
        (LABEL_AGENT, agent.to_string()),
        (LABEL_REPLICA, replica.to_string()),
        (LABEL_SPEC, format!("hash-{image}")),
        (LABEL_SPEC_ID, sid(image)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    ContainerSpec {
        name: container_name(PREFIX, agent, replica),
        image: image.into(),
        env: vec![],
        labels,
        binds: vec![],
        volume: None,
        nano_cpus: None,
        memory_bytes: None,
        network: None,
        hardening: Default::default(),
        note: None,
        lease_dir: None,
    }
}

fn run(agent: &str, replica: u32, image: &str) -> Wanted {
    Wanted {
        agent: agent.into(),
        replica,
        revision: 1,
        drain: Duration::from_secs(60),
        plan: Plan::Run(Box::new(spec(agent, replica, image))),
        spec_id: Some(sid(image)),
    }
}

/// The template name of a test image.
fn sid(image: &str) -> String {
    format!("{:08x}", image.bytes().fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b))))
}

fn drains(w: &[Wanted]) -> HashMap<String, Duration> {
    w.iter().map(|w| (w.agent.clone(), w.drain)).collect()
}

async fn tick(s: &mut Supervisor<FakeRuntime>, w: &[Wanted]) {
    s.tick(w, &drains(w), PREFIX).await.unwrap();
    settle().await;
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

fn state(s: &Supervisor<FakeRuntime>, w: &[Wanted]) -> ReplicaReport {
    s.reports(w).remove(0)
}

#[tokio::test(start_paused = true)]
async fn no_container_creates_and_starts() {
    let rt = FakeRuntime::default();
    let mut s = Supervisor::new(rt.clone());
    let w = vec![run("a", 0, "img:1")];
    tick(&mut s, &w).await;
    let c = rt.by_name("fleet-a-0").unwrap();
    assert!(c.running && c.starts == 1);
    let r = state(&s, &w);
    assert_eq!((r.state, r.restarts), (ReplicaState::Running, 0));
    tick(&mut s, &w).await;
    assert_eq!(rt.count("create"), 1, "a running replica is left alone");
}

#[tokio::test(start_paused = true)]
async fn new_revision_only_changes_nothing() {
    let rt = FakeRuntime::default();
    let mut s = Supervisor::new(rt.clone());
    let mut w = vec![run("a", 0, "img:1")];
    tick(&mut s, &w).await;
    let id = rt.by_name("fleet-a-0").unwrap().id;
    w[0].revision = 2;
    tick(&mut s, &w).await;
    assert_eq!(rt.by_name("fleet-a-0").unwrap().id, id);
    assert_eq!(rt.count("stop"), 0);
    assert_eq!(state(&s, &w).revision, 2);
}

#[tokio::test(start_paused = true)]
async fn changed_spec_drains_in_background_then_recreates() {
    let rt = FakeRuntime::default();
    let mut s = Supervisor::new(rt.clone());
    tick(&mut s, &[run("a", 0, "img:1")]).await;
    let old = rt.by_name("fleet-a-0").unwrap().id;
    rt.state.lock().containers.get_mut(&old).unwrap().ignores_term = true;
    let w = vec![run("a", 0, "img:2")];
    s.tick(&w, &drains(&w), PREFIX).await.unwrap();
    settle().await;
    assert_eq!(state(&s, &w).state, ReplicaState::Draining);
    assert!(rt.calls().contains(&format!("stop {old} 60s")), "stopped with the agent's drainSeconds: {:?}", rt.calls());
    tokio::time::advance(Duration::from_secs(30)).await;
    tick(&mut s, &w).await;
    assert_eq!(state(&s, &w).state, ReplicaState::Draining, "the name is taken while draining");
    assert_eq!(rt.count("create"), 1);
    tokio::time::advance(Duration::from_secs(31)).await;
    settle().await;
    tick(&mut s, &w).await;
    let new = rt.by_name("fleet-a-0").unwrap();
    assert_ne!(new.id, old);
    assert_eq!(new.spec.image, "img:2");
    assert_eq!(state(&s, &w).state, ReplicaState::Running);
}

#[tokio::test(start_paused = true)]
async fn exit_0_and_75_restart_at_once_at_most_every_10s() {
    let rt = FakeRuntime::default();
    let mut s = Supervisor::new(rt.clone());
    let w = vec![run("a", 0, "img:1")];
    tick(&mut s, &w).await;
    tokio::time::advance(Duration::from_secs(30)).await;
    rt.exit("fleet-a-0", 75);
    tick(&mut s, &w).await;
    let r = state(&s, &w);
    assert_eq!((r.state, r.restarts, r.last_exit_code), (ReplicaState::Running, 1, Some(75)), "restarted at once");
    assert_eq!(rt.by_name("fleet-a-0").unwrap().starts, 2, "the same container is started again");
    // Exiting again at once: the next start waits until 10 s after the last.
    tokio::time::advance(Duration::from_secs(1)).await;
    rt.exit("fleet-a-0", 0);
    tick(&mut s, &w).await;
    assert_eq!(state(&s, &w).state, ReplicaState::Starting);
    tokio::time::advance(Duration::from_secs(8)).await;
    tick(&mut s, &w).await;
    assert_eq!(state(&s, &w).restarts, 1, "not before 10 s");
    tokio::time::advance(Duration::from_secs(1)).await;
    tick(&mut s, &w).await;
    assert_eq!(state(&s, &w).restarts, 2);
    assert_eq!(state(&s, &w).state, ReplicaState::Running);
}

/// A container the Docker guard will not start again (its binds are not the guard's own
/// copies: made before the guard copied them) is removed and made anew, not retried forever.
#[tokio::test(start_paused = true)]
async fn a_container_the_guard_will_not_start_is_made_anew() {
    let rt = FakeRuntime::default();
    let mut s = Supervisor::new(rt.clone());
    let w = vec![run("a", 0, "img:1")];
    tick(&mut s, &w).await;
    let old = rt.by_name("fleet-a-0").unwrap().id;
    tokio::time::advance(Duration::from_secs(30)).await;
    rt.exit("fleet-a-0", 75);
    rt.state.lock().fail_start = Some(format!(
        "docker-guard: container {old} binds \"/var/lib/fleet-node/agents/a/agent-pat\", which {}: remove it",
        crate::runtime::NOT_THE_GUARDS_FILES
    ));
    tick(&mut s, &w).await;
    assert!(rt.by_name("fleet-a-0").is_none(), "removed, not retried");
    rt.state.lock().fail_start = None;
    tick(&mut s, &w).await;
    let new = rt.by_name("fleet-a-0").expect("made anew");
    assert_ne!(new.id, old);
    assert_eq!(state(&s, &w).state, ReplicaState::Running);
}

/// Ticks every second until the replica restarts; returns how long that took.
async fn time_to_restart(s: &mut Supervisor<FakeRuntime>, w: &[Wanted]) -> u64 {
    let before = state(s, w).restarts;
    for secs in 1..=400 {
        tokio::time::advance(Duration::from_secs(1)).await;
        tick(s, w).await;
        if state(s, w).restarts > before {
            return secs;
        }
    }
    panic!("no restart within 400 s");
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_5_10_20_to_300_and_crashloop_after_three() {
    let rt = FakeRuntime::default();
    let mut s = Supervisor::new(rt.clone());
    let w = vec![run("a", 0, "img:1")];
    tick(&mut s, &w).await;
    let mut waits = vec![];
    let mut states = vec![];
    for _ in 0..8 {
        rt.exit("fleet-a-0", 1);
        tick(&mut s, &w).await;
        states.push(state(&s, &w).state);
        waits.push(time_to_restart(&mut s, &w).await);
    }
    assert_eq!(waits, vec![5, 10, 20, 40, 80, 160, 300, 300]);
    assert_eq!(&states[..3], &[ReplicaState::Starting, ReplicaState::Starting, ReplicaState::Crashloop]);
    let r = state(&s, &w);
    assert_eq!(r.state, ReplicaState::Crashloop, "crashloop persists while it keeps failing");
    assert_eq!((r.restarts, r.last_exit_code), (8, Some(1)));
    assert_eq!(r.message.as_deref(), Some("exited with code 1"));
    assert_eq!(rt.count("create"), 1, "restarts reuse the container");
}

#[tokio::test(start_paused = true)]
async fn a_10_minute_run_or_an_exit_75_clears_crashloop() {
    let rt = FakeRuntime::default();
    let mut s = Supervisor::new(rt.clone());
    let w = vec![run("a", 0, "img:1")];
    tick(&mut s, &w).await;
    for _ in 0..3 {
        rt.exit("fleet-a-0", 2);
        tick(&mut s, &w).await;
        time_to_restart(&mut s, &w).await;
    }
    assert_eq!(state(&s, &w).state, ReplicaState::Crashloop);
    tokio::time::advance(Duration::from_secs(600)).await;
    tick(&mut s, &w).await;
    assert_eq!(state(&s, &w).state, ReplicaState::Running, "a 10-minute run resets the count");
    rt.exit("fleet-a-0", 2);
    tick(&mut s, &w).await;
    assert_eq!(time_to_restart(&mut s, &w).await, 5, "the count starts over");
    for _ in 0..2 {
        rt.exit("fleet-a-0", 2);
        tick(&mut s, &w).await;
        time_to_restart(&mut s, &w).await;
    }
    assert_eq!(state(&s, &w).state, ReplicaState::Crashloop);
    tokio::time::advance(Duration::from_secs(11)).await;
    rt.exit("fleet-a-0", 75);
    tick(&mut s, &w).await;
    let r = state(&s, &w);
    assert_eq!((r.state, r.message), (ReplicaState::Running, None), "exit 75 clears crashloop and restarts at once");
}

#[tokio::test(start_paused = true)]
async fn refusals_cost_nothing_however_often_repeated() {
    let rt = FakeRuntime::default();
    let mut s = Supervisor::new(rt.clone());
    let msg = "image_not_allowed: image evil:1 is not allowed for executor kind k".to_string();
    let w = vec![Wanted { plan: Plan::Refuse(msg.clone()), ..run("a", 0, "evil:1") }];
    for _ in 0..50 {
        tick(&mut s, &w).await;
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    let r = state(&s, &w);
    assert_eq!((r.state, r.restarts, r.message), (ReplicaState::Stopped, 0, Some(msg)));
    assert!(rt.calls().is_empty(), "no Docker call at all: {:?}", rt.calls());
}

#[tokio::test(start_paused = true)]
async fn a_running_container_whose_image_became_disallowed_is_drained() {
    let rt = FakeRuntime::default();
    let mut s = Supervisor::new(rt.clone());
    tick(&mut s, &[run("a", 0, "img:1")]).await;
    let id = rt.by_name("fleet-a-0").unwrap().id;
    let msg = "image_not_allowed: image img:1 is not allowed for executor kind k".to_string();
    let w = vec![Wanted { plan: Plan::Refuse(msg.clone()), ..run("a", 0, "img:1") }];
    tick(&mut s, &w).await;
    assert!(rt.calls().contains(&format!("stop {id} 60s")), "{:?}", rt.calls());
    assert!(rt.by_name("fleet-a-0").is_none(), "removed");
    assert_eq!(state(&s, &w).state, ReplicaState::Stopped);
    assert_eq!(state(&s, &w).message, Some(msg));
}

#[tokio::test(start_paused = true)]
async fn start_failures_back_off_then_crashloop_and_a_new_spec_is_tried_at_once() {
    let rt = FakeRuntime::default();
    rt.state.lock().fail_create = Some("No such image: img:1".into());
    let mut s = Supervisor::new(rt.clone());
    let w = vec![run("a", 0, "img:1")];
    tick(&mut s, &w).await;
    let r = state(&s, &w);
    assert_eq!((r.state, r.message.as_deref()), (ReplicaState::Starting, Some("start failed: No such image: img:1")));
    let mut gaps = vec![];
    let mut last = rt.count("create");
    let mut t = 0;
    while gaps.len() < 3 {
        tokio::time::advance(Duration::from_secs(1)).await;
        t += 1;
        tick(&mut s, &w).await;
        if rt.count("create") > last {
            gaps.push(t);
            t = 0;
            last = rt.count("create");
        }
    }
    assert_eq!(gaps, vec![5, 10, 20]);
    assert_eq!(state(&s, &w).state, ReplicaState::Crashloop);
    assert!(state(&s, &w).message.unwrap().starts_with("start failed: "));
    // Another image is tried at once.
    rt.state.lock().fail_create = None;
    let w2 = vec![run("a", 0, "img:2")];
    tick(&mut s, &w2).await;
    assert_eq!(state(&s, &w2).state, ReplicaState::Running);
}

#[tokio::test(start_paused = true)]
async fn unwanted_replicas_stop_with_drain_and_vanished_agents_with_30s() {
    let rt = FakeRuntime::default();
    let mut s = Supervisor::new(rt.clone());
    let all = vec![run("a", 0, "img:1"), run("a", 1, "img:1"), run("b", 0, "img:1")];
    tick(&mut s, &all).await;
    let a1 = rt.by_name("fleet-a-1").unwrap().id;
    let b0 = rt.by_name("fleet-b-0").unwrap().id;
    // a lowered to one replica, b gone entirely.
    let w = vec![run("a", 0, "img:1")];
    tick(&mut s, &w).await;
    let calls = rt.calls();
    assert!(calls.contains(&format!("stop {a1} 60s")), "lowered: the agent's drain: {calls:?}");
    assert!(calls.contains(&format!("stop {b0} 30s")), "vanished: 30 s: {calls:?}");
    assert!(rt.by_name("fleet-a-1").is_none() && rt.by_name("fleet-b-0").is_none());
    assert_eq!(s.reports(&w).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_restarted_node_adopts_its_running_containers() {
    let rt = FakeRuntime::default();
    let w = vec![run("a", 0, "img:1")];
    let mut first = Supervisor::new(rt.clone());
    tick(&mut first, &w).await;
    let id = rt.by_name("fleet-a-0").unwrap().id;
    drop(first);
    let mut second = Supervisor::new(rt.clone());
    tick(&mut second, &w).await;
    assert_eq!(rt.by_name("fleet-a-0").unwrap().id, id);
    assert_eq!(rt.count("create"), 1);
    assert_eq!(rt.count("stop"), 0);
    assert_eq!(state(&second, &w).state, ReplicaState::Running);
}

#[tokio::test(start_paused = true)]
async fn docker_unreachable_is_an_error_for_health() {
    let rt = FakeRuntime::default();
    rt.state.lock().down = true;
    let mut s = Supervisor::new(rt.clone());
    let w = vec![run("a", 0, "img:1")];
    assert!(matches!(s.tick(&w, &drains(&w), PREFIX).await, Err(RtError::Unreachable(_))));
}

#[test]
fn backoff_sequence() {
    let b: Vec<u64> = (1..=8).map(|f| backoff(f).as_secs()).collect();
    assert_eq!(b, vec![5, 10, 20, 40, 80, 160, 300, 300]);
}

#[tokio::test(start_paused = true)]
async fn containers_outside_the_prefix_are_never_touched() {
    let rt = FakeRuntime::default();
    let mut foreign = spec("a", 0, "img:1");
    foreign.name = "otherfleet-a-0".into();
    let id = rt.create(&foreign).await.unwrap();
    rt.start(&id).await.unwrap();
    let mut s = Supervisor::new(rt.clone());
    tick(&mut s, &[]).await;
    assert_eq!(rt.count("stop"), 0, "{:?}", rt.calls());
    assert!(rt.by_name("otherfleet-a-0").unwrap().running);
}

/// docs/behaviour.md#hardening: a replica message is cut to 4,096 bytes, never inside a character.
#[test]
fn messages_are_cut_to_4096_bytes_on_a_character_boundary() {
    assert_eq!(cut_message("short".into()), "short");
    let long = "é".repeat(3000); // 6,000 bytes, two per character
    let cut = cut_message(long);
    assert_eq!(cut.len(), 4096);
    assert!(cut.chars().all(|c| c == 'é'));
    let odd = format!("a{}", "é".repeat(3000)); // the boundary falls inside a character
    let cut = cut_message(odd);
    assert_eq!(cut.len(), 4095);
}

/// docs/behaviour.md#rolling-out-a-change: a replica reports the template of the container
/// that runs now — the old one while it drains, the new one once it runs.
#[tokio::test(start_paused = true)]
async fn a_replica_reports_the_template_its_container_runs() {
    let rt = FakeRuntime::default();
    let mut s = Supervisor::new(rt.clone());
    let w1 = vec![run("a", 0, "img:1")];
    tick(&mut s, &w1).await;
    assert_eq!(state(&s, &w1).spec_id, Some(sid("img:1")));
    let old = rt.by_name("fleet-a-0").unwrap().id;
    rt.state.lock().containers.get_mut(&old).unwrap().ignores_term = true;
    let w2 = vec![run("a", 0, "img:2")];
    tick(&mut s, &w2).await;
    assert_eq!((state(&s, &w2).state, state(&s, &w2).spec_id), (ReplicaState::Draining, Some(sid("img:1"))));
    tokio::time::advance(Duration::from_secs(61)).await;
    settle().await;
    tick(&mut s, &w2).await;
    assert_eq!((state(&s, &w2).state, state(&s, &w2).spec_id), (ReplicaState::Running, Some(sid("img:2"))));
}

/// checkBeforeStop: an image the engine does not have stops nothing; the replica runs the old
/// template and says why with the engine's words; once the image is there the update goes on.
#[tokio::test(start_paused = true)]
async fn check_before_stop_keeps_the_old_container_while_the_new_image_is_missing() {
    let rt = FakeRuntime::default();
    rt.state.lock().missing_images.push("img:2".into());
    let mut s = Supervisor::new(rt.clone()).checking_before_stop(true);
    tick(&mut s, &[run("a", 0, "img:1")]).await;
    let old = rt.by_name("fleet-a-0").unwrap().id;
    let w = vec![run("a", 0, "img:2")];
    for _ in 0..3 {
        tick(&mut s, &w).await;
        tokio::time::advance(Duration::from_secs(5)).await;
    }
    assert_eq!(rt.count("stop"), 0, "{:?}", rt.calls());
    let r = state(&s, &w);
    assert_eq!(r.state, ReplicaState::Running);
    assert_eq!(r.message.as_deref(), Some("update_blocked: No such image: img:2"));
    assert_eq!(r.spec_id, Some(sid("img:1")));
    rt.state.lock().missing_images.clear();
    tick(&mut s, &w).await;
    assert!(rt.calls().contains(&format!("stop {old} 60s")), "{:?}", rt.calls());
    tick(&mut s, &w).await;
    assert_eq!(rt.by_name("fleet-a-0").unwrap().spec.image, "img:2");
}

/// checkBeforeStop: a new template the node refuses (here a kind's allow-list) keeps the old
/// container; the seed's rule (the default) drains it.
#[tokio::test(start_paused = true)]
async fn check_before_stop_keeps_the_old_container_when_the_new_template_is_refused() {
    let msg = "image_not_allowed: image img:9 is not allowed for executor kind k".to_string();
    for check in [true, false] {
        let rt = FakeRuntime::default();
        let mut s = Supervisor::new(rt.clone()).checking_before_stop(check);
        tick(&mut s, &[run("a", 0, "img:1")]).await;
        let w = vec![Wanted { plan: Plan::Refuse(msg.clone()), spec_id: Some(sid("img:9")), ..run("a", 0, "img:1") }];
        tick(&mut s, &w).await;
        let r = state(&s, &w);
        if check {
            assert_eq!(rt.count("stop"), 0, "{:?}", rt.calls());
            assert_eq!(r.state, ReplicaState::Running);
            assert_eq!(r.message, Some(format!("update_blocked: {msg}")));
        } else {
            assert_eq!(rt.count("stop"), 1, "{:?}", rt.calls());
            assert_eq!((r.state, r.message), (ReplicaState::Stopped, Some(msg.clone())));
        }
    }
}

/// A replica with a lease directory under `dir` (docs/behaviour.md#busy-replicas).
fn leased(dir: &std::path::Path, agent: &str, replica: u32, image: &str) -> Wanted {
    let mut w = run(agent, replica, image);
    if let Plan::Run(spec) = &mut w.plan {
        spec.lease_dir = Some(dir.join("leases").join(&spec.name).display().to_string());
    }
    w
}

fn with_leases(rt: FakeRuntime, dir: &std::path::Path) -> Supervisor<FakeRuntime> {
    let leases = crate::lease::Leases::new(dir, dir);
    Supervisor::new(rt).with_leases(LeaseReader::new(leases, "unix:///nowhere"))
}

fn write_lease(dir: &std::path::Path, name: &str, text: &str) {
    std::fs::write(dir.join("leases").join(name).join(crate::lease::FILE), text).unwrap();
}

fn in_a_minute() -> i64 {
    SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64 + 60
}

#[tokio::test(start_paused = true)]
async fn a_running_replica_reports_its_lease_until_it_says_idle() {
    let t = tempfile::tempdir().unwrap();
    let rt = FakeRuntime::default();
    let mut s = with_leases(rt.clone(), t.path());
    let w = vec![leased(t.path(), "a", 0, "img:1")];
    tick(&mut s, &w).await;
    assert_eq!(state(&s, &w).busy_until, None, "a new container starts idle");
    let until = in_a_minute();
    write_lease(t.path(), "fleet-a-0", &format!("{until}\n"));
    tick(&mut s, &w).await;
    assert_eq!(state(&s, &w).busy_until, Some(crate::lease::rfc3339(until)));
    write_lease(t.path(), "fleet-a-0", "");
    tick(&mut s, &w).await;
    assert_eq!(state(&s, &w).busy_until, None, "written empty: idle");
}

#[tokio::test(start_paused = true)]
async fn a_replica_not_running_is_never_busy_and_a_restart_forgets_the_last_run_s_lease() {
    let t = tempfile::tempdir().unwrap();
    let rt = FakeRuntime::default();
    let mut s = with_leases(rt.clone(), t.path());
    let w = vec![leased(t.path(), "a", 0, "img:1")];
    tick(&mut s, &w).await;
    write_lease(t.path(), "fleet-a-0", &in_a_minute().to_string());
    tick(&mut s, &w).await;
    assert!(state(&s, &w).busy_until.is_some());
    rt.exit("fleet-a-0", 1);
    tick(&mut s, &w).await;
    let r = state(&s, &w);
    assert_eq!((r.state, r.busy_until), (ReplicaState::Starting, None), "exited: not busy");
    // The file was written in the run that ended: the next run does not inherit it.
    let file = t.path().join("leases/fleet-a-0").join(crate::lease::FILE);
    let past = SystemTime::now() - Duration::from_secs(30);
    std::fs::File::options().write(true).open(&file).unwrap().set_modified(past).unwrap();
    tokio::time::advance(backoff(1)).await;
    tick(&mut s, &w).await;
    tick(&mut s, &w).await;
    let r = state(&s, &w);
    assert_eq!((r.state, r.restarts, r.busy_until), (ReplicaState::Running, 1, None));
}

#[tokio::test(start_paused = true)]
async fn a_lease_goes_with_its_container() {
    let t = tempfile::tempdir().unwrap();
    let rt = FakeRuntime::default();
    let mut s = with_leases(rt.clone(), t.path());
    tick(&mut s, &[leased(t.path(), "a", 0, "img:1")]).await;
    write_lease(t.path(), "fleet-a-0", &in_a_minute().to_string());
    // A new template: the container is made anew, with a fresh, empty directory.
    let w = vec![leased(t.path(), "a", 0, "img:2")];
    tick(&mut s, &w).await;
    tick(&mut s, &w).await;
    assert_eq!(rt.by_name("fleet-a-0").unwrap().spec.image, "img:2");
    assert_eq!(state(&s, &w).busy_until, None);
    assert!(!t.path().join("leases/fleet-a-0").join(crate::lease::FILE).exists());
    // No longer wanted: once the container is gone, so is its directory.
    write_lease(t.path(), "fleet-a-0", &in_a_minute().to_string());
    tick(&mut s, &[]).await;
    tick(&mut s, &[]).await;
    assert!(rt.by_name("fleet-a-0").is_none());
    assert!(!t.path().join("leases/fleet-a-0").exists());
}
