//! The registry's identity and PAT writers: an agent's principal and its error, a pair's
//! live credential, retirements waiting for revocation, and the boxes a delivered desired
//! state lets go. Each records its change for the pass.

use super::state::State;
use crate::model::Id;
use crate::store::records::{Cred, IdentityRec, RetiringCred};
use std::sync::Arc;

impl State {
    pub(in crate::store) fn set_identity(&mut self, agent: &Id, rec: IdentityRec) {
        self.identities.insert(agent.clone(), rec);
        self.changes.identities.insert(agent.clone());
    }

    /// Sets (`Some`) or clears (`None`) an agent's identity error; returns whether it changed.
    pub(in crate::store) fn set_identity_error(&mut self, agent: &Id, error: Option<String>) -> bool {
        let changed = match error {
            Some(e) => self.identity_errors.insert(agent.clone(), e.clone()).as_ref() != Some(&e),
            None => self.identity_errors.remove(agent).is_some(),
        };
        if changed {
            self.changes.identities.insert(agent.clone());
        }
        changed
    }

    /// Makes `cred` the live credential of `pair`; returns the one it replaces.
    fn set_active(&mut self, pair: &(Id, Id), cred: Arc<Cred>) -> Option<Arc<Cred>> {
        let old = self.pairs.entry(&pair.0, &pair.1).live.replace(cred);
        self.changes.creds.insert(pair.clone());
        old
    }

    /// Takes credential `id` out of `pair` if it is the live one there.
    fn take_active(&mut self, pair: &(Id, Id), id: &str) -> Option<Arc<Cred>> {
        let rec = self.pairs.get_mut(&pair.0, &pair.1)?;
        if rec.live.as_ref().is_none_or(|c| c.id() != id) {
            return None;
        }
        self.changes.creds.insert(pair.clone());
        rec.live.take()
    }

    /// Credential `id` of `pair` is to be revoked at `at` (ms), or sooner if it already was:
    /// it is no longer live, and waits in the retiring credentials.
    pub(in crate::store) fn schedule_revoke(&mut self, pair: &(Id, Id), id: &str, at: impl Fn(Option<i64>) -> i64) {
        let cred = self.take_active(pair, id).or_else(|| self.retiring.remove(id).map(|r| r.cred));
        if let Some(mut c) = cred {
            let m = Arc::make_mut(&mut c);
            m.revoke_ms = Some(at(m.revoke_ms.get())).into();
            self.retiring.insert(c.id().into(), RetiringCred { pair: pair.clone(), cred: c });
        }
    }

    /// A new PAT of `pair` is stored: it becomes the live one, the pair's counter goes past
    /// its n, and `retire` (id, instant) is scheduled for revocation. Returns the node's name.
    pub(in crate::store) fn credential_stored(
        &mut self,
        pair: &(Id, Id),
        cred: Cred,
        retire: Option<(&Id, i64)>,
    ) -> Id {
        if let Some((old, at)) = retire {
            self.schedule_revoke(pair, old, |_| at);
        }
        self.pairs.entry(&pair.0, &pair.1).next_n = cred.n + 1;
        let name = self.nodes.get(&pair.1).map(|n| n.name.clone()).unwrap_or_else(|| pair.1.clone());
        let issued_ms = cred.issued_ms;
        if let Some(mut other) = self.set_active(pair, Arc::new(cred)) {
            // Only one worker issues a pair's PATs, and it named the live one in `retire`: a PAT
            // replaced here without one is a bug, kept for revocation rather than lost.
            tracing::warn!(credential = %other.id(), "a live PAT was replaced without being retired; it is revoked");
            let m = Arc::make_mut(&mut other);
            m.revoke_ms = Some(m.revoke_ms.get().unwrap_or(issued_ms)).into();
            self.retiring.insert(other.id().into(), RetiringCred { pair: pair.clone(), cred: other });
        }
        name
    }

    /// A PAT found by replaying its key (`revoke_ms` set): it waits for its revocation, and
    /// the pair's counter goes past it.
    pub(in crate::store) fn credential_found(&mut self, pair: &(Id, Id), cred: Cred) {
        let entry = self.pairs.entry(&pair.0, &pair.1);
        entry.next_n = entry.next_n.max(cred.n + 1);
        self.retiring.insert(cred.id().into(), RetiringCred { pair: pair.clone(), cred: Arc::new(cred) });
    }

    /// A retiring credential was revoked in IAM: it is forgotten. Returns the node's name.
    pub(in crate::store) fn credential_revoked(&mut self, r: &RetiringCred) -> Id {
        let id = r.cred.id();
        self.retiring.remove(&*id);
        self.take_active(&r.pair, &id);
        self.nodes.get(&r.pair.1).map(|n| n.name.clone()).unwrap_or_else(|| r.pair.1.clone())
    }

    /// The node has the body of `generation`: the body is let go, and so are the boxes of
    /// the live credentials it carried (the node has them; a later body reads them back).
    pub(in crate::store) fn delivered(&mut self, node: &Id, generation: u64) {
        let Some(d) = self.desired.get_mut(node).filter(|d| d.generation == generation && d.is_held()) else {
            return;
        };
        let boxed = d.let_go();
        for (agent, cred) in boxed.iter() {
            let Some(pair) = self.pairs.get_mut(agent, node) else { continue };
            if pair.live.as_ref().is_some_and(|live| Arc::ptr_eq(live, cred)) {
                pair.live = Some(Arc::new(cred.without_box()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::records::{MaybeMs, NodeRec, Sealed};

    fn pat(id: &str) -> Arc<Cred> {
        Arc::new(Cred {
            sealed: Sealed::from_base64(id, "c"),
            n: 0,
            principal_id: "p".into(),
            expires_ms: 0,
            issued_ms: 0,
            revoke_ms: MaybeMs::NONE,
        })
    }

    /// A live PAT is found by its pair only; once retired (by a rotation, by the pass, or by
    /// its node's deletion) it leaves the pair and waits by id with its revoke instant, the
    /// earliest one winning on a deletion; each step is recorded for the pass.
    #[test]
    fn a_retired_pat_leaves_its_pair_and_waits_by_id() {
        let mut st = State::default();
        let pair: (Id, Id) = ("a".into(), "n1".into());
        assert!(st.set_active(&pair, pat("p0")).is_none());
        assert_eq!(st.live_cred(&pair).map(|c| c.id().into_owned()).as_deref(), Some("p0"));
        assert!(st.retiring("p0").is_none(), "a live PAT is not kept by id");
        assert!(st.take_changes().creds.contains(&pair));

        // A rotation: the old one is scheduled, then the new one goes live.
        st.schedule_revoke(&pair, "p0", |_| 5_000);
        assert!(st.set_active(&pair, pat("p1")).is_none());
        assert_eq!(st.live_cred(&pair).map(|c| c.id().into_owned()).as_deref(), Some("p1"));
        assert_eq!(st.retiring("p0").and_then(|r| r.cred.revoke_ms.get()), Some(5_000));

        // Naming a PAT that is not the pair's live one leaves the live one alone.
        st.schedule_revoke(&pair, "nope", |_| 1);
        assert_eq!(st.live_cred(&pair).map(|c| c.id().into_owned()).as_deref(), Some("p1"));

        // The node is deleted: both are due now, the earlier instant kept.
        let rec = NodeRec::bare("n1", "one");
        let deleted = st.forget_node(&rec, 3_000);
        let mut revoked = deleted.revoke.clone();
        revoked.sort();
        assert_eq!(revoked, ["p0", "p1"]);
        assert!(st.live_cred(&pair).is_none());
        assert_eq!(st.retiring("p0").and_then(|r| r.cred.revoke_ms.get()), Some(3_000));
        assert_eq!(st.retiring("p1").and_then(|r| r.cred.revoke_ms.get()), Some(3_000));
        assert_eq!(st.retiring_creds().count(), 2);
    }
}
