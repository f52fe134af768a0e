//! What a pass keeps of the agent list it replaces: the agents changed since the last
//! committed pass, each as it was. The replaced list itself is dropped as the pass diffs it.

use crate::model::{Id, Template};
use crate::store::kept::Listed;
use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

/// An agent as the last committed pass saw it, for one the CP changed or removed since: what
/// its placement items said (the placements gauge counts the difference) and the template its
/// replicas run (a change of it starts a rollout).
#[derive(Clone)]
pub struct Was {
    pub listed: Listed,
    /// With no restart stamp.
    pub template: Arc<Template>,
}

/// All a pass needs of the agent list the last committed pass saw: the agents changed since,
/// by key, each as it was (`None`: not listed then). A change of every agent would otherwise
/// hold two lists (~9 MB each at 20,000 agents) through the pass that starts its rollouts.
#[derive(Clone, Default)]
pub struct Replaced(HashMap<Id, Option<Was>>);

impl Replaced {
    /// `None`: the agent did not change; `Some(None)`: it was not listed.
    pub fn get(&self, key: &str) -> Option<Option<&Was>> {
        self.0.get(key).map(Option::as_ref)
    }

    /// Records a change of the agent `key`, as `was` says it was, unless an earlier pass
    /// since the last committed one recorded it: that is what it was then.
    pub fn note(&mut self, key: &Id, was: impl FnOnce() -> Option<Was>) {
        self.0.entry(key.clone()).or_insert_with(was);
    }

    /// Every agent changed.
    pub fn keys(&self) -> impl Iterator<Item = &Id> {
        self.0.keys()
    }

    /// Listed at the last committed pass, and changed or removed since.
    pub fn was_listed(&self, key: &str) -> bool {
        matches!(self.get(key), Some(Some(_)))
    }
}
