//! A node's allowance changed by an admin (docs/behaviour.md#what-a-node-may-claim): written
//! through like the rest of the store (database, then registry, then the change record and an
//! event), and applied at once to what the node last claimed.

use super::db::DbError;
use super::events;
use super::parts::Parts;
use super::records::claims::{allowance_column, refused_event};
use crate::model::Id;
use fleet_api::claims::Allowance;

impl Parts {
    /// Gives the node (id or name) `allowed`; `None` when there is no such node.
    pub async fn set_allowance(&self, id_or_name: &str, allowed: Allowance, by: &str) -> Result<Option<Id>, DbError> {
        let Some(id) = self.registry.read().resolve(id_or_name) else { return Ok(None) };
        let allowed = allowed.normalised();
        self.db.set_allowance(&id, allowance_column(&allowed).as_deref()).await?;
        let boxed = (!allowed.is_open()).then(|| Box::new(allowed));
        let Some((name, refused)) = self.registry.write().put_allowance(&id, boxed) else { return Ok(None) };
        tracing::info!(node = %name, %by, "node allowance changed");
        if let Some(refused) = refused.filter(|r| !r.is_empty()) {
            self.events.record(refused_event(&refused).node(&id, &name));
        }
        if let Err(e) = events::flush(&self.db, &self.events).await {
            tracing::warn!(error = %e, "cannot write events now; the flusher retries");
        }
        Ok(Some(id))
    }
}
