//! The store's tables as a backup, a restore and a copy see them: every table a controller
//! keeps, with each column and the kind of value it holds on both backends. The leader lease
//! (PostgreSQL only) and the migration bookkeeping are not the fleet's state and are left out:
//! a store copied or restored keeps its own. A test holds this list to both backends' schemas,
//! so a migration that adds a column or a table fails it until the column is listed here.

/// The kind of value a column holds. `Bool` is `INTEGER` 0/1 on SQLite and `BOOLEAN` on
/// PostgreSQL: both read and compare as 0/1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Int,
    Text,
    Blob,
    Bool,
}

/// One table: its name and its columns in order.
#[derive(Debug)]
pub struct Table {
    pub name: &'static str,
    pub columns: &'static [(&'static str, Kind)],
}

impl Table {
    /// The column list of a `SELECT` or an `INSERT`.
    pub fn column_list(&self) -> String {
        self.columns.iter().map(|(c, _)| *c).collect::<Vec<_>>().join(", ")
    }

    pub fn kinds(&self) -> impl Iterator<Item = Kind> + '_ {
        self.columns.iter().map(|(_, k)| *k)
    }
}

use Kind::{Blob, Bool, Int, Text};

/// Every table of the fleet's state, as of this release's migrations.
pub const TABLES: &[Table] = &[
    Table {
        name: "join_keys",
        columns: &[
            ("hash", Blob),
            ("expires_ms", Int),
            ("used_ms", Int),
            ("note", Text),
            ("created_ms", Int),
            ("node_id", Text),
            ("allowed", Text),
        ],
    },
    Table {
        name: "nodes",
        columns: &[
            ("id", Text),
            ("name", Text),
            ("token_hash", Blob),
            ("public_key", Blob),
            ("joined_ms", Int),
            ("last_seen_ms", Int),
            ("info", Text),
            ("cordoned", Bool),
            ("drain_started_ms", Int),
            ("drain_force", Bool),
            ("drain_done_ms", Int),
            ("allowed", Text),
        ],
    },
    Table { name: "placements", columns: &[("agent_key", Text), ("replica", Int), ("node_id", Text)] },
    Table { name: "identities", columns: &[("agent_key", Text), ("principal_id", Text), ("bound", Bool)] },
    Table {
        name: "pat_pairs",
        columns: &[("agent_key", Text), ("node_id", Text), ("next_n", Int), ("pending_n", Int)],
    },
    Table {
        name: "credentials",
        columns: &[
            ("id", Text),
            ("agent_key", Text),
            ("node_id", Text),
            ("n", Int),
            ("principal_id", Text),
            ("ciphertext", Text),
            ("expires_ms", Int),
            ("issued_ms", Int),
            ("revoke_ms", Int),
        ],
    },
    Table {
        name: "desired",
        columns: &[("node_id", Text), ("generation", Int), ("agents", Text), ("input_hash", Int)],
    },
    Table { name: "statuses", columns: &[("agent_key", Text), ("body", Text)] },
    Table { name: "kv", columns: &[("key", Text), ("value", Text)] },
    Table {
        name: "events",
        columns: &[
            ("seq", Int),
            ("at_ms", Int),
            ("kind", Text),
            ("agent_key", Text),
            ("node_id", Text),
            ("node", Text),
            ("replica", Int),
            ("message", Text),
        ],
    },
    Table { name: "agents", columns: &[("key", Text), ("body", Text)] },
];

/// Tables of a store that are not the fleet's state.
pub const NOT_COPIED: &[&str] = &["_sqlx_migrations", "sqlite_sequence", "leader_lease"];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::db::sql::Pool;
    use crate::store::db::testing::each;
    use std::collections::BTreeSet;

    /// (table, column) of every table a migrated store has, but those not copied.
    async fn schema(pool: &Pool) -> BTreeSet<(String, String)> {
        let rows: Vec<(String, String)> = match pool {
            Pool::Sqlite(p) => sqlx::query_as(
                "SELECT m.name, c.name FROM sqlite_master m, pragma_table_info(m.name) c WHERE m.type = 'table'",
            )
            .fetch_all(p)
            .await
            .unwrap(),
            Pool::Pg(p) => sqlx::query_as(
                "SELECT table_name::text, column_name::text FROM information_schema.columns \
                 WHERE table_schema = current_schema()",
            )
            .fetch_all(p)
            .await
            .unwrap(),
        };
        rows.into_iter().filter(|(t, _)| !NOT_COPIED.contains(&t.as_str())).collect()
    }

    /// A migration that adds a table or a column fails this until the catalogue lists it: a
    /// backup, a restore or a copy would otherwise leave it behind.
    #[tokio::test]
    async fn the_catalogue_is_every_table_and_column_of_both_backends() {
        let listed: BTreeSet<(String, String)> =
            TABLES.iter().flat_map(|t| t.columns.iter().map(|(c, _)| (t.name.to_string(), c.to_string()))).collect();
        for fresh in each() {
            let db = crate::store::db::Db::open(&fresh.url).await.unwrap();
            assert_eq!(schema(db.pool()).await, listed, "on {}", fresh.backend);
        }
    }
}
