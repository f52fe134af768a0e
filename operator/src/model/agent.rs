//! An agent as the Control Plane describes it (docs/behaviour.md#control-plane-calls-and-agent-descriptions),
//! once read: every field valid (the reading is `super::read`).

use super::names::{Interner, Names};
use fleet_api::{Executor, Resources};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
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
    pub audiences: Names,
    /// Absent means no restriction; `[]` means no scopes.
    #[serde(default)]
    pub scope_ceiling: Option<Names>,
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
    pub requires: Names,
    #[serde(default)]
    pub secrets: Names,
    #[serde(default)]
    pub resources: Option<Resources>,
    /// The rollout policy as the CP wrote it; read when a rollout starts, where an invalid
    /// field falls back to its default (docs/behaviour.md#rolling-out-a-change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<JsonText>,
    /// `spread` and `priority` as the CP wrote them, judged where they are used
    /// (docs/behaviour.md#spread-and-priority): an invalid one takes its default there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<Box<serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Box<serde_json::Value>>,
}

/// A field kept as the JSON text the CP wrote, and read where it is used. Parsed, an object
/// is a `serde_json::Value` map: a B-tree node of ~600 bytes for `{"minReadySeconds":10}`,
/// whose text is 22 — over 20,000 agents that each set a policy, 12 MB in every agent list
/// held. Two are equal when their texts are: a CP that rewrites a field in other words
/// changes the agent, as any other edit does.
#[derive(Debug, Clone)]
pub struct JsonText(Box<RawValue>);

impl JsonText {
    pub fn of(v: &serde_json::Value) -> JsonText {
        // A `Value` always serialises; `null` stands in should that ever change.
        JsonText(serde_json::value::to_raw_value(v).unwrap_or_else(|_| RawValue::NULL.to_owned()))
    }

    /// The field, parsed (the text came from JSON, so it parses).
    pub fn value(&self) -> serde_json::Value {
        serde_json::from_str(self.0.get()).unwrap_or(serde_json::Value::Null)
    }
}

impl PartialEq for JsonText {
    fn eq(&self, other: &JsonText) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Serialize for JsonText {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for JsonText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(d).map(JsonText)
    }
}

/// Lowest and highest `placement.priority`.
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i64> = -1000..=1000;

/// What an agent's `spread` and `priority` say: the value used, and the problem with the
/// field as written when it took its default instead.
pub fn spread_of(raw: Option<&serde_json::Value>) -> (Option<&str>, Option<String>) {
    match raw {
        None | Some(serde_json::Value::Null) => (None, None),
        Some(serde_json::Value::String(s)) if fleet_api::names::is_label_name(s) => (Some(s.as_str()), None),
        Some(v) => (None, Some(format!("placement.spread: {v} is not a label name; the replicas are not spread"))),
    }
}

pub fn priority_of(raw: Option<&serde_json::Value>) -> (i32, Option<String>) {
    match raw {
        None | Some(serde_json::Value::Null) => (0, None),
        Some(v) => match v.as_i64().filter(|p| PRIORITY_RANGE.contains(p)) {
            Some(p) => (p as i32, None),
            None => (0, Some(format!("placement.priority: {v} is not an integer from -1000 to 1000; 0 applies"))),
        },
    }
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
        Placement::Spec(PlacementSpec {
            replicas: 1,
            requires: Names::default(),
            secrets: Names::default(),
            resources: None,
            rollout: None,
            spread: None,
            priority: None,
        })
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
    pub audiences: Names,
}

/// `drainSeconds` when the item has none.
pub const DEFAULT_DRAIN_SECONDS: u64 = 60;

fn sixty() -> u64 {
    DEFAULT_DRAIN_SECONDS
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
    /// Shares its lists of names (`model::names`): a list equal to the same list of `last`
    /// (this agent in the list in force) is that one, so a list that did not change costs a
    /// comparison; any other is the equal one `interner` met before in the list being read.
    pub fn intern(&mut self, last: Option<&Agent>, interner: &mut Interner) {
        let last_iam = last.and_then(|l| l.identity.iam.as_ref());
        if let Some(iam) = &mut self.identity.iam {
            interner.share(&mut iam.audiences, last_iam.map(|i| &i.audiences));
            if let Some(s) = &mut iam.scope_ceiling {
                interner.share(s, last_iam.and_then(|i| i.scope_ceiling.as_ref()));
            }
        }
        let last_spec = last.and_then(|l| match &l.placement {
            Placement::Spec(s) => Some(s),
            Placement::None(_) => None,
        });
        if let Placement::Spec(p) = &mut self.placement {
            interner.share(&mut p.requires, last_spec.map(|s| &s.requires));
            interner.share(&mut p.secrets, last_spec.map(|s| &s.secrets));
        }
        interner.share(&mut self.skills.audiences, last.map(|l| &l.skills.audiences));
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

    /// The label the agent's replicas spread over, if a valid one is given.
    pub fn spread(&self) -> Option<&str> {
        spread_of(self.placed_spec().and_then(|s| s.spread.as_deref())).0
    }

    /// The agent's placement priority (0 when none or invalid).
    pub fn priority(&self) -> i32 {
        priority_of(self.placed_spec().and_then(|s| s.priority.as_deref())).0
    }

    /// What is wrong with the agent's `spread` or `priority`, for the explanation.
    pub fn placement_problems(&self) -> Vec<String> {
        let Some(s) = self.placed_spec() else { return Vec::new() };
        [spread_of(s.spread.as_deref()).1, priority_of(s.priority.as_deref()).1].into_iter().flatten().collect()
    }

    /// The rollout policy the CP item gives, if any, parsed.
    pub fn rollout(&self) -> Option<serde_json::Value> {
        match &self.placement {
            Placement::Spec(s) => s.rollout.as_ref().map(JsonText::value),
            Placement::None(_) => None,
        }
    }

    pub fn resources(&self) -> Resources {
        match &self.placement {
            Placement::Spec(s) => s.resources.clone().unwrap_or_default(),
            Placement::None(_) => Resources::default(),
        }
    }
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
