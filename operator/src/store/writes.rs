//! Write-through: one method per kind of change the workers and the pass make. Each writes
//! the database first, then the registry, then the change record the pass reads, in that
//! order and in one place, so no caller can forget a step (the fields they touch are private
//! to the store). A database failure changes nothing in memory: the caller retries.

use super::db::{CredRow, DbError, PassWrite};
use super::events::{Event, Kind};
use super::kept::{Outcome, Placements, Sent, StatusBody};
use super::parts::Parts;
use super::records::{Cred, DesiredRec, DrainProgress, IdentityRec, Linger, RetiringCred, Rollout};
use crate::model::Id;
use std::sync::Arc;

/// What a pass publishes once its rows are stored and its nodes woken: the placement
/// outcome, retirements, placement items and the statuses it wants sent.
#[derive(Default)]
pub struct PassPublish {
    /// Credentials no longer needed (pair, id), with the instant (ms) to revoke them.
    pub retired: Vec<((Id, Id), Id, i64)>,
    pub outcome: Option<Arc<Outcome>>,
    /// The placement items, when the agents or the outcome they are built from changed.
    pub placements: Option<Placements>,
    /// Start the wanted statuses afresh (a full pass computes them all).
    pub reset_statuses: bool,
    /// Each agent's status as computed, as its hash; `None`: it gets none.
    pub statuses: Vec<(Id, Option<Sent>)>,
    /// Every draining node's progress (when placement ran).
    pub drains: Option<rustc_hash::FxHashMap<Id, DrainProgress>>,
    /// The mark of a store older than the fleet, set (`Some(Some)`) or cleared (`Some(None)`).
    pub catch_up: Option<Option<crate::store::records::catch_up::CatchUp>>,
    /// The unsettled-status marks the pass stored and cleared.
    pub unsettled: crate::store::kept::Marks,
}

impl Parts {
    /// The agent's IAM principal was created (not yet bound in the CP).
    pub async fn identity_created(&self, agent: &Id, principal: &str) -> Result<(), DbError> {
        self.db.put_identity(agent, principal, false).await?;
        self.registry.write().set_identity(agent, IdentityRec { principal_id: principal.into(), bound: false });
        Ok(())
    }

    /// The CP accepted the agent's identity; any identity error is cleared.
    pub async fn identity_bound(&self, agent: &Id, principal: &str) -> Result<(), DbError> {
        self.db.put_identity(agent, principal, true).await?;
        let mut st = self.registry.write();
        st.set_identity(agent, IdentityRec { principal_id: principal.into(), bound: true });
        st.set_identity_error(agent, None);
        Ok(())
    }

    /// Records why the agent's identity or a PAT is not ready (memory only: a restart retries
    /// anyway). Returns whether the message changed.
    pub fn identity_failed(&self, agent: &Id, message: String) -> bool {
        let changed = self.registry.write().set_identity_error(agent, Some(message.clone()));
        if changed {
            self.events.record(Event::new(Kind::IdentityFailed, message).agent(agent));
        }
        changed
    }

    /// The agent's identity work succeeded: its error, if any, is cleared.
    pub fn identity_ok(&self, agent: &Id) {
        self.registry.write().set_identity_error(agent, None);
    }

    /// A new PAT was issued for `pair` (agent, node): it becomes the live one, the pair's
    /// counter is raised past its n in the same commit, and the one it replaces (`retire`: id,
    /// revoke instant) is scheduled for revocation.
    pub async fn credential_stored(
        &self,
        pair: &(Id, Id),
        cred: Cred,
        retire: Option<(Id, i64)>,
    ) -> Result<(), DbError> {
        let row = cred_row(pair, &cred, None);
        let old = retire.as_ref().map(|(id, at)| (&**id, *at));
        self.db.store_credential(&row, (cred.n + 1) as i64, old).await?;
        let (issued, agent) = (retire.is_none(), pair.0.clone());
        let name = self.registry.write().credential_stored(pair, cred, retire.as_ref().map(|(id, at)| (id, *at)));
        let (kind, msg) = match issued {
            false => {
                (Kind::PatRotated, format!("new PAT sealed to {name}; the previous one is revoked after its grace"))
            }
            true => (Kind::PatIssued, format!("PAT issued and sealed to {name}")),
        };
        self.events.record(Event::new(kind, msg).agent(&agent).node(&pair.1, &name));
        Ok(())
    }

    /// A PAT of `pair` that IAM replayed for its key while the store catches up with the
    /// fleet: issued after the store's time, unknown to it until now. It is stored as retiring
    /// (to be revoked at its `revoke_ms`) and the pair's counter goes past it
    /// (docs/behaviour.md#a-store-older-than-the-fleet).
    pub async fn credential_found(&self, pair: &(Id, Id), cred: Cred) -> Result<(), DbError> {
        let row = cred_row(pair, &cred, cred.revoke_ms.get());
        self.db.store_credential(&row, (cred.n + 1) as i64, None).await?;
        self.registry.write().credential_found(pair, cred);
        Ok(())
    }

    /// The credential was revoked in IAM: it is forgotten.
    pub async fn credential_revoked(&self, r: &RetiringCred) -> Result<(), DbError> {
        let (id, (agent, node)) = (r.cred.id(), &r.pair);
        self.db.delete_credential(&id).await?;
        let name = self.registry.write().credential_revoked(r);
        let msg = format!("PAT of {name} revoked");
        self.events.record(Event::new(Kind::PatRevoked, msg).agent(agent).node(node, &name));
        Ok(())
    }

    /// The CP accepted `body` as the agent's status, derived while the pass wanted `wanted`.
    /// That want is settled: the body sent is as new as the one the pass wanted, or newer
    /// (another copy of the work item waiting behind this one does not send it again). A
    /// want a later pass set meanwhile stays, unless it is this body. Kept in memory even
    /// when the database copy fails (logged): it only saves a resend after a restart.
    pub async fn status_sent(&self, agent: &Id, body: StatusBody, wanted: Sent) {
        let json = serde_json::to_string(&body).unwrap_or_default();
        if let Err(e) = self.db.put_status(agent, &json).await {
            tracing::error!(agent = %agent, error = %e, "cannot store sent status");
        }
        let phase = body.phase;
        let before = self.registry.write().status_accepted(agent, Sent::of(&body), wanted).map(|b| b.phase);
        if before != Some(phase) {
            let msg = match before {
                Some(b) => format!("{phase} (was {b})"),
                None => phase.to_string(),
            };
            self.events.record(Event::new(Kind::AgentPhase, msg).agent(agent));
        }
    }

    /// Stores a pass's rows, then publishes its new desired states: each wakes its node's
    /// long-polls. The rest of what the pass decided follows with [`Store::publish_pass`],
    /// after the nodes are woken.
    ///
    /// The registry serves a generation before the hub announces it: a poll that finds a
    /// generation announced and reads the registry must find it there, or it waits for a wake
    /// that already happened (as long as its `wait`, a node's whole report period).
    pub async fn commit_pass(
        &self,
        rows: &PassWrite,
        desired: Vec<(Id, DesiredRec)>,
        hashes: Vec<(Id, u64)>,
        rollouts: Vec<(Id, Option<Arc<Rollout>>)>,
        lingering: Vec<((Id, u32), Option<Linger>)>,
    ) -> Result<(), DbError> {
        if !rows.events.is_empty() {
            // Those recorded before the pass's own go first, so the history keeps their order.
            if let Err(e) = super::events::flush(&self.db, &self.events).await {
                tracing::warn!(error = %e, "cannot write the events recorded before the pass; the flusher retries");
            }
        }
        self.db.apply_pass(rows).await?;
        if !rows.events.is_empty() {
            self.events.written_by_pass();
        }
        let mut desired = desired;
        let announced: Vec<(Id, u64)> = desired.iter().map(|(node, rec)| (node.clone(), rec.generation)).collect();
        {
            let mut st = self.registry.write();
            st.put_desired(&mut desired, hashes);
            st.put_rollouts(rollouts);
            st.put_lingering(lingering);
        }
        for (node, generation) in &announced {
            self.hub.publish(node, *generation);
        }
        Ok(())
    }

    /// Publishes the rest of a committed pass. Returns the agents whose wanted status
    /// differs from what the CP has.
    pub fn publish_pass(&self, publish: PassPublish) -> Vec<Id> {
        let (replaced, to_send) = {
            let mut st = self.registry.write();
            for (pair, id, at) in &publish.retired {
                st.schedule_revoke(pair, id, |_| *at);
            }
            if let Some(mark) = publish.catch_up {
                st.set_catch_up(mark);
            }
            st.put_unsettled(publish.unsettled);
            st.publish(publish.outcome, publish.placements, publish.drains, publish.reset_statuses, publish.statuses)
        };
        // The items replaced may hold the last handle to an agent list: dropped after the lock.
        drop(replaced);
        to_send
    }
}

/// The stored row of `pair`'s credential, to be revoked at `revoke_ms` if given.
fn cred_row(pair: &(Id, Id), cred: &Cred, revoke_ms: Option<i64>) -> CredRow {
    CredRow {
        id: cred.id().into_owned(),
        agent_key: pair.0.to_string(),
        node_id: pair.1.to_string(),
        n: cred.n as i64,
        principal_id: cred.principal_id.to_string(),
        ciphertext: cred.sealed.to_base64(),
        expires_ms: cred.expires_ms,
        issued_ms: cred.issued_ms,
        revoke_ms,
    }
}
