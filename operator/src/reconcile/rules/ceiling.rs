//! The audiences and scope ceiling of an agent's PAT (docs/behaviour.md#identity-and-pats), a pure function of the
//! agent and the controller's configuration.

use crate::model::Agent;
use std::collections::BTreeSet;

pub const CONTROL_PLANE: &str = "control-plane";
/// Never delegated to an agent, whatever it declares.
pub const NEVER: &str = "iam:agents";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ceiling {
    pub audiences: Vec<String>,
    pub scopes: Vec<String>,
}

/// (audience, scope) of a configured or declared entry: `aud=scope`, or `aud:rest` whose
/// audience is its own prefix. An entry of neither form names no audience and is dropped.
pub fn normalise(entry: &str) -> Option<(String, String)> {
    if let Some((aud, scope)) = entry.split_once('=') {
        if aud.is_empty() || scope.is_empty() {
            return None;
        }
        return Some((aud.to_string(), scope.to_string()));
    }
    let (aud, rest) = entry.split_once(':')?;
    if aud.is_empty() || rest.is_empty() {
        return None;
    }
    Some((aud.to_string(), entry.to_string()))
}

fn written(aud: &str, scope: &str) -> String {
    match scope.split_once(':') {
        Some((prefix, _)) if prefix == aud => scope.to_string(),
        _ => format!("{aud}={scope}"),
    }
}

fn privileged(scope: &str) -> bool {
    scope.starts_with("iam:")
}

pub fn ceiling(agent: &Agent, token_audiences: &[String], token_scopes: &[String]) -> Ceiling {
    let iam = agent.identity.iam.as_ref();
    let mut audiences: BTreeSet<String> = BTreeSet::new();
    audiences.insert(CONTROL_PLANE.to_string());
    let declared = agent.skills.audiences.strs().chain(iam.map(|i| i.audiences.strs()).into_iter().flatten());
    for a in declared {
        if token_audiences.iter().any(|t| t == a) {
            audiences.insert(a.to_string());
        }
    }
    let agent_ceiling: Option<BTreeSet<(String, String)>> =
        iam.and_then(|i| i.scope_ceiling.as_ref()).map(|c| c.iter().filter_map(|e| normalise(e)).collect());
    let mut scopes: BTreeSet<String> = BTreeSet::new();
    for entry in token_scopes {
        let Some((aud, scope)) = normalise(entry) else { continue };
        if !audiences.contains(&aud) || scope == NEVER {
            continue;
        }
        let admitted = match &agent_ceiling {
            Some(c) => c.contains(&(aud.clone(), scope.clone())),
            None => !privileged(&scope),
        };
        if !admitted {
            continue;
        }
        scopes.insert(written(&aud, &scope));
    }
    Ceiling { audiences: audiences.into_iter().collect(), scopes: scopes.into_iter().collect() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{parse_agents, raw_items};
    use serde_json::json;

    fn agent(iam: serde_json::Value, skills: &[&str]) -> Agent {
        let mut read = parse_agents(
            &raw_items(vec![json!({"key": "a", "revision": 1, "state": "running",
            "identity": {"kind": "agent", "iam": iam}, "executor": {"kind": "k"},
            "skills": {"audiences": skills}})]),
            &[],
            &mut Default::default(),
        );
        assert!(read.skipped.is_empty() && read.warnings.is_empty());
        read.agents.remove(0)
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    const SCOPES: &[&str] = &[
        "control-plane:read",
        "control-plane:write",
        "notification-service=notifications:send",
        "iam:agents",
        "iam:tokens",
    ];

    #[test]
    fn control_plane_always_other_audiences_only_if_listed() {
        let a = agent(json!({"audiences": ["notification-service", "billing"]}), &["search"]);
        let c = ceiling(&a, &s(&["notification-service", "search"]), &[]);
        assert_eq!(c.audiences, s(&["control-plane", "notification-service", "search"]));
        assert!(c.scopes.is_empty(), "empty FLEET_TOKEN_SCOPES → empty ceiling");
        let c = ceiling(&a, &[], &s(SCOPES));
        assert_eq!(c.audiences, s(&["control-plane"]));
        assert_eq!(c.scopes, s(&["control-plane:read", "control-plane:write"]));
    }

    #[test]
    fn scopes_follow_audiences_by_prefix_and_by_equals() {
        let a = agent(json!({"audiences": ["notification-service"]}), &[]);
        let c = ceiling(&a, &s(&["notification-service"]), &s(SCOPES));
        assert_eq!(
            c.scopes,
            s(&["control-plane:read", "control-plane:write", "notification-service=notifications:send"])
        );
    }

    #[test]
    fn intersection_with_declared_ceiling() {
        let a = agent(
            json!({"audiences": ["notification-service"],
                   "scopeCeiling": ["control-plane:read", "notification-service=notifications:send", "other:x"]}),
            &[],
        );
        let c = ceiling(&a, &s(&["notification-service"]), &s(SCOPES));
        assert_eq!(c.scopes, s(&["control-plane:read", "notification-service=notifications:send"]));
        // `[]` means no scopes at all.
        let none = agent(json!({"scopeCeiling": []}), &[]);
        assert!(ceiling(&none, &[], &s(SCOPES)).scopes.is_empty());
        // the same pair written two ways still matches
        let eq = agent(json!({"scopeCeiling": ["control-plane=control-plane:read"]}), &[]);
        assert_eq!(ceiling(&eq, &[], &s(SCOPES)).scopes, s(&["control-plane:read"]));
    }

    #[test]
    fn privileged_only_when_declared_and_iam_agents_never() {
        let plain = agent(json!({"audiences": ["iam"]}), &[]);
        let c = ceiling(&plain, &s(&["iam"]), &s(SCOPES));
        assert!(!c.scopes.iter().any(|x| x.starts_with("iam:")), "{c:?}");
        let declares = agent(json!({"audiences": ["iam"], "scopeCeiling": ["iam:tokens", "iam:agents"]}), &[]);
        let c = ceiling(&declares, &s(&["iam"]), &s(SCOPES));
        assert_eq!(c.scopes, s(&["iam:tokens"]));
        assert_eq!(c.audiences, s(&["control-plane", "iam"]));
    }

    #[test]
    fn sorted_deduplicated_and_written_canonically() {
        let a = agent(json!({"audiences": ["x", "x"]}), &["x"]);
        let c = ceiling(&a, &s(&["x"]), &s(&["x=x:b", "x:a", "x:a", "control-plane=read"]));
        assert_eq!(c.audiences, s(&["control-plane", "x"]));
        assert_eq!(c.scopes, s(&["control-plane=read", "x:a", "x:b"]));
        assert_eq!(normalise("nocolon"), None);
    }
}
