//! The rows the store reads and writes, and the writes it folds into one transaction: the
//! bottom of the database layer, with no SQL in it.

use crate::model::{AgentList, Id};
use crate::store::records::event::Event;
use crate::store::records::{Lifecycle, Rollout};
use std::collections::BTreeMap;

/// The lease a leader holds (docs/behaviour.md#high-availability): its writes carry it, and are refused once it ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fence {
    pub holder: String,
    pub epoch: i64,
}

/// A join key row as listed (its hash, never the key).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct JoinKeyRow {
    pub hash: Vec<u8>,
    pub note: String,
    pub created_ms: i64,
    pub expires_ms: i64,
    pub used_ms: Option<i64>,
    pub node_id: Option<String>,
    pub allowed: Option<String>,
}

/// A node row as stored.
#[derive(Debug, Clone)]
pub struct NodeRow {
    pub id: String,
    pub name: String,
    pub token_hash: Vec<u8>,
    pub public_key: Vec<u8>,
    pub joined_ms: i64,
    pub last_seen_ms: i64,
    pub info: String,
    pub lifecycle: Lifecycle,
    /// The node's allowance as JSON; `None` allows anything.
    pub allowed: Option<String>,
}

#[derive(Debug, Clone)]
pub struct CredRow {
    pub id: String,
    pub agent_key: String,
    pub node_id: String,
    pub n: i64,
    pub principal_id: String,
    pub ciphertext: String,
    pub expires_ms: i64,
    pub issued_ms: i64,
    pub revoke_ms: Option<i64>,
}

/// Everything read back at start.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub nodes: Vec<NodeRow>,
    pub placements: Vec<(String, i64, String)>,
    pub identities: Vec<(String, String, bool)>,
    pub pairs: Vec<(String, String, i64, Option<i64>)>,
    pub credentials: Vec<CredRow>,
    pub desired: Vec<(String, i64, String)>,
    /// (node, the hash of its body's inputs) where one is stored.
    pub input_hashes: Vec<(String, i64)>,
    pub statuses: Vec<(String, String)>,
    /// The stored agent list, one agent's JSON a row (in no particular order).
    pub agents: Vec<String>,
    pub kv: Vec<(String, String)>,
}

pub enum JoinOutcome {
    Joined,
    /// The key's node joined again (same name and public key, key still within its TTL): it
    /// keeps its id and has the new token (docs/behaviour.md#node-lifecycle).
    Rejoined {
        id: String,
    },
    KeyInvalid,
    NameTaken,
}

/// One pass's writes.
#[derive(Debug, Default)]
pub struct PassWrite {
    /// (agent, replica) and (agent, replica, node): the registry's own strings, shared (a
    /// fleet coming up binds 100,000 replicas, and two new strings each would be ~6 MB).
    pub unbind: Vec<(Id, u32)>,
    pub bind: Vec<(Id, u32, Id)>,
    /// (node, generation, agents JSON): a slice of the body the node is served, so a pass
    /// holds each body it changed once ([`crate::store::records::DesiredRec::agents_bytes`]).
    pub desired: Vec<(String, u64, axum::body::Bytes)>,
    /// (node, hash of its body's inputs) for every body the pass built, written or not: the
    /// next leader builds only those whose hash differs.
    pub input_hashes: Vec<(String, u64)>,
    pub retire: Vec<(String, i64)>,
    pub kv: Vec<(String, String)>,
    /// `kv` rows to delete: when the value is given, only while the row still holds it.
    pub kv_delete: Vec<(String, Option<String>)>,
    /// Rollouts to store as `kv` rows (`rollout/<agent>`): the records the registry gets,
    /// serialised a few hundred at a time as they are written — a fleet-wide change starts
    /// 20,000 rollouts in one pass, ~40 MB as JSON at once.
    pub rollouts: Vec<std::sync::Arc<Rollout>>,
    /// The pass's events, written with what they tell of: a reader who sees a rollout
    /// complete finds its `rollout_completed` in the history (the flusher trims it after).
    pub events: Vec<Event>,
}

impl PassWrite {
    pub fn is_empty(&self) -> bool {
        self.unbind.is_empty()
            && self.bind.is_empty()
            && self.desired.is_empty()
            && self.input_hashes.is_empty()
            && self.retire.is_empty()
            && self.kv.is_empty()
            && self.kv_delete.is_empty()
            && self.rollouts.is_empty()
            && self.events.is_empty()
    }
}

/// A change of the stored agent list (one row an agent): the agents to write are read from
/// the list and serialised a few hundred at a time as they are written, so a change of the
/// whole list (the first read, or a resync) is never held as one JSON text.
#[derive(Debug, Default)]
pub struct AgentsWrite {
    pub list: AgentList,
    /// Positions in `list` of the agents that are new or changed.
    pub put: Vec<usize>,
    /// Keys of stored agents the list no longer has.
    pub delete: Vec<String>,
    /// The stored rows are unknown (a write failed): every row is replaced by `put`.
    pub replace_all: bool,
    pub etag: String,
}

impl AgentsWrite {
    /// The whole list, replacing whatever rows are stored.
    pub fn all(list: AgentList, etag: String) -> AgentsWrite {
        AgentsWrite { put: (0..list.len()).collect(), list, delete: vec![], replace_all: true, etag }
    }
}

/// One write, as the worker asked for it.
#[derive(Debug, Clone)]
pub enum Op {
    Identity {
        agent: String,
        principal: String,
        bound: bool,
    },
    /// An issued credential; raises its pair's counter to `next_n` and retires the one it replaces.
    Credential {
        row: CredRow,
        next_n: i64,
        retire: Option<(String, i64)>,
    },
    DeleteCredential {
        id: String,
    },
    Status {
        agent: String,
        body: String,
    },
}

/// What a run of writes comes to. Each table's writes are final values keyed by row (the
/// last write of a row wins, as if they had run one after another), and are applied in an
/// order that gives the same result as running them in sequence: a credential is inserted
/// before it can be retired, and deletions come last (an id is never re-inserted).
#[derive(Default)]
pub struct Batch<'a> {
    pub identities: BTreeMap<&'a str, (&'a str, bool)>,
    /// Each pair's PAT counter, raised with the credential it keyed.
    pub pairs: BTreeMap<(&'a str, &'a str), i64>,
    pub credentials: Vec<&'a CredRow>,
    /// In order: applied one by one, the last retirement of an id wins.
    pub retire: Vec<(&'a str, i64)>,
    pub delete: Vec<&'a str>,
    pub statuses: BTreeMap<&'a str, &'a str>,
}

impl<'a> Batch<'a> {
    /// Folds a run of writes into final values per row.
    pub fn fold(ops: &[&'a Op]) -> Batch<'a> {
        let mut b = Batch::default();
        for op in ops {
            match op {
                Op::Identity { agent, principal, bound } => {
                    b.identities.insert(agent, (principal, *bound));
                }
                Op::Credential { row, next_n, retire } => {
                    b.credentials.push(row);
                    b.pairs.insert((&row.agent_key, &row.node_id), *next_n);
                    if let Some((id, at)) = retire {
                        b.retire.push((id, *at));
                    }
                }
                Op::DeleteCredential { id } => b.delete.push(id),
                Op::Status { agent, body } => {
                    b.statuses.insert(agent, body);
                }
            }
        }
        b
    }
}
