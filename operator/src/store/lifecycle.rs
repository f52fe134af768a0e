//! A node's lifecycle (SPEC §10.1): cordon, drain and delete, each written through like the
//! rest of the store (database, then registry, then the change record and an event).

use super::events::{Event, Kind};
use super::{Id, State, Store};
use crate::clock;
use fleet_api::NodeView;
use std::time::Duration;

/// Whether new replicas may be placed on a node, and whether its replicas are moving off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lifecycle {
    #[default]
    Schedulable,
    /// No new replica is placed; those there stay.
    Cordoned,
    /// Cordoned, and every replica moves off; `done_ms` once none is left bound.
    Draining { started_ms: i64, force: bool, done_ms: Option<i64> },
}

impl Lifecycle {
    pub fn schedulable(self) -> bool {
        self == Lifecycle::Schedulable
    }

    /// `Some(force)` while draining.
    pub fn draining(self) -> Option<bool> {
        match self {
            Lifecycle::Draining { force, .. } => Some(force),
            _ => None,
        }
    }

    /// As stored: (cordoned, drain started, force, drain done).
    pub fn columns(self) -> (bool, Option<i64>, bool, Option<i64>) {
        match self {
            Lifecycle::Schedulable => (false, None, false, None),
            Lifecycle::Cordoned => (true, None, false, None),
            Lifecycle::Draining { started_ms, force, done_ms } => (true, Some(started_ms), force, done_ms),
        }
    }

    pub fn from_columns(cordoned: bool, started: Option<i64>, force: bool, done: Option<i64>) -> Lifecycle {
        match (started, cordoned) {
            (Some(started_ms), _) => Lifecycle::Draining { started_ms, force, done_ms: done },
            (None, true) => Lifecycle::Cordoned,
            (None, false) => Lifecycle::Schedulable,
        }
    }
}

/// What an admin asks of a node's lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Cordon,
    Uncordon,
    Drain { force: bool },
}

/// A drain's progress as the last pass saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainProgress {
    /// Replicas still bound to the node.
    pub remaining: u32,
    /// Those with nowhere else to go.
    pub blocked: Vec<(Id, u32)>,
}

/// A deleted node, and the credentials to revoke now.
#[derive(Debug)]
pub struct Deleted {
    pub id: Id,
    pub name: Id,
    pub revoke: Vec<String>,
}

impl State {
    /// The node with this id, or else this name.
    pub fn resolve(&self, id_or_name: &str) -> Option<Id> {
        if let Some(n) = self.nodes.get(id_or_name) {
            return Some(n.id.clone());
        }
        self.by_name.get(id_or_name).cloned()
    }

    /// The node's view with its drain's progress.
    pub fn node_view(&self, n: &super::NodeRec, now_ms: i64, offline_after: Duration) -> NodeView {
        let mut v = n.view(now_ms, offline_after);
        if let Some(free) = self.outcome.free_of(&n.id) {
            v.slots_used = n.info.capacity.slots.saturating_sub(free.slots);
        }
        if let Lifecycle::Draining { started_ms, force, .. } = n.lifecycle {
            let p = self.drains.get(&n.id).cloned().unwrap_or_default();
            v.drain = Some(fleet_api::DrainView {
                started_at: clock::rfc3339_ms(started_ms),
                remaining: p.remaining,
                blocked: p
                    .blocked
                    .iter()
                    .map(|(a, r)| fleet_api::BlockedReplica { agent_key: a.to_string(), replica: *r })
                    .collect(),
                force,
            });
        }
        v
    }
}

impl Store {
    /// Applies `action` to the node (id or name); `None` when there is no such node.
    pub async fn set_lifecycle(
        &self,
        id_or_name: &str,
        action: Action,
        by: &str,
    ) -> Result<Option<Id>, super::DbError> {
        let now = clock::now_ms();
        let Some((id, name, before)) = ({
            let st = self.state.read();
            st.resolve(id_or_name).and_then(|id| st.nodes.get(&id).map(|n| (id, n.name.clone(), n.lifecycle)))
        }) else {
            return Ok(None);
        };
        let after = match action {
            Action::Cordon => match before {
                Lifecycle::Schedulable => Lifecycle::Cordoned,
                other => other,
            },
            Action::Uncordon => Lifecycle::Schedulable,
            // A drain asked again keeps its start; `force` may be raised.
            Action::Drain { force } => match before {
                Lifecycle::Draining { started_ms, force: f, .. } => {
                    Lifecycle::Draining { started_ms, force: f || force, done_ms: None }
                }
                _ => Lifecycle::Draining { started_ms: now, force, done_ms: None },
            },
        };
        if after == before {
            return Ok(Some(id));
        }
        self.db.set_lifecycle(&id, after.columns()).await?;
        self.state.write().put_lifecycle(&id, after);
        let (kind, what) = match after {
            Lifecycle::Schedulable => (Kind::NodeUncordoned, "uncordoned".to_string()),
            Lifecycle::Cordoned => (Kind::NodeCordoned, "cordoned".to_string()),
            Lifecycle::Draining { force, .. } => {
                (Kind::NodeDraining, format!("draining{}", if force { " (force)" } else { "" }))
            }
        };
        tracing::info!(node = %name, %by, "node {what}");
        self.events.record(Event::new(kind, format!("{what} by {by}")).node(&id, &name));
        self.flush_events_now().await;
        Ok(Some(id))
    }

    /// The pass saw no replica left on the draining node.
    pub async fn drain_done(&self, id: &Id) -> Result<(), super::DbError> {
        let now = clock::now_ms();
        let (name, lc) = {
            let st = self.state.read();
            let Some(n) = st.nodes.get(id) else { return Ok(()) };
            let Lifecycle::Draining { started_ms, force, done_ms: None } = n.lifecycle else { return Ok(()) };
            (n.name.clone(), Lifecycle::Draining { started_ms, force, done_ms: Some(now) })
        };
        self.db.set_lifecycle(id, lc.columns()).await?;
        if let Some(n) = self.state.write().nodes.get_mut(id) {
            n.lifecycle = lc;
        }
        tracing::info!(node = %name, "node drained: no replica is bound to it");
        self.events.record(Event::new(Kind::NodeDrained, "drained: no replica is bound to it").node(id, &name));
        Ok(())
    }

    /// Deletes the node (id or name) at once: its token stops working, its name is free, every
    /// credential sealed to it is to be revoked now, and the next pass starts from scratch.
    pub async fn delete_node(&self, id_or_name: &str, why: &str) -> Result<Option<Deleted>, super::DbError> {
        let now = clock::now_ms();
        let Some(id) = self.state.read().resolve(id_or_name) else { return Ok(None) };
        self.db.delete_node(&id, now).await?;
        let deleted = {
            let mut st = self.state.write();
            let Some(rec) = st.nodes.remove(&id) else { return Ok(None) };
            st.forget_node(&rec, now)
        };
        self.hub.remove(&id);
        tracing::info!(node = %deleted.name, id = %id, credentials = deleted.revoke.len(), "node deleted ({why})");
        let msg = format!("deleted ({why}); {} credentials revoked", deleted.revoke.len());
        self.events.record(Event::new(Kind::NodeDeleted, msg).node(&id, &deleted.name));
        self.flush_events_now().await;
        Ok(Some(deleted))
    }
}

impl Store {
    /// An admin's action is in the history by the time the admin asks for it: written now
    /// rather than with the next second's flush (a failure leaves it for that flush).
    async fn flush_events_now(&self) {
        if let Err(e) = self.flush_events().await {
            tracing::warn!(error = %e, "cannot write events now; the flusher retries");
        }
    }
}

impl State {
    /// Sets a node's lifecycle and records the change for the pass.
    pub(super) fn put_lifecycle(&mut self, id: &Id, after: Lifecycle) {
        if let Some(n) = self.nodes.get_mut(id) {
            n.lifecycle = after;
        }
        if after.draining().is_none() {
            self.drains.remove(id);
        } else if !self.drains.contains_key(id) {
            // Until the next pass says otherwise, everything bound there remains (one
            // scan of the bindings per drain asked: an admin's action, not a hot path).
            let remaining = self.outcome.bindings.count_on(id);
            self.drains.insert(id.clone(), DrainProgress { remaining, blocked: Vec::new() });
        }
        self.changes.facts.insert(id.clone());
    }

    /// Removes every trace of a deleted node from the registry.
    pub(super) fn forget_node(&mut self, rec: &super::NodeRec, now: i64) -> Deleted {
        let id = rec.id.clone();
        self.by_token.remove(&rec.token_hash);
        self.by_name.remove(&rec.name);
        self.desired.remove(&id);
        self.desired_hashes.remove(&id);
        self.dirty_nodes.remove(&id);
        self.drains.remove(&id);
        let live: Vec<((Id, Id), Id)> = self
            .pairs
            .of_node(&id)
            .iter()
            .filter_map(|(agent, p)| Some(((agent.clone(), id.clone()), Id::from(p.live.as_ref()?.id()))))
            .collect();
        let retiring: Vec<((Id, Id), Id)> = self
            .retiring
            .values()
            .filter(|r| r.pair.1 == id)
            .map(|r| (r.pair.clone(), Id::from(r.cred.id())))
            .collect();
        let mut revoke = Vec::new();
        for (pair, cid) in live.into_iter().chain(retiring) {
            self.schedule_revoke(&pair, &cid, |at| at.map_or(now, |at| at.min(now)));
            revoke.push(cid.to_string());
        }
        self.pairs.remove_node(&id);
        self.changes.rebuild = true;
        self.changes.revoke_now.extend(revoke.iter().cloned());
        Deleted { id, name: rec.name.clone(), revoke }
    }
}
