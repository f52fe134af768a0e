//! The record of what changed since the pass last looked. Every writer of the registry adds
//! its change here in the critical section that makes it, so the pass recomputes only what
//! changed and never misses a change.

use crate::model::Id;
use std::collections::HashSet;

/// Changes the pass has not seen yet. Each writer of the registry records its change here in
/// the critical section that makes it, so a pass that takes these and then reads the state
/// never misses one (a change made in between is read now and recomputed once more later).
#[derive(Debug, Default)]
pub struct Changes {
    /// Nodes that joined or whose placement facts (labels, kinds, images, capacity,
    /// secrets) changed.
    pub facts: HashSet<Id>,
    /// Nodes whose replica reports or health changed.
    pub reports: HashSet<Id>,
    /// Nodes that reported after being offline, or changed their report period (and with
    /// it their offline threshold).
    pub seen: HashSet<Id>,
    /// (agent, node) pairs whose live credential changed.
    pub creds: HashSet<(Id, Id)>,
    /// Agents whose identity or identity error changed.
    pub identities: HashSet<Id>,
    /// A node was deleted: the next pass starts from scratch (deletes are rare; the memo's
    /// per-node parts are simpler rebuilt than patched).
    pub rebuild: bool,
    /// Credentials of deleted nodes, to revoke now.
    pub revoke_now: Vec<String>,
    /// Nodes that reported a newer generation than the store has for them.
    pub ahead: HashSet<Id>,
}
