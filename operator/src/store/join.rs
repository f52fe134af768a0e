//! Joining: a one-time key issued (with what its node may claim), a node joined with it (or
//! joined again after its first answer was lost), looked up and marked used in the database
//! transaction that creates the node.

use super::db::{DbError, JoinOutcome, NodeRow};
use super::events::{Event, Kind};
use super::parts::Parts;
use super::records::claims::{allowance_column, allowance_of, claimed_of, refused_event};
use super::records::node::sorted;
use super::records::{Lifecycle, NodeInfo, NodeRec};
use super::secret::{hash, random_secret};
use crate::clock;
use crate::model::Id;
use fleet_api::claims::Allowance;
use fleet_api::{Health, JoinRequest, JoinResponse};
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("the join key is unknown, used or expired")]
    KeyInvalid,
    #[error("a node named {0:?} already exists")]
    NameTaken(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

impl Parts {
    /// Issues a join key valid for `ttl`, whose node may claim what `allowed` allows; returns
    /// the key and its expiry (ms).
    pub async fn issue_join_key(
        &self,
        ttl: Duration,
        note: &str,
        allowed: &Allowance,
    ) -> Result<(String, i64), DbError> {
        let key = random_secret("fjk_");
        let now = clock::now_ms();
        let expires = now + ttl.as_millis() as i64;
        let allowed = allowance_column(allowed);
        self.db.insert_join_key(&hash(&key), expires, note, allowed.as_deref(), now).await?;
        Ok((key, expires))
    }

    /// The join keys still of interest (unexpired, or used within a week), newest first, at
    /// most 1,000: what each was for and what became of it, never the key.
    pub async fn join_keys(&self) -> Result<Vec<fleet_api::JoinKeyView>, DbError> {
        let now = clock::now_ms();
        Ok(self.db.join_keys(now, 1000).await?.into_iter().map(|r| join_key_view(r, now)).collect())
    }

    /// Ends a join key now, by its id (the start of its hash): no join and no re-join with it
    /// from here on. Whether there was one.
    pub async fn revoke_join_key(&self, id: &str) -> Result<bool, DbError> {
        let hashes = self.db.join_key_hashes().await?;
        let Some(hash) = hashes.iter().find(|h| super::secret::hex_id(h) == id) else { return Ok(false) };
        self.db.end_join_key(hash, clock::now_ms()).await?;
        Ok(true)
    }

    /// Joins a node (body already validated). The key is looked up in the database, in the
    /// transaction that marks it used and creates the node; the node takes the key's
    /// allowance, and what it claims is split under it from the start.
    pub async fn join(&self, req: &JoinRequest) -> Result<JoinResponse, JoinError> {
        let token = random_secret("fnt_");
        let id = uuid::Uuid::new_v4().to_string();
        let public_key = fleet_api::seal::decode_public_key(&req.public_key).unwrap_or_default();
        let now = clock::now_ms();
        // A key's allowance never changes once issued, so it can be read before the
        // transaction that takes the key.
        let allowed_json = self.db.join_key_allowance(&hash(&req.join_key)).await?;
        let allowed = allowance_of(allowed_json.as_deref());
        let mut info = NodeInfo {
            capacity: req.capacity.clone(),
            secrets: sorted(&req.secrets),
            version: req.version.clone(),
            maintenance_windows: NodeInfo::windows_from(&req.maintenance_windows),
            health: Some(Health::Ok),
            ..Default::default()
        };
        let claimed =
            claimed_of(&req.labels, &req.executor_kinds, &req.executor_images, &req.executor_secrets, &info.secrets);
        info.admit(claimed, allowed.as_deref());
        let row = NodeRow {
            id: id.clone(),
            name: req.name.clone(),
            token_hash: hash(&token).to_vec(),
            public_key: public_key.to_vec(),
            joined_ms: now,
            last_seen_ms: now,
            info: serde_json::to_string(&info).unwrap_or_default(),
            lifecycle: Lifecycle::default(),
            allowed: allowed_json,
        };
        match self.db.join(&hash(&req.join_key), &row, now).await? {
            JoinOutcome::KeyInvalid => return Err(JoinError::KeyInvalid),
            JoinOutcome::NameTaken => return Err(JoinError::NameTaken(req.name.clone())),
            JoinOutcome::Rejoined { id } => return Ok(self.rejoined(id.into(), token, info, now)),
            JoinOutcome::Joined => {}
        }
        let idr: Id = id.clone().into();
        let name: Id = req.name.as_str().into();
        let mut rec = NodeRec {
            id: idr.clone(),
            name: name.clone(),
            token_hash: hash(&token),
            public_key,
            joined_ms: now,
            last_seen_ms: now,
            info: NodeInfo::default(),
            allow: BTreeMap::new(),
            allowed,
            lifecycle: Lifecycle::default(),
            reported: true,
        };
        rec.set_info(info);
        let refused = rec.info.refused_facts();
        if self.registry.write().add_joined_node(rec) {
            self.hub.publish(&idr, 1);
        }
        self.events.record(Event::new(Kind::NodeJoined, "joined").node(&idr, &name));
        if !refused.is_empty() {
            self.events.record(refused_event(&refused).node(&idr, &name));
        }
        Ok(JoinResponse { node_id: id, node_token: token })
    }

    /// The registry side of a join answered again: the node keeps its id and its state, takes
    /// the new token (the previous one stops working) and what it announced now.
    fn rejoined(&self, id: Id, token: String, info: NodeInfo, now: i64) -> JoinResponse {
        let (name, refused) = match self.registry.write().rejoin(&id, hash(&token), info, now) {
            Some(done) => done,
            None => (id.clone(), None),
        };
        if let Some(refused) = refused {
            self.events.record(refused_event(&refused).node(&id, &name));
        }
        tracing::info!(node = %name, id = %id, "node joined again with its key (the first answer was lost?); its previous token no longer works");
        let msg = "joined again with the same key, name and public key; the previous token no longer works";
        self.events.record(Event::new(Kind::NodeJoined, msg).node(&id, &name));
        JoinResponse { node_id: id.to_string(), node_token: token }
    }
}

fn join_key_view(r: super::db::rows::JoinKeyRow, now: i64) -> fleet_api::JoinKeyView {
    let allowed = allowance_of(r.allowed.as_deref()).unwrap_or_default();
    let state = match (r.used_ms, r.expires_ms > now) {
        (_, false) => "expired",
        (Some(_), true) => "used",
        (None, true) => "unused",
    };
    fleet_api::JoinKeyView {
        id: super::secret::hex_id(&r.hash),
        note: r.note,
        created_at: clock::rfc3339_ms(r.created_ms),
        expires_at: clock::rfc3339_ms(r.expires_ms),
        state: state.into(),
        used_at: r.used_ms.map(clock::rfc3339_ms),
        node_id: r.node_id,
        allowed_labels: allowed.allowed_labels,
        allowed_kinds: allowed.allowed_kinds,
    }
}
