//! Rollouts in the store (docs/behaviour.md#rolling-out-a-change). The pass is their one
//! writer: it stores each changed rollout as a `kv` row in its own transaction and publishes
//! it with its desired states. An admin's order (pause, resume, undo, restart) is a `kv` row
//! too, written by whichever replica took the request; the leader's pass reads the orders,
//! applies them and deletes each in the transaction that stores its effect — so an order is
//! never lost to a change of leader, and is applied once.

use super::db::DbError;
use super::parts::Parts;
use super::records::Rollout;
use crate::model::{Id, Template};
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Key prefix of the orders waiting for the pass.
pub const ORDER_PREFIX: &str = "rollout-order/";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum Command {
    Pause,
    Resume,
    /// The previous template, as the replica that took the order read it.
    Undo {
        to: Template,
    },
    Restart,
}

impl Command {
    pub fn name(&self) -> &'static str {
        match self {
            Command::Pause => "pause",
            Command::Resume => "resume",
            Command::Undo { .. } => "undo",
            Command::Restart => "restart",
        }
    }
}

/// An admin's order as stored: the command, who gave it and a nonce that makes each order's
/// row unique (the pass deletes exactly the row it applied).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Order {
    pub command: Command,
    pub by: String,
    pub nonce: u64,
}

/// An order read back: the agent, the row's value as stored (to delete it by) and the order.
pub type Pending = (Id, String, Order);

/// How long an order's caller waits for the pass to apply it.
pub const ORDER_WAIT: Duration = Duration::from_secs(10);

impl Parts {
    /// Stores an order for `agent`'s rollout; returns the row's value, which
    /// [`Parts::order_applied`] waits to see gone.
    pub async fn order_rollout(&self, agent: &str, command: Command, by: &str) -> Result<String, DbError> {
        let order = Order { command, by: by.to_string(), nonce: rand::random() };
        let value = serde_json::to_string(&order).map_err(|e| DbError::Other(e.to_string()))?;
        self.db.put_kv(&format!("{ORDER_PREFIX}{agent}"), &value).await?;
        self.orders_waiting.store(true, Ordering::Release);
        Ok(value)
    }

    /// Whether the order stored as `value` is no longer waiting (applied, or replaced by a
    /// later one).
    pub async fn order_applied(&self, agent: &str, value: &str) -> Result<bool, DbError> {
        Ok(self.db.get_kv(&format!("{ORDER_PREFIX}{agent}")).await?.as_deref() != Some(value))
    }

    /// The orders waiting, when any may be: one stored here since the last look, or any
    /// replica's once `every` has passed since then.
    pub async fn pending_orders(&self, now_ms: i64, every: Duration) -> Result<Vec<Pending>, DbError> {
        let due = now_ms - self.orders_looked_ms.load(Ordering::Acquire) >= every.as_millis() as i64;
        if !self.orders_waiting.swap(false, Ordering::AcqRel) && !due {
            return Ok(Vec::new());
        }
        self.orders_looked_ms.store(now_ms, Ordering::Release);
        let rows = self.db.kv_prefix(ORDER_PREFIX).await?;
        Ok(rows
            .into_iter()
            .filter_map(|(k, v)| {
                let agent = k.strip_prefix(ORDER_PREFIX)?;
                match serde_json::from_str::<Order>(&v) {
                    Ok(o) => Some((Id::from(agent), v, o)),
                    Err(e) => {
                        tracing::warn!(agent, error = %e, "a stored rollout order does not parse; ignored");
                        None
                    }
                }
            })
            .collect())
    }

    /// The agent's rollout as stored (a complete one is kept in the database only).
    pub async fn stored_rollout(&self, agent: &str) -> Result<Option<Rollout>, DbError> {
        let Some(row) = self.db.get_kv(&Rollout::key(agent)).await? else { return Ok(None) };
        Ok(serde_json::from_str(&row).ok())
    }
}
