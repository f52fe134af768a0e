//! A replica as its node last reported it, as the registry keeps it until the next report.
//! 100,000 replicas are kept at 10,000 nodes: the agent's key is the agent list's own string
//! (one allocation an agent instead of one a replica), and the message, which most replicas
//! lack, is a boxed string. Stored and served in the wire's form ([`ReplicaReport`]'s JSON).

use crate::model::Id;
use fleet_api::{ReplicaReport, ReplicaState};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Seen {
    pub agent_key: Id,
    pub revision: u64,
    pub replica: u32,
    pub state: ReplicaState,
    #[serde(default)]
    pub restarts: u32,
    #[serde(default)]
    pub last_exit_code: Option<i64>,
    #[serde(default)]
    pub message: Option<Box<str>>,
}

impl Seen {
    /// The reported replica, its agent's key taken from `known` when the agent is known.
    pub fn of(r: ReplicaReport, known: impl Fn(&str) -> Option<Id>) -> Seen {
        Seen {
            agent_key: known(&r.agent_key).unwrap_or_else(|| r.agent_key.into()),
            revision: r.revision,
            replica: r.replica,
            state: r.state,
            restarts: r.restarts,
            last_exit_code: r.last_exit_code,
            message: r.message.map(String::into_boxed_str),
        }
    }

    /// The replica as the API shows it.
    pub fn to_report(&self) -> ReplicaReport {
        ReplicaReport {
            agent_key: self.agent_key.to_string(),
            revision: self.revision,
            replica: self.replica,
            state: self.state,
            restarts: self.restarts,
            last_exit_code: self.last_exit_code,
            message: self.message.as_deref().map(String::from),
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
        assert_eq!((back.restarts, back.last_exit_code, back.message), (0, None, None));
    }

    #[test]
    fn a_replica_is_kept_in_72_bytes() {
        assert!(std::mem::size_of::<Seen>() <= 72, "{} bytes", std::mem::size_of::<Seen>());
    }
}
