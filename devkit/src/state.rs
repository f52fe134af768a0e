//! devkit's in-memory state: agents, statuses and identities (CP side); principals, PATs and
//! service tokens (IAM side); faults.

use crate::DevkitConfig;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Faults {
    /// IAM answers every call with 503.
    pub iam_down: bool,
    /// IAM refuses principal and PAT creation with 403 (service account lacks `iam:agents`).
    pub iam_forbidden: bool,
    /// The CP answers every call with 503.
    pub cp_down: bool,
    /// Added to every CP and IAM answer.
    pub latency_ms: u64,
    /// The JWKS answers 503.
    pub jwks_down: bool,
    /// The JWKS answers an empty key list.
    pub jwks_empty: bool,
    /// A new PAT is recorded at once but answered this much later (a crash in between
    /// leaves a PAT the controller never stored).
    pub pat_answer_delay_ms: u64,
    /// IAM grants PATs this lifetime whatever was asked (IAM may cap lifetimes).
    pub pat_lifetime_seconds: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PatRecord {
    pub id: String,
    pub principal_id: String,
    pub agent_key: Option<String>,
    pub token: String,
    pub audiences: Vec<String>,
    pub scope_ceiling: Vec<String>,
    pub expires_at: String,
    pub expires_in_seconds: u64,
    pub description: String,
    pub idempotency_key: String,
    pub revoked: bool,
}

pub struct DevState {
    pub agents: BTreeMap<String, serde_json::Value>,
    /// Each agent as served, kept beside `agents` by the methods that change it: pages are
    /// copied from here instead of serialising 20,000 agents per list read.
    pub agents_json: BTreeMap<String, Box<serde_json::value::RawValue>>,
    /// Bumped on every agent change; the list's ETag.
    pub version: u64,
    /// When a list version was first served (first page, 200): the earliest moment the
    /// controller could know of a change. The simulator measures wake latency from here.
    pub version_served_at: HashMap<u64, std::time::Instant>,
    /// When the last page of each list version was first served (the reader has it all).
    pub version_listed_at: HashMap<u64, std::time::Instant>,
    pub statuses: HashMap<String, Vec<serde_json::Value>>,
    pub identities: HashMap<String, serde_json::Value>,
    /// Idempotency key → principal id.
    pub principals: HashMap<String, String>,
    pub principal_agent: HashMap<String, String>,
    pub pats: Vec<PatRecord>,
    pub pat_by_key: HashMap<String, usize>,
    /// Service access token → (audience, expiry unix seconds).
    pub service_tokens: HashMap<String, (String, i64)>,
    pub faults: Faults,
    /// IAM's cap on agent PAT lifetime.
    pub max_ttl_seconds: u64,
    /// The scopes each audience admits.
    pub audience_scopes: BTreeMap<String, Vec<String>>,
    /// What the controller's service account holds: agents never get more.
    pub controller_audiences: Vec<String>,
    pub controller_scopes: Vec<String>,
    pub client_id: String,
    pub client_secret: String,
    pub tenant: String,
    pub page_size: usize,
    /// Count of calls by name, for tests (e.g. "list_agents", "list_agents_304").
    pub calls: HashMap<String, u64>,
    /// Count of requests by the replica that sent them (`x-fleet-replica`), for tests of
    /// which controller called when.
    pub calls_from: HashMap<String, u64>,
    /// Each of those requests, the newest [`CALL_LOG_MAX`], for the fault suite's check that
    /// only the leader calls out.
    pub call_log: std::collections::VecDeque<Call>,
}

/// A request a controller replica sent.
#[derive(Debug, Clone)]
pub struct Call {
    pub replica: String,
    /// When it reached devkit.
    pub arrived: std::time::SystemTime,
    /// When the replica's call gate let it start (`x-fleet-call-at`), if it said.
    pub made: Option<std::time::SystemTime>,
}

/// The most requests [`DevState::call_log`] keeps.
pub const CALL_LOG_MAX: usize = 1_000_000;

impl DevState {
    pub fn new(c: &DevkitConfig) -> Self {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let mut audience_scopes = BTreeMap::new();
        audience_scopes.insert("control-plane".to_string(), s(&["control-plane:read", "control-plane:write"]));
        audience_scopes.insert("iam".to_string(), s(&["iam:agents", "iam:tokens"]));
        audience_scopes.insert("notification-service".to_string(), s(&["notifications:send"]));
        DevState {
            agents: BTreeMap::new(),
            agents_json: BTreeMap::new(),
            version: 1,
            version_served_at: HashMap::new(),
            version_listed_at: HashMap::new(),
            statuses: HashMap::new(),
            identities: HashMap::new(),
            principals: HashMap::new(),
            principal_agent: HashMap::new(),
            pats: vec![],
            pat_by_key: HashMap::new(),
            service_tokens: HashMap::new(),
            faults: Faults::default(),
            max_ttl_seconds: 604_800,
            audience_scopes,
            controller_audiences: s(&["control-plane", "iam", "notification-service"]),
            controller_scopes: s(&["control-plane:read", "control-plane:write", "iam:agents", "notifications:send"]),
            client_id: c.client_id.clone(),
            client_secret: c.client_secret.clone(),
            tenant: c.tenant.clone(),
            page_size: c.page_size.max(1),
            calls: HashMap::new(),
            calls_from: HashMap::new(),
            call_log: Default::default(),
        }
    }

    pub fn count(&mut self, call: &str) {
        *self.calls.entry(call.to_string()).or_default() += 1;
    }

    pub fn put_agent(&mut self, agent: serde_json::Value) {
        let key = agent.get("key").and_then(|k| k.as_str()).unwrap_or("").to_string();
        self.agents_json.insert(key.clone(), to_raw(&agent));
        self.agents.insert(key, agent);
        self.version += 1;
    }

    pub fn edit_agent(&mut self, key: &str, f: impl FnOnce(&mut serde_json::Value)) -> bool {
        match self.agents.get_mut(key) {
            Some(a) => {
                f(a);
                let raw = to_raw(a);
                self.agents_json.insert(key.to_string(), raw);
                self.version += 1;
                true
            }
            None => false,
        }
    }

    pub fn remove_agent(&mut self, key: &str) -> bool {
        self.agents_json.remove(key);
        let gone = self.agents.remove(key).is_some();
        if gone {
            self.version += 1;
        }
        gone
    }

    /// Live (not revoked) PATs of `agent`.
    pub fn live_pats(&self, agent: &str) -> Vec<&PatRecord> {
        self.pats.iter().filter(|p| !p.revoked && p.agent_key.as_deref() == Some(agent)).collect()
    }
}

/// Agent `i` of the simulator's fleet, as the CP would list it: 10 % of another executor
/// kind, 20 % require `gpu`, 12.5 % a zone label, 14 % the secret `github-token`. Used by
/// `fleet-sim` and by the controller's profiling examples, so both measure the same list.
pub fn synthetic_agent(i: usize, replicas: u32) -> serde_json::Value {
    synthetic_agent_in(i, replicas, 4)
}

/// [`synthetic_agent`] on a fleet of `zones` zones: with four (the default fleet) the zone
/// required is `z0`; with ten, one of them (`(i / 8) mod 10`).
pub fn synthetic_agent_in(i: usize, replicas: u32, zones: usize) -> serde_json::Value {
    let kind = if i % 10 == 9 { "observer" } else { "claude-code" };
    let mut requires = vec![];
    if i.is_multiple_of(5) {
        requires.push("gpu".to_string());
    }
    if i.is_multiple_of(8) {
        let zone = if zones == 4 { i % 4 } else { (i / 8) % zones };
        requires.push(format!("zone=z{zone}"));
    }
    let secrets: Vec<&str> = if i.is_multiple_of(7) { vec!["github-token"] } else { vec![] };
    serde_json::json!({"key": format!("agent-{i:05}"), "revision": 1, "state": "running",
           "identity": {"kind": "agent", "iam": {"audiences": ["notification-service"], "scopeCeiling": ["control-plane:read"]}},
           "executor": {"kind": kind, "image": null},
           "placement": {"replicas": replicas, "requires": requires, "secrets": secrets},
           "drainSeconds": 10})
}

/// [`synthetic_agent`] with the placement fields of docs/behaviour.md#spread-and-priority:
/// 10 % spread over `zone`, and every agent a priority from five levels (−100, −10, 0, 10,
/// 100) drawn by a hash of `i`.
pub fn synthetic_agent_with_fields(i: usize, replicas: u32, zones: usize) -> serde_json::Value {
    const LEVELS: [i64; 5] = [-100, -10, 0, 10, 100];
    let mut a = synthetic_agent_in(i, replicas, zones);
    if i % 10 == 3 {
        a["placement"]["spread"] = serde_json::json!("zone");
    }
    let drawn = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    a["placement"]["priority"] = serde_json::json!(LEVELS[drawn as usize % 5]);
    a
}

/// Example agents for `fleet-controller dev`, as the CP would list them.
pub fn example_agents(kind: &str) -> Vec<serde_json::Value> {
    use serde_json::json;
    vec![
        json!({"key": "coder", "revision": 1, "state": "running",
               "identity": {"kind": "agent", "iam": {"audiences": ["notification-service"]}},
               "executor": {"kind": kind, "image": null},
               "placement": {"replicas": 1, "requires": [], "secrets": [], "priority": 10},
               "skills": {"audiences": []}, "drainSeconds": 10}),
        json!({"key": "reviewer", "revision": 1, "state": "running",
               "identity": {"kind": "agent"},
               "executor": {"kind": kind, "image": null},
               "placement": {"replicas": 2, "spread": "zone"}, "drainSeconds": 10}),
        json!({"key": "notifier", "revision": 1, "state": "running",
               "identity": {"kind": "agent"}, "executor": {"kind": kind}, "placement": "none"}),
    ]
}

/// Agents from a YAML file: a list of CP agent items.
pub fn agents_from_yaml(text: &str) -> Result<Vec<serde_json::Value>, String> {
    let v: serde_json::Value = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
    match v {
        serde_json::Value::Array(items) => Ok(items),
        _ => Err("the agents file must hold a YAML list of agents".into()),
    }
}

fn to_raw(v: &serde_json::Value) -> Box<serde_json::value::RawValue> {
    serde_json::value::to_raw_value(v).expect("a Value serialises")
}
