//! A replica as its node last reported it, as the registry keeps it until the next report.
//! 100,000 replicas are kept at 10,000 nodes: the agent's key is the agent list's own string
//! (one allocation an agent instead of one a replica), and the message, which most replicas
//! lack, is a boxed string. Stored and served in the wire's form ([`ReplicaReport`]'s JSON).

use crate::model::Id;
use fleet_api::{ReplicaReport, ReplicaState};
use serde::{Deserialize, Serialize};

/// 64 bytes: the exit code is kept beside a flag that fills padding, where `Option<i64>` would
/// take 16 bytes and the record 72 — a node's ten replicas are 640 bytes instead of 768 in
/// jemalloc's classes (1.3 MB at 10,000 nodes).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "Wire")]
pub struct Seen {
    pub agent_key: Id,
    pub revision: u64,
    pub replica: u32,
    pub state: ReplicaState,
    pub restarts: u32,
    exit_code: i64,
    has_exit_code: bool,
    /// The template the replica's container runs ([`crate::model::SpecId`]'s number; 0: none
    /// reported). It fills padding: the record stays 64 bytes.
    pub spec: u32,
    pub message: Option<Box<str>>,
}

/// The stored form: the wire's fields, with the defaults rows stored before them read as.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    agent_key: Id,
    revision: u64,
    replica: u32,
    state: ReplicaState,
    #[serde(default)]
    restarts: u32,
    #[serde(default)]
    last_exit_code: Option<i64>,
    #[serde(default)]
    message: Option<Box<str>>,
    #[serde(default)]
    spec_id: Option<Box<str>>,
}

/// The stored form, written from the record without copying it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireRef<'a> {
    agent_key: &'a str,
    revision: u64,
    replica: u32,
    state: ReplicaState,
    restarts: u32,
    last_exit_code: Option<i64>,
    message: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spec_id: Option<String>,
}

impl From<Wire> for Seen {
    fn from(w: Wire) -> Seen {
        Seen::new(w.agent_key, w.revision, w.replica, w.state, w.restarts, w.last_exit_code, w.message)
            .with_spec(w.spec_id.as_deref())
    }
}

impl Serialize for Seen {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        WireRef {
            agent_key: &self.agent_key,
            revision: self.revision,
            replica: self.replica,
            state: self.state,
            restarts: self.restarts,
            last_exit_code: self.last_exit_code(),
            message: self.message.as_deref(),
            spec_id: self.spec_id(),
        }
        .serialize(s)
    }
}

impl Seen {
    pub fn new(
        agent_key: Id,
        revision: u64,
        replica: u32,
        state: ReplicaState,
        restarts: u32,
        last_exit_code: Option<i64>,
        message: Option<Box<str>>,
    ) -> Seen {
        Seen {
            agent_key,
            revision,
            replica,
            state,
            restarts,
            exit_code: last_exit_code.unwrap_or(0),
            has_exit_code: last_exit_code.is_some(),
            spec: 0,
            message,
        }
    }

    /// The replica with the template its node reported (an id the controller did not make
    /// reads as none).
    pub fn with_spec(mut self, spec_id: Option<&str>) -> Seen {
        self.spec = spec_id.and_then(crate::model::SpecId::parse).map_or(0, |s| s.0);
        self
    }

    /// The reported template's id, as the node said it.
    pub fn spec_id(&self) -> Option<String> {
        (self.spec != 0).then(|| crate::model::SpecId(self.spec).to_string())
    }

    /// The reported replica, its agent's key taken from `known` when the agent is known.
    pub fn of(r: ReplicaReport, known: impl Fn(&str) -> Option<Id>) -> Seen {
        let key = known(&r.agent_key).unwrap_or_else(|| r.agent_key.into());
        let message = r.message.map(String::into_boxed_str);
        Seen::new(key, r.revision, r.replica, r.state, r.restarts, r.last_exit_code, message)
            .with_spec(r.spec_id.as_deref())
    }

    /// The exit code of the replica's last run, when the node reported one.
    pub fn last_exit_code(&self) -> Option<i64> {
        self.has_exit_code.then_some(self.exit_code)
    }

    /// The replica as the API shows it.
    pub fn to_report(&self) -> ReplicaReport {
        ReplicaReport {
            agent_key: self.agent_key.to_string(),
            revision: self.revision,
            replica: self.replica,
            state: self.state,
            restarts: self.restarts,
            last_exit_code: self.last_exit_code(),
            message: self.message.as_deref().map(String::from),
            spec_id: self.spec_id(),
            busy_until: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn report(key: &str, message: Option<&str>) -> ReplicaReport {
        ReplicaReport {
            agent_key: key.into(),
            revision: 4,
            replica: 2,
            state: ReplicaState::Crashloop,
            restarts: 3,
            last_exit_code: Some(-9),
            message: message.map(String::from),
            spec_id: Some("0a1b2c3d".into()),
            busy_until: None,
        }
    }

    /// A known agent's key is the list's string; an unknown one is kept as reported; either
    /// way the API shows what the node said, and the stored JSON is the wire's.
    #[test]
    fn a_replica_shares_its_agents_key_and_reads_back_as_reported() {
        let listed: Id = "a-1".into();
        let known = |k: &str| (k == "a-1").then(|| listed.clone());
        let seen = Seen::of(report("a-1", Some("exit 137")), known);
        assert!(Arc::ptr_eq(&seen.agent_key, &listed));
        assert_eq!(seen.to_report(), report("a-1", Some("exit 137")));
        let other = Seen::of(report("gone", None), known);
        assert_eq!(&*other.agent_key, "gone");
        assert_eq!(other.to_report(), report("gone", None));

        let json = serde_json::to_value(&seen).unwrap();
        assert_eq!(json, serde_json::to_value(report("a-1", Some("exit 137"))).unwrap());
        let back: Seen = serde_json::from_value(json).unwrap();
        assert_eq!(back, seen);
        // A row stored before (the wire's type, fields left out at their defaults).
        let old = r#"{"agentKey":"a-1","revision":4,"replica":2,"state":"running"}"#;
        let back: Seen = serde_json::from_str(old).unwrap();
        assert_eq!((back.restarts, back.last_exit_code(), back.message), (0, None, None));
        // Every exit code comes back as reported, zero and the extremes among them.
        for code in [Some(0), Some(i64::MIN), Some(i64::MAX), Some(-9), None] {
            let mut r = report("a-1", None);
            r.last_exit_code = code;
            let seen = Seen::of(r.clone(), known);
            assert_eq!(seen.last_exit_code(), code);
            let back: Seen = serde_json::from_value(serde_json::to_value(&seen).unwrap()).unwrap();
            assert_eq!(back.to_report(), r);
        }
    }

    #[test]
    fn a_replica_is_kept_in_64_bytes() {
        assert!(std::mem::size_of::<Seen>() <= 64, "{} bytes", std::mem::size_of::<Seen>());
    }
}
