//! A node's lifecycle (docs/behaviour.md#node-lifecycle): cordon, drain and delete, each written through like the
//! rest of the store (database, then registry, then the change record and an event).

use super::db::DbError;
use super::events::{self, Event, Kind};
use super::parts::Parts;
use super::records::{Action, Deleted, Lifecycle};
use crate::clock;
use crate::model::Id;

impl Parts {
    /// Applies `action` to the node (id or name); `None` when there is no such node.
    pub async fn set_lifecycle(&self, id_or_name: &str, action: Action, by: &str) -> Result<Option<Id>, DbError> {
        let now = clock::now_ms();
        let Some((id, name, before)) = ({
            let st = self.registry.read();
            st.resolve(id_or_name).and_then(|id| st.node(&id).map(|n| (id, n.name.clone(), n.lifecycle)))
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
        self.registry.write().put_lifecycle(&id, after);
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
    pub async fn drain_done(&self, id: &Id) -> Result<(), DbError> {
        let now = clock::now_ms();
        let (name, lc) = {
            let st = self.registry.read();
            let Some(n) = st.node(id) else { return Ok(()) };
            let Lifecycle::Draining { started_ms, force, done_ms: None } = n.lifecycle else { return Ok(()) };
            (n.name.clone(), Lifecycle::Draining { started_ms, force, done_ms: Some(now) })
        };
        self.db.set_lifecycle(id, lc.columns()).await?;
        self.registry.write().set_drained(id, lc);
        tracing::info!(node = %name, "node drained: no replica is bound to it");
        self.events.record(Event::new(Kind::NodeDrained, "drained: no replica is bound to it").node(id, &name));
        Ok(())
    }

    /// Deletes the node (id or name) at once: its token stops working, its name is free, every
    /// credential sealed to it is to be revoked now, and the next pass starts from scratch.
    pub async fn delete_node(&self, id_or_name: &str, why: &str) -> Result<Option<Deleted>, DbError> {
        let now = clock::now_ms();
        let Some(id) = self.registry.read().resolve(id_or_name) else { return Ok(None) };
        self.db.delete_node(&id, now).await?;
        let deleted = {
            let mut st = self.registry.write();
            let Some(rec) = st.remove_node(&id) else { return Ok(None) };
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

impl Parts {
    /// An admin's action is in the history by the time the admin asks for it: written now
    /// rather than with the next second's flush (a failure leaves it for that flush).
    async fn flush_events_now(&self) {
        if let Err(e) = events::flush(&self.db, &self.events).await {
            tracing::warn!(error = %e, "cannot write events now; the flusher retries");
        }
    }
}
