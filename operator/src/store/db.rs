//! The durable copy under the registry: SQLite through sqlx, WAL, written through on every
//! change and read once at start. Nothing here is on a read path.

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
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        // Four connections measured better than one under the simulator's cold start (121 s
        // against 147 s to converge): PAT writes and a pass's batch overlap their non-SQLite
        // work, although SQLite still takes one writer at a time.
        let pool = SqlitePoolOptions::new().max_connections(4).connect_with(opts).await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        Ok(Db { pool })
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

    /// Marks the key used and creates the node in one transaction; a refusal leaves the key usable.
    pub async fn join(&self, key_hash: &[u8], node: &NodeRow, now_ms: i64) -> Result<JoinOutcome, DbError> {
        let mut tx = self.pool.begin().await?;
        let taken =
            sqlx::query("UPDATE join_keys SET used_ms = ? WHERE hash = ? AND used_ms IS NULL AND expires_ms > ?")
                .bind(now_ms)
                .bind(key_hash)
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
        if taken.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(JoinOutcome::KeyInvalid);
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

    /// Writes reported node state (a batch, from the report flusher).
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

    /// Applies one pass's changes in a single transaction.
    pub async fn apply_pass(&self, w: &PassWrite) -> Result<(), DbError> {
        if w.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        for (agent, replica) in &w.unbind {
            sqlx::query("DELETE FROM placements WHERE agent_key = ? AND replica = ?")
                .bind(agent)
                .bind(*replica as i64)
                .execute(&mut *tx)
                .await?;
        }
        for (agent, replica, node) in &w.bind {
            sqlx::query("INSERT INTO placements (agent_key, replica, node_id) VALUES (?, ?, ?) ON CONFLICT (agent_key, replica) DO UPDATE SET node_id = excluded.node_id")
                .bind(agent)
                .bind(*replica as i64)
                .bind(node)
                .execute(&mut *tx)
                .await?;
        }
        for (node, generation, agents) in &w.desired {
            sqlx::query("INSERT INTO desired (node_id, generation, agents) VALUES (?, ?, ?) ON CONFLICT (node_id) DO UPDATE SET generation = excluded.generation, agents = excluded.agents")
                .bind(node)
                .bind(*generation as i64)
                .bind(agents)
                .execute(&mut *tx)
                .await?;
        }
        for (id, revoke_ms) in &w.retire {
            sqlx::query("UPDATE credentials SET revoke_ms = ? WHERE id = ?")
                .bind(revoke_ms)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        for (k, v) in &w.kv {
            sqlx::query(
                "INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            )
            .bind(k)
            .bind(v)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub async fn put_identity(&self, agent: &str, principal: &str, bound: bool) -> Result<(), DbError> {
        sqlx::query("INSERT INTO identities (agent_key, principal_id, bound) VALUES (?, ?, ?) ON CONFLICT (agent_key) DO UPDATE SET principal_id = excluded.principal_id, bound = excluded.bound")
            .bind(agent)
            .bind(principal)
            .bind(bound)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn put_pair(&self, agent: &str, node: &str, next_n: i64, pending_n: Option<i64>) -> Result<(), DbError> {
        sqlx::query("INSERT INTO pat_pairs (agent_key, node_id, next_n, pending_n) VALUES (?, ?, ?, ?) ON CONFLICT (agent_key, node_id) DO UPDATE SET next_n = excluded.next_n, pending_n = excluded.pending_n")
            .bind(agent)
            .bind(node)
            .bind(next_n)
            .bind(pending_n)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Stores an issued credential, clears the pair's pending counter and retires the
    /// credential it replaces, atomically.
    pub async fn store_credential(&self, c: &CredRow, next_n: i64, retire: Option<(&str, i64)>) -> Result<(), DbError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("INSERT INTO credentials (id, agent_key, node_id, n, principal_id, ciphertext, expires_ms, issued_ms, revoke_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL) ON CONFLICT (id) DO NOTHING")
            .bind(&c.id)
            .bind(&c.agent_key)
            .bind(&c.node_id)
            .bind(c.n)
            .bind(&c.principal_id)
            .bind(&c.ciphertext)
            .bind(c.expires_ms)
            .bind(c.issued_ms)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE pat_pairs SET next_n = ?, pending_n = NULL WHERE agent_key = ? AND node_id = ?")
            .bind(next_n)
            .bind(&c.agent_key)
            .bind(&c.node_id)
            .execute(&mut *tx)
            .await?;
        if let Some((id, at)) = retire {
            sqlx::query("UPDATE credentials SET revoke_ms = ? WHERE id = ?")
                .bind(at)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub async fn delete_credential(&self, id: &str) -> Result<(), DbError> {
        sqlx::query("DELETE FROM credentials WHERE id = ?").bind(id).execute(&self.pool).await?;
        Ok(())
    }

    pub async fn put_status(&self, agent: &str, body: &str) -> Result<(), DbError> {
        sqlx::query("INSERT INTO statuses (agent_key, body) VALUES (?, ?) ON CONFLICT (agent_key) DO UPDATE SET body = excluded.body")
            .bind(agent)
            .bind(body)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn load(&self) -> Result<Snapshot, DbError> {
        let p = &self.pool;
        let nodes = sqlx::query("SELECT id, name, token_hash, public_key, joined_ms, last_seen_ms, info FROM nodes")
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
