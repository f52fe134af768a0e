//! Reading the CP's agent items (docs/behaviour.md#control-plane-calls-and-agent-descriptions).
//!
//! Lenient where being strict would stop an agent (docs/behaviour.md#wrong-input-never-stops-an-agent):
//! unknown fields are ignored, and an optional field that is malformed or out of range keeps
//! the item — clamped where a range is given, else with its value from the agent's last good
//! item (its default for a new agent) — with a warning naming the agent and the field. Only a
//! bad `key`, a missing `executor.kind` or a `state` that is neither value skips an item, and
//! a skipped item whose agent was listed before keeps that agent's last good version.
//!
//! Items arrive as raw JSON text and are parsed straight into [`Agent`]. Only an item that
//! does not parse so is read again field by field through a `serde_json::Value`: were every
//! item read that way, the `Value`s would be most of the cost of a 20,000-agent list.

use super::agent::{
    find_agent, Agent, AgentState, Iam, Identity, IdentityKind, JsonText, Placement, PlacementSpec, Skills,
    DEFAULT_DRAIN_SECONDS, MAX_DRAIN_SECONDS, MAX_REPLICAS,
};
use super::names::{Interner, Names};
use fleet_api::{images, names, Executor, Resources};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// Why one CP item was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedAgent {
    pub key: Option<String>,
    pub reason: String,
}

/// A field of a kept item that was malformed or out of range, and what was used instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldWarning {
    pub agent: String,
    /// The field's path in the item, as the CP writes it (`placement.replicas`), or `item`
    /// when a skipped item's last good version was kept.
    pub field: &'static str,
    pub problem: String,
    /// What the agent has instead, in words (`0`, `its last good value`, `its default`).
    pub used: String,
}

/// The items of a page, read.
#[derive(Debug, Default)]
pub struct Read {
    pub agents: Vec<Agent>,
    pub skipped: Vec<SkippedAgent>,
    pub warnings: Vec<FieldWarning>,
}

/// Reads the items of one page. `previous` is the agent list in force, in key order: the
/// last good version of each agent, for the fields (and items) that are wrong now.
pub fn parse_agents(items: &[Box<RawValue>], previous: &[Agent], interner: &mut Interner) -> Read {
    let mut out = Read { agents: Vec::with_capacity(items.len()), ..Read::default() };
    for item in items {
        match read_item(item.get(), previous, &mut out.warnings) {
            Ok(mut a) => {
                a.intern(find_agent(previous, &a.key), interner);
                out.agents.push(a);
            }
            Err(skip) => {
                if let Some(last) = skip.key.as_deref().and_then(|k| find_agent(previous, k)) {
                    out.warnings.push(FieldWarning {
                        agent: last.key.to_string(),
                        field: "item",
                        problem: skip.reason.clone(),
                        used: "its last good version, until the CP sends a good one or drops it".into(),
                    });
                    out.agents.push(last.clone());
                }
                out.skipped.push(skip);
            }
        }
    }
    out
}

fn read_item(text: &str, previous: &[Agent], warnings: &mut Vec<FieldWarning>) -> Result<Agent, SkippedAgent> {
    let mut agent = match serde_json::from_str::<Agent>(text) {
        Ok(a) => {
            check_key(&a.key)?;
            a
        }
        Err(strict) => {
            let value: Value = serde_json::from_str(text)
                .map_err(|_| SkippedAgent { key: None, reason: format!("the item is not JSON: {strict}") })?;
            let (key, state, kind) = essentials(&value)?;
            let mut w = Warner { agent: key, last: find_agent(previous, key), warnings };
            w.whole(&value, state, kind)
        }
    };
    let key = agent.key.clone();
    let mut w = Warner { agent: &key, last: find_agent(previous, &key), warnings };
    w.ranges(&mut agent);
    Ok(agent)
}

fn skip(key: Option<&str>, reason: String) -> SkippedAgent {
    SkippedAgent { key: key.map(str::to_string), reason }
}

fn check_key(key: &str) -> Result<(), SkippedAgent> {
    if names::is_agent_key(key) {
        return Ok(());
    }
    Err(skip(Some(key), format!("key {key:?} does not match ^[a-z0-9]([a-z0-9-]{{0,61}}[a-z0-9])?$")))
}

/// The fields without which an item is not an agent: its key, its state and its kind.
fn essentials(value: &Value) -> Result<(&str, AgentState, &str), SkippedAgent> {
    let obj = value.as_object().ok_or_else(|| skip(None, "the item is not an object".into()))?;
    let key = obj.get("key").and_then(Value::as_str).ok_or_else(|| skip(None, "key is missing".into()))?;
    check_key(key)?;
    let state = match obj.get("state").and_then(Value::as_str) {
        Some("running") => AgentState::Running,
        Some("stopped") => AgentState::Stopped,
        _ => {
            let got = shown(obj.get("state"));
            return Err(skip(Some(key), format!("state {got} is neither \"running\" nor \"stopped\"")));
        }
    };
    let kind = obj.get("executor").and_then(|e| e.get("kind")).and_then(Value::as_str).filter(|k| !k.is_empty());
    let kind = kind.ok_or_else(|| skip(Some(key), "executor.kind is missing".into()))?;
    Ok((key, state, kind))
}

/// A value as a warning shows it: JSON, cut to 200 characters.
fn shown(v: Option<&Value>) -> String {
    let text = v.map_or_else(|| "(missing)".to_string(), Value::to_string);
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// Reads the fields of one agent's item, recording what it had to replace.
struct Warner<'a> {
    agent: &'a str,
    /// The agent's last good version, if it was listed before.
    last: Option<&'a Agent>,
    warnings: &'a mut Vec<FieldWarning>,
}

/// A field's value when it is wrong: the last good one, else the default.
fn instead<T>(last: Option<T>, default: impl FnOnce() -> T) -> (T, &'static str) {
    match last {
        Some(t) => (t, "its last good value"),
        None => (default(), "its default"),
    }
}

impl<'a> Warner<'a> {
    /// The last good placement spec, when the agent had one (not `"none"`).
    fn last_spec(&self) -> Option<&'a PlacementSpec> {
        match self.last.map(|l| &l.placement) {
            Some(Placement::Spec(s)) => Some(s),
            _ => None,
        }
    }

    fn warn(&mut self, field: &'static str, problem: String, used: &str) {
        self.warnings.push(FieldWarning { agent: self.agent.to_string(), field, problem, used: used.to_string() });
    }

    /// An optional field: its default when absent, its value when it reads as a `T`, else
    /// the last good value (or the default), with a warning.
    fn field<T: DeserializeOwned>(
        &mut self,
        v: Option<&Value>,
        field: &'static str,
        last: Option<T>,
        default: impl FnOnce() -> T,
    ) -> T {
        let Some(v) = v else { return default() };
        match T::deserialize(v) {
            Ok(t) => t,
            Err(e) => {
                let (t, used) = instead(last, default);
                self.warn(field, format!("{}: {e}", shown(Some(v))), used);
                t
            }
        }
    }

    /// The object at `field`, `None` when absent; a value of another type is warned about
    /// and read as absent by the caller's own fallback.
    fn object<'v>(&mut self, v: Option<&'v Value>, field: &'static str) -> Result<Option<&'v Map<String, Value>>, ()> {
        match v {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(other) => {
                let used = if self.last.is_some() { "its last good value" } else { "its default" };
                self.warn(field, format!("{}: not an object", shown(Some(other))), used);
                Err(())
            }
        }
    }

    /// The whole agent from an item that did not parse as one, field by field.
    fn whole(&mut self, value: &Value, state: AgentState, kind: &str) -> Agent {
        let obj = value.as_object().expect("essentials checked it is an object");
        let last = self.last;
        Agent {
            key: self.agent.into(),
            revision: self.field(obj.get("revision"), "revision", last.map(|l| l.revision), || 0),
            state,
            identity: self.identity(obj.get("identity")),
            executor: Executor {
                kind: kind.to_string(),
                image: self.field(
                    value.pointer("/executor/image"),
                    "executor.image",
                    last.map(|l| l.executor.image.clone()),
                    || None,
                ),
            },
            placement: self.placement(obj.get("placement")),
            skills: self.skills(obj.get("skills")),
            drain_seconds: self.drain_seconds(obj.get("drainSeconds")),
        }
    }

    fn identity(&mut self, v: Option<&Value>) -> Identity {
        let last = self.last.map(|l| &l.identity);
        let Ok(obj) = self.object(v, "identity") else {
            return last.cloned().unwrap_or_else(safe_identity);
        };
        let Some(obj) = obj else { return safe_identity() };
        let kind = self.field(obj.get("kind"), "identity.kind", last.map(|i| i.kind), || IdentityKind::Agent);
        let last_iam = last.and_then(|i| i.iam.as_ref());
        let iam = match self.object(obj.get("iam").filter(|v| !v.is_null()), "identity.iam") {
            Err(()) => last_iam.cloned().or_else(no_scopes),
            Ok(None) => None,
            Ok(Some(iam)) => Some(Iam {
                audiences: self.field(
                    iam.get("audiences"),
                    "identity.iam.audiences",
                    last_iam.map(|i| i.audiences.clone()),
                    Names::default,
                ),
                scope_ceiling: self.scope_ceiling(iam.get("scopeCeiling"), last_iam),
            }),
        };
        Identity { kind, iam }
    }

    /// Absent means no restriction; but a ceiling that cannot be read never widens what the
    /// agent may do: it keeps the last good one, and a new agent gets no scopes until the CP
    /// sends one that reads.
    fn scope_ceiling(&mut self, v: Option<&Value>, last_iam: Option<&Iam>) -> Option<Names> {
        let v = v?;
        match Option::<Names>::deserialize(v) {
            Ok(c) => c,
            Err(e) => {
                let last = last_iam.map(|i| i.scope_ceiling.clone());
                let (c, used) = match last {
                    Some(c) => (c, "its last good value"),
                    None => (Some(Names::default()), "no scopes"),
                };
                self.warn("identity.iam.scopeCeiling", format!("{}: {e}", shown(Some(v))), used);
                c
            }
        }
    }

    fn placement(&mut self, v: Option<&Value>) -> Placement {
        let last = self.last.map(|l| &l.placement);
        match v {
            None => return Placement::default(),
            Some(Value::String(s)) if s == "none" => return Placement::None("none"),
            Some(Value::Object(_)) => {}
            Some(other) => {
                let (p, used) = instead(last.cloned(), Placement::default);
                self.warn("placement", format!("{}: neither \"none\" nor an object", shown(Some(other))), used);
                return p;
            }
        }
        let obj = v.and_then(Value::as_object).expect("matched an object above");
        let last = self.last_spec();
        Placement::Spec(PlacementSpec {
            replicas: self.replicas(obj.get("replicas"), last.map(|s| s.replicas)),
            requires: self.field(
                obj.get("requires"),
                "placement.requires",
                last.map(|s| s.requires.clone()),
                Names::default,
            ),
            secrets: self.field(
                obj.get("secrets"),
                "placement.secrets",
                last.map(|s| s.secrets.clone()),
                Names::default,
            ),
            resources: self.field(
                obj.get("resources"),
                "placement.resources",
                last.map(|s| s.resources.clone()),
                || None,
            ),
            // Kept as written: its fields are judged when a rollout starts, each falling back
            // to its default alone.
            rollout: obj.get("rollout").filter(|v| v.is_object()).map(JsonText::of),
            spread: obj.get("spread").filter(|v| !v.is_null()).map(|v| Box::new(v.clone())),
            priority: obj.get("priority").filter(|v| !v.is_null()).map(|v| Box::new(v.clone())),
        })
    }

    /// A replica count that is not a whole number from 0 to the most one agent may ask for
    /// keeps the last good count: clamping a typo of `1000000` would start a thousand.
    fn replicas(&mut self, v: Option<&Value>, last: Option<u32>) -> u32 {
        let Some(v) = v else { return 1 };
        match v.as_u64() {
            Some(n) if n <= u64::from(MAX_REPLICAS) => n as u32,
            _ => {
                let (n, used) = instead(last, || 1);
                let problem = format!("{}: not a whole number from 0 to {MAX_REPLICAS}", shown(Some(v)));
                self.warn("placement.replicas", problem, used);
                n
            }
        }
    }

    fn skills(&mut self, v: Option<&Value>) -> Skills {
        let last = self.last.map(|l| &l.skills);
        match self.object(v, "skills") {
            Err(()) => last.cloned().unwrap_or_default(),
            Ok(None) => Skills::default(),
            Ok(Some(obj)) => Skills {
                audiences: self.field(
                    obj.get("audiences"),
                    "skills.audiences",
                    last.map(|s| s.audiences.clone()),
                    Names::default,
                ),
            },
        }
    }

    /// Whole seconds, clamped to 0…3600; anything else keeps the last good value.
    fn drain_seconds(&mut self, v: Option<&Value>) -> u64 {
        let Some(v) = v else { return DEFAULT_DRAIN_SECONDS };
        if let Some(n) = v.as_i64().filter(|n| *n < 0) {
            self.warn("drainSeconds", format!("{n}: below 0"), "0");
            return 0;
        }
        if let Some(n) = v.as_u64() {
            return n; // `ranges` clamps the top for both readings.
        }
        let (n, used) = instead(self.last.map(|l| l.drain_seconds), || DEFAULT_DRAIN_SECONDS);
        self.warn("drainSeconds", format!("{}: not a whole number of seconds", shown(Some(v))), used);
        n
    }

    /// The checks of values that parse but are out of range, for both readings of an item.
    fn ranges(&mut self, a: &mut Agent) {
        if a.drain_seconds > MAX_DRAIN_SECONDS {
            self.warn("drainSeconds", format!("{}: above {MAX_DRAIN_SECONDS}", a.drain_seconds), "3600");
            a.drain_seconds = MAX_DRAIN_SECONDS;
        }
        let last_spec = self.last_spec();
        if let Placement::Spec(s) = &mut a.placement {
            if s.replicas > MAX_REPLICAS {
                let (n, used) = instead(last_spec.map(|l| l.replicas), || 1);
                self.warn("placement.replicas", format!("{}: above {MAX_REPLICAS}", s.replicas), used);
                s.replicas = n;
            }
            // Kept as written, judged where used (a wrong one takes its default there).
            if let Some(p) = super::agent::spread_of(s.spread.as_deref()).1 {
                self.warn("placement.spread", p, "the default: not spread");
            }
            if let Some(p) = super::agent::priority_of(s.priority.as_deref()).1 {
                self.warn("placement.priority", p, "the default: 0");
            }
            if let Some(c) = s.resources.as_ref().and_then(|r| r.cpus).filter(|c| !(c.is_finite() && *c > 0.0)) {
                let (r, used) = instead(last_spec.map(|l| l.resources.clone()), || None::<Resources>);
                self.warn("placement.resources.cpus", format!("{c}: not a positive number"), used);
                s.resources = r;
            }
        }
        if let Some(img) = a.executor.image.as_deref().filter(|i| !images::is_reference(i)) {
            let (image, used) = instead(self.last.map(|l| l.executor.image.clone()), || None);
            self.warn("executor.image", format!("{img:?}: not an image reference"), used);
            a.executor.image = image;
        }
    }
}

/// The identity of a new agent whose `identity` cannot be read: an agent, with no scopes.
fn safe_identity() -> Identity {
    Identity { kind: IdentityKind::Agent, iam: no_scopes() }
}

fn no_scopes() -> Option<Iam> {
    Some(Iam { audiences: Names::default(), scope_ceiling: Some(Names::default()) })
}

/// Agent items as the CP would send them, for tests.
#[cfg(test)]
pub fn raw_items(items: Vec<serde_json::Value>) -> Vec<Box<RawValue>> {
    items.iter().map(|v| serde_json::value::to_raw_value(v).expect("a Value serialises")).collect()
}

#[cfg(test)]
mod tests;
