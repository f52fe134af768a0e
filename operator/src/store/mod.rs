//! The store: a registry in memory that every read path (API, long-poll, pass) reads, over a
//! database that is the durable copy, written first and then published in memory (docs/behaviour.md#the-store). This module is the façade the rest of the controller calls; each method says what
//! it does and hands it to the module that does it:
//!
//! - `records` — the records kept (nodes, identities and PATs, desired states, events);
//! - `registry` — the tables, behind a private lock, changed only by recording setters;
//! - `db` — the database, layered one way: rows and errors, SQL per backend, group commit;
//! - `join`, `report`, `delivery`, `lifecycle`, `allowance`, `writes`, `follow` — the
//!   write-through operations on the store's parts (`parts`), by what they serve;
//! - `hub` (long-poll wake-ups), `events` (the history), `kept` and `bindings` (what a pass
//!   publishes), `secret` (tokens and their hashes).

mod allowance;
pub mod bindings;
pub mod db;
mod delivery;
pub mod events;
pub mod follow;
pub mod hub;
mod join;
pub mod kept;
mod lifecycle;
mod parts;
pub mod records;
mod refused;
pub mod registry;
mod report;
pub mod rollouts;
pub mod secret;
pub mod writes;

pub use crate::model::Id;
pub use db::lease;
pub use join::JoinError;
pub use records::{
    Action, Cred, Deleted, DesiredRec, DrainProgress, IdentityRec, Lifecycle, Linger, MaybeMs, NodeInfo, NodeRec,
    NodeStep, PairRec, RetiringCred, Rollout, Sealed, Seen,
};
pub use registry::{same_keys, AgentIndex, Changes, Reader, ReportOutcome, State};
pub use report::FLUSH_CHUNK;
pub use secret::hash;
pub use writes::PassPublish;

use crate::clock;
use crate::model::AgentList;
use axum::body::Bytes;
use db::{Db, DbError, PassWrite};
use fleet_api::{JoinRequest, JoinResponse, ObservedReport};
use kept::{Sent, StatusBody};
use parts::Parts;
use registry::Registry;
use std::sync::Arc;
use std::time::Duration;

pub struct Store {
    parts: Arc<Parts>,
}

/// Opening, reloading, and the parts other modules use directly.
impl Store {
    /// Opens the database and loads the registry. Every node's last-seen time becomes
    /// max(stored, now): an outage of the controller does not make the fleet look offline.
    pub async fn open(url: &str) -> Result<Store, DbError> {
        Self::open_as(url, "").await
    }

    /// [`Store::open`] for the replica named `replica` (its writes' notifications carry the
    /// name, so it skips its own; docs/behaviour.md#high-availability).
    pub async fn open_as(url: &str, replica: &str) -> Result<Store, DbError> {
        let db = Db::open_as(url, replica).await?;
        let st = State::from_snapshot(db.load().await?, clock::now_ms());
        let hub = hub::Hub::default();
        for (id, generation) in st.generations() {
            hub.publish(id, generation);
        }
        let parts = Parts {
            db,
            registry: Registry::new(st),
            hub,
            events: events::Pending::default(),
            refused: refused::RefusedTokens::default(),
            orders_waiting: Default::default(),
            orders_looked_ms: Default::default(),
        };
        Ok(Store { parts: Arc::new(parts) })
    }

    /// Loads the whole registry again from the database, as a start does (a replica taking
    /// the lease over, docs/behaviour.md#high-availability): what other replicas wrote is in it, every node's liveness
    /// grace starts now, and the next pass starts from scratch. Reports this replica took
    /// and has not flushed yet are kept. Generations only grow: the database has every one
    /// this replica served.
    pub async fn reload(&self) -> Result<(), DbError> {
        self.flush_reports().await?;
        let started = std::time::Instant::now();
        let snapshot = self.db().load().await?;
        let read = started.elapsed();
        let fresh = State::from_snapshot(snapshot, clock::now_ms());
        tracing::debug!(
            read_ms = read.as_millis() as u64,
            built_ms = (started.elapsed() - read).as_millis() as u64,
            "store loaded"
        );
        // What the CP last accepted is trusted as stored, except for the agents the last
        // leader marked unsettled (a send of theirs may have landed unrecorded): only those
        // are sent again (reconcile::pass::unsettled).
        let old = self.parts.registry.replace(fresh);
        let st = self.read();
        for (id, generation) in st.generations() {
            if old.desired(id).is_none_or(|o| o.generation < generation) {
                self.hub().publish(id, generation);
            }
        }
        for n in old.nodes().filter(|n| st.node(&n.id).is_none()) {
            self.hub().remove(&n.id);
        }
        drop(st);
        drop(old);
        Ok(())
    }

    /// A read of the registry: hold it briefly, never across `.await`.
    #[track_caller]
    pub fn read(&self) -> Reader<'_> {
        self.parts.registry.read()
    }

    pub fn db(&self) -> &Db {
        &self.parts.db
    }

    /// The long-poll hub: one generation watch per node.
    pub fn hub(&self) -> &hub::Hub {
        &self.parts.hub
    }

    /// Events recorded and not yet written.
    pub fn events(&self) -> &events::Pending {
        &self.parts.events
    }

    /// What changed since the pass last looked (taking it starts a new record).
    #[track_caller]
    pub fn take_changes(&self) -> Changes {
        self.parts.registry.write().take_changes()
    }

    /// Follows the other replicas' writes until the process ends (PostgreSQL; see `follow`).
    pub async fn follow(&self, me: String, offline_after: Duration, leading: impl Fn() -> bool, kick: impl Fn()) {
        follow::run(self.parts.clone(), me, offline_after, leading, kick).await
    }

    /// This fleet's id (docs/behaviour.md#kubernetes-mirror): made at random by the first
    /// replica that asks and kept in the store (its `kv` row [`FLEET_ID_KEY`]), so every
    /// replica of an HA group, and every restart, has the same one.
    pub async fn fleet_id(&self) -> Result<String, DbError> {
        let made = format!("{:016x}", rand::random::<u64>());
        self.db().kv_insert_absent(FLEET_ID_KEY, &made).await
    }
}

/// The `kv` row of [`Store::fleet_id`].
pub const FLEET_ID_KEY: &str = "fleet_id";

/// Nodes: joining, reports, lifecycle.
impl Store {
    /// Issues a join key valid for `ttl`, whose node may claim what `allowed` allows; returns
    /// the key and its expiry (ms).
    pub async fn issue_join_key(
        &self,
        ttl: Duration,
        note: &str,
        allowed: &fleet_api::claims::Allowance,
    ) -> Result<(String, i64), DbError> {
        self.parts.issue_join_key(ttl, note, allowed).await
    }

    /// The join keys still of interest, newest first.
    pub async fn join_keys(&self) -> Result<Vec<fleet_api::JoinKeyView>, DbError> {
        self.parts.join_keys().await
    }

    /// Ends a join key now, by its id; whether there was one.
    pub async fn revoke_join_key(&self, id: &str) -> Result<bool, DbError> {
        self.parts.revoke_join_key(id).await
    }

    /// Gives the node (id or name) another allowance, applied at once to what it last
    /// claimed; `None` when there is no such node.
    pub async fn set_allowance(
        &self,
        id_or_name: &str,
        allowed: fleet_api::claims::Allowance,
        by: &str,
    ) -> Result<Option<Id>, DbError> {
        self.parts.set_allowance(id_or_name, allowed, by).await
    }

    /// Joins a node (body already validated), marking its key used in the same transaction.
    pub async fn join(&self, req: &JoinRequest) -> Result<JoinResponse, JoinError> {
        self.parts.join(req).await
    }

    /// Takes an observed report (validated). Memory first; the flusher persists it.
    pub fn report(&self, node: &Id, r: ObservedReport, now: i64, offline_after: Duration) -> ReportOutcome {
        self.parts.report(node, r, now, offline_after)
    }

    /// Persists reported node state, [`FLUSH_CHUNK`] nodes a transaction; returns how many
    /// nodes were written. Called periodically and at shutdown.
    pub async fn flush_reports(&self) -> Result<usize, DbError> {
        self.parts.flush_reports_by(FLUSH_CHUNK).await
    }

    /// Writes the events recorded since the last call; called with the report flush.
    pub async fn flush_events(&self) -> Result<usize, DbError> {
        events::flush(&self.parts.db, &self.parts.events).await
    }

    /// The events a reader asked for.
    pub async fn read_events(&self, f: &events::Filter) -> Result<Vec<fleet_api::EventView>, DbError> {
        events::read(&self.parts.db, f).await
    }

    /// Applies `action` to the node (id or name); `None` when there is no such node.
    pub async fn set_lifecycle(&self, id_or_name: &str, action: Action, by: &str) -> Result<Option<Id>, DbError> {
        self.parts.set_lifecycle(id_or_name, action, by).await
    }

    /// The pass saw no replica left on the draining node.
    pub async fn drain_done(&self, id: &Id) -> Result<(), DbError> {
        self.parts.drain_done(id).await
    }

    /// Deletes the node (id or name) at once: its token stops working, its name is free, and
    /// every credential sealed to it is to be revoked now.
    pub async fn delete_node(&self, id_or_name: &str, why: &str) -> Result<Option<Deleted>, DbError> {
        self.parts.delete_node(id_or_name, why).await
    }

    /// A node token this replica does not know, looked up in the database (a node that
    /// joined on another replica moments ago).
    pub async fn learn_node_by_token(&self, token: &str, offline_after: Duration) -> Result<Option<Id>, DbError> {
        self.parts.learn_node_by_token(token, offline_after).await
    }
}

/// Rollouts: the admins' orders and what is stored (docs/behaviour.md#rolling-out-a-change).
impl Store {
    /// Stores an order for the agent's rollout; returns what [`Store::order_applied`] waits on.
    pub async fn order_rollout(&self, agent: &str, command: rollouts::Command, by: &str) -> Result<String, DbError> {
        self.parts.order_rollout(agent, command, by).await
    }

    /// Whether the order stored as `value` was applied (or replaced).
    pub async fn order_applied(&self, agent: &str, value: &str) -> Result<bool, DbError> {
        self.parts.order_applied(agent, value).await
    }

    /// The orders waiting for the pass (read from the database at most every `every` unless
    /// one was stored here).
    pub async fn pending_orders(&self, now_ms: i64, every: Duration) -> Result<Vec<rollouts::Pending>, DbError> {
        self.parts.pending_orders(now_ms, every).await
    }

    /// The agent's rollout as stored.
    pub async fn stored_rollout(&self, agent: &str) -> Result<Option<Rollout>, DbError> {
        self.parts.stored_rollout(agent).await
    }
}

/// Desired states: served, let go once delivered, read back.
impl Store {
    /// The generation of `node`'s desired state and its body as served, `None` when the body
    /// was let go ([`Store::load_desired`]).
    pub fn desired_body(&self, node: &Id) -> Option<(u64, Option<Bytes>)> {
        self.parts.desired_body(node)
    }

    /// The node has generation `generation`: its body and the boxes it carried are let go.
    pub fn delivered(&self, node: &Id, generation: u64) {
        self.parts.delivered(node, generation)
    }

    /// The body of `node`'s current desired state, read back from the database when it was
    /// let go. `None` for a node that is gone.
    pub async fn load_desired(&self, node: &Id) -> Result<Option<(u64, Bytes)>, DbError> {
        self.parts.load_desired(node).await
    }

    /// Reads one node's desired state from the database now and applies it if newer.
    pub async fn refresh_desired(&self, node: &Id) -> Result<(), DbError> {
        self.parts.refresh_desired(node).await
    }

    /// Applies stored desired states newer than this replica's, and wakes their long-polls.
    pub fn apply_desired(&self, rows: Vec<(String, i64, String)>) {
        self.parts.apply_desired(rows)
    }
}

/// What the pass and the workers write through.
impl Store {
    /// A new agent list (in key order) and its ETag; returns the old list, to be dropped
    /// outside the lock by the caller.
    pub fn set_agents(&self, agents: AgentList, etag: Option<String>) -> AgentList {
        self.parts.registry.write().put_agents(agents, etag)
    }

    /// The CP's ETag moved over the same agents: the list held stays.
    pub fn set_agents_etag(&self, etag: Option<String>) {
        self.parts.registry.write().put_agents_etag(etag)
    }

    /// Stores a pass's rows, then publishes its new desired states (each wakes its node) and
    /// the rollouts it changed.
    pub async fn commit_pass(
        &self,
        rows: &PassWrite,
        desired: Vec<(Id, DesiredRec)>,
        hashes: Vec<(Id, u64)>,
        rollouts: Vec<(Id, Option<Arc<Rollout>>)>,
        lingering: Vec<((Id, u32), Option<Linger>)>,
    ) -> Result<(), DbError> {
        self.parts.commit_pass(rows, desired, hashes, rollouts, lingering).await
    }

    /// Rollouts whose counts or readiness alone moved, published at once: they are not stored
    /// (a restart recomputes them from the reports), so nothing waits for a commit, and the
    /// records they replace are let go now rather than held beside them until the pass ends.
    pub fn refresh_rollouts(&self, rollouts: Vec<(Id, Arc<Rollout>)>) {
        if rollouts.is_empty() {
            return;
        }
        self.parts.registry.write().put_rollouts(rollouts.into_iter().map(|(agent, r)| (agent, Some(r))).collect());
    }

    /// Publishes the rest of a committed pass; returns the agents whose wanted status
    /// differs from what the CP has.
    pub fn publish_pass(&self, publish: PassPublish) -> Vec<Id> {
        self.parts.publish_pass(publish)
    }

    /// The agent's IAM principal was created (not yet bound in the CP).
    pub async fn identity_created(&self, agent: &Id, principal: &str) -> Result<(), DbError> {
        self.parts.identity_created(agent, principal).await
    }

    /// The CP accepted the agent's identity; any identity error is cleared.
    pub async fn identity_bound(&self, agent: &Id, principal: &str) -> Result<(), DbError> {
        self.parts.identity_bound(agent, principal).await
    }

    /// Records why the agent's identity or a PAT is not ready; whether the message changed.
    pub fn identity_failed(&self, agent: &Id, message: String) -> bool {
        self.parts.identity_failed(agent, message)
    }

    /// The agent's identity work succeeded: its error, if any, is cleared.
    pub fn identity_ok(&self, agent: &Id) {
        self.parts.identity_ok(agent)
    }

    /// A new PAT of `pair` became the live one; `retire` (id, instant) is scheduled for
    /// revocation.
    pub async fn credential_stored(
        &self,
        pair: &(Id, Id),
        cred: Cred,
        retire: Option<(Id, i64)>,
    ) -> Result<(), DbError> {
        self.parts.credential_stored(pair, cred, retire).await
    }

    /// A PAT IAM replayed while the store catches up with the fleet: known now, retiring.
    pub async fn credential_found(&self, pair: &(Id, Id), cred: Cred) -> Result<(), DbError> {
        self.parts.credential_found(pair, cred).await
    }

    /// The credential was revoked in IAM: it is forgotten.
    pub async fn credential_revoked(&self, r: &RetiringCred) -> Result<(), DbError> {
        self.parts.credential_revoked(r).await
    }

    /// The CP accepted `body` as the agent's status, derived while the pass wanted `wanted`.
    pub async fn status_sent(&self, agent: &Id, body: StatusBody, wanted: Sent) {
        self.parts.status_sent(agent, body, wanted).await
    }
}

#[cfg(test)]
mod tests;
