//! Agents as the Control Plane describes them (docs/behaviour.md#control-plane-calls-and-agent-descriptions). Parsing is lenient about unknown
//! fields (the CP is usually newer than we are) and strict about what we act on: an item
//! that does not parse, or whose key is not a valid name, is skipped whole with an error.

use fleet_api::{names, Executor, Resources};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use std::sync::Arc;

/// A node id, node name or agent key, shared rather than copied.
pub type Id = Arc<str>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentState {
    Running,
    Stopped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdentityKind {
    Agent,
    Service,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Iam {
    #[serde(default)]
    pub audiences: Vec<String>,
    /// Absent means no restriction; `[]` means no scopes.
    #[serde(default)]
    pub scope_ceiling: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    pub kind: IdentityKind,
    #[serde(default)]
    pub iam: Option<Iam>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementSpec {
    #[serde(default = "one")]
    pub replicas: u32,
    #[serde(default)]
    pub requires: Vec<String>,
    #[serde(default)]
    pub secrets: Vec<String>,
    #[serde(default)]
    pub resources: Option<Resources>,
}

fn one() -> u32 {
    1
}

/// `placement` is either the string `"none"` (identity only) or a spec.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Placement {
    None(&'static str),
    Spec(PlacementSpec),
}

impl Default for Placement {
    fn default() -> Self {
        Placement::Spec(PlacementSpec { replicas: 1, requires: vec![], secrets: vec![], resources: None })
    }
}

impl<'de> Deserialize<'de> for Placement {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        match v {
            serde_json::Value::String(s) if s == "none" => Ok(Placement::None("none")),
            serde_json::Value::String(s) => {
                Err(serde::de::Error::custom(format!("placement {s:?} is neither \"none\" nor an object")))
            }
            other => PlacementSpec::deserialize(other).map(Placement::Spec).map_err(serde::de::Error::custom),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Skills {
    #[serde(default)]
    pub audiences: Vec<String>,
}

fn sixty() -> u64 {
    60
}

/// One agent item of `GET /api/v1/agents`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Agent {
    pub key: Id,
    pub revision: u64,
    pub state: AgentState,
    pub identity: Identity,
    pub executor: Executor,
    #[serde(default)]
    pub placement: Placement,
    #[serde(default)]
    pub skills: Skills,
    #[serde(default = "sixty")]
    pub drain_seconds: u64,
}

/// Most replicas one agent may ask for: a typo of `1000000` must not allocate a million slots.
pub const MAX_REPLICAS: u32 = 1000;

/// Longest drain an agent may ask for (docs/behaviour.md#hardening): longer values are clamped, with a warning.
pub const MAX_DRAIN_SECONDS: u64 = 3600;

impl Agent {
    /// Gives back the room parsing left in its lists: serde grows a list of unknown length by
    /// doubling, so a one-element list holds four (~70 bytes each): in a 20,000-agent list the
    /// audiences and scope ceilings alone would waste ~4.6 MB.
    pub fn shrink(&mut self) {
        if let Some(iam) = &mut self.identity.iam {
            iam.audiences.shrink_to_fit();
            if let Some(s) = &mut iam.scope_ceiling {
                s.shrink_to_fit();
            }
        }
        if let Placement::Spec(p) = &mut self.placement {
            p.requires.shrink_to_fit();
            p.secrets.shrink_to_fit();
        }
        self.skills.audiences.shrink_to_fit();
    }

    /// The placement spec when this agent is placed at all (docs/behaviour.md#placement): running, of kind agent,
    /// with a placement other than `none`.
    pub fn placed_spec(&self) -> Option<&PlacementSpec> {
        match (&self.placement, self.state, self.identity.kind) {
            (Placement::Spec(s), AgentState::Running, IdentityKind::Agent) => Some(s),
            _ => None,
        }
    }

    /// Agents the controller reports a status for: kind agent with a real placement spec.
    pub fn gets_status(&self) -> bool {
        self.identity.kind == IdentityKind::Agent && matches!(self.placement, Placement::Spec(_))
    }

    pub fn desired_replicas(&self) -> u32 {
        match (&self.placement, self.state) {
            (Placement::Spec(s), AgentState::Running) => s.replicas,
            _ => 0,
        }
    }

    pub fn resources(&self) -> Resources {
        match &self.placement {
            Placement::Spec(s) => s.resources.clone().unwrap_or_default(),
            Placement::None(_) => Resources::default(),
        }
    }
}

/// Why one CP item was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedAgent {
    pub key: Option<String>,
    pub reason: String,
}

/// Parses the items of one page, keeping the good ones and naming each bad one.
///
/// Items arrive as raw JSON text and are parsed straight into [`Agent`]: a `serde_json::Value`
/// in between would be most of the cost of reading a 20,000-agent list.
pub fn parse_agents(items: &[Box<RawValue>]) -> (Vec<Agent>, Vec<SkippedAgent>) {
    /// Only for naming an item that is not a valid agent.
    #[derive(Deserialize)]
    struct KeyOnly {
        key: Option<String>,
    }
    let mut good = Vec::with_capacity(items.len());
    let mut bad = Vec::new();
    for item in items {
        let key = || serde_json::from_str::<KeyOnly>(item.get()).ok().and_then(|k| k.key);
        match serde_json::from_str::<Agent>(item.get()) {
            Ok(mut a) => match check(&a) {
                Ok(()) => {
                    if a.drain_seconds > MAX_DRAIN_SECONDS {
                        tracing::warn!(agent = %a.key, drain_seconds = a.drain_seconds, "drainSeconds clamped to {MAX_DRAIN_SECONDS}");
                        a.drain_seconds = MAX_DRAIN_SECONDS;
                    }
                    a.shrink();
                    good.push(a)
                }
                Err(reason) => bad.push(SkippedAgent { key: Some(a.key.to_string()), reason }),
            },
            Err(e) => bad.push(SkippedAgent { key: key(), reason: e.to_string() }),
        }
    }
    (good, bad)
}

/// Agent items as the CP would send them, for tests.
#[cfg(test)]
pub fn raw_items(items: Vec<serde_json::Value>) -> Vec<Box<RawValue>> {
    items.iter().map(|v| serde_json::value::to_raw_value(v).expect("a Value serialises")).collect()
}

fn check(a: &Agent) -> Result<(), String> {
    if !names::is_agent_key(&a.key) {
        return Err(format!("key {:?} does not match ^[a-z0-9]([a-z0-9-]{{0,61}}[a-z0-9])?$", a.key));
    }
    if let Placement::Spec(s) = &a.placement {
        if s.replicas > MAX_REPLICAS {
            return Err(format!("placement.replicas {} exceeds {MAX_REPLICAS}", s.replicas));
        }
        if let Some(r) = &s.resources {
            if r.cpus.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
                return Err("placement.resources.cpus must be a positive number".into());
            }
        }
    }
    if let Some(img) = &a.executor.image {
        if !fleet_api::images::is_reference(img) {
            return Err(format!("executor.image {img:?} is not an image reference"));
        }
    }
    Ok(())
}

/// The active agent list as the controller last saw it, shared cheaply with the pass. In key
/// order, each key once (the CP lists so; `reconcile::pass::agents` sorts a list that is not,
/// and the stored list is read back sorted).
pub type AgentList = Arc<Vec<Agent>>;

/// The agent of this key in a list in key order, by binary search: for a list without an
/// index of its own (the one a pass replaced). Lists in use have one (`store::AgentIndex`).
pub fn find_agent<'a>(agents: &'a [Agent], key: &str) -> Option<&'a Agent> {
    agents.binary_search_by(|a| (*a.key).cmp(key)).ok().map(|i| &agents[i])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn spec_example_parses_with_defaults() {
        let item = json!({"key": "coder", "revision": 4, "state": "running",
            "identity": {"kind": "agent", "iam": {"audiences": ["notification-service"],
                                                 "scopeCeiling": ["control-plane:read"]}},
            "executor": {"kind": "claude-code", "image": null},
            "placement": {"replicas": 1, "requires": ["repos"], "secrets": ["github-token"],
                          "resources": {"cpus": 2.0, "memoryMb": 4096}},
            "skills": {"audiences": []}, "drainSeconds": 60, "somethingNew": {"x": 1}});
        let (good, bad) = parse_agents(&raw_items(vec![item]));
        assert!(bad.is_empty(), "{bad:?}");
        let a = &good[0];
        assert_eq!(a.placed_spec().unwrap().requires, vec!["repos"]);
        assert_eq!(a.resources().memory_mb, Some(4096));
        // Parsed lists hold no room past their items (each is kept for the agent's life).
        let iam = a.identity.iam.as_ref().unwrap();
        let spec = a.placed_spec().unwrap();
        assert_eq!(iam.audiences.capacity(), 1);
        assert_eq!(iam.scope_ceiling.as_ref().unwrap().capacity(), 1);
        assert_eq!((spec.requires.capacity(), spec.secrets.capacity()), (1, 1));

        let minimal = json!({"key": "m", "revision": 1, "state": "running",
            "identity": {"kind": "agent"}, "executor": {"kind": "k"}});
        let (good, _) = parse_agents(&raw_items(vec![minimal]));
        let m = &good[0];
        assert_eq!(m.placed_spec().unwrap().replicas, 1);
        assert_eq!(m.drain_seconds, 60);
        assert!(m.identity.iam.is_none());
    }

    #[test]
    fn placement_none_and_bad_items() {
        let none = json!({"key": "id-only", "revision": 1, "state": "running",
            "identity": {"kind": "agent"}, "executor": {"kind": "k"}, "placement": "none"});
        let bad_key = json!({"key": "Bad_Key", "revision": 1, "state": "running",
            "identity": {"kind": "agent"}, "executor": {"kind": "k"}});
        let broken = json!({"key": "broken", "revision": "x"});
        let weird = json!({"key": "weird", "revision": 1, "state": "running",
            "identity": {"kind": "agent"}, "executor": {"kind": "k"}, "placement": "everywhere"});
        let (good, bad) = parse_agents(&raw_items(vec![none, bad_key, broken, weird]));
        assert_eq!(good.len(), 1);
        assert!(good[0].placed_spec().is_none());
        assert!(!good[0].gets_status());
        let keys: Vec<_> = bad.iter().map(|b| b.key.clone().unwrap()).collect();
        assert_eq!(keys, vec!["Bad_Key", "broken", "weird"]);
    }

    /// docs/behaviour.md#hardening: a drain longer than an hour is clamped (the desired state carries the
    /// clamped value); a negative one is not a u64 and skips the item.
    #[test]
    fn drain_seconds_are_clamped_to_an_hour() {
        let item = |d: serde_json::Value| {
            json!({"key": "slow", "revision": 1, "state": "running",
                   "identity": {"kind": "agent"}, "executor": {"kind": "k"}, "drainSeconds": d})
        };
        let (good, _) = parse_agents(&raw_items(vec![item(json!(86_400))]));
        assert_eq!(good[0].drain_seconds, MAX_DRAIN_SECONDS);
        let (good, _) = parse_agents(&raw_items(vec![item(json!(3600))]));
        assert_eq!(good[0].drain_seconds, 3600);
        let (good, bad) = parse_agents(&raw_items(vec![item(json!(-1))]));
        assert!(good.is_empty() && bad.len() == 1);
    }
}
