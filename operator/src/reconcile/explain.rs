//! "Why is my agent where it is" (SPEC §10.2): the filters of §5.1 applied one after another
//! over every known node, with counts, what is missing, and the troubleshooting hint. It is
//! computed on request from what the pass published (the registry's nodes, the last
//! outcome with each node's room left) and costs nothing while no one asks: one look at
//! each node, no sum over bindings.

use super::derive::{agent_status, demand, Lookup};
use super::placement::{Demand, Free};
use crate::model::Id;
use crate::store::{NodeRec, State};
use fleet_api::{codes, Exhausted, FilterCount, NodeVerdict, PlacementExplanation, ReasonView, ReplicaPlacement};
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
    let lookup_node = |id: &Id| st.nodes.get(id).map(|n| (&*n.name, n.online(now, offline_after)));
    let has_cred = |pair: &(Id, Id)| st.live_cred(pair).is_some();
    let status = agent_status(agent, &st.outcome, st, &Lookup { node: &lookup_node, has_cred: &has_cred });
    let phase = serde_json::to_value(status.phase).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
    let reason = status.reason.as_ref().map(|r| ReasonView { code: r.code.clone(), message: r.message.clone() });
    let replicas = status
        .replicas
        .iter()
        .map(|r| {
            let node_id = st.outcome.bindings.get(&(Id::from(key), r.replica)).map(|n| n.to_string());
            ReplicaPlacement {
                replica: r.replica,
                node_id,
                node: r.node.clone(),
                state: serde_json::to_value(r.state)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default(),
                message: r.message.clone(),
            }
        })
        .collect();
    let (filters, nodes) = match demand(agent) {
        Some(d) => filter(st, &d, now, offline_after, with_nodes),
        None => (Vec::new(), with_nodes.then(Vec::new)),
    };
    let hint = reason.as_ref().map(|r| hint(&r.code).to_string()).filter(|h| !h.is_empty());
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
    })
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
    if !n.info.executor_kinds.contains(&d.kind) {
        return Some((2, format!("no executor kind {}", d.kind)));
    }
    if let Some(img) = &d.image {
        if !n.allow.get(&d.kind).is_some_and(|l| l.admits(img)) {
            return Some((3, format!("image {img} not allowed for {}", d.kind)));
        }
    }
    let missing: Vec<&str> = d
        .requires
        .iter()
        .filter(|r| !fleet_api::labels::requirement_met(r, &n.info.labels))
        .map(|s| s.as_str())
        .collect();
    if !missing.is_empty() {
        return Some((4, format!("missing label {}", missing.join(", "))));
    }
    let lacking: Vec<&str> =
        d.secrets.iter().filter(|s| !n.info.secrets.iter().any(|x| x == *s)).map(|s| s.as_str()).collect();
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

/// Whether the node's room left is short of a slot, the cpus or the memory `d` needs.
fn shortages(d: &Demand, free: Option<&Free>) -> [bool; 3] {
    let f = free.copied().unwrap_or_default();
    let cpus = d.cpus.map(|c| (c * 1000.0).round().max(0.0) as u64);
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
    let mut missing_labels: BTreeMap<String, u32> = d.requires.iter().map(|r| (r.clone(), 0)).collect();
    let mut missing_secrets: BTreeMap<String, u32> = d.secrets.iter().map(|s| (s.clone(), 0)).collect();
    let mut exhausted = Exhausted::default();
    let mut verdicts = Vec::new();
    for n in st.nodes.values() {
        let free = st.outcome.free.get(&n.id);
        let v = verdict(d, n, n.online(now, offline_after), free);
        match &v {
            Some((4, _)) => {
                for (r, count) in missing_labels.iter_mut() {
                    *count += u32::from(!fleet_api::labels::requirement_met(r, &n.info.labels));
                }
            }
            Some((5, _)) => {
                for (s, count) in missing_secrets.iter_mut() {
                    *count += u32::from(!n.info.secrets.iter().any(|x| x == s));
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
    let mut before = st.nodes.len() as u32;
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
        codes::NODE_UNAVAILABLE => "the agent's node is offline and no other node fits: bring the node back or join another",
        codes::IDENTITY_PENDING => {
            "the controller could not create the agent's identity or PAT: the message says why (IAM unreachable, scope, expiry)"
        }
        refusal::SECRET_MISSING => "the node lacks a secret file the agent needs: put it in the node's secretsDir",
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
