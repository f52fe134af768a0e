//! The agent status sent to the CP (docs/behaviour.md#agent-status), derived purely from the desired replicas,
//! their bindings, identity readiness and what nodes reported. First matching rule wins.

use crate::store::Seen;
use fleet_api::{codes, ReplicaState};

pub use crate::store::kept::{Phase, Reason, ReplicaStatus, StatusBody};

/// Where one desired replica stands.
#[derive(Debug, Clone)]
pub struct ReplicaInput<'a> {
    pub replica: u32,
    /// The bound node's name and whether it is online; `None` when unplaced.
    pub node: Option<(&'a str, bool)>,
    /// Bound to an offline node with nowhere else to go.
    pub stuck: bool,
    /// The bound node's last report of this replica.
    pub report: Option<&'a Seen>,
}

#[derive(Debug, Clone)]
pub struct StatusInput<'a> {
    pub stopped: bool,
    pub desired: u32,
    pub replicas: Vec<ReplicaInput<'a>>,
    /// The docs/behaviour.md#placement reason of the unplaced replicas, when some are unplaced.
    pub waiting: Option<&'static str>,
    /// `Some(message)` while the identity or a PAT is not ready.
    pub identity_pending: Option<String>,
}

pub fn waiting_message(code: &str) -> &'static str {
    match code {
        codes::NO_NODE => "no node is online",
        codes::NO_SCHEDULABLE_NODE => "every online node is cordoned or draining",
        codes::NO_EXECUTOR_KIND => "no online node runs this executor kind",
        codes::IMAGE_NOT_ALLOWED => "no node with this executor kind admits the agent's image",
        codes::NO_LABEL => "no node has every required label",
        codes::NO_SECRET => "no node has every required secret",
        codes::NO_CAPACITY => "every fitting node is full",
        codes::PREEMPTED => "a replica of higher priority took its room; it waits for room",
        _ => "waiting for a node",
    }
}

fn reason(code: &str, message: impl Into<String>) -> Option<Reason> {
    Some(Reason { code: code.to_string(), message: message.into() })
}

pub fn derive(input: &StatusInput) -> StatusBody {
    let replicas: Vec<ReplicaStatus> = input
        .replicas
        .iter()
        .map(|r| ReplicaStatus {
            replica: r.replica,
            node: r.node.map(|(n, _)| n.to_string()),
            state: r.report.map(|p| p.state).unwrap_or(ReplicaState::Pending),
            restarts: r.report.map(|p| p.restarts).unwrap_or(0),
            last_exit_code: r.report.and_then(|p| p.last_exit_code()),
            message: r.report.and_then(|p| p.message.as_deref().map(String::from)),
        })
        .collect();
    let running = |r: &&ReplicaInput| {
        r.node.is_some_and(|(_, online)| online) && r.report.is_some_and(|p| p.state == ReplicaState::Running)
    };
    let ready = input.replicas.iter().filter(running).count() as u32;
    let observed_revision = input.replicas.iter().filter(running).filter_map(|r| r.report.map(|p| p.revision)).min();
    let node = input.replicas.iter().find_map(|r| r.node.map(|(n, _)| n.to_string()));
    let body = |phase, reason| StatusBody {
        phase,
        reason,
        node: node.clone(),
        observed_revision,
        ready_replicas: ready,
        desired_replicas: input.desired,
        replicas: replicas.clone(),
    };

    if input.stopped || input.desired == 0 {
        return body(Phase::Stopped, None);
    }
    // A preempted agent waits as `pending` (docs/behaviour.md#spread-and-priority), not for a node.
    if input.replicas.iter().all(|r| r.node.is_none()) && input.waiting != Some(codes::PREEMPTED) {
        let code = input.waiting.unwrap_or(codes::NO_NODE);
        return body(Phase::WaitingForNode, reason(code, waiting_message(code)));
    }
    if let Some(msg) = &input.identity_pending {
        return body(Phase::Pending, reason(codes::IDENTITY_PENDING, msg.clone()));
    }
    if let Some(r) = input.replicas.iter().find(|r| r.report.is_some_and(|p| p.state == ReplicaState::Crashloop)) {
        let msg = r.report.and_then(|p| p.message.as_deref()).unwrap_or("replica is crash-looping").to_string();
        return body(Phase::CrashLooping, reason("crash_looping", msg));
    }
    if let Some(r) = input.replicas.iter().find(|r| r.stuck) {
        let name = r.node.map(|(n, _)| n).unwrap_or("?");
        return body(
            Phase::NodeUnavailable,
            reason(
                codes::NODE_UNAVAILABLE,
                format!("node {name} is offline and no other node fits replica {}", r.replica),
            ),
        );
    }
    if ready >= input.desired {
        return body(Phase::Running, None);
    }
    if let Some(c) = input.waiting {
        return body(Phase::Pending, reason(c, waiting_message(c)));
    }
    // [ext] A replica its node refused or cannot start: the node's cause is the reason.
    let refused = input.replicas.iter().filter_map(|r| r.report).filter(|p| p.state != ReplicaState::Running);
    if let Some((code, message)) =
        refused.filter_map(|p| p.message.as_deref()).find_map(|m| Some((codes::refusal::code_of(m)?, m)))
    {
        return body(Phase::Pending, reason(code, message));
    }
    body(Phase::Pending, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rep(state: ReplicaState, revision: u64) -> Seen {
        Seen::new("a".into(), revision, 0, state, 2, Some(1), Some("boom".into()))
    }

    fn input<'a>(replicas: Vec<ReplicaInput<'a>>) -> StatusInput<'a> {
        StatusInput { stopped: false, desired: replicas.len() as u32, replicas, waiting: None, identity_pending: None }
    }

    fn ri<'a>(i: u32, node: Option<(&'a str, bool)>, report: Option<&'a Seen>) -> ReplicaInput<'a> {
        ReplicaInput { replica: i, node, stuck: false, report }
    }

    #[test]
    fn rules_in_order() {
        let running = rep(ReplicaState::Running, 4);
        let old = rep(ReplicaState::Running, 3);
        let crash = rep(ReplicaState::Crashloop, 4);

        let mut s = input(vec![ri(0, Some(("w1", true)), Some(&running))]);
        s.stopped = true;
        assert_eq!(derive(&s).phase, Phase::Stopped);

        let mut s = input(vec![ri(0, None, None)]);
        s.waiting = Some(codes::NO_LABEL);
        let b = derive(&s);
        assert_eq!(b.phase, Phase::WaitingForNode);
        assert_eq!(b.reason.unwrap().code, "no_label");
        assert_eq!(b.replicas[0].state, ReplicaState::Pending);
        assert_eq!(b.node, None);

        let mut s = input(vec![ri(0, Some(("w1", true)), Some(&crash))]);
        s.identity_pending = Some("IAM unreachable".into());
        let b = derive(&s);
        assert_eq!((b.phase, b.reason.unwrap().message.as_str()), (Phase::Pending, "IAM unreachable"));

        let b =
            derive(&input(vec![ri(0, Some(("w1", true)), Some(&crash)), ri(1, Some(("w2", true)), Some(&running))]));
        assert_eq!(b.phase, Phase::CrashLooping);
        assert_eq!(b.reason.unwrap().message, "boom");

        let mut stuck = ri(0, Some(("w1", false)), Some(&running));
        stuck.stuck = true;
        let b = derive(&input(vec![stuck]));
        assert_eq!(b.phase, Phase::NodeUnavailable);
        assert_eq!(b.ready_replicas, 0, "offline node's replicas are not ready");

        let b = derive(&input(vec![ri(0, Some(("w1", true)), Some(&running)), ri(1, Some(("w2", true)), Some(&old))]));
        assert_eq!(b.phase, Phase::Running);
        assert_eq!(b.observed_revision, Some(3));
        assert_eq!(b.ready_replicas, 2);
        assert_eq!(b.node.as_deref(), Some("w1"));

        let mut s = input(vec![ri(0, Some(("w1", true)), Some(&running)), ri(1, None, None)]);
        s.waiting = Some(codes::NO_CAPACITY);
        let b = derive(&s);
        assert_eq!(b.phase, Phase::Pending);
        assert_eq!(b.reason.unwrap().code, "no_capacity");

        let b = derive(&input(vec![ri(0, Some(("w1", true)), None)]));
        assert_eq!((b.phase, b.reason), (Phase::Pending, None));
    }

    /// docs/behaviour.md#agent-status rule 7 [ext]: a replica refused or failing to start on its node makes the node's
    /// cause the agent's reason, with the node's message whole.
    #[test]
    fn node_side_refusals_become_the_reason() {
        use codes::refusal;
        let table = [
            (refusal::image_not_allowed("reg/x:2", "k"), ReplicaState::Stopped, "image_not_allowed"),
            (refusal::secret_missing("github-token"), ReplicaState::Stopped, "secret_missing"),
            (refusal::secret_not_allowed("github-token", "k"), ReplicaState::Stopped, "secret_not_allowed"),
            (refusal::CREDENTIAL_UNOPENABLE.to_string(), ReplicaState::Stopped, "credential_unreadable"),
            (refusal::executor_kind_missing("k"), ReplicaState::Stopped, "executor_kind_missing"),
            (refusal::start_failed("No such image: agent-runner:1.4.0"), ReplicaState::Starting, "start_failed"),
        ];
        for (message, state, code) in table {
            let mut r = rep(state, 4);
            r.message = Some(message.as_str().into());
            let b = derive(&input(vec![ri(0, Some(("w1", true)), Some(&r))]));
            assert_eq!(b.phase, Phase::Pending, "{code}");
            assert_eq!(b.reason, Some(Reason { code: code.into(), message }), "{code}");
        }
        // A waiting reason of an unplaced replica comes first; an ordinary message is no reason.
        let mut r = rep(ReplicaState::Stopped, 4);
        r.message = Some(refusal::secret_missing("gh").into());
        let mut s = input(vec![ri(0, Some(("w1", true)), Some(&r)), ri(1, None, None)]);
        s.waiting = Some(codes::NO_CAPACITY);
        assert_eq!(derive(&s).reason.unwrap().code, "no_capacity");
        let b = derive(&input(vec![ri(0, Some(("w1", true)), Some(&rep(ReplicaState::Starting, 4)))]));
        assert_eq!((b.phase, b.reason), (Phase::Pending, None), "\"boom\" is no refusal");
    }

    #[test]
    fn wire_shape() {
        let running = rep(ReplicaState::Running, 4);
        let v = serde_json::to_value(derive(&input(vec![ri(0, Some(("w1", true)), Some(&running))]))).unwrap();
        assert_eq!(v["phase"], "running");
        assert_eq!(v["observedRevision"], 4);
        assert_eq!(v["readyReplicas"], 1);
        assert_eq!(v["desiredReplicas"], 1);
        assert_eq!(v["replicas"][0]["lastExitCode"], 1);
        assert_eq!(v["reason"], serde_json::Value::Null);
        let phases = [Phase::WaitingForNode, Phase::CrashLooping, Phase::NodeUnavailable];
        let names: Vec<_> = phases.iter().map(|p| serde_json::to_value(p).unwrap()).collect();
        assert_eq!(names, vec!["waiting_for_node", "crash_looping", "node_unavailable"]);
    }
}
