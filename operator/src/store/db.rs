//! The durable copy under the registry: SQLite through sqlx, WAL, written through on every
//! change and read once at start. Nothing here is on a read path.

use super::writer::{self, Op, Writer};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};
use std::str::FromStr;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("database: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("database: {0}")]
    Other(String),
}

#[derive(Clone)]
pub struct Db {
    pool: SqlitePool,
    /// Group commit for the workers' writes (see `writer`).
    writer: Writer,
    /// The writer task, until the supervisor takes it (`server.rs`).
    writer_task: std::sync::Arc<parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

/// A node row as stored.
#[derive(Debug, Clone)]
pub struct NodeRow {
    pub id: String,
    pub name: String,
    pub token_hash: Vec<u8>,
    pub public_key: Vec<u8>,
    pub joined_ms: i64,
    pub last_seen_ms: i64,
    pub info: String,
    pub lifecycle: super::Lifecycle,
}

#[derive(Debug, Clone)]
pub struct CredRow {
    pub id: String,
    pub agent_key: String,
    pub node_id: String,
    pub n: i64,
    pub principal_id: String,
    pub ciphertext: String,
    pub expires_ms: i64,
    pub issued_ms: i64,
    pub revoke_ms: Option<i64>,
}

/// Everything read back at start.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub nodes: Vec<NodeRow>,
    pub placements: Vec<(String, i64, String)>,
    pub identities: Vec<(String, String, bool)>,
    pub pairs: Vec<(String, String, i64, Option<i64>)>,
    pub credentials: Vec<CredRow>,
    pub desired: Vec<(String, i64, String)>,
    pub statuses: Vec<(String, String)>,
    pub kv: Vec<(String, String)>,
}

pub enum JoinOutcome {
    Joined,
    /// The key's node joined again (same name and public key, key still within its TTL): it
    /// keeps its id and has the new token (SPEC §10.1).
    Rejoined {
        id: String,
    },
    KeyInvalid,
    NameTaken,
}

impl Db {
    /// Opens (creating when missing) and migrates the database at `url`.
    pub async fn open(url: &str) -> Result<Db, DbError> {
        if let Some(path) = url.strip_prefix("sqlite://") {
            let path = path.split('?').next().unwrap_or(path);
            if let Some(dir) = std::path::Path::new(path).parent() {
                if !dir.as_os_str().is_empty() {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| DbError::Other(format!("cannot create {}: {e}", dir.display())))?;
                }
            }
        } else if !url.starts_with("sqlite:") {
            return Err(DbError::Other(format!(
                "unsupported database URL {:?}: this build stores in SQLite (sqlite://PATH)",
                url.split('@').next_back().unwrap_or("")
            )));
        }
        let opts = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: a commit is on disk before it is acknowledged, so a `201` for a join
            // survives a power loss (SPEC §11). With WAL and the group commit it costs little
            // (docs/performance.md, "Durability").
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        // Four connections measured better than one under the simulator's cold start (121 s
        // against 147 s to converge): PAT writes and a pass's batch overlap their non-SQLite
        // work, although SQLite still takes one writer at a time.
        let pool = SqlitePoolOptions::new().max_connections(4).connect_with(opts).await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        let (writer, task) = Writer::spawn(pool.clone());
        Ok(Db { pool, writer, writer_task: std::sync::Arc::new(parking_lot::Mutex::new(Some(task))) })
    }

    /// The writer task's handle, once: whoever watches it learns when the writer ends.
    pub fn take_writer_task(&self) -> Option<tokio::task::JoinHandle<()>> {
        self.writer_task.lock().take()
    }

    /// Whether the database answers (for `/readyz`).
    pub async fn ping(&self) -> Result<(), DbError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    #[cfg(test)]
    pub(crate) fn writer(&self) -> &Writer {
        &self.writer
    }

    pub async fn insert_join_key(&self, hash: &[u8], expires_ms: i64, note: &str, now_ms: i64) -> Result<(), DbError> {
        sqlx::query("INSERT INTO join_keys (hash, expires_ms, note, created_ms) VALUES (?, ?, ?, ?)")
            .bind(hash)
            .bind(expires_ms)
            .bind(note)
            .bind(now_ms)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Marks the key used and creates the node in one transaction; a refusal leaves the key
    /// usable. A used key answers again for the node it made, while its TTL lasts, when the
    /// name and public key are the same: that node gets the new token.
    pub async fn join(&self, key_hash: &[u8], node: &NodeRow, now_ms: i64) -> Result<JoinOutcome, DbError> {
        let mut tx = self.pool.begin().await?;
        let taken = sqlx::query(
            "UPDATE join_keys SET used_ms = ?, node_id = ? WHERE hash = ? AND used_ms IS NULL AND expires_ms > ?",
        )
        .bind(now_ms)
        .bind(&node.id)
        .bind(key_hash)
        .bind(now_ms)
        .execute(&mut *tx)
        .await?;
        if taken.rows_affected() != 1 {
            let again = rejoin(&mut tx, key_hash, node, now_ms).await?;
            match &again {
                JoinOutcome::Rejoined { .. } => tx.commit().await?,
                _ => tx.rollback().await?,
            }
            return Ok(again);
        }
        let exists =
            sqlx::query("SELECT 1 FROM nodes WHERE name = ?").bind(&node.name).fetch_optional(&mut *tx).await?;
        if exists.is_some() {
            tx.rollback().await?;
            return Ok(JoinOutcome::NameTaken);
        }
        sqlx::query(
            "INSERT INTO nodes (id, name, token_hash, public_key, joined_ms, last_seen_ms, info) VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&node.id)
        .bind(&node.name)
        .bind(&node.token_hash)
        .bind(&node.public_key)
        .bind(node.joined_ms)
        .bind(node.last_seen_ms)
        .bind(&node.info)
        .execute(&mut *tx)
        .await?;
        sqlx::query("INSERT INTO desired (node_id, generation, agents) VALUES (?, 1, '[]')")
            .bind(&node.id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(JoinOutcome::Joined)
    }

    /// Stores a node's lifecycle columns.
    pub async fn set_lifecycle(&self, id: &str, c: (bool, Option<i64>, bool, Option<i64>)) -> Result<(), DbError> {
        sqlx::query(
            "UPDATE nodes SET cordoned = ?, drain_started_ms = ?, drain_force = ?, drain_done_ms = ? WHERE id = ?",
        )
        .bind(c.0)
        .bind(c.1)
        .bind(c.2)
        .bind(c.3)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Deletes the node and what hangs on it; its credentials are due for revocation now.
    pub async fn delete_node(&self, id: &str, now_ms: i64) -> Result<(), DbError> {
        let mut tx = self.pool.begin().await?;
        for sql in [
            "DELETE FROM nodes WHERE id = ?",
            "DELETE FROM desired WHERE node_id = ?",
            "DELETE FROM placements WHERE node_id = ?",
            "DELETE FROM pat_pairs WHERE node_id = ?",
            // The key cannot make the deleted node join again.
            "UPDATE join_keys SET node_id = NULL WHERE node_id = ?",
        ] {
            sqlx::query(sql).bind(id).execute(&mut *tx).await?;
        }
        sqlx::query("UPDATE credentials SET revoke_ms = ? WHERE node_id = ? AND (revoke_ms IS NULL OR revoke_ms > ?)")
            .bind(now_ms)
            .bind(id)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Writes reported node state (a batch, from the report flusher), in order.
    pub async fn update_nodes(&self, rows: &[(String, i64, String)]) -> Result<(), DbError> {
        let mut tx = self.pool.begin().await?;
        for (id, last_seen, info) in rows {
            sqlx::query("UPDATE nodes SET last_seen_ms = ?, info = ? WHERE id = ?")
                .bind(last_seen)
                .bind(info)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Applies one pass's changes in a single transaction, as multi-row statements (placing a
    /// joining fleet binds 100,000 replicas at once). Within each list the last entry for a
    /// row wins, as if they were applied one by one.
    pub async fn apply_pass(&self, w: &PassWrite) -> Result<(), DbError> {
        if w.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        writer::rows(
            &mut tx,
            "DELETE FROM placements WHERE (agent_key, replica) IN (SELECT column1, column2 FROM (",
            "))",
            2,
            &w.unbind,
            |b, (agent, replica)| {
                b.push_bind(agent).push_bind(*replica as i64);
            },
        )
        .await?;
        writer::rows(
            &mut tx,
            "INSERT INTO placements (agent_key, replica, node_id) ",
            " ON CONFLICT (agent_key, replica) DO UPDATE SET node_id = excluded.node_id",
            3,
            &w.bind,
            |b, (agent, replica, node)| {
                b.push_bind(agent).push_bind(*replica as i64).push_bind(node);
            },
        )
        .await?;
        writer::rows(
            &mut tx,
            "INSERT INTO desired (node_id, generation, agents) ",
            " ON CONFLICT (node_id) DO UPDATE SET generation = excluded.generation, agents = excluded.agents",
            3,
            &w.desired,
            |b, (node, generation, agents)| {
                b.push_bind(node).push_bind(*generation as i64).push_bind(agents);
            },
        )
        .await?;
        let retire: Vec<(&str, i64)> = w.retire.iter().map(|(id, at)| (id.as_str(), *at)).collect();
        writer::retire_credentials(&mut tx, &retire).await?;
        writer::rows(
            &mut tx,
            "INSERT INTO kv (key, value) ",
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            2,
            &w.kv,
            |b, (k, v)| {
                b.push_bind(k).push_bind(v);
            },
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn put_identity(&self, agent: &str, principal: &str, bound: bool) -> Result<(), DbError> {
        self.writer.write(Op::Identity { agent: agent.into(), principal: principal.into(), bound }).await
    }

    /// Stores an issued credential, raises its pair's PAT counter to `next_n` and retires the
    /// credential it replaces, atomically.
    pub async fn store_credential(&self, c: &CredRow, next_n: i64, retire: Option<(&str, i64)>) -> Result<(), DbError> {
        let retire = retire.map(|(id, at)| (id.to_string(), at));
        self.writer.write(Op::Credential { row: c.clone(), next_n, retire }).await
    }

    pub async fn delete_credential(&self, id: &str) -> Result<(), DbError> {
        self.writer.write(Op::DeleteCredential { id: id.into() }).await
    }

    pub async fn put_status(&self, agent: &str, body: &str) -> Result<(), DbError> {
        self.writer.write(Op::Status { agent: agent.into(), body: body.into() }).await
    }

    pub async fn load(&self) -> Result<Snapshot, DbError> {
        let p = &self.pool;
        let nodes = sqlx::query(
            "SELECT id, name, token_hash, public_key, joined_ms, last_seen_ms, info, \
             cordoned, drain_started_ms, drain_force, drain_done_ms FROM nodes",
        )
        .fetch_all(p)
        .await?
        .into_iter()
        .map(|r| NodeRow {
            id: r.get(0),
            name: r.get(1),
            token_hash: r.get(2),
            public_key: r.get(3),
            joined_ms: r.get(4),
            last_seen_ms: r.get(5),
            info: r.get(6),
            lifecycle: super::Lifecycle::from_columns(r.get(7), r.get(8), r.get(9), r.get(10)),
        })
        .collect();
        let placements = sqlx::query("SELECT agent_key, replica, node_id FROM placements")
            .fetch_all(p)
            .await?
            .into_iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        let identities = sqlx::query("SELECT agent_key, principal_id, bound FROM identities")
            .fetch_all(p)
            .await?
            .into_iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        let pairs = sqlx::query("SELECT agent_key, node_id, next_n, pending_n FROM pat_pairs")
            .fetch_all(p)
            .await?
            .into_iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect();
        let credentials = sqlx::query(
            "SELECT id, agent_key, node_id, n, principal_id, ciphertext, expires_ms, issued_ms, revoke_ms FROM credentials",
        )
        .fetch_all(p)
        .await?
        .into_iter()
        .map(|r| CredRow {
            id: r.get(0),
            agent_key: r.get(1),
            node_id: r.get(2),
            n: r.get(3),
            principal_id: r.get(4),
            ciphertext: r.get(5),
            expires_ms: r.get(6),
            issued_ms: r.get(7),
            revoke_ms: r.get(8),
        })
        .collect();
        let desired = sqlx::query("SELECT node_id, generation, agents FROM desired")
            .fetch_all(p)
            .await?
            .into_iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        let statuses = sqlx::query("SELECT agent_key, body FROM statuses")
            .fetch_all(p)
            .await?
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let kv = sqlx::query("SELECT key, value FROM kv")
            .fetch_all(p)
            .await?
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        Ok(Snapshot { nodes, placements, identities, pairs, credentials, desired, statuses, kv })
    }
}

/// A used key's second join: the node it made, if the key is within its TTL and the name and
/// public key match, gets the new token.
async fn rejoin(
    tx: &mut sqlx::SqliteConnection,
    key_hash: &[u8],
    node: &NodeRow,
    now_ms: i64,
) -> Result<JoinOutcome, DbError> {
    let made: Option<String> = sqlx::query_scalar(
        "SELECT node_id FROM join_keys WHERE hash = ? AND used_ms IS NOT NULL AND expires_ms > ? AND node_id IS NOT NULL",
    )
    .bind(key_hash)
    .bind(now_ms)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(id) = made else { return Ok(JoinOutcome::KeyInvalid) };
    let updated = sqlx::query("UPDATE nodes SET token_hash = ? WHERE id = ? AND name = ? AND public_key = ?")
        .bind(&node.token_hash)
        .bind(&id)
        .bind(&node.name)
        .bind(&node.public_key)
        .execute(&mut *tx)
        .await?;
    Ok(if updated.rows_affected() == 1 { JoinOutcome::Rejoined { id } } else { JoinOutcome::KeyInvalid })
}

/// One pass's writes.
#[derive(Debug, Default)]
pub struct PassWrite {
    pub unbind: Vec<(String, u32)>,
    pub bind: Vec<(String, u32, String)>,
    pub desired: Vec<(String, u64, String)>,
    pub retire: Vec<(String, i64)>,
    pub kv: Vec<(String, String)>,
}

impl PassWrite {
    pub fn is_empty(&self) -> bool {
        self.unbind.is_empty()
            && self.bind.is_empty()
            && self.desired.is_empty()
            && self.retire.is_empty()
            && self.kv.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SPEC §11: every connection commits with `synchronous=FULL` (2), so an acknowledged join
    /// survives a power loss.
    #[tokio::test]
    async fn every_connection_is_fully_synchronous() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&format!("sqlite://{}", dir.path().join("s.db").display())).await.unwrap();
        for _ in 0..4 {
            let mode: i64 = sqlx::query_scalar("PRAGMA synchronous").fetch_one(db.pool()).await.unwrap();
            assert_eq!(mode, 2, "FULL");
        }
    }

    /// More rows than one statement takes, rebinding and unbinding in one pass, and a node
    /// reported twice in one flush.
    #[tokio::test]
    async fn pass_writes_span_statements_and_keep_their_order() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&format!("sqlite://{}", dir.path().join("p.db").display())).await.unwrap();
        let mut w = PassWrite::default();
        for i in 0..25_000u32 {
            w.bind.push((format!("agent-{}", i / 5), i % 5, format!("node-{}", i % 7)));
        }
        db.apply_pass(&w).await.unwrap();
        let w = PassWrite {
            unbind: (0..5).map(|r| ("agent-0".to_string(), r)).collect(),
            bind: vec![("agent-0".into(), 1, "node-x".into()), ("agent-1".into(), 0, "node-y".into())],
            desired: vec![("node-1".into(), 2, "[]".into()), ("node-1".into(), 3, "[1]".into())],
            retire: vec![],
            kv: vec![("agents_etag".into(), "\"v1\"".into()), ("agents_etag".into(), "\"v2\"".into())],
        };
        db.apply_pass(&w).await.unwrap();
        let s = db.load().await.unwrap();
        assert_eq!(s.placements.len(), 25_000 - 4);
        assert!(s.placements.contains(&("agent-0".into(), 1, "node-x".into())));
        assert!(s.placements.contains(&("agent-1".into(), 0, "node-y".into())));
        assert!(!s.placements.iter().any(|p| p.0 == "agent-0" && p.1 != 1));
        assert_eq!(s.desired, vec![("node-1".to_string(), 3, "[1]".to_string())]);
        assert_eq!(s.kv, vec![("agents_etag".to_string(), "\"v2\"".to_string())]);

        let node = |id: &str, name: &str| NodeRow {
            id: id.into(),
            name: name.into(),
            token_hash: name.as_bytes().to_vec(),
            public_key: vec![0; 32],
            joined_ms: 1,
            last_seen_ms: 1,
            info: "{}".into(),
            lifecycle: Default::default(),
        };
        db.insert_join_key(b"k1", i64::MAX, "", 0).await.unwrap();
        db.insert_join_key(b"k2", i64::MAX, "", 0).await.unwrap();
        assert!(matches!(db.join(b"k1", &node("n1", "one"), 1).await.unwrap(), JoinOutcome::Joined));
        assert!(matches!(db.join(b"k2", &node("n2", "two"), 1).await.unwrap(), JoinOutcome::Joined));
        db.update_nodes(&[
            ("n1".into(), 5, "{\"a\":1}".into()),
            ("n2".into(), 6, "{}".into()),
            ("n1".into(), 7, "{\"a\":2}".into()),
        ])
        .await
        .unwrap();
        let s = db.load().await.unwrap();
        let seen: Vec<_> = s.nodes.iter().map(|n| (n.id.as_str(), n.last_seen_ms, n.info.as_str())).collect();
        assert!(seen.contains(&("n1", 7, "{\"a\":2}")) && seen.contains(&("n2", 6, "{}")), "{seen:?}");
    }
}
