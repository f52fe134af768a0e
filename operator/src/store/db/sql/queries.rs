// The store's SQL, written once and compiled once per backend (`sql/mod.rs` includes this
// file into `sqlite` and `pg`, each with its own `DB`, `Conn`, `Pool` and `FOR_SHARE`). Raw
// statements use `$N` placeholders, which both drivers take; multi-row statements are built
// with `QueryBuilder<DB>`, which writes each driver's own. Fenced statements (docs/behaviour.md#high-availability) run
// `fence` first, in their transaction.

use crate::store::db::error::DbError;
use crate::store::db::rows::{
    AgentsWrite, Batch, CredRow, Fence, JoinKeyRow, JoinOutcome, NodeRow, PassWrite, Snapshot,
};
use crate::store::records::event::{Event, Filter};
use fleet_api::EventView;
use sqlx::query_builder::Separated;
use sqlx::{QueryBuilder, Row};

/// Bound parameters per statement (SQLite takes 32,766, PostgreSQL 65,535). SQLite copies
/// every bound value and parses the whole statement before it runs, so a statement's memory
/// is its rows': at 30,000 parameters the first pass of a 10,000-node fleet (10,000 desired
/// bodies of a few KiB, 100,000 bindings) would take tens of MiB at once, the controller's
/// peak.
/// At 3,000 a statement is a few MiB; the rows of one pass still commit together.
const MAX_VARS: usize = 3_000;
/// Agents serialised and written per statement (a few hundred KiB of JSON).
const AGENT_ROWS: usize = 500;
/// Desired bodies per statement: a node's body is a few KiB, and a statement's bound values
/// are copied twice (sqlx owns them for the call, SQLite binds its own copy), so 1,000 of
/// them were ~2.3 MB twice over beside the pass that stores them, at the controller's peak
/// (docs/performance.md#shared-names-and-bindings-by-agent-the-twelfth-run). 50 are
/// ~250 KiB; the pass's chunk still commits in one transaction.
const DESIRED_ROWS: usize = 50;
/// Rows per event insert (7 bound values each).
const EVENT_ROWS: usize = 2_000;

/// Refuses the transaction unless `fence` still holds the lease: the same predicate as the
/// renewal, and the row is share-locked so a takeover waits for this transaction to end.
pub async fn fence(c: &mut Conn, fence: Option<&Fence>) -> Result<(), DbError> {
    let Some(f) = fence else { return Ok(()) };
    let sql = format!(
        "SELECT 1 FROM leader_lease WHERE name = $1 AND holder = $2 AND epoch = $3 \
         AND expires_at > now(){FOR_SHARE}"
    );
    let held = sqlx::query(&sql)
        .bind(crate::store::db::lease::NAME)
        .bind(&f.holder)
        .bind(f.epoch)
        .fetch_optional(&mut *c)
        .await?;
    match held {
        Some(_) => Ok(()),
        None => Err(DbError::Fenced { epoch: f.epoch }),
    }
}

pub async fn ping(p: &Pool) -> Result<(), DbError> {
    sqlx::query("SELECT 1").execute(p).await?;
    Ok(())
}

pub async fn insert_join_key(
    p: &Pool,
    hash: &[u8],
    expires_ms: i64,
    note: &str,
    allowed: Option<&str>,
    now_ms: i64,
) -> Result<(), DbError> {
    sqlx::query("INSERT INTO join_keys (hash, expires_ms, note, created_ms, allowed) VALUES ($1, $2, $3, $4, $5)")
        .bind(hash)
        .bind(expires_ms)
        .bind(note)
        .bind(now_ms)
        .bind(allowed)
        .execute(p)
        .await?;
    Ok(())
}

/// The join keys still of interest at `now_ms`: unexpired, or used within the last week; the
/// newest first, at most `limit`.
pub async fn join_keys(p: &Pool, now_ms: i64, limit: i64) -> Result<Vec<JoinKeyRow>, DbError> {
    let rows = sqlx::query_as(
        "SELECT hash, note, created_ms, expires_ms, used_ms, node_id, allowed FROM join_keys \
         WHERE expires_ms > $1 OR used_ms > $2 ORDER BY created_ms DESC LIMIT $3",
    )
    .bind(now_ms)
    .bind(now_ms - 7 * 86_400_000)
    .bind(limit)
    .fetch_all(p)
    .await?;
    Ok(rows)
}

/// The hashes of every join key.
pub async fn join_key_hashes(p: &Pool) -> Result<Vec<Vec<u8>>, DbError> {
    Ok(sqlx::query_scalar("SELECT hash FROM join_keys").fetch_all(p).await?)
}

/// Ends the join key with `hash` at `now_ms`, for joins and re-joins alike.
pub async fn end_join_key(p: &Pool, hash: &[u8], now_ms: i64) -> Result<(), DbError> {
    sqlx::query("UPDATE join_keys SET expires_ms = $1 WHERE hash = $2 AND expires_ms > $1")
        .bind(now_ms)
        .bind(hash)
        .execute(p)
        .await?;
    Ok(())
}

/// The allowance a join key carries (JSON), `None` for a key without one or no such key.
pub async fn join_key_allowance(p: &Pool, hash: &[u8]) -> Result<Option<String>, DbError> {
    let allowed: Option<Option<String>> =
        sqlx::query_scalar("SELECT allowed FROM join_keys WHERE hash = $1").bind(hash).fetch_optional(p).await?;
    Ok(allowed.flatten())
}

pub async fn set_allowance(p: &Pool, id: &str, allowed: Option<&str>) -> Result<(), DbError> {
    sqlx::query("UPDATE nodes SET allowed = $1 WHERE id = $2").bind(allowed).bind(id).execute(p).await?;
    Ok(())
}

pub async fn join(p: &Pool, key_hash: &[u8], node: &NodeRow, now_ms: i64) -> Result<JoinOutcome, DbError> {
    let mut tx = p.begin().await?;
    let taken = sqlx::query(
        "UPDATE join_keys SET used_ms = $1, node_id = $2 WHERE hash = $3 AND used_ms IS NULL AND expires_ms > $1",
    )
    .bind(now_ms)
    .bind(&node.id)
    .bind(key_hash)
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
    let exists = sqlx::query("SELECT 1 FROM nodes WHERE name = $1").bind(&node.name).fetch_optional(&mut *tx).await?;
    if exists.is_some() {
        tx.rollback().await?;
        return Ok(JoinOutcome::NameTaken);
    }
    sqlx::query(
        "INSERT INTO nodes (id, name, token_hash, public_key, joined_ms, last_seen_ms, info, allowed) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(&node.id)
    .bind(&node.name)
    .bind(&node.token_hash)
    .bind(&node.public_key)
    .bind(node.joined_ms)
    .bind(node.last_seen_ms)
    .bind(&node.info)
    .bind(&node.allowed)
    .execute(&mut *tx)
    .await?;
    sqlx::query("INSERT INTO desired (node_id, generation, agents) VALUES ($1, 1, '[]')")
        .bind(&node.id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(JoinOutcome::Joined)
}

/// A used key's second join: the node it made, if the key is within its TTL and was first used
/// at most [`fleet_api::REJOIN_WINDOW_SECONDS`] ago, and the name and public key match, gets
/// the new token.
async fn rejoin(tx: &mut Conn, key_hash: &[u8], node: &NodeRow, now_ms: i64) -> Result<JoinOutcome, DbError> {
    let made: Option<String> = sqlx::query_scalar(
        "SELECT node_id FROM join_keys WHERE hash = $1 AND used_ms IS NOT NULL AND expires_ms > $2 \
         AND used_ms > $3 AND node_id IS NOT NULL",
    )
    .bind(key_hash)
    .bind(now_ms)
    .bind(now_ms - fleet_api::REJOIN_WINDOW_SECONDS * 1000)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(id) = made else { return Ok(JoinOutcome::KeyInvalid) };
    let updated = sqlx::query("UPDATE nodes SET token_hash = $1 WHERE id = $2 AND name = $3 AND public_key = $4")
        .bind(&node.token_hash)
        .bind(&id)
        .bind(&node.name)
        .bind(&node.public_key)
        .execute(&mut *tx)
        .await?;
    Ok(if updated.rows_affected() == 1 { JoinOutcome::Rejoined { id } } else { JoinOutcome::KeyInvalid })
}

pub async fn set_lifecycle(p: &Pool, id: &str, c: (bool, Option<i64>, bool, Option<i64>)) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE nodes SET cordoned = $1, drain_started_ms = $2, drain_force = $3, drain_done_ms = $4 WHERE id = $5",
    )
    .bind(c.0)
    .bind(c.1)
    .bind(c.2)
    .bind(c.3)
    .bind(id)
    .execute(p)
    .await?;
    Ok(())
}

pub async fn delete_node(p: &Pool, id: &str, now_ms: i64) -> Result<(), DbError> {
    let mut tx = p.begin().await?;
    // A write first: on SQLite a transaction that read before it writes cannot take the write
    // lock once another connection has written meanwhile (busy at once, not after the timeout).
    let gone: Option<(Vec<u8>, String)> = sqlx::query_as("DELETE FROM nodes WHERE id = $1 RETURNING token_hash, name")
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
    // Its token is kept as a deleted one's, refused as revoked rather than as unknown.
    if let Some((token_hash, name)) = gone {
        let key = crate::store::records::node::deleted_key(&token_hash);
        let value = serde_json::json!({"node": id, "name": name, "deletedMs": now_ms}).to_string();
        sqlx::query("DELETE FROM kv WHERE key = $1").bind(&key).execute(&mut *tx).await?;
        sqlx::query("INSERT INTO kv (key, value) VALUES ($1, $2)").bind(&key).bind(value).execute(&mut *tx).await?;
    }
    for sql in [
        "DELETE FROM desired WHERE node_id = $1",
        "DELETE FROM placements WHERE node_id = $1",
        "DELETE FROM pat_pairs WHERE node_id = $1",
        // The key cannot make the deleted node join again.
        "UPDATE join_keys SET node_id = NULL WHERE node_id = $1",
    ] {
        sqlx::query(sql).bind(id).execute(&mut *tx).await?;
    }
    sqlx::query("UPDATE credentials SET revoke_ms = $1 WHERE node_id = $2 AND (revoke_ms IS NULL OR revoke_ms > $1)")
        .bind(now_ms)
        .bind(id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

pub async fn update_nodes(p: &Pool, rows: &[(String, i64, String)]) -> Result<(), DbError> {
    let mut tx = p.begin().await?;
    for (id, last_seen, info) in rows {
        sqlx::query("UPDATE nodes SET last_seen_ms = $1, info = $2 WHERE id = $3")
            .bind(last_seen)
            .bind(info)
            .bind(id)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Rollouts serialised and written per statement.
const ROLLOUTS_AT_ONCE: usize = 200;

pub async fn apply_pass(p: &Pool, f: Option<&Fence>, w: &PassWrite) -> Result<(), DbError> {
    let mut tx = p.begin().await?;
    fence(&mut tx, f).await?;
    rows(
        &mut tx,
        "DELETE FROM placements WHERE (agent_key, replica) IN (SELECT column1, column2 FROM (",
        ") AS v)",
        2,
        &w.unbind,
        |b, (agent, replica)| {
            b.push_bind(&**agent).push_bind(*replica as i64);
        },
    )
    .await?;
    let bind = last_per_key(&w.bind, |(agent, replica, _)| (&**agent, *replica));
    rows(
        &mut tx,
        "INSERT INTO placements (agent_key, replica, node_id) ",
        " ON CONFLICT (agent_key, replica) DO UPDATE SET node_id = excluded.node_id",
        3,
        &bind,
        |b, (agent, replica, node)| {
            b.push_bind(&**agent).push_bind(*replica as i64).push_bind(&**node);
        },
    )
    .await?;
    let desired = last_per_key(&w.desired, |(node, _, _)| node.as_str())
        .into_iter()
        .map(|(node, generation, agents)| match std::str::from_utf8(agents) {
            Ok(text) => Ok((node, generation, text)),
            Err(_) => Err(DbError::Other(format!("the desired state of node {node} is not UTF-8; not stored"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    rows_at_most(
        &mut tx,
        "INSERT INTO desired (node_id, generation, agents) ",
        " ON CONFLICT (node_id) DO UPDATE SET generation = excluded.generation, agents = excluded.agents",
        (3, DESIRED_ROWS),
        &desired,
        |b, (node, generation, agents)| {
            b.push_bind(*node).push_bind(**generation as i64).push_bind(*agents);
        },
    )
    .await?;
    input_hashes(&mut tx, &w.input_hashes).await?;
    let retire: Vec<(&str, i64)> = w.retire.iter().map(|(id, at)| (id.as_str(), *at)).collect();
    retire_credentials(&mut tx, &retire).await?;
    let kv: Vec<(&str, &str)> =
        last_per_key(&w.kv, |(k, _)| k.as_str()).into_iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    upsert_kv(&mut tx, &kv).await?;
    for chunk in w.rollouts.chunks(ROLLOUTS_AT_ONCE) {
        let serialised: Vec<(String, String)> = chunk
            .iter()
            .filter_map(|r| match serde_json::to_string(&**r) {
                Ok(row) => Some((crate::store::records::Rollout::key(&r.agent), row)),
                Err(e) => {
                    tracing::error!(agent = %r.agent, error = %e, "cannot store the rollout");
                    None
                }
            })
            .collect();
        let rows_of: Vec<(&str, &str)> = serialised.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        upsert_kv(&mut tx, &rows_of).await?;
    }
    for (k, v) in &w.kv_delete {
        if let Some(v) = v {
            sqlx::query("DELETE FROM kv WHERE key = $1 AND value = $2").bind(k).bind(v).execute(&mut *tx).await?;
        }
    }
    let keys: Vec<String> = w.kv_delete.iter().filter(|(_, v)| v.is_none()).map(|(k, _)| k.clone()).collect();
    delete_kv(&mut tx, &keys).await?;
    insert_events(&mut tx, &w.events).await?;
    tx.commit().await?;
    Ok(())
}

/// Sets the input hashes of desired rows (after the bodies of the same pass are written). The
/// bits are stored as a signed 64-bit integer, both databases' widest.
async fn input_hashes(c: &mut Conn, hashes: &[(String, u64)]) -> Result<(), DbError> {
    let hashes = last_per_key(hashes, |(node, _)| node.as_str());
    rows(
        c,
        "UPDATE desired SET input_hash = v.column2 FROM (",
        ") AS v WHERE desired.node_id = v.column1",
        2,
        &hashes,
        |b, (node, hash)| {
            b.push_bind(node.as_str()).push_bind(*hash as i64);
        },
    )
    .await
}

/// Deletes `kv` rows by key, many to a statement: a pass may clear the unsettled-status
/// marks of a whole fleet at once.
async fn delete_kv(c: &mut Conn, keys: &[String]) -> Result<(), DbError> {
    for chunk in keys.chunks(MAX_VARS) {
        let mut q = QueryBuilder::<DB>::new("DELETE FROM kv");
        push_ids(&mut q, "key", Some(chunk));
        q.build().persistent(false).execute(&mut *c).await?;
    }
    Ok(())
}

/// Inserts or replaces `kv` rows.
async fn upsert_kv(c: &mut Conn, items: &[(&str, &str)]) -> Result<(), DbError> {
    let head = "INSERT INTO kv (key, value) ";
    let tail = " ON CONFLICT (key) DO UPDATE SET value = excluded.value";
    rows(c, head, tail, 2, items, |b, (k, v)| {
        b.push_bind(*k).push_bind(*v);
    })
    .await
}

/// Sets one `kv` row, unfenced: what any replica may write (an admin's order).
pub async fn put_kv(p: &Pool, key: &str, value: &str) -> Result<(), DbError> {
    sqlx::query("INSERT INTO kv (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value")
        .bind(key)
        .bind(value)
        .execute(p)
        .await?;
    Ok(())
}

pub async fn get_kv(p: &Pool, key: &str) -> Result<Option<String>, DbError> {
    let row = sqlx::query("SELECT value FROM kv WHERE key = $1").bind(key).fetch_optional(p).await?;
    Ok(row.map(|r| r.get::<String, _>(0)))
}

/// Sets a `kv` row only when its key has none; the value the key holds afterwards (the one a
/// racing replica stored first, if it won).
pub async fn kv_insert_absent(p: &Pool, key: &str, value: &str) -> Result<String, DbError> {
    sqlx::query("INSERT INTO kv (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING")
        .bind(key)
        .bind(value)
        .execute(p)
        .await?;
    get_kv(p, key).await?.ok_or_else(|| DbError::Other(format!("the kv row {key} vanished after its insert")))
}

/// The `kv` rows whose key starts with `prefix`, in key order.
pub async fn kv_prefix(p: &Pool, prefix: &str) -> Result<Vec<(String, String)>, DbError> {
    let rows = sqlx::query("SELECT key, value FROM kv WHERE substr(key, 1, $2) = $1 ORDER BY key")
        .bind(prefix)
        .bind(prefix.chars().count() as i32)
        .fetch_all(p)
        .await?;
    Ok(rows.into_iter().map(|r| (r.get::<String, _>(0), r.get::<String, _>(1))).collect())
}

/// Writes a change of the agent list, and the ETag it was read with, in one transaction: the
/// stored list is never half of one list and half of another.
pub async fn store_agents(p: &Pool, f: Option<&Fence>, w: &AgentsWrite) -> Result<(), DbError> {
    let mut tx = p.begin().await?;
    fence(&mut tx, f).await?;
    if w.replace_all {
        sqlx::query("DELETE FROM agents").execute(&mut *tx).await?;
    }
    rows(&mut tx, "DELETE FROM agents WHERE key IN (SELECT column1 FROM (", ") AS v)", 1, &w.delete, |b, key| {
        b.push_bind(key);
    })
    .await?;
    for chunk in w.put.chunks(AGENT_ROWS) {
        let mut bodies = Vec::with_capacity(chunk.len());
        for agent in chunk.iter().filter_map(|&i| w.list.get(i)) {
            let body = serde_json::to_string(agent).map_err(|e| DbError::Other(format!("agent {}: {e}", agent.key)))?;
            bodies.push((agent.key.as_ref(), body));
        }
        rows(
            &mut tx,
            "INSERT INTO agents (key, body) ",
            " ON CONFLICT (key) DO UPDATE SET body = excluded.body",
            2,
            &bodies,
            |b, (key, body)| {
                b.push_bind(*key).push_bind(body.as_str());
            },
        )
        .await?;
    }
    sqlx::query("INSERT INTO kv (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value")
        .bind("agents_etag")
        .bind(&w.etag)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Writes a folded run of the workers' writes in one (fenced) transaction.
pub async fn commit_batch(p: &Pool, f: Option<&Fence>, b: &Batch<'_>) -> Result<(), DbError> {
    let mut tx = p.begin().await?;
    fence(&mut tx, f).await?;
    let identities: Vec<_> = b.identities.iter().collect();
    rows(
        &mut tx,
        "INSERT INTO identities (agent_key, principal_id, bound) ",
        " ON CONFLICT (agent_key) DO UPDATE SET principal_id = excluded.principal_id, bound = excluded.bound",
        3,
        &identities,
        |q, (agent, (principal, bound))| {
            q.push_bind(**agent).push_bind(*principal).push_bind(*bound);
        },
    )
    .await?;
    let pairs: Vec<_> = b.pairs.iter().collect();
    rows(
        &mut tx,
        // `pending_n` is cleared: a row from an earlier version may still carry one.
        "INSERT INTO pat_pairs (agent_key, node_id, next_n) ",
        " ON CONFLICT (agent_key, node_id) DO UPDATE SET next_n = excluded.next_n, pending_n = NULL",
        3,
        &pairs,
        |q, ((agent, node), next_n)| {
            q.push_bind(*agent).push_bind(*node).push_bind(*next_n);
        },
    )
    .await?;
    rows(
        &mut tx,
        "INSERT INTO credentials (id, agent_key, node_id, n, principal_id, ciphertext, expires_ms, issued_ms, revoke_ms) ",
        " ON CONFLICT (id) DO NOTHING",
        9,
        &b.credentials,
        |q, r| {
            q.push_bind(&r.id)
                .push_bind(&r.agent_key)
                .push_bind(&r.node_id)
                .push_bind(r.n)
                .push_bind(&r.principal_id)
                .push_bind(&r.ciphertext)
                .push_bind(r.expires_ms)
                .push_bind(r.issued_ms)
                .push_bind(r.revoke_ms);
        },
    )
    .await?;
    retire_credentials(&mut tx, &b.retire).await?;
    rows(&mut tx, "DELETE FROM credentials WHERE id IN (SELECT column1 FROM (", ") AS v)", 1, &b.delete, |q, id| {
        q.push_bind(*id);
    })
    .await?;
    let statuses: Vec<_> = b.statuses.iter().collect();
    rows(
        &mut tx,
        "INSERT INTO statuses (agent_key, body) ",
        " ON CONFLICT (agent_key) DO UPDATE SET body = excluded.body",
        2,
        &statuses,
        |q, (agent, body)| {
            q.push_bind(**agent).push_bind(**body);
        },
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Sets `revoke_ms` of each credential id in turn, one prepared UPDATE each (a rotation
/// retires one).
async fn retire_credentials(c: &mut Conn, retire: &[(&str, i64)]) -> Result<(), DbError> {
    for (id, at) in retire {
        sqlx::query("UPDATE credentials SET revoke_ms = $1 WHERE id = $2").bind(*at).bind(*id).execute(&mut *c).await?;
    }
    Ok(())
}

/// Runs `head VALUES (...), (...) tail` over `items`, as many rows per statement as the
/// backend takes parameters for. Nothing is run for no items. Not kept prepared: each row
/// count is another statement, and SQLite's plan of one with thousands of parameters is
/// megabytes — cached per connection they would be a third of the controller's heap.
async fn rows<'q, T>(
    c: &mut Conn,
    head: &str,
    tail: &str,
    cols: usize,
    items: &'q [T],
    bind: impl FnMut(&mut Separated<'_, 'q, DB, &'static str>, &'q T),
) -> Result<(), DbError> {
    rows_at_most(c, head, tail, (cols, usize::MAX), items, bind).await
}

/// [`rows`] with at most `most` rows of `cols` columns per statement.
async fn rows_at_most<'q, T>(
    c: &mut Conn,
    head: &str,
    tail: &str,
    (cols, most): (usize, usize),
    items: &'q [T],
    mut bind: impl FnMut(&mut Separated<'_, 'q, DB, &'static str>, &'q T),
) -> Result<(), DbError> {
    for chunk in items.chunks((MAX_VARS / cols).clamp(1, most)) {
        let mut qb = QueryBuilder::<DB>::new(head);
        qb.push_values(chunk, |mut b, item| bind(&mut b, item));
        qb.push(tail);
        qb.build().persistent(false).execute(&mut *c).await?;
    }
    Ok(())
}

/// The last entry of each key, in the order of those last entries: an upsert statement
/// touches each row once (PostgreSQL refuses a second touch), with the result of applying
/// the entries one by one.
fn last_per_key<'a, T, K: Ord + std::hash::Hash>(items: &'a [T], key: impl Fn(&'a T) -> K) -> Vec<&'a T> {
    // References, not copies: a pass's rows hold every desired body it changed. Keys in
    // strictly rising order (a pass's bindings are) are each there once: no map of them.
    if items.windows(2).all(|w| key(&w[0]) < key(&w[1])) {
        return items.iter().collect();
    }
    let mut last = std::collections::HashMap::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        last.insert(key(item), i);
    }
    if last.len() == items.len() {
        return items.iter().collect();
    }
    let mut keep: Vec<usize> = last.into_values().collect();
    keep.sort_unstable();
    keep.into_iter().map(|i| &items[i]).collect()
}

/// Every table the registry is built from. The queries run at once, each on a session of its
/// own: a new leader waits for this load, and one after another they took 0.8 s at 10,000
/// nodes (no one query above 0.3 s). Like the one-by-one reads before, they are not one
/// snapshot; what changes meanwhile is followed after (docs/behaviour.md#high-availability).
pub async fn load(p: &Pool) -> Result<Snapshot, DbError> {
    let two = |sql: &'static str| async move {
        let rows = sqlx::query(sql).fetch_all(p).await?;
        Ok::<Vec<(String, String)>, DbError>(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
    };
    let placements = async {
        let rows = sqlx::query("SELECT agent_key, replica, node_id FROM placements").fetch_all(p).await?;
        Ok::<_, DbError>(rows.into_iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
    };
    let identities = async {
        let rows = sqlx::query("SELECT agent_key, principal_id, bound FROM identities").fetch_all(p).await?;
        Ok::<_, DbError>(rows.into_iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
    };
    let pairs = async {
        let rows = sqlx::query("SELECT agent_key, node_id, next_n, pending_n FROM pat_pairs").fetch_all(p).await?;
        Ok::<_, DbError>(rows.into_iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect())
    };
    // Without the sealed boxes: the registry keeps none at start ([`ciphertexts`] reads one
    // back when a desired state needs it).
    let credentials = async {
        let rows = sqlx::query(
            "SELECT id, agent_key, node_id, n, principal_id, '' AS ciphertext, expires_ms, issued_ms, revoke_ms \
             FROM credentials",
        )
        .fetch_all(p)
        .await?;
        Ok::<_, DbError>(
            rows.into_iter()
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
                .collect(),
        )
    };
    let input_hashes = async {
        let rows = sqlx::query("SELECT node_id, input_hash FROM desired WHERE input_hash IS NOT NULL").fetch_all(p).await?;
        Ok::<_, DbError>(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
    };
    let agents = async {
        let rows = sqlx::query("SELECT body FROM agents").fetch_all(p).await?;
        Ok::<_, DbError>(rows.into_iter().map(|r| r.get(0)).collect())
    };
    let (nodes, placements, identities, pairs, credentials, desired, input_hashes, statuses, agents, kv) = futures::try_join!(
        nodes(p, None),
        placements,
        identities,
        pairs,
        credentials,
        desired(p, None),
        input_hashes,
        two("SELECT agent_key, body FROM statuses"),
        agents,
        two("SELECT key, value FROM kv"),
    )?;
    Ok(Snapshot { nodes, placements, identities, pairs, credentials, desired, input_hashes, statuses, agents, kv })
}

/// `WHERE column IN (ids…)` for `ids`, nothing for `None`.
fn push_ids<'q>(q: &mut QueryBuilder<'q, DB>, column: &str, ids: Option<&'q [String]>) {
    if let Some(ids) = ids {
        q.push(format!(" WHERE {column} IN ("));
        let mut list = q.separated(", ");
        for id in ids {
            list.push_bind(id);
        }
        list.push_unseparated(")");
    }
}

const SELECT_NODES: &str = "SELECT id, name, token_hash, public_key, joined_ms, last_seen_ms, info, \
     cordoned, drain_started_ms, drain_force, drain_done_ms, allowed FROM nodes";

pub async fn nodes(p: &Pool, ids: Option<&[String]>) -> Result<Vec<NodeRow>, DbError> {
    if ids.is_some_and(|i| i.is_empty()) {
        return Ok(Vec::new());
    }
    let mut q = QueryBuilder::<DB>::new(SELECT_NODES);
    push_ids(&mut q, "id", ids);
    let rows = q.build().persistent(false).fetch_all(p).await?;
    Ok(rows.iter().map(node_row).collect())
}

pub async fn node_by_token_hash(p: &Pool, hash: &[u8]) -> Result<Option<NodeRow>, DbError> {
    let sql = format!("{SELECT_NODES} WHERE token_hash = $1");
    let row = sqlx::query(&sql).bind(hash).fetch_optional(p).await?;
    Ok(row.as_ref().map(node_row))
}

fn node_row(r: &<DB as sqlx::Database>::Row) -> NodeRow {
    NodeRow {
        id: r.get(0),
        name: r.get(1),
        token_hash: r.get(2),
        public_key: r.get(3),
        joined_ms: r.get(4),
        last_seen_ms: r.get(5),
        info: r.get(6),
        lifecycle: crate::store::records::Lifecycle::from_columns(r.get(7), r.get(8), r.get(9), r.get(10)),
        allowed: r.get(11),
    }
}

/// The sealed boxes of these credentials, as stored: (id, ciphertext). A credential that is
/// gone has no row; no ids, no statement.
pub async fn ciphertexts(p: &Pool, ids: &[String]) -> Result<Vec<(String, String)>, DbError> {
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(MAX_VARS) {
        let mut q = QueryBuilder::<DB>::new("SELECT id, ciphertext FROM credentials");
        push_ids(&mut q, "id", Some(chunk));
        let rows = q.build().persistent(false).fetch_all(p).await?;
        out.extend(rows.into_iter().map(|r| (r.get(0), r.get(1))));
    }
    Ok(out)
}

pub async fn desired(p: &Pool, ids: Option<&[String]>) -> Result<Vec<(String, i64, String)>, DbError> {
    if ids.is_some_and(|i| i.is_empty()) {
        return Ok(Vec::new());
    }
    let mut q = QueryBuilder::<DB>::new("SELECT node_id, generation, agents FROM desired");
    push_ids(&mut q, "node_id", ids);
    let rows = q.build().persistent(false).fetch_all(p).await?;
    Ok(rows.into_iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
}

/// Inserts events and trims the history to its bounds, in one transaction.
pub async fn write_events(p: &Pool, events: &[Event], keep_per_subject: i64, keep_total: i64) -> Result<(), DbError> {
    let mut tx = p.begin().await?;
    insert_events(&mut tx, events).await?;
    // Over the whole (bounded) table: a few milliseconds, and one statement per subject kind
    // however many subjects the batch touched.
    for column in ["agent_key", "node_id"] {
        let trim = format!(
            "DELETE FROM events WHERE seq IN (SELECT seq FROM (SELECT seq, ROW_NUMBER() OVER \
             (PARTITION BY {column} ORDER BY seq DESC) AS rn FROM events WHERE {column} IS NOT NULL) AS r \
             WHERE rn > $1)"
        );
        sqlx::query(&trim).bind(keep_per_subject).execute(&mut *tx).await?;
    }
    sqlx::query("DELETE FROM events WHERE seq <= (SELECT MAX(seq) FROM events) - $1")
        .bind(keep_total)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

async fn insert_events(c: &mut Conn, events: &[Event]) -> Result<(), DbError> {
    for chunk in events.chunks(EVENT_ROWS) {
        let mut q =
            QueryBuilder::<DB>::new("INSERT INTO events (at_ms, kind, agent_key, node_id, node, replica, message) ");
        q.push_values(chunk, |mut b, e| {
            b.push_bind(e.at_ms)
                .push_bind(e.kind.as_str())
                .push_bind(e.agent.as_deref())
                .push_bind(e.node_id.as_deref())
                .push_bind(e.node.as_deref())
                .push_bind(e.replica.map(i64::from))
                .push_bind(&e.message);
        });
        q.build().persistent(false).execute(&mut *c).await?;
    }
    Ok(())
}

pub async fn read_events(p: &Pool, f: &Filter, limit: i64) -> Result<Vec<EventView>, DbError> {
    let mut q = QueryBuilder::<DB>::new(
        "SELECT seq, at_ms, kind, agent_key, node_id, node, replica, message FROM events WHERE seq > ",
    );
    q.push_bind(f.since);
    if let Some(b) = f.before {
        q.push(" AND seq < ").push_bind(b);
    }
    if let Some(a) = &f.agent {
        q.push(" AND agent_key = ").push_bind(a);
    }
    if let Some(n) = &f.node {
        q.push(" AND (node_id = ").push_bind(n).push(" OR node = ").push_bind(n).push(")");
    }
    q.push(if f.newest_first { " ORDER BY seq DESC LIMIT " } else { " ORDER BY seq LIMIT " }).push_bind(limit);
    let rows = q.build().persistent(false).fetch_all(p).await?;
    Ok(rows
        .into_iter()
        .map(|r| EventView {
            seq: r.get(0),
            at: crate::clock::rfc3339_ms(r.get(1)),
            kind: r.get(2),
            agent_key: r.get(3),
            node_id: r.get(4),
            node: r.get(5),
            replica: r.get::<Option<i64>, _>(6).map(|n| n as u32),
            message: r.get(7),
        })
        .collect())
}
