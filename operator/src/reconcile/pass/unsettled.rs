//! Which agents' statuses the CP may not have yet, as every replica can read it: the pass
//! stores a mark (`unsettled-status/<agent>`, [`crate::store::kept::UNSETTLED_PREFIX`]) with
//! its writes before it wants a status sent, and clears the mark in a later pass once no send
//! of it is wanted, queued or on the wire. A replica taking the lease over trusts the stored
//! copy of what the CP accepted for every agent without a mark, and sends again only the
//! marked ones (docs/behaviour.md#high-availability): a status the old leader sent but had
//! not stored yet is always marked, because the mark was committed before the want that sent
//! it was published.
//!
//! A mark stays while anything could still send: a want of an earlier pass, a work item in
//! the queue or in flight (a send that ends after its want was dropped). Clearing late only
//! costs a resend after a takeover; clearing early could leave the CP with a body no replica
//! knows of.

use super::plan::Plan;
use crate::model::Id;
use crate::reconcile::work::{Ctx, WorkKey};
use crate::store::kept::{unsettled_key, Marks, Sent};
use std::collections::HashSet;

/// What the rule reads of the registry and the queue, for one agent.
pub trait Seen {
    /// What the CP last accepted, as the registry has it.
    fn sent(&self, agent: &Id) -> Option<Sent>;
    /// Whether a send may still happen without this pass: a want of an earlier pass, or a
    /// work item queued, delayed or in flight.
    fn pending(&self, agent: &Id) -> bool;
}

/// The rule: an agent this pass wants a status sent for (computed, and not what the CP has)
/// gets a mark unless it has one; a marked agent with nothing pending and no send wanted by
/// this pass loses it.
pub fn marks(statuses: &[(Id, Option<Sent>)], marked: &HashSet<Id>, seen: &impl Seen) -> Marks {
    let mut out = Marks::default();
    let mut wanted: HashSet<&Id> = HashSet::new();
    for (agent, want) in statuses {
        let Some(want) = want else { continue };
        if seen.sent(agent) != Some(*want) {
            wanted.insert(agent);
            if !marked.contains(agent) {
                out.set.push(agent.clone());
            }
        }
    }
    for agent in marked {
        if !wanted.contains(agent) && !seen.pending(agent) {
            out.clear.push(agent.clone());
        }
    }
    out.clear.sort_unstable();
    out
}

/// The registry and the work queue as the rule reads them.
struct Live<'a> {
    st: &'a crate::store::State,
    ctx: &'a Ctx,
}

impl Seen for Live<'_> {
    fn sent(&self, agent: &Id) -> Option<Sent> {
        self.st.status_sent(agent).copied()
    }

    fn pending(&self, agent: &Id) -> bool {
        self.st.status_wanted(agent).is_some() || self.ctx.work.queue.scheduled(&WorkKey::Status(agent.clone()))
    }
}

/// Adds the marks to the pass's rows (committed before its wants are published) and to what
/// it publishes (the registry's own copy of them).
pub fn mark(ctx: &Ctx, plan: &mut Plan) {
    let marks = {
        let st = ctx.store.read();
        marks(&plan.publish.statuses, st.unsettled(), &Live { st: &st, ctx })
    };
    for agent in &marks.set {
        plan.rows.kv.push((unsettled_key(agent), "1".into()));
    }
    for agent in &marks.clear {
        plan.rows.kv_delete.push((unsettled_key(agent), None));
    }
    plan.publish.unsettled = marks;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::kept::StatusBody;
    use std::collections::HashMap;

    #[derive(Default)]
    struct Fake {
        sent: HashMap<Id, Sent>,
        pending: HashSet<Id>,
    }

    impl Seen for Fake {
        fn sent(&self, agent: &Id) -> Option<Sent> {
            self.sent.get(agent).copied()
        }
        fn pending(&self, agent: &Id) -> bool {
            self.pending.contains(agent)
        }
    }

    fn body(ready: u32) -> Sent {
        Sent::of(&StatusBody {
            phase: crate::store::kept::Phase::Running,
            reason: None,
            node: None,
            observed_revision: None,
            ready_replicas: ready,
            desired_replicas: 1,
            replicas: vec![],
        })
    }

    fn ids(v: &[&str]) -> Vec<Id> {
        v.iter().map(|s| Id::from(*s)).collect()
    }

    /// A pass that wants what the CP has marks nothing: a takeover with nothing changed
    /// stores no mark and sends nothing.
    #[test]
    fn a_status_the_cp_has_is_not_marked() {
        let mut seen = Fake::default();
        seen.sent.insert("a".into(), body(1));
        let m = marks(&[("a".into(), Some(body(1))), ("b".into(), None)], &HashSet::new(), &seen);
        assert_eq!(m, Marks::default());
    }

    /// A new want is marked once; a marked agent keeps its mark while a send may happen.
    #[test]
    fn a_want_is_marked_once_and_kept_while_a_send_may_happen() {
        let mut seen = Fake::default();
        seen.sent.insert("a".into(), body(0));
        let statuses = [("a".into(), Some(body(1))), ("b".into(), Some(body(1)))];
        let m = marks(&statuses, &HashSet::from(["b".into()]), &seen);
        assert_eq!(m, Marks { set: ids(&["a"]), clear: vec![] });
        seen.pending.insert("c".into());
        let m = marks(&[], &HashSet::from(["c".into()]), &seen);
        assert_eq!(m, Marks::default(), "queued or on the wire: kept");
    }

    /// Once the CP has it and nothing is pending, the mark goes, even when this pass computed
    /// the agent again.
    #[test]
    fn a_settled_mark_is_cleared() {
        let mut seen = Fake::default();
        seen.sent.insert("a".into(), body(1));
        let marked = HashSet::from(["a".into(), "gone".into()]);
        let m = marks(&[("a".into(), Some(body(1))), ("gone".into(), None)], &marked, &seen);
        assert_eq!(m, Marks { set: vec![], clear: ids(&["a", "gone"]) });
    }
}
