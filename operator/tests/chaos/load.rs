//! What streams in while the faults hit: an admin's writes through the Service, and the CP's
//! changes to its agents. The writes that were acknowledged are kept, to be found again.

use crate::world::{Want, Wanted};
use fleet_devkit::Devkit;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Whether the writes and changes flow now, and whether they are over.
#[derive(Clone)]
pub struct Flow {
    pub quiet: Arc<AtomicBool>,
    pub stop: Arc<AtomicBool>,
}

impl Default for Flow {
    fn default() -> Flow {
        Flow { quiet: Arc::new(AtomicBool::new(true)), stop: Arc::new(AtomicBool::new(false)) }
    }
}

impl Flow {
    /// Waits `every` and then while quiet; false once stopped.
    async fn next(&self, every: Duration) -> bool {
        tokio::time::sleep(every).await;
        while self.quiet.load(Ordering::SeqCst) && !self.stop.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        !self.stop.load(Ordering::SeqCst)
    }
}

/// A node's lifecycle as the last acknowledged write left it; `Unknown` after a write that
/// got no answer (it may or may not have been applied).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    Schedulable,
    Cordoned,
    Draining,
    Unknown,
}

/// The admin's acknowledged writes.
#[derive(Default)]
pub struct Written {
    pub join_keys: Vec<String>,
    pub nodes: BTreeMap<String, Lifecycle>,
    pub acknowledged: usize,
    pub unanswered: usize,
}

/// Every 700 ms while `flow` flows: a join key, or a cordon, uncordon or drain of one of `nodes`.
pub async fn admin_writes(url: String, token: String, nodes: Vec<String>, seed: u64, flow: Flow) -> Written {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xad41);
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let mut w = Written::default();
    while flow.next(Duration::from_millis(700)).await {
        if rng.gen_bool(0.3) {
            let body = json!({"ttlSeconds": 86400, "note": "fault suite"});
            match post(&http, &token, format!("{url}/api/v1/join-keys"), body).await {
                Some((201, v)) => {
                    w.join_keys.push(v["joinKey"].as_str().unwrap_or_default().to_string());
                    w.acknowledged += 1;
                }
                Some(_) => {}
                None => w.unanswered += 1,
            }
            continue;
        }
        let node = nodes[rng.gen_range(0..nodes.len())].clone();
        let now = w.nodes.get(&node).copied().unwrap_or(Lifecycle::Schedulable);
        let (op, then) = next_op(now, &mut rng);
        match post(&http, &token, format!("{url}/api/v1/nodes/{node}:{op}"), json!({})).await {
            Some((200 | 202, _)) => {
                w.nodes.insert(node, then);
                w.acknowledged += 1;
            }
            // Refused (503 while no replica leads): not applied.
            Some((s, _)) if s < 500 || s == 503 => {}
            _ => {
                w.nodes.insert(node, Lifecycle::Unknown);
                w.unanswered += 1;
            }
        }
    }
    w
}

/// A write whose result is defined from `now`, and that result.
fn next_op(now: Lifecycle, rng: &mut StdRng) -> (&'static str, Lifecycle) {
    match now {
        Lifecycle::Unknown | Lifecycle::Draining => ("uncordon", Lifecycle::Schedulable),
        Lifecycle::Schedulable | Lifecycle::Cordoned if rng.gen_bool(0.3) => ("drain", Lifecycle::Draining),
        Lifecycle::Schedulable => ("cordon", Lifecycle::Cordoned),
        Lifecycle::Cordoned => ("uncordon", Lifecycle::Schedulable),
    }
}

/// (status, body), or `None` when no answer came.
async fn post(http: &reqwest::Client, token: &str, url: String, body: Value) -> Option<(u16, Value)> {
    let r = http.post(url).bearer_auth(token).json(&body).send().await.ok()?;
    let s = r.status().as_u16();
    Some((s, r.json().await.unwrap_or(Value::Null)))
}

/// Every 1.5 s while `flow` flows: one agent's replicas (1–3) or image changes, at a new revision.
pub async fn cp_changes(dk: Devkit, wanted: Wanted, seed: u64, flow: Flow) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xc9);
    while flow.next(Duration::from_millis(1500)).await {
        let mut all = wanted.lock();
        let keys: Vec<String> = all.keys().cloned().collect();
        let key = &keys[rng.gen_range(0..keys.len())];
        let w = all.get_mut(key).unwrap();
        *w = changed(w, &mut rng);
        let w = w.clone();
        dk.edit_agent(key, |a| {
            a["revision"] = json!(w.revision);
            a["placement"]["replicas"] = json!(w.replicas);
            a["executor"]["image"] = json!(w.image);
        });
    }
}

fn changed(w: &Want, rng: &mut StdRng) -> Want {
    let mut next = Want { revision: w.revision + 1, ..w.clone() };
    if rng.gen_bool(0.5) {
        next.replicas = rng.gen_range(1..=3);
    } else {
        let v: u64 = w.image.trim_start_matches("agent:").parse().unwrap_or(1);
        next.image = format!("agent:{}", v + 1);
    }
    next
}
