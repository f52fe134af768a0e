//! What a store holds, as a backup and a restore print it: its nodes, agents, placed replicas,
//! (agent, node) pairs with a live PAT, rollouts, usable join keys and events, and when the
//! backup was taken (docs/operations.md#backup-and-restore).

use crate::clock;
use sqlx::SqliteConnection;

/// The `kv` row a backup stamps its copy with: when it was taken (ms since the epoch).
pub const TAKEN_KEY: &str = "backup/taken_ms";

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub taken_ms: Option<i64>,
    pub nodes: i64,
    pub agents: i64,
    pub replicas: i64,
    pub pairs: i64,
    pub rollouts: i64,
    pub rollouts_under_way: i64,
    pub join_keys: i64,
    pub events: i64,
    pub newest_event_ms: Option<i64>,
}

async fn one(c: &mut SqliteConnection, sql: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(sql).fetch_one(&mut *c).await
}

/// The summary of the SQLite store `c` reads; usable join keys are those unused and unexpired
/// at `now_ms`.
pub async fn of(c: &mut SqliteConnection, now_ms: i64) -> Result<Summary, sqlx::Error> {
    let rollouts: Vec<String> =
        sqlx::query_scalar("SELECT value FROM kv WHERE key LIKE 'rollout/%'").fetch_all(&mut *c).await?;
    let under_way = rollouts
        .iter()
        .filter(|r| serde_json::from_str::<serde_json::Value>(r).is_ok_and(|v| v["state"] != "complete"))
        .count();
    let taken: Option<String> =
        sqlx::query_scalar("SELECT value FROM kv WHERE key = $1").bind(TAKEN_KEY).fetch_optional(&mut *c).await?;
    Ok(Summary {
        taken_ms: taken.and_then(|t| t.parse().ok()),
        nodes: one(c, "SELECT COUNT(*) FROM nodes").await?,
        agents: one(c, "SELECT COUNT(*) FROM agents").await?,
        replicas: one(c, "SELECT COUNT(*) FROM placements").await?,
        pairs: one(c, "SELECT COUNT(*) FROM credentials WHERE revoke_ms IS NULL").await?,
        rollouts: rollouts.len() as i64,
        rollouts_under_way: under_way as i64,
        join_keys: sqlx::query_scalar("SELECT COUNT(*) FROM join_keys WHERE used_ms IS NULL AND expires_ms > $1")
            .bind(now_ms)
            .fetch_one(&mut *c)
            .await?,
        events: one(c, "SELECT COUNT(*) FROM events").await?,
        newest_event_ms: sqlx::query_scalar("SELECT MAX(at_ms) FROM events").fetch_one(&mut *c).await?,
    })
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = |ms: Option<i64>| ms.map_or_else(|| "-".to_string(), clock::rfc3339_ms);
        writeln!(f, "  taken at     {}", at(self.taken_ms))?;
        writeln!(f, "  nodes        {}", self.nodes)?;
        writeln!(f, "  agents       {}", self.agents)?;
        writeln!(f, "  replicas     {} placed", self.replicas)?;
        writeln!(f, "  pairs        {} with a live PAT", self.pairs)?;
        writeln!(f, "  rollouts     {} kept, {} under way", self.rollouts, self.rollouts_under_way)?;
        writeln!(f, "  join keys    {} usable", self.join_keys)?;
        write!(f, "  events       {} (newest {})", self.events, at(self.newest_event_ms))
    }
}
