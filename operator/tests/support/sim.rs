//! Nodes that apply their desired states as fleet-node does, over the node protocol: a
//! replica whose template or PAT changed is recreated — `starting` for [`START`] (or as long
//! as the test says), then `running` — or `crashloop` when its image is one the test calls
//! bad, each state reported with its `specId`.

use super::TestNode;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a simulated node runs: (agent, replica) → (`specId#credentialId`, image, state,
/// revision).
pub type Running = Arc<Mutex<BTreeMap<(String, u32), (String, String, String, u64)>>>;

/// A node that applies its desired states like fleet-node: a replica whose template changed is
/// `starting` for `START` and then `running` (or `crashloop` when its image is bad), and it
/// reports either.
pub struct SimNode {
    pub running: Running,
    pub task: tokio::task::JoinHandle<()>,
    /// The images it crash-loops.
    pub bad: Arc<Mutex<HashSet<String>>>,
    /// Desired states it was served with a generation older than one it had: none may be.
    pub backwards: Arc<AtomicU64>,
    /// Every container it created, in order: (agent, replica, `specId#credentialId`).
    pub history: History,
    /// Set: the node's process is gone (it asks and reports nothing); its containers run on.
    pub off: Arc<std::sync::atomic::AtomicBool>,
    /// The refusals its desired-state requests got: (status, body).
    pub refusals: Arc<Mutex<Vec<(u16, Value)>>>,
    /// The generation it has.
    pub generation: Arc<AtomicU64>,
    /// Replicas busy until then (RFC 3339), as their containers say (docs/behaviour.md#busy-replicas);
    /// reported while they run, forgotten when their container is recreated.
    pub busy: Busy,
}

/// (agent, replica) → until when it says it is busy.
pub type Busy = Arc<Mutex<BTreeMap<(String, u32), String>>>;

/// The containers a simulated node created: (agent, replica, `specId#credentialId`).
pub type History = Arc<Mutex<Vec<(String, u32, String)>>>;

pub const START: Duration = Duration::from_millis(300);
/// How often a node asks for its desired state and reports, unless the test says.
pub const PERIOD: Duration = Duration::from_millis(100);

impl SimNode {
    pub fn start(node: TestNode, bad: Arc<Mutex<HashSet<String>>>) -> SimNode {
        Self::start_paced(node, bad, PERIOD)
    }

    /// Asking for its desired state and reporting every `period`; a request that takes more
    /// than two seconds is given up, as fleet-node's would be.
    pub fn start_paced(node: TestNode, bad: Arc<Mutex<HashSet<String>>>, period: Duration) -> SimNode {
        Self::start_with(node, bad, period, START)
    }

    /// As [`SimNode::start_paced`], its containers taking `start` to come up.
    pub fn start_with(node: TestNode, bad: Arc<Mutex<HashSet<String>>>, period: Duration, start: Duration) -> SimNode {
        let running: Running = Default::default();
        let backwards = Arc::new(AtomicU64::new(0));
        let (history, off, refusals, has): (History, Arc<std::sync::atomic::AtomicBool>, _, _) =
            (Default::default(), Default::default(), Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicU64::new(0)));
        let (r, crashing, older) = (running.clone(), bad.clone(), backwards.clone());
        let (made, gone, refused, held) = (history.clone(), off.clone(), refusals.clone(), has.clone());
        let busy: Busy = Default::default();
        let leases = busy.clone();
        let task = tokio::spawn(async move {
            let mut generation = None;
            let mut desired = Value::Null;
            // Containers coming up: (when they are up, agent, replica, `specId#credentialId`).
            let mut coming: Vec<(Instant, String, u32, String)> = Vec::new();
            loop {
                if gone.load(Ordering::Relaxed) {
                    tokio::time::sleep(period).await;
                    continue;
                }
                let asked = tokio::time::timeout(Duration::from_secs(2), node.try_desired(generation, 0)).await;
                if let Ok(Some((s, v))) = asked {
                    let g = v["generation"].as_u64();
                    if s == 200 && g < generation {
                        older.fetch_add(1, Ordering::Relaxed);
                    } else if s == 200 && g.is_some() {
                        generation = g;
                        held.store(g.unwrap_or(0), Ordering::Relaxed);
                        desired = v;
                    } else if s != 200 && s != 304 {
                        refused.lock().push((s.as_u16(), v));
                    }
                }
                let up_at = Instant::now() + start;
                let started = apply(&r, &desired);
                // A lease does not survive its container.
                started.iter().for_each(|(a, i, _)| drop(leases.lock().remove(&(a.clone(), *i))));
                made.lock().extend(started.iter().cloned());
                coming.extend(started.into_iter().map(|(a, i, spec)| (up_at, a, i, spec)));
                come_up(&r, &mut coming, &bad.lock());
                report(&node, &r, &leases, generation).await;
                // As fleet-node reports a container once it is up, not a period later.
                let next =
                    coming.iter().map(|c| c.0).min().map_or(period, |t| t.saturating_duration_since(Instant::now()));
                tokio::time::sleep(next.min(period)).await;
            }
        });
        SimNode { running, task, bad: crashing, backwards, history, off, refusals, generation: has, busy }
    }

    /// Replicas not running now.
    pub fn down(&self) -> usize {
        self.running.lock().values().filter(|v| v.2 != "running").count()
    }

    pub fn images(&self) -> Vec<String> {
        self.running.lock().values().map(|v| v.1.clone()).collect()
    }
}

impl Drop for SimNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One step of a node's replicas toward its desired state: those whose template or PAT
/// changed are `starting`, and returned (agent, replica, `specId#credentialId`).
fn apply(running: &Running, desired: &Value) -> Vec<(String, u32, String)> {
    let Some(agents) = desired["agents"].as_array() else { return Vec::new() };
    let mut wanted = HashSet::new();
    let mut starting = Vec::new();
    let mut r = running.lock();
    for a in agents {
        let key = a["agentKey"].as_str().unwrap().to_string();
        let cred = a["identity"]["credential"]["credentialId"].as_str().unwrap_or_default();
        // What recreates the container: its template, or a new PAT.
        let spec = format!("{}#{cred}", a["specId"].as_str().unwrap_or_default());
        let image = a["executor"]["image"].as_str().unwrap_or_default().to_string();
        let rev = a["revision"].as_u64().unwrap();
        for i in a["replicaIndexes"].as_array().unwrap() {
            let i = i.as_u64().unwrap() as u32;
            wanted.insert((key.clone(), i));
            let e = r.entry((key.clone(), i)).or_insert_with(|| (String::new(), String::new(), "starting".into(), rev));
            e.3 = rev;
            if e.0 != spec {
                *e = (spec.clone(), image.clone(), "starting".into(), rev);
                starting.push((key.clone(), i, spec.clone()));
            }
        }
    }
    r.retain(|k, _| wanted.contains(k));
    starting
}

/// The containers whose start is over run — or crash-loop, their image being bad — unless
/// they were recreated or removed since.
fn come_up(running: &Running, coming: &mut Vec<(Instant, String, u32, String)>, bad: &HashSet<String>) {
    let now = Instant::now();
    let mut r = running.lock();
    coming.retain(|(at, key, i, spec)| {
        if *at > now {
            return true;
        }
        if let Some(e) = r.get_mut(&(key.clone(), *i)).filter(|e| e.0 == *spec) {
            e.2 = if bad.contains(&e.1) { "crashloop".into() } else { "running".into() };
        }
        false
    });
}

/// Reports what runs, with the generation applied.
async fn report(node: &TestNode, running: &Running, busy: &Busy, generation: Option<u64>) {
    let leases = busy.lock().clone();
    let replicas: Vec<Value> = running
        .lock()
        .iter()
        .map(|((a, i), (spec, _, state, rev))| {
            let spec = spec.split('#').next().unwrap_or_default();
            let message = if state == "crashloop" { json!("exited with code 1") } else { Value::Null };
            let busy = leases.get(&(a.clone(), *i)).filter(|_| state == "running");
            let mut r = json!({"agentKey": a, "replica": i, "state": state, "revision": rev, "restarts": 0,
                               "specId": spec, "message": message});
            // Left out when idle, as fleet-node does: an older controller refuses the field.
            if let Some(until) = busy {
                r["busyUntil"] = json!(until);
            }
            r
        })
        .collect();
    let mut body = node.report_body(&[]);
    body["replicas"] = json!(replicas);
    body["appliedGeneration"] = json!(generation.unwrap_or(0));
    let _ = tokio::time::timeout(Duration::from_secs(2), node.try_put_observed(&body)).await;
}
