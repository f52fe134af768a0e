//! Nodes that apply their desired states as fleet-node does, over the node protocol: a
//! replica whose template or PAT changed is recreated — `starting` for [`START`], then
//! `running` — or `crashloop` when its image is one the test calls bad, each reported with its
//! `specId`.

use super::TestNode;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What a simulated node runs: (agent, replica) → (`specId#credentialId`, image, state,
/// revision).
pub type Running = Arc<Mutex<BTreeMap<(String, u32), (String, String, String, u64)>>>;

/// A node that applies its desired states like fleet-node: a replica whose template changed is
/// `starting` for `START` and then `running` (or `crashloop` when its image is bad).
pub struct SimNode {
    pub running: Running,
    pub task: tokio::task::JoinHandle<()>,
    /// The images it crash-loops.
    pub bad: Arc<Mutex<HashSet<String>>>,
    /// Desired states it was served with a generation older than one it had: none may be.
    pub backwards: Arc<AtomicU64>,
}

pub const START: Duration = Duration::from_millis(300);

impl SimNode {
    pub fn start(node: TestNode, bad: Arc<Mutex<HashSet<String>>>) -> SimNode {
        Self::start_paced(node, bad, Duration::from_millis(100))
    }

    /// Asking for its desired state and reporting every `period`; a request that takes more
    /// than two seconds is given up, as fleet-node's would be.
    pub fn start_paced(node: TestNode, bad: Arc<Mutex<HashSet<String>>>, period: Duration) -> SimNode {
        let running: Running = Default::default();
        let backwards = Arc::new(AtomicU64::new(0));
        let (r, crashing, older) = (running.clone(), bad.clone(), backwards.clone());
        let task = tokio::spawn(async move {
            let mut generation = None;
            let mut desired = Value::Null;
            loop {
                let asked = tokio::time::timeout(Duration::from_secs(2), node.try_desired(generation, 0)).await;
                if let Ok(Some((s, v))) = asked {
                    let g = v["generation"].as_u64();
                    if s == 200 && g < generation {
                        older.fetch_add(1, Ordering::Relaxed);
                    } else if s == 200 && g.is_some() {
                        generation = g;
                        desired = v;
                    }
                }
                let bad_now = bad.lock().clone();
                apply(&r, &desired, &bad_now).await;
                let replicas: Vec<Value> = r
                    .lock()
                    .iter()
                    .map(|((a, i), (spec, _, state, rev))| {
                        let spec = spec.split('#').next().unwrap_or_default();
                        json!({"agentKey": a, "replica": i, "state": state, "revision": rev, "restarts": 0,
                               "specId": spec, "message": if state == "crashloop" { json!("exited with code 1") } else { Value::Null }})
                    })
                    .collect();
                let mut body = node.report_body(&[]);
                body["replicas"] = json!(replicas);
                body["appliedGeneration"] = json!(generation.unwrap_or(0));
                let _ = tokio::time::timeout(Duration::from_secs(2), node.try_put_observed(&body)).await;
                tokio::time::sleep(period).await;
            }
        });
        SimNode { running, task, bad: crashing, backwards }
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

/// One step of a node's replicas toward its desired state.
async fn apply(running: &Running, desired: &Value, bad: &HashSet<String>) {
    let Some(agents) = desired["agents"].as_array() else { return };
    let mut wanted = HashSet::new();
    let mut starting = Vec::new();
    {
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
                let e =
                    r.entry((key.clone(), i)).or_insert_with(|| (String::new(), String::new(), "starting".into(), rev));
                e.3 = rev;
                if e.0 != spec {
                    *e = (spec.clone(), image.clone(), "starting".into(), rev);
                    starting.push((key.clone(), i, image.clone()));
                }
            }
        }
        r.retain(|k, _| wanted.contains(k));
    }
    if starting.is_empty() {
        return;
    }
    tokio::time::sleep(START).await;
    let mut r = running.lock();
    for (key, i, image) in starting {
        if let Some(e) = r.get_mut(&(key, i)) {
            e.2 = if bad.contains(&image) { "crashloop".into() } else { "running".into() };
        }
    }
}
