//! Progressive delivery on the wire (docs/behaviour.md#rolling-out-a-change): an agent's
//! rollout policy as the CP item's `placement.rollout` gives it, and the rollout view of
//! `GET /api/v1/agents/{key}/rollout`.

use serde::{Deserialize, Serialize};
use std::fmt;
use utoipa::ToSchema;

/// The budget of unavailable replicas: a count, or a percentage of `replicas` rounded down;
/// at least 1 either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxUnavailable {
    Count(u32),
    Percent(u32),
}

impl MaxUnavailable {
    /// The budget for an agent of `replicas` replicas.
    pub fn budget(self, replicas: u32) -> u32 {
        let n = match self {
            MaxUnavailable::Count(n) => n,
            MaxUnavailable::Percent(p) => (u64::from(replicas) * u64::from(p) / 100) as u32,
        };
        n.max(1)
    }

    /// `"25%"` or `"3"`; `None` for anything else (a negative number, over 100 %).
    pub fn parse(v: &serde_json::Value) -> Option<MaxUnavailable> {
        match v {
            serde_json::Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()).map(MaxUnavailable::Count),
            serde_json::Value::String(s) => match s.strip_suffix('%') {
                Some(p) => p.parse::<u32>().ok().filter(|p| *p <= 100).map(MaxUnavailable::Percent),
                None => s.parse::<u32>().ok().map(MaxUnavailable::Count),
            },
            _ => None,
        }
    }
}

impl fmt::Display for MaxUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaxUnavailable::Count(n) => write!(f, "{n}"),
            MaxUnavailable::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl Serialize for MaxUnavailable {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            MaxUnavailable::Count(n) => s.serialize_u32(*n),
            MaxUnavailable::Percent(_) => s.serialize_str(&self.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for MaxUnavailable {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        MaxUnavailable::parse(&v).ok_or_else(|| serde::de::Error::custom("an integer or a percentage up to 100%"))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnFailure {
    /// Touch no more replicas.
    Halt,
    /// Also give the updated replicas the previous template back.
    Revert,
}

/// An agent's rollout policy, every field given (the CP item's, else the controller's default).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutPolicy {
    #[schema(value_type = String, example = "25%")]
    pub max_unavailable: MaxUnavailable,
    pub min_ready_seconds: u32,
    pub progress_deadline_seconds: u32,
    pub canary: u32,
    pub on_failure: OnFailure,
    /// How long a voluntary disruption waits for a busy replica (docs/behaviour.md#busy-replicas);
    /// at most [`MAX_BUSY_SECONDS`]. Records stored before it read the controller's default.
    #[serde(default = "default_max_busy")]
    pub max_busy_seconds: u32,
}

/// The hard cap of `maxBusySeconds`: no agent holds a disruption longer, whatever it says.
pub const MAX_BUSY_SECONDS: u32 = 86_400;
/// `FLEET_ROLLOUT_MAX_BUSY_SECONDS`'s default.
pub const DEFAULT_MAX_BUSY_SECONDS: u32 = 3_600;

fn default_max_busy() -> u32 {
    DEFAULT_MAX_BUSY_SECONDS
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RolloutState {
    Complete,
    Progressing,
    Paused,
    Halted,
    Reverted,
    /// Progressing, but no replica left to step may start one now: every one is outside a
    /// maintenance window (docs/behaviour.md#maintenance-windows). Shown only; stored as progressing.
    WaitingForWindow,
}

impl RolloutState {
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutState::Complete => "complete",
            RolloutState::Progressing => "progressing",
            RolloutState::Paused => "paused",
            RolloutState::Halted => "halted",
            RolloutState::Reverted => "reverted",
            RolloutState::WaitingForWindow => "waiting_for_window",
        }
    }
}

/// The controller's defaults for a policy's fields (`FLEET_ROLLOUT_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutDefaults {
    pub max_unavailable: MaxUnavailable,
    pub min_ready_seconds: u32,
    pub progress_deadline_seconds: u32,
    pub max_busy_seconds: u32,
}

impl Default for RolloutDefaults {
    fn default() -> Self {
        RolloutDefaults {
            max_unavailable: MaxUnavailable::Percent(25),
            min_ready_seconds: 10,
            progress_deadline_seconds: 600,
            max_busy_seconds: DEFAULT_MAX_BUSY_SECONDS,
        }
    }
}

/// A template as the view names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateView {
    pub spec_id: String,
    pub revision: u64,
    pub image: Option<String>,
}

/// A replica a step waits for, why, and until when: `busy` (its work, until its lease ends or
/// the agent's hold does, whichever is sooner) or `window` (until a maintenance window opens).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaitingReplica {
    pub replica: u32,
    pub node: String,
    pub reason: String,
    pub until: String,
}

/// An updated replica that failed, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailedReplica {
    pub replica: u32,
    pub node: String,
    pub reason: String,
}

/// `GET /api/v1/agents/{key}/rollout`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutView {
    pub agent_key: String,
    pub state: RolloutState,
    pub policy: RolloutPolicy,
    /// The field of `placement.rollout` that was invalid (the defaults apply in its place).
    pub policy_error: Option<String>,
    pub target: TemplateView,
    pub previous: Option<TemplateView>,
    pub desired_replicas: u32,
    /// Replicas handed the target template.
    pub updated_replicas: u32,
    pub ready_replicas: u32,
    pub unavailable_replicas: u32,
    pub budget: u32,
    pub failed: Vec<FailedReplica>,
    /// The replicas the next steps wait for (docs/behaviour.md#busy-replicas).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<WaitingReplica>,
    /// With `state: waiting_for_window`: when the next window opens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_window: Option<String>,
    pub started_at: Option<String>,
    pub changed_at: Option<String>,
    pub message: Option<String>,
    /// When the latest read of the CP whose result a pass has committed began (RFC 3339 with
    /// ms, on the controller's clock); null before the first. What was changed in the CP
    /// before that instant is in this view: a client that changed the CP waits for a view
    /// whose `cpReadAt` is after its first answer's `asOf`.
    #[serde(default)]
    pub cp_read_at: Option<String>,
    /// When the controller built this view (RFC 3339 with ms, on its clock); absent from
    /// controllers that do not say `cpReadAt` either.
    #[serde(default)]
    pub as_of: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_budget_is_a_count_or_a_percentage_and_at_least_one() {
        let p = |v| MaxUnavailable::parse(&v);
        assert_eq!(p(json!(2)), Some(MaxUnavailable::Count(2)));
        assert_eq!(p(json!("25%")), Some(MaxUnavailable::Percent(25)));
        assert_eq!(p(json!("3")), Some(MaxUnavailable::Count(3)));
        assert_eq!(p(json!(-1)), None);
        assert_eq!(p(json!("101%")), None);
        assert_eq!(p(json!(true)), None);
        assert_eq!(MaxUnavailable::Percent(25).budget(10), 2);
        assert_eq!(MaxUnavailable::Percent(25).budget(3), 1);
        assert_eq!(MaxUnavailable::Count(0).budget(3), 1);
        assert_eq!(serde_json::to_value(MaxUnavailable::Percent(25)).unwrap(), json!("25%"));
        assert_eq!(serde_json::to_value(MaxUnavailable::Count(4)).unwrap(), json!(4));
    }
}
