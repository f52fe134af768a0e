//! The registry as the database has it, read back at start and when a replica takes the
//! lease over.

use super::state::State;
use crate::model::{Agent, Id, Shared, Template};
use crate::store::db::{CredRow, NodeRow, Snapshot};
use crate::store::kept::{self, Outcome, Placements, StatusBody};
use crate::store::records::catch_up::{self, CatchUp};
use crate::store::records::node::{from_hex, DELETED_PREFIX};
use crate::store::records::{Cred, DesiredRec, IdentityRec, Linger, NodeInfo, NodeRec, RetiringCred, Rollout, Sealed};
use std::collections::BTreeMap;
use std::sync::Arc;

impl State {
    /// The registry as the database has it; every node's last-seen time becomes
    /// max(stored, `now`), so an outage of the controller does not make the fleet look
    /// offline (docs/behaviour.md#node-liveness).
    pub(in crate::store) fn from_snapshot(snap: Snapshot, now: i64) -> State {
        let mut st = State::default();
        for rec in snap.nodes.into_iter().filter_map(|r| node_from_row(r, now)) {
            st.insert_node(rec);
        }
        let bindings = snap.placements.into_iter().map(|(a, r, n)| (Id::from(a), r as u32, Id::from(n))).collect();
        st.outcome = Arc::new(Outcome { bindings, ..Default::default() });
        for (agent, principal_id, bound) in snap.identities {
            st.identities.insert(agent.into(), IdentityRec { principal_id: principal_id.into(), bound });
        }
        for (agent, node, next_n, pending_n) in snap.pairs {
            st.pairs.entry(&agent.into(), &node.into()).next_n = pending_n.unwrap_or(next_n) as u64;
        }
        for row in snap.credentials {
            let (pair, mut c) = cred_from_row(row);
            if let Some(i) = st.identities.get(&pair.0).filter(|i| i.principal_id == c.principal_id) {
                c.principal_id = i.principal_id.clone();
            }
            match c.revoke_ms.get() {
                None => st.pairs.entry(&pair.0, &pair.1).live = Some(Arc::new(c)),
                Some(_) => drop(st.retiring.insert(c.id().into(), RetiringCred { pair, cred: Arc::new(c) })),
            }
        }
        // Bodies are read back when a node asks for one it does not have (most have theirs).
        for (node, generation, agents) in snap.desired {
            st.desired.insert(node.into(), DesiredRec::stored(generation as u64, &agents));
        }
        for (node, hash) in snap.input_hashes {
            if st.desired.contains_key(node.as_str()) {
                st.desired_hashes.insert(node.into(), hash as u64);
            }
        }
        for (agent, body) in snap.statuses {
            if let Ok(b) = serde_json::from_str::<StatusBody>(&body) {
                st.statuses_sent.insert(agent.into(), kept::Sent::of(&b));
            }
        }
        st.set_agents(Arc::new(stored_agents(snap.agents)));
        // The stored placements are listed from the start, not only once the first pass
        // has published them: an admin asking right after a restart sees what is stored.
        st.placements = Placements::of_list(&st.agents, st.outcome.clone());
        let mut templates = Shared::default();
        for (k, v) in snap.kv {
            if k == "agents_etag" {
                st.agents_etag = Some(v);
            } else if let Some(agent) = k.strip_prefix("rollout/") {
                st.load_rollout(agent, &v, &mut templates);
            } else if k.starts_with(crate::store::records::linger::PREFIX) {
                st.load_linger(&k, &v);
            } else if let Some(hash) = k.strip_prefix(DELETED_PREFIX).and_then(from_hex) {
                st.deleted_tokens.insert(hash);
            } else if let Some(agent) = k.strip_prefix(kept::UNSETTLED_PREFIX) {
                // Sent, or about to be, by a leader that may not have stored what the CP
                // accepted: the copy read above is not trusted, and the status goes again.
                st.statuses_sent.remove(agent);
                st.unsettled.insert(agent.into());
            } else if k == catch_up::KEY {
                st.catch_up = CatchUp::parse(&v);
            }
        }
        st
    }
}

impl State {
    /// A stored rollout, kept in memory while it says something its agent's item does not;
    /// its templates shared with the other rollouts' equal ones.
    fn load_rollout(&mut self, agent: &str, row: &str, templates: &mut Shared) {
        let mut r: Rollout = match serde_json::from_str(row) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(agent, error = %e, "a stored rollout does not parse; the agent's replicas keep what they run");
                return;
            }
        };
        let Some(a) = self.agent(agent) else { return };
        r.target = templates.share_arc(r.target);
        r.previous = r.previous.map(|t| templates.share_arc(t));
        if r.rare.is_boxed() {
            r.rare.older = std::mem::take(&mut r.rare.older).into_iter().map(|t| templates.share_arc(t)).collect();
        }
        if r.worth_keeping(&Template::of(a, r.target.restart)) {
            self.rollouts.insert(a.key.clone(), Arc::new(r));
        }
    }
}

impl State {
    /// A stored lingering replica (a pass ends one whose agent or node has gone).
    fn load_linger(&mut self, key: &str, row: &str) {
        match (Linger::parse_key(key), serde_json::from_str::<Linger>(row)) {
            (Some((agent, replica)), Ok(l)) => drop(self.lingering.insert((Id::from(agent), replica), l)),
            _ => tracing::error!(key, "a stored lingering replica does not parse; its old container is let go"),
        }
    }
}

/// The stored agent list in key order; a row that no longer parses is skipped, with an error
/// (the CP's list replaces it at the next read).
fn stored_agents(rows: Vec<String>) -> Vec<Agent> {
    let mut interner = crate::model::Interner::default();
    let mut agents: Vec<Agent> = rows
        .into_iter()
        .filter_map(|row| match serde_json::from_str::<Agent>(&row) {
            Ok(mut a) => {
                a.intern(None, &mut interner);
                Some(a)
            }
            Err(e) => {
                tracing::error!(error = %e, "a stored agent does not parse; skipped until the CP is read");
                None
            }
        })
        .collect();
    agents.sort_unstable_by(|a, b| a.key.cmp(&b.key));
    agents
}

/// A stored node, seen no earlier than `now`; `None` (logged) for a malformed row.
pub(super) fn node_from_row(r: NodeRow, now: i64) -> Option<NodeRec> {
    let info: NodeInfo = serde_json::from_str(&r.info).unwrap_or_default();
    let (Ok(token_hash), Ok(public_key)) = (r.token_hash.try_into(), r.public_key.try_into()) else {
        tracing::error!(node = %r.id, "stored node has a malformed token hash or key; skipped");
        return None;
    };
    let mut rec = NodeRec {
        id: r.id.into(),
        name: r.name.into(),
        token_hash,
        public_key,
        joined_ms: r.joined_ms,
        last_seen_ms: r.last_seen_ms.max(now),
        info,
        allow: BTreeMap::new(),
        allowed: crate::store::records::claims::allowance_of(r.allowed.as_deref()),
        lifecycle: r.lifecycle,
        reported: false,
    };
    // Split under the stored allowance: the report written last may predate a change of it.
    rec.readmit();
    Some(rec)
}

/// A stored credential and its (agent, node) pair. Its box stays in the database: a
/// node that needs it again has it in its desired state, and a new desired state reads
/// it back.
fn cred_from_row(r: CredRow) -> ((Id, Id), Cred) {
    let cred = Cred {
        sealed: Sealed::stored(&r.id),
        n: r.n as u64,
        principal_id: r.principal_id.into(),
        expires_ms: r.expires_ms,
        issued_ms: r.issued_ms,
        revoke_ms: r.revoke_ms.into(),
    };
    ((r.agent_key.into(), r.node_id.into()), cred)
}
