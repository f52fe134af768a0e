//! The mark of a store older than the fleet (docs/behaviour.md#a-store-older-than-the-fleet):
//! kept in the `kv` table from the moment the controller learns it — a restore writes it, and
//! so does the first node that reports a generation newer than the store's — until every PAT
//! issued after the store's time is known and every pair holds a PAT issued since the mark.
//! Stored, so a controller that restarts meanwhile goes on with it.

use serde::{Deserialize, Serialize};

/// Its `kv` key.
pub const KEY: &str = "store/catch_up";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CatchUp {
    /// When the catch-up started: every pair's PAT issued before it is replaced.
    pub since_ms: i64,
    /// When the backup the store came from was taken, when known.
    #[serde(default)]
    pub backup_ms: Option<i64>,
    /// How it was learnt, for the log.
    pub why: String,
}

impl CatchUp {
    /// A store restored from a backup taken at `taken_ms`.
    pub fn restored(now_ms: i64, taken_ms: Option<i64>) -> CatchUp {
        let why = match taken_ms {
            Some(t) => format!("restored from a backup taken at {}", crate::clock::rfc3339_ms(t)),
            None => "marked as restored".to_string(),
        };
        CatchUp { since_ms: now_ms, backup_ms: taken_ms, why }
    }

    /// A node that holds a newer generation than the store has for it.
    pub fn node_ahead(now_ms: i64, node: &str, theirs: u64, ours: u64) -> CatchUp {
        let why = format!("node {node} holds generation {theirs}, newer than the store's {ours}");
        CatchUp { since_ms: now_ms, backup_ms: None, why }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The mark in a `kv` value; `None` for one that cannot be read.
    pub fn parse(value: &str) -> Option<CatchUp> {
        serde_json::from_str(value).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_reads_back_and_says_why() {
        let m = CatchUp::restored(5, Some(0));
        assert_eq!(CatchUp::parse(&m.to_json()), Some(m.clone()));
        assert!(m.why.starts_with("restored from a backup taken at 1970-01-01T00:00:00"), "{}", m.why);
        let n = CatchUp::node_ahead(7, "n1", 9, 4);
        assert_eq!(n.why, "node n1 holds generation 9, newer than the store's 4");
        assert_eq!(CatchUp::parse("not json"), None);
    }
}
