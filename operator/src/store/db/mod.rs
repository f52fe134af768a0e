//! The durable copy under the registry: SQLite (WAL) or PostgreSQL through sqlx, written
//! through on every change and read once at start. Nothing here is on a read path. The SQL
//! itself is in `sql/queries.rs`. Layered one way: rows and errors, then the SQL per backend
//! (`sql`, and the lease), then the group-commit writer, then [`Db`], which picks the backend
//! from the URL and fences the leader's writes (docs/behaviour.md#high-availability).

pub mod error;
pub mod lease;
pub mod rows;
pub mod sql;
pub mod writer;

pub use error::DbError;
pub use rows::{AgentsWrite, CredRow, Fence, JoinKeyRow, JoinOutcome, NodeRow, PassWrite, Snapshot};

use rows::Op;
use sql::{fence_of, on, open_pg, open_sqlite, pg, sqlite, Pool};
use std::sync::Arc;
use writer::Writer;

#[derive(Clone)]
pub struct Db {
    pool: Pool,
    /// The lease this replica leads under; `None` while it follows. Always `None` on SQLite,
    /// whose single replica writes unfenced.
    fence: Arc<parking_lot::RwLock<Option<Fence>>>,
    /// Group commit for the workers' writes (see `writer`).
    writer: Writer,
    /// The writer task, until the supervisor takes it (`server.rs`).
    writer_task: std::sync::Arc<parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl Db {
    /// Opens (creating when missing) and migrates the database at `url`: `sqlite://PATH` or
    /// `postgres://…`.
    pub async fn open(url: &str) -> Result<Db, DbError> {
        Self::open_as(url, "").await
    }

    /// [`Db::open`] for the replica named `replica`: on PostgreSQL every connection carries
    /// the name (`fleet.replica`), and the change notifications of its writes with it.
    pub async fn open_as(url: &str, replica: &str) -> Result<Db, DbError> {
        let pool = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Pool::Pg(open_pg(url, replica).await?)
        } else if url.starts_with("sqlite:") {
            Pool::Sqlite(open_sqlite(url).await?)
        } else {
            return Err(DbError::Other(format!(
                "unsupported database URL {:?}: use sqlite://PATH (one replica) or postgres://USER@HOST/DB (several)",
                url.split('@').next_back().unwrap_or("")
            )));
        };
        let fence: Arc<parking_lot::RwLock<Option<Fence>>> = Default::default();
        let (writer, task) = Writer::spawn(pool.clone(), fence.clone());
        Ok(Db { pool, fence, writer, writer_task: std::sync::Arc::new(parking_lot::Mutex::new(Some(task))) })
    }

    /// Whether this store can have several replicas (PostgreSQL).
    pub fn is_shared(&self) -> bool {
        matches!(self.pool, Pool::Pg(_))
    }

    /// The PostgreSQL pool, for the lease and the listener.
    pub fn pg(&self) -> Option<&sqlx::PgPool> {
        match &self.pool {
            Pool::Pg(p) => Some(p),
            Pool::Sqlite(_) => None,
        }
    }

    /// Leads under `fence` from now on (`None`: follows).
    pub fn set_fence(&self, fence: Option<Fence>) {
        *self.fence.write() = fence;
    }

    /// The fence a leader write carries: none on SQLite; on PostgreSQL the lease held, and a
    /// refusal when none is.
    pub(crate) fn fence(&self) -> Result<Option<Fence>, DbError> {
        fence_of(&self.pool, &self.fence)
    }

    /// The writer task's handle, once: whoever watches it learns when the writer ends.
    pub fn take_writer_task(&self) -> Option<tokio::task::JoinHandle<()>> {
        self.writer_task.lock().take()
    }

    /// Whether the database answers (for `/readyz`).
    pub async fn ping(&self) -> Result<(), DbError> {
        on!(&self.pool, ping())
    }

    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    #[cfg(test)]
    pub(crate) fn writer(&self) -> &Writer {
        &self.writer
    }

    /// Stores a join key's hash with its expiry, note and allowance (JSON, `None`: anything).
    pub async fn insert_join_key(
        &self,
        hash: &[u8],
        expires_ms: i64,
        note: &str,
        allowed: Option<&str>,
        now_ms: i64,
    ) -> Result<(), DbError> {
        on!(&self.pool, insert_join_key(hash, expires_ms, note, allowed, now_ms))
    }

    /// The join keys still of interest: unexpired, or used within the last week; newest first.
    pub async fn join_keys(&self, now_ms: i64, limit: i64) -> Result<Vec<JoinKeyRow>, DbError> {
        on!(&self.pool, join_keys(now_ms, limit))
    }

    /// The hashes of every join key.
    pub async fn join_key_hashes(&self) -> Result<Vec<Vec<u8>>, DbError> {
        on!(&self.pool, join_key_hashes())
    }

    /// Ends the join key with `hash` now: no join and no re-join with it.
    pub async fn end_join_key(&self, hash: &[u8], now_ms: i64) -> Result<(), DbError> {
        on!(&self.pool, end_join_key(hash, now_ms))
    }

    /// The allowance a join key carries (JSON); `None` for a key without one, or no such key.
    pub async fn join_key_allowance(&self, hash: &[u8]) -> Result<Option<String>, DbError> {
        on!(&self.pool, join_key_allowance(hash))
    }

    /// Stores a node's allowance (JSON, `None`: anything).
    pub async fn set_allowance(&self, id: &str, allowed: Option<&str>) -> Result<(), DbError> {
        on!(&self.pool, set_allowance(id, allowed))
    }

    /// Marks the key used and creates the node in one transaction; a refusal leaves the key
    /// usable. A used key answers again for the node it made, while its TTL lasts, when the
    /// name and public key are the same: that node gets the new token.
    pub async fn join(&self, key_hash: &[u8], node: &NodeRow, now_ms: i64) -> Result<JoinOutcome, DbError> {
        on!(&self.pool, join(key_hash, node, now_ms))
    }

    /// Stores a node's lifecycle columns.
    pub async fn set_lifecycle(&self, id: &str, c: (bool, Option<i64>, bool, Option<i64>)) -> Result<(), DbError> {
        on!(&self.pool, set_lifecycle(id, c))
    }

    /// Sets a `kv` row from any replica (an admin's rollout order).
    pub async fn put_kv(&self, key: &str, value: &str) -> Result<(), DbError> {
        on!(&self.pool, put_kv(key, value))
    }

    pub async fn get_kv(&self, key: &str) -> Result<Option<String>, DbError> {
        on!(&self.pool, get_kv(key))
    }

    /// Sets a `kv` row unless it has a value; returns the value it holds.
    pub async fn kv_insert_absent(&self, key: &str, value: &str) -> Result<String, DbError> {
        on!(&self.pool, kv_insert_absent(key, value))
    }

    /// The `kv` rows under a key prefix, in key order.
    pub async fn kv_prefix(&self, prefix: &str) -> Result<Vec<(String, String)>, DbError> {
        on!(&self.pool, kv_prefix(prefix))
    }

    /// Deletes the node and what hangs on it; its credentials are due for revocation now.
    pub async fn delete_node(&self, id: &str, now_ms: i64) -> Result<(), DbError> {
        on!(&self.pool, delete_node(id, now_ms))
    }

    /// Writes reported node state (a batch, from the report flusher), in order.
    pub async fn update_nodes(&self, rows: &[(String, i64, String)]) -> Result<(), DbError> {
        on!(&self.pool, update_nodes(rows))
    }

    /// Applies one pass's changes in a single fenced transaction, as multi-row statements
    /// (placing a joining fleet binds 100,000 replicas at once). Within each list the last
    /// entry for a row wins, as if they were applied one by one.
    pub async fn apply_pass(&self, w: &PassWrite) -> Result<(), DbError> {
        if w.is_empty() {
            return Ok(());
        }
        let fence = self.fence()?;
        on!(&self.pool, apply_pass(fence.as_ref(), w))
    }

    /// Writes a change of the agent list and its ETag in one fenced transaction.
    pub async fn store_agents(&self, w: &AgentsWrite) -> Result<(), DbError> {
        let fence = self.fence()?;
        on!(&self.pool, store_agents(fence.as_ref(), w))
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
        on!(&self.pool, load())
    }

    /// The node rows of `ids` that exist; every node row when `ids` is `None`.
    pub async fn nodes(&self, ids: Option<&[String]>) -> Result<Vec<NodeRow>, DbError> {
        on!(&self.pool, nodes(ids))
    }

    /// The node whose token hashes to `hash`, if one does.
    pub async fn node_by_token_hash(&self, hash: &[u8]) -> Result<Option<NodeRow>, DbError> {
        on!(&self.pool, node_by_token_hash(hash))
    }

    /// The sealed boxes of these credentials: (id, ciphertext as stored); none for no ids.
    pub async fn ciphertexts(&self, ids: &[String]) -> Result<Vec<(String, String)>, DbError> {
        on!(&self.pool, ciphertexts(ids))
    }

    /// The desired states of `ids` that exist; every one when `ids` is `None`.
    pub async fn desired(&self, ids: Option<&[String]>) -> Result<Vec<(String, i64, String)>, DbError> {
        on!(&self.pool, desired(ids))
    }
}

/// Fresh databases for the store's tests, one of each backend: the store's test suite runs
/// against both (docs/behaviour.md#high-availability). PostgreSQL comes from `fleet_devkit::postgres`, started by the
/// first test that needs it.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use std::time::Duration;

    /// A backend's name and the URL of a fresh, empty database of it; the directory holds
    /// the SQLite file and lives as long as the value.
    pub struct Fresh {
        pub backend: &'static str,
        pub url: String,
        _dir: tempfile::TempDir,
    }

    /// SQLite always; PostgreSQL unless it is not installed and `FLEET_E2E=1` is unset.
    pub fn each() -> Vec<Fresh> {
        let dir = tempfile::tempdir().unwrap();
        let sqlite = format!("sqlite://{}", dir.path().join("s.db").display());
        let mut all = vec![Fresh { backend: "sqlite", url: sqlite, _dir: dir }];
        if let Some(pg) = fleet_devkit::postgres::shared_or_skip("the store's tests on PostgreSQL") {
            let url = pg.database().unwrap();
            all.push(Fresh { backend: "postgres", url, _dir: tempfile::tempdir().unwrap() });
        }
        all
    }

    /// Opens the database and, on PostgreSQL, takes the lease so the leader's writes pass
    /// their fence.
    pub async fn open_leading(url: &str) -> Db {
        let db = Db::open(url).await.unwrap();
        lead(&db).await;
        db
    }

    /// Rows in `table`.
    pub async fn count(db: &Db, table: &str) -> i64 {
        let sql = format!("SELECT COUNT(*) FROM {table}");
        match db.pool() {
            Pool::Sqlite(p) => sqlx::query_scalar(&sql).fetch_one(p).await.unwrap(),
            Pool::Pg(p) => sqlx::query_scalar(&sql).fetch_one(p).await.unwrap(),
        }
    }

    pub async fn lead(db: &Db) {
        if let Some(pool) = db.pg() {
            let fence = lease::acquire(pool, "test", "", Duration::from_secs(3600)).await.unwrap();
            db.set_fence(Some(fence.expect("a fresh database's lease is free")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sql::SQLITE_CACHE_KIB;
    use super::testing::{each, open_leading};
    use super::*;

    /// docs/behaviour.md#hardening: every connection commits with `synchronous=FULL` (2), so an acknowledged join
    /// survives a power loss.
    #[tokio::test]
    async fn every_connection_is_fully_synchronous() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&format!("sqlite://{}", dir.path().join("s.db").display())).await.unwrap();
        for _ in 0..4 {
            let Pool::Sqlite(pool) = db.pool() else { unreachable!() };
            let mode: i64 = sqlx::query_scalar("PRAGMA synchronous").fetch_one(pool).await.unwrap();
            assert_eq!(mode, 2, "FULL");
        }
    }

    /// Every pooled connection (all four held at once) caches at most
    /// [`SQLITE_CACHE_KIB`] of pages, not SQLite's 2,000 KiB.
    #[tokio::test]
    async fn every_connection_caches_few_pages() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&format!("sqlite://{}", dir.path().join("s.db").display())).await.unwrap();
        let Pool::Sqlite(pool) = db.pool() else { unreachable!() };
        let mut held = Vec::new();
        for _ in 0..4 {
            let mut conn = pool.acquire().await.unwrap();
            let size: i64 = sqlx::query_scalar("PRAGMA cache_size").fetch_one(&mut *conn).await.unwrap();
            assert_eq!(size, -i64::from(SQLITE_CACHE_KIB), "a negative cache_size is KiB");
            held.push(conn);
        }
    }

    /// More rows than one statement takes, rebinding and unbinding in one pass, and a node
    /// reported twice in one flush.
    #[tokio::test]
    async fn pass_writes_span_statements_and_keep_their_order() {
        for fresh in each() {
            eprintln!("on {}", fresh.backend);
            pass_writes_on(&open_leading(&fresh.url).await).await;
        }
    }

    async fn pass_writes_on(db: &Db) {
        let mut w = PassWrite::default();
        for i in 0..25_000u32 {
            w.bind.push((format!("agent-{}", i / 5).into(), i % 5, format!("node-{}", i % 7).into()));
        }
        db.apply_pass(&w).await.unwrap();
        let w = PassWrite {
            unbind: (0..5).map(|r| ("agent-0".into(), r)).collect(),
            bind: vec![("agent-0".into(), 1, "node-x".into()), ("agent-1".into(), 0, "node-y".into())],
            desired: vec![("node-1".into(), 2, "[]".into()), ("node-1".into(), 3, "[1]".into())],
            // The last of a node's wins; every bit of 64 is kept; a node without a row has none.
            input_hashes: vec![("node-1".into(), 7), ("node-1".into(), u64::MAX - 1), ("node-9".into(), 5)],
            retire: vec![],
            kv: vec![("agents_etag".into(), "\"v1\"".into()), ("agents_etag".into(), "\"v2\"".into())],
            kv_delete: vec![],
            rollouts: vec![],
            // Written with the rows they tell of.
            events: vec![crate::store::events::Event::new(crate::store::events::Kind::RolloutCompleted, "done")],
        };
        db.apply_pass(&w).await.unwrap();
        assert_eq!(crate::store::db::testing::count(db, "events").await, 1);
        let s = db.load().await.unwrap();
        assert_eq!(s.placements.len(), 25_000 - 4);
        assert!(s.placements.contains(&("agent-0".into(), 1, "node-x".into())));
        assert!(s.placements.contains(&("agent-1".into(), 0, "node-y".into())));
        assert!(!s.placements.iter().any(|p| p.0 == "agent-0" && p.1 != 1));
        assert_eq!(s.desired, vec![("node-1".to_string(), 3, "[1]".to_string())]);
        assert_eq!(s.input_hashes, vec![("node-1".to_string(), (u64::MAX - 1) as i64)]);
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
            allowed: None,
        };
        db.insert_join_key(b"k1", i64::MAX, "", None, 0).await.unwrap();
        db.insert_join_key(b"k2", i64::MAX, "", None, 0).await.unwrap();
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

    /// A used join key joins its node again (its first `201` lost) only within
    /// [`fleet_api::REJOIN_WINDOW_SECONDS`] of its first use, never after it was revoked; the
    /// list shows a key's state and never the key.
    #[tokio::test]
    async fn a_used_key_rejoins_only_for_minutes_and_a_revoked_one_never() {
        for fresh in each() {
            eprintln!("on {}", fresh.backend);
            let db = open_leading(&fresh.url).await;
            let node = |token: &[u8]| NodeRow {
                id: "n1".into(),
                name: "one".into(),
                token_hash: token.to_vec(),
                public_key: vec![7; 32],
                joined_ms: 1,
                last_seen_ms: 1,
                info: "{}".into(),
                lifecycle: Default::default(),
                allowed: None,
            };
            let window = fleet_api::REJOIN_WINDOW_SECONDS * 1000;
            let t0 = 1_000_000;
            db.insert_join_key(b"key", i64::MAX, "worker", None, 0).await.unwrap();
            assert!(matches!(db.join(b"key", &node(b"t1"), t0).await.unwrap(), JoinOutcome::Joined));
            let again = db.join(b"key", &node(b"t2"), t0 + window - 1).await.unwrap();
            assert!(matches!(again, JoinOutcome::Rejoined { .. }), "within the window");
            let late = db.join(b"key", &node(b"t3"), t0 + window + 1).await.unwrap();
            assert!(matches!(late, JoinOutcome::KeyInvalid), "past the window, however long the key's TTL");

            let listed = db.join_keys(t0, 10).await.unwrap();
            assert_eq!((listed.len(), listed[0].used_ms, listed[0].node_id.as_deref()), (1, Some(t0), Some("n1")));
            db.insert_join_key(b"key2", i64::MAX, "", None, 0).await.unwrap();
            assert_eq!(db.join_key_hashes().await.unwrap().len(), 2);
            db.end_join_key(b"key2", t0).await.unwrap();
            let mut other = node(b"t4");
            (other.id, other.name) = ("n2".into(), "two".into());
            assert!(matches!(db.join(b"key2", &other, t0 + 1).await.unwrap(), JoinOutcome::KeyInvalid), "revoked");
            db.end_join_key(b"key", t0).await.unwrap();
            let rejoin = db.join(b"key", &node(b"t5"), t0 + 2).await.unwrap();
            assert!(matches!(rejoin, JoinOutcome::KeyInvalid), "a revoked key joins its node again neither");
        }
    }

    fn agent_list(n: usize, revision: u64) -> crate::model::AgentList {
        let items = (0..n).map(|i| fleet_devkit::state::synthetic_agent(i, 1 + revision as u32)).collect();
        let read = crate::model::parse_agents(&crate::model::raw_items(items), &[], &mut Default::default());
        assert!(read.skipped.is_empty() && read.warnings.is_empty(), "{read:?}");
        std::sync::Arc::new(read.agents)
    }

    fn stored_keys(s: &Snapshot) -> Vec<String> {
        let mut keys: Vec<String> =
            s.agents.iter().map(|b| serde_json::from_str::<crate::model::Agent>(b).unwrap().key.to_string()).collect();
        keys.sort();
        keys
    }

    /// The agent list is one row an agent: a change writes what changed (more than one
    /// statement's worth at first), a resync replaces every row, and the ETag goes with it.
    #[tokio::test]
    async fn agent_rows_take_a_change_of_the_list() {
        for fresh in each() {
            eprintln!("on {}", fresh.backend);
            let db = open_leading(&fresh.url).await;
            let list = agent_list(1_200, 0);
            db.store_agents(&AgentsWrite::all(list.clone(), "\"e1\"".into())).await.unwrap();
            let s = db.load().await.unwrap();
            assert_eq!(s.agents.len(), 1_200);
            assert!(s.kv.contains(&("agents_etag".into(), "\"e1\"".into())));

            // agent-00003 changes (three replicas now) and agent-00005 is gone.
            let changed = agent_list(1_200, 2);
            let w = AgentsWrite {
                list: changed.clone(),
                put: vec![3],
                delete: vec!["agent-00005".into()],
                replace_all: false,
                etag: "\"e2\"".into(),
            };
            db.store_agents(&w).await.unwrap();
            let s = db.load().await.unwrap();
            assert_eq!(s.agents.len(), 1_199);
            let keys = stored_keys(&s);
            assert!(!keys.contains(&"agent-00005".to_string()));
            let three = s.agents.iter().filter(|b| b.contains("\"replicas\":3")).count();
            assert_eq!(three, 1, "only the changed agent was written");
            assert!(s.kv.contains(&("agents_etag".into(), "\"e2\"".into())));

            let few = std::sync::Arc::new(changed[..10].to_vec());
            db.store_agents(&AgentsWrite::all(few, "\"e3\"".into())).await.unwrap();
            let s = db.load().await.unwrap();
            assert_eq!(stored_keys(&s), (0..10).map(|i| format!("agent-{i:05}")).collect::<Vec<_>>());
        }
    }

    /// A pass's desired bodies go 50 to a statement (their bound values are copied twice per
    /// statement): 120 bodies, three statements, each body stored once with its generation.
    #[tokio::test]
    async fn a_pass_stores_its_desired_bodies_a_few_to_a_statement() {
        for fresh in each() {
            eprintln!("on {}", fresh.backend);
            let db = open_leading(&fresh.url).await;
            let body = |i: usize| format!("[{{\"agentKey\":\"a{i}\",\"pad\":\"{}\"}}]", "x".repeat(3_000));
            let desired = (0..120).map(|i| (format!("n{i:03}"), i as u64 + 1, body(i).into())).collect();
            db.apply_pass(&PassWrite { desired, ..PassWrite::default() }).await.unwrap();
            let mut stored = db.desired(None).await.unwrap();
            stored.sort();
            assert_eq!(stored.len(), 120);
            for (i, (node, generation, agents)) in stored.into_iter().enumerate() {
                assert_eq!((node, generation, agents), (format!("n{i:03}"), i as i64 + 1, body(i)));
            }
        }
    }

    /// A store a newer release migrated further (a migration this build does not know is
    /// recorded as applied) opens and works: a rolling upgrade runs both side by side, and a
    /// rollback runs the older one on it (docs/operations.md#versions-and-upgrades).
    #[tokio::test]
    async fn a_store_a_newer_release_migrated_opens() {
        for fresh in each() {
            eprintln!("on {}", fresh.backend);
            drop(Db::open(&fresh.url).await.unwrap());
            let newer = "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
                         VALUES (9999, 'a newer release', TRUE, $1, 1)";
            let checksum = vec![0u8; 48];
            if fresh.backend == "sqlite" {
                let pool = sqlx::SqlitePool::connect(&fresh.url).await.unwrap();
                sqlx::query(newer).bind(&checksum).execute(&pool).await.unwrap();
                pool.close().await;
            } else {
                let pool = sqlx::PgPool::connect(&fresh.url).await.unwrap();
                sqlx::query(newer).bind(&checksum).execute(&pool).await.unwrap();
                pool.close().await;
            }
            let db = open_leading(&fresh.url).await;
            db.insert_join_key(b"k", i64::MAX, "", None, 0).await.unwrap();
            assert_eq!(testing::count(&db, "join_keys").await, 1);
        }
    }

    /// A database of a version that kept the agent list as one `kv` value has it moved to the
    /// rows by the migration, on both backends.
    #[tokio::test]
    async fn an_agent_list_of_an_earlier_version_moves_to_rows() {
        let list: Vec<_> = agent_list(3, 0).iter().cloned().collect();
        let old_value = serde_json::to_string(&list).unwrap();
        for fresh in each() {
            eprintln!("on {}", fresh.backend);
            let insert = "INSERT INTO kv (key, value) VALUES ('agents', $1), ('agents_etag', 'W/\"x\"')";
            if fresh.backend == "sqlite" {
                let pool = sqlx::sqlite::SqlitePoolOptions::new()
                    .connect_with(
                        fresh.url.parse::<sqlx::sqlite::SqliteConnectOptions>().unwrap().create_if_missing(true),
                    )
                    .await
                    .unwrap();
                let mut m = sqlx::migrate!("./migrations/sqlite");
                m.migrations = m.migrations.iter().filter(|m| m.version < 3).cloned().collect::<Vec<_>>().into();
                m.run(&pool).await.unwrap();
                sqlx::query(insert).bind(&old_value).execute(&pool).await.unwrap();
                pool.close().await;
            } else {
                let pool = sqlx::PgPool::connect(&fresh.url).await.unwrap();
                let mut m = sqlx::migrate!("./migrations/postgres");
                m.migrations = m.migrations.iter().filter(|m| m.version < 4).cloned().collect::<Vec<_>>().into();
                m.run(&pool).await.unwrap();
                sqlx::query(insert).bind(&old_value).execute(&pool).await.unwrap();
                pool.close().await;
            }
            let db = open_leading(&fresh.url).await;
            let s = db.load().await.unwrap();
            assert_eq!(stored_keys(&s), ["agent-00000", "agent-00001", "agent-00002"]);
            let first: crate::model::Agent =
                serde_json::from_str(s.agents.iter().find(|b| b.contains("agent-00000")).unwrap()).unwrap();
            assert_eq!(first, list[0]);
            assert_eq!(s.kv, vec![("agents_etag".to_string(), "W/\"x\"".to_string())]);
        }
    }
}
