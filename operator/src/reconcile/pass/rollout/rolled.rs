//! What the rollout phase decided, for the phases after it.

use crate::model::Id;
use crate::store::{Rollout, State};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::Arc;

/// What the phase decided.
#[derive(Default)]
pub struct Rolled {
    /// The rollouts this pass changed; `None` lets one go from memory.
    pub changed: HashMap<Id, Option<Arc<Rollout>>>,
    /// Those of them the phase has not yet published as it committed them: the pass's first
    /// commit publishes these.
    pub unpublished: Vec<(Id, Option<Arc<Rollout>>)>,
    /// Nodes whose template of some agent changed (a step, a revert): their desired states
    /// are built again. A rollout starting or ending changes no node's template — a node is
    /// sent what it ran — so it dirties nothing by itself (the CP change that started it did).
    pub nodes: HashSet<Id>,
    /// The earliest instant (ms) a rollout needs another look: a replica's `minReadySeconds`
    /// or progress deadline running out.
    pub next_due: Option<i64>,
}

impl Rolled {
    /// The agent's rollout as this pass leaves it.
    pub fn get<'a>(&'a self, st: &'a State, key: &str) -> Option<&'a Arc<Rollout>> {
        match self.changed.get(key) {
            Some(r) => r.as_ref(),
            None => st.rollout(key),
        }
    }

    pub fn due(&mut self, at: i64) {
        self.next_due = Some(self.next_due.map_or(at, |d| d.min(at)));
    }
}
