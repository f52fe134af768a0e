//! What the store is made of: the database, the registry over it, the long-poll hub, the
//! events waiting to be written and the node tokens recently refused. The store's modules work on these parts; the façade
//! (`store::Store`) owns them and is what the rest of the controller calls.

use super::db::Db;
use super::events::Pending;
use super::hub::Hub;
use super::refused::RefusedTokens;
use super::registry::Registry;

pub struct Parts {
    pub db: Db,
    pub registry: Registry,
    pub hub: Hub,
    /// Events recorded and not yet written (the report flusher writes them).
    pub events: Pending,
    /// Node tokens the database recently said no to.
    pub refused: RefusedTokens,
    /// A rollout order was stored here since the pass last looked (`rollouts`).
    pub orders_waiting: std::sync::atomic::AtomicBool,
    /// When the pass last read the orders (ms).
    pub orders_looked_ms: std::sync::atomic::AtomicI64,
}
