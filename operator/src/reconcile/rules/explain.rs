//! "Why is my agent where it is" (docs/behaviour.md#why-an-agent-is-where-it-is): the filters of docs/behaviour.md#placement applied one after another
//! over every known node, with counts, what is missing, and the troubleshooting hint. It is
//! computed on request from what the pass published (the registry's nodes, the last
//! outcome with each node's room left) and costs nothing while no one asks: one look at
//! each node, no sum over bindings.

use super::derive::{demand, status_now};
use super::placement::{Demand, Free};
use crate::store::{NodeRec, State};
use fleet_api::{
    codes, Exhausted, FilterCount, NodeVerdict, PlacementExplanation, ReasonView, ReplicaPlacement, SpreadView,
};
use std::collections::BTreeMap;
use std::time::Duration;

/// The filters in order, each with the waiting reason it gives when it leaves no node.
const FILTERS: [(&str, &str); 7] = [
    ("online", codes::NO_NODE),
    ("schedulable", codes::NO_SCHEDULABLE_NODE),
    ("executor_kind", codes::NO_EXECUTOR_KIND),
    ("image", codes::IMAGE_NOT_ALLOWED),
    ("labels", codes::NO_LABEL),
    ("secrets", codes::NO_SECRET),
    ("capacity", codes::NO_CAPACITY),
];

/// The explanation of agent `key`; `None` when it is not in the active list.
pub fn explain(
    st: &State,
    key: &str,
    now: i64,
    offline_after: Duration,
    with_nodes: bool,
) -> Option<PlacementExplanation> {
    let agent = st.agent(key)?;
    let status = status_now(agent, st, now, offline_after);
    let phase = serde_json::to_value(status.phase).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
    let reason = status.reason.as_ref().map(|r| ReasonView { code: r.code.clone(), message: r.message.clone() });
    let replicas = status
        .replicas
        .iter()
        .map(|r| {
            let bound = st.outcome().bindings.get(key, r.replica);
            let node_id = bound.map(|n| n.to_string());
            let busy = bound.and_then(|n| st.busy_until_ms(n, key, r.replica, now));
            ReplicaPlacement {
                replica: r.replica,
                node_id,
                node: r.node.clone(),
                state: serde_json::to_value(r.state)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default(),
                message: r.message.clone(),
                busy_until: busy.map(crate::clock::rfc3339_ms),
            }
        })
        .collect();
    let (filters, nodes) = match demand(agent) {
        Some(d) => filter(st, &d, now, offline_after, with_nodes),
        None => (Vec::new(), with_nodes.then(Vec::new)),
    };
    let hint = reason.as_ref().map(|r| hint(&r.code).to_string()).filter(|h| !h.is_empty());
    let spread = agent.spread().map(|label| spread_view(st, key, label));
    Some(PlacementExplanation {
        agent_key: key.to_string(),
        revision: agent.revision,
        phase,
        reason,
        desired_replicas: status.desired_replicas,
        replicas,
        filters,
        hint,
        nodes,
        spread,
        priority: agent.priority(),
        problems: agent.placement_problems(),
    })
}

/// The agent's bound replicas per value of its spread label.
fn spread_view(st: &State, key: &str, label: &str) -> SpreadView {
    let mut counts = std::collections::BTreeMap::new();
    for (_, node) in st.outcome().bindings.of_agent(key) {
        let value = st.node(node).map_or("", |n| fleet_api::labels::value_of(&n.info.labels, label));
        *counts.entry(value.to_string()).or_default() += 1;
    }
    SpreadView { label: label.to_string(), counts }
}

/// The first filter `n` fails for `d` (index into [`FILTERS`]) and a detail for the verdict.
fn verdict(d: &Demand, n: &NodeRec, online: bool, free: Option<&Free>) -> Option<(usize, String)> {
    if !online {
        return Some((0, "offline".into()));
    }
    if !n.lifecycle.schedulable() {
        let what = if n.lifecycle.draining().is_some() { "draining" } else { "cordoned" };
        return Some((1, what.into()));
    }
    if !n.info.executor_kinds.iter().any(|k| *k == d.kind) {
        return Some((
            2,
            format!("no executor kind {}{}", d.kind, refused_note(n, |r| r.kinds.iter().any(|k| *k == d.kind))),
        ));
    }
    if let Some(img) = &d.image {
        if !n.allow.get(&*d.kind).is_some_and(|l| l.admits(img)) {
            return Some((3, format!("image {img} not allowed for {}", d.kind)));
        }
    }
    let missing: Vec<&str> =
        d.requires.iter().filter(|r| !fleet_api::labels::requirement_met(r, &n.info.labels)).map(|s| &**s).collect();
    if !missing.is_empty() {
        let claimed = refused_note(n, |r| {
            r.labels.iter().any(|l| missing.iter().any(|m| fleet_api::labels::requirement_met(m, &[l])))
        });
        return Some((4, format!("missing label {}{claimed}", missing.join(", "))));
    }
    let offered = n.info.secrets_for(&d.kind);
    let lacking: Vec<&str> = d.secrets.iter().filter(|s| !offered.iter().any(|o| **o == ***s)).map(|s| &**s).collect();
    if !lacking.is_empty() {
        return Some((5, format!("missing secret {}", lacking.join(", "))));
    }
    let short = shortages(d, free);
    if short.iter().any(|s| *s) {
        let names = ["slots", "cpus", "memoryMb"];
        let what: Vec<&str> = names.iter().zip(short).filter(|(_, s)| *s).map(|(n, _)| *n).collect();
        return Some((6, format!("short of {}", what.join(", "))));
    }
    None
}

/// ` (claimed, refused by its allowance)` when the node claims what a verdict misses but may not
/// (docs/behaviour.md#what-a-node-may-claim): the node.yaml has it, the fix is the allowance.
fn refused_note(n: &NodeRec, claims_it: impl Fn(&fleet_api::claims::Claimed) -> bool) -> &'static str {
    match &n.info.refused {
        Some(r) if claims_it(r) => " (claimed, refused by its allowance)",
        _ => "",
    }
}

/// Whether the node's room left is short of a slot, the cpus or the memory `d` needs.
fn shortages(d: &Demand, free: Option<&Free>) -> [bool; 3] {
    let f = free.copied().unwrap_or_default();
    let cpus = d.cpus.map(super::placement::milli);
    [
        f.slots == 0,
        matches!((f.cpus_milli, cpus), (Some(have), Some(need)) if have < need),
        matches!((f.memory_mb, d.memory_mb), (Some(have), Some(need)) if have < need),
    ]
}

type Explained = (Vec<FilterCount>, Option<Vec<NodeVerdict>>);

/// The filter counts over every node, and each node's verdict when asked.
fn filter(st: &State, d: &Demand, now: i64, offline_after: Duration, with_nodes: bool) -> Explained {
    let mut excluded = [0u32; FILTERS.len()];
    let mut missing_labels: BTreeMap<String, u32> = d.requires.iter().map(|r| (r.to_string(), 0)).collect();
    let mut missing_secrets: BTreeMap<String, u32> = d.secrets.iter().map(|s| (s.to_string(), 0)).collect();
    let mut exhausted = Exhausted::default();
    let mut verdicts = Vec::new();
    for n in st.nodes() {
        let free = st.outcome().free_of(&n.id);
        let v = verdict(d, n, n.online(now, offline_after), free);
        match &v {
            Some((4, _)) => {
                for (r, count) in missing_labels.iter_mut() {
                    *count += u32::from(!fleet_api::labels::requirement_met(r, &n.info.labels));
                }
            }
            Some((5, _)) => {
                for (s, count) in missing_secrets.iter_mut() {
                    *count += u32::from(!n.info.secrets_for(&d.kind).contains(s));
                }
            }
            Some((6, _)) => {
                let [slots, cpus, mem] = shortages(d, free);
                exhausted.slots += u32::from(slots);
                exhausted.cpus += u32::from(cpus);
                exhausted.memory_mb += u32::from(mem);
            }
            _ => {}
        }
        if let Some((i, _)) = &v {
            excluded[*i] += 1;
        }
        if with_nodes {
            verdicts.push(NodeVerdict {
                node_id: n.id.to_string(),
                name: n.name.to_string(),
                fits: v.is_none(),
                reason: v.as_ref().map(|(i, _)| FILTERS[*i].1.to_string()),
                detail: v.map(|(_, d)| d),
            });
        }
    }
    verdicts.sort_by(|a, b| a.name.cmp(&b.name));
    let mut before = st.node_count() as u32;
    let counts = FILTERS
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            let c = FilterCount {
                filter: name.to_string(),
                before,
                excluded: excluded[i],
                missing: match i {
                    4 => Some(std::mem::take(&mut missing_labels)),
                    5 => Some(std::mem::take(&mut missing_secrets)),
                    _ => None,
                },
                exhausted: (i == 6).then(|| exhausted.clone()),
            };
            before -= excluded[i];
            c
        })
        .collect();
    (counts, with_nodes.then_some(verdicts))
}

/// What to do about a reason: the troubleshooting text (docs/troubleshooting.md).
pub fn hint(code: &str) -> &'static str {
    use codes::refusal;
    match code {
        codes::NO_NODE => "no node is online: start fleet-node on a joined machine, or join one (fleetctl join-key)",
        codes::NO_SCHEDULABLE_NODE => {
            "every online node is cordoned or draining: uncordon one (fleetctl uncordon <node>) or join another"
        }
        codes::NO_EXECUTOR_KIND => {
            "no online node runs this executor kind: add the kind to a node's executors in node.yaml and restart fleet-node"
        }
        codes::IMAGE_NOT_ALLOWED => {
            "no node of this kind admits the agent's image: add it to executors.<kind>.images in node.yaml and restart fleet-node"
        }
        codes::NO_LABEL => {
            "no online node has every label in placement.requires: add the label to a node's labels in node.yaml and restart fleet-node"
        }
        codes::NO_SECRET => {
            "no online node has every secret in placement.secrets: put a file named after the secret in a node's secretsDir"
        }
        codes::NO_CAPACITY => {
            "every fitting node is full: raise a node's capacity in node.yaml, lower the agent's resources, or join a node"
        }
        codes::PREEMPTED => {
            "a replica of a higher-priority agent took this one's room: it comes back when room appears (join a node, raise a node's capacity, lower the other agent's replicas, or raise this agent's placement.priority)"
        }
        codes::NODE_UNAVAILABLE => "the agent's node is offline and no other node fits: bring the node back or join another",
        codes::IDENTITY_PENDING => {
            "the controller could not create the agent's identity or PAT: the message says why (IAM unreachable, scope, expiry)"
        }
        refusal::SECRET_MISSING => "the node lacks a secret file the agent needs: put it in the node's secretsDir",
        refusal::SECRET_NOT_ALLOWED => {
            "the node does not offer this secret to the agent's kind: add it to executors.<kind>.secrets in node.yaml and restart fleet-node"
        }
        refusal::CREDENTIAL_UNREADABLE => {
            "the node cannot open its PAT: its stateDir was recreated after joining; join it again under a new name"
        }
        refusal::EXECUTOR_KIND_MISSING => "the node no longer runs this executor kind: restore it in node.yaml",
        refusal::START_FAILED => {
            "Docker did not create the container (often: the image is not on the machine; the node never pulls)"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Agent;
    use crate::reconcile::rules::derive::facts_of;
    use crate::reconcile::rules::placement::place;
    use crate::store::{Lifecycle, NodeInfo, NodeRec};
    use fleet_api::Capacity;
    use serde_json::json;
    use std::sync::Arc;

    const OFFLINE: Duration = Duration::from_secs(60);

    fn node(name: &str, online: bool, f: impl FnOnce(&mut NodeRec)) -> NodeRec {
        let mut n = NodeRec {
            id: format!("id-{name}").into(),
            name: name.into(),
            token_hash: [0; 32],
            public_key: [0; 32],
            joined_ms: 0,
            last_seen_ms: if online { crate::clock::now_ms() } else { 0 },
            info: NodeInfo {
                executor_kinds: vec!["k".into()],
                capacity: Capacity { slots: 2, cpus: Some(1.0), memory_mb: Some(1024) },
                ..Default::default()
            },
            allow: Default::default(),
            allowed: None,
            lifecycle: Lifecycle::Schedulable,
            reported: true,
        };
        f(&mut n);
        n
    }

    fn agent(key: &str, placement: serde_json::Value) -> Agent {
        serde_json::from_value(json!({"key": key, "revision": 3, "state": "running",
            "identity": {"kind": "agent"}, "executor": {"kind": "k", "image": null}, "placement": placement}))
        .unwrap()
    }

    /// A registry with these nodes and one agent, placed as the pass would.
    fn state(nodes: Vec<NodeRec>, a: Agent) -> State {
        let now = crate::clock::now_ms();
        let facts: Vec<_> = nodes.iter().map(|n| facts_of(n, n.online(now, OFFLINE))).collect();
        let demands: Vec<_> = crate::reconcile::rules::derive::demand(&a).into_iter().collect();
        let st =
            State::default().with_outcome(Arc::new(place(&demands, &facts, &super::super::placement::Bindings::new())));
        nodes.into_iter().fold(st, State::with_node).with_agents(Arc::new(vec![a]))
    }

    fn counts(e: &PlacementExplanation) -> Vec<(String, u32, u32)> {
        e.filters.iter().map(|f| (f.filter.clone(), f.before, f.excluded)).collect()
    }

    fn row(f: &str, before: u32, excluded: u32) -> (String, u32, u32) {
        (f.to_string(), before, excluded)
    }

    /// Every waiting reason of docs/behaviour.md#placement (and the `no_schedulable_node` of docs/behaviour.md#node-lifecycle): the first filter
    /// that leaves no node is the reason, the counts say how many each filter removed, and
    /// the hint says what to do.
    #[test]
    fn every_waiting_reason_is_explained_with_its_filter_counts() {
        let gpu = |n: &mut NodeRec| n.info.labels = vec!["gpu".into()];
        let cordon = |n: &mut NodeRec| n.lifecycle = Lifecycle::Cordoned;
        type Case = (&'static str, Vec<NodeRec>, serde_json::Value, Vec<(String, u32, u32)>);
        let cases: Vec<Case> = vec![
            (
                codes::NO_NODE,
                vec![node("a", false, |_| {}), node("b", false, |_| {})],
                json!({"replicas": 1}),
                vec![row("online", 2, 2), row("schedulable", 0, 0)],
            ),
            (
                codes::NO_SCHEDULABLE_NODE,
                vec![node("a", true, cordon), node("b", false, |_| {})],
                json!({"replicas": 1}),
                vec![row("online", 2, 1), row("schedulable", 1, 1), row("executor_kind", 0, 0)],
            ),
            (
                codes::NO_EXECUTOR_KIND,
                vec![node("a", true, |n| n.info.executor_kinds = vec!["other".into()])],
                json!({"replicas": 1}),
                vec![row("online", 1, 0), row("schedulable", 1, 0), row("executor_kind", 1, 1)],
            ),
            (
                codes::NO_LABEL,
                vec![node("a", true, |_| {}), node("b", true, |_| {}), node("c", true, gpu)],
                json!({"replicas": 1, "requires": ["gpu", "zone=eu"]}),
                vec![row("executor_kind", 3, 0), row("image", 3, 0), row("labels", 3, 3), row("secrets", 0, 0)],
            ),
            (
                codes::NO_SECRET,
                vec![node("a", true, |_| {})],
                json!({"replicas": 1, "secrets": ["github-token"]}),
                vec![row("labels", 1, 0), row("secrets", 1, 1), row("capacity", 0, 0)],
            ),
            (
                codes::NO_CAPACITY,
                vec![node("a", true, |n| n.info.capacity.slots = 0), node("b", true, |_| {})],
                json!({"replicas": 1, "resources": {"memoryMb": 4096}}),
                vec![row("secrets", 2, 0), row("capacity", 2, 2)],
            ),
        ];
        for (code, nodes, placement, want) in cases {
            let st = state(nodes, agent("x", placement));
            let e = explain(&st, "x", crate::clock::now_ms(), OFFLINE, false).unwrap();
            assert_eq!(e.phase, "waiting_for_node", "{code}");
            assert_eq!(e.reason.as_ref().map(|r| r.code.as_str()), Some(code), "{code}");
            assert_eq!(e.hint.as_deref(), Some(hint(code)), "{code}");
            let got = counts(&e);
            for w in &want {
                assert!(got.contains(w), "{code}: {w:?} in {got:?}");
            }
            assert_eq!(e.filters.len(), 7, "every filter, in order");
            assert!(e.nodes.is_none());
        }
    }

    #[test]
    fn missing_labels_secrets_and_exhausted_resources_are_counted_per_item() {
        let nodes = vec![
            node("a", true, |n| n.info.labels = vec!["gpu".into()]),
            node("b", true, |n| n.info.labels = vec!["zone=eu".into()]),
            node("c", true, |_| {}),
        ];
        let st = state(nodes, agent("x", json!({"replicas": 1, "requires": ["gpu", "zone=eu"]})));
        let e = explain(&st, "x", crate::clock::now_ms(), OFFLINE, true).unwrap();
        let labels = e.filters.iter().find(|f| f.filter == "labels").unwrap();
        assert_eq!(labels.missing.as_ref().unwrap(), &BTreeMap::from([("gpu".into(), 2), ("zone=eu".into(), 2)]));
        let verdicts = e.nodes.unwrap();
        assert_eq!(verdicts.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(verdicts[0].detail.as_deref(), Some("missing label zone=eu"));
        assert_eq!(verdicts[2].detail.as_deref(), Some("missing label gpu, zone=eu"));
        assert!(verdicts.iter().all(|v| !v.fits && v.reason.as_deref() == Some(codes::NO_LABEL)));

        let nodes = vec![node("a", true, |n| n.info.capacity.slots = 0), node("b", true, |_| {})];
        let st = state(nodes, agent("y", json!({"replicas": 1, "resources": {"cpus": 2, "memoryMb": 2048}})));
        let e = explain(&st, "y", crate::clock::now_ms(), OFFLINE, true).unwrap();
        let cap = e.filters.iter().find(|f| f.filter == "capacity").unwrap();
        assert_eq!(cap.exhausted, Some(Exhausted { slots: 1, cpus: 2, memory_mb: 2 }));
        assert_eq!(e.nodes.unwrap()[0].detail.as_deref(), Some("short of slots, cpus, memoryMb"));
    }

    /// A placed agent: where each replica runs, and the filters as they stand.
    #[test]
    fn a_placed_agent_shows_its_replicas_and_unknown_agents_are_none() {
        let st = state(vec![node("a", true, |_| {})], agent("x", json!({"replicas": 2})));
        let e = explain(&st, "x", crate::clock::now_ms(), OFFLINE, false).unwrap();
        assert_eq!((e.revision, e.desired_replicas), (3, 2));
        assert!(e.replicas.iter().all(|r| r.node.as_deref() == Some("a") && r.node_id.as_deref() == Some("id-a")));
        assert_eq!(e.replicas[0].state, "pending", "no report yet");
        let cap = e.filters.iter().find(|f| f.filter == "capacity").unwrap();
        assert_eq!((cap.before, cap.excluded), (1, 1), "its own replicas took the node's two slots");
        assert!(explain(&st, "nope", 0, OFFLINE, false).is_none());
    }

    /// docs/behaviour.md#why-an-agent-is-where-it-is with docs/behaviour.md#agent-status rule 7: a node's refusal of a placed replica is the reason, its
    /// message is the replica's, and the hint says what to do on the node.
    #[test]
    fn node_side_refusals_are_the_reason_of_a_placed_agent() {
        use codes::refusal;
        let table = [
            (refusal::secret_missing("github-token"), fleet_api::ReplicaState::Stopped, refusal::SECRET_MISSING),
            (
                refusal::secret_not_allowed("github-token", "k"),
                fleet_api::ReplicaState::Stopped,
                refusal::SECRET_NOT_ALLOWED,
            ),
            (
                refusal::CREDENTIAL_UNOPENABLE.to_string(),
                fleet_api::ReplicaState::Stopped,
                refusal::CREDENTIAL_UNREADABLE,
            ),
            (refusal::executor_kind_missing("k"), fleet_api::ReplicaState::Stopped, refusal::EXECUTOR_KIND_MISSING),
            (refusal::start_failed("No such image: a:1"), fleet_api::ReplicaState::Starting, refusal::START_FAILED),
        ];
        for (message, replica_state, code) in table {
            let report = fleet_api::ReplicaReport {
                agent_key: "x".into(),
                revision: 3,
                replica: 0,
                state: replica_state,
                restarts: 0,
                last_exit_code: None,
                message: Some(message.clone()),
                spec_id: None,
                busy_until: None,
            };
            let a = node("a", true, |n| n.info.replicas = vec![crate::store::Seen::of(report, |_| None)]);
            let mut st = state(vec![a], agent("x", json!({"replicas": 1})));
            st.put_identity("x", crate::store::IdentityRec { principal_id: "p".into(), bound: true });
            let pair = ("x".into(), "id-a".into());
            st.put_live_cred(
                &pair,
                Arc::new(crate::store::Cred {
                    sealed: crate::store::Sealed::from_base64("c", "s"),
                    n: 0,
                    principal_id: "p".into(),
                    expires_ms: i64::MAX,
                    issued_ms: 0,
                    revoke_ms: crate::store::MaybeMs::NONE,
                }),
            );
            let e = explain(&st, "x", crate::clock::now_ms(), OFFLINE, false).unwrap();
            assert_eq!(e.phase, "pending", "{code}");
            assert_eq!(e.reason.as_ref().map(|r| r.code.as_str()), Some(code), "{code}");
            assert_eq!(e.replicas[0].message.as_deref(), Some(message.as_str()));
            assert_eq!(e.replicas[0].node.as_deref(), Some("a"));
            assert_eq!(e.hint.as_deref(), Some(hint(code)), "{code}");
        }
    }

    /// Every hint is the text docs/troubleshooting.md gives for its reason.
    #[test]
    fn every_hint_is_in_the_troubleshooting_table() {
        let doc = include_str!("../../../../docs/troubleshooting.md");
        use codes::refusal;
        let others = [
            codes::PREEMPTED,
            codes::NODE_UNAVAILABLE,
            codes::IDENTITY_PENDING,
            refusal::SECRET_MISSING,
            refusal::SECRET_NOT_ALLOWED,
            refusal::CREDENTIAL_UNREADABLE,
            refusal::EXECUTOR_KIND_MISSING,
            refusal::START_FAILED,
        ];
        for code in crate::reconcile::rules::placement::REASONS.iter().chain(&others) {
            let h = hint(code);
            assert!(!h.is_empty(), "{code} has a hint");
            assert!(doc.contains(h), "docs/troubleshooting.md lacks the hint for {code}: {h}");
        }
    }
}
