//! An agent's template (docs/behaviour.md#rolling-out-a-change): what forces a recreate on
//! every node and is the same everywhere — executor, secrets, resources and the restart
//! stamp — and the `specId` that names it.

use super::agent::Agent;
use fleet_api::{Executor, Resources};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;

/// A template's name: 32 bits of a SHA-256 of the template, shown as 8 hex digits. Equal
/// templates have equal ids on every replica and across versions (the hash is of the
/// template's JSON, not of a process-local hasher); two templates of one agent colliding is a
/// one-in-four-billion chance, and would make a step look done a pass early. Never 0: a
/// replica record keeps 0 for "none reported".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct SpecId(pub u32);

impl SpecId {
    /// An id as [`fmt::Display`] writes it; `None` for any other text.
    pub fn parse(s: &str) -> Option<SpecId> {
        if s.len() != 8 || !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return None;
        }
        u32::from_str_radix(s, 16).ok().filter(|n| *n != 0).map(SpecId)
    }
}

impl fmt::Display for SpecId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}

impl From<SpecId> for String {
    fn from(s: SpecId) -> String {
        s.to_string()
    }
}

impl TryFrom<String> for SpecId {
    type Error = String;
    fn try_from(s: String) -> Result<SpecId, String> {
        SpecId::parse(&s).ok_or_else(|| format!("{s:?} is not a spec id"))
    }
}

/// What a replica runs, apart from its identity and PAT.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Template {
    pub executor: Executor,
    #[serde(default)]
    pub secrets: Vec<String>,
    #[serde(default)]
    pub resources: Resources,
    #[serde(default)]
    pub restart: u64,
    /// The revision of the CP item this template was last seen in: a node still on it is sent
    /// that revision, so `observedRevision` shows how far a rollout got. Not part of the id.
    pub revision: u64,
}

impl Template {
    /// The agent's template as the CP describes it now, with the restart stamp given.
    pub fn of(a: &Agent, restart: u64) -> Template {
        let mut secrets = a.placed_spec().map(|s| s.secrets.clone()).unwrap_or_default();
        secrets.sort();
        secrets.dedup();
        Template { executor: a.executor.clone(), secrets, resources: a.resources(), restart, revision: a.revision }
    }

    pub fn id(&self) -> SpecId {
        let mut h = Sha256::new();
        // Serialising plain data cannot fail.
        let fields = (&self.executor, &self.secrets, &self.resources, self.restart);
        h.update(serde_json::to_vec(&fields).unwrap_or_default());
        let d = h.finalize();
        let n = u32::from_be_bytes([d[0], d[1], d[2], d[3]]);
        SpecId(n.max(1))
    }

    /// Whether the two run the same containers (the revision aside).
    pub fn same(&self, other: &Template) -> bool {
        self.executor == other.executor
            && self.secrets == other.secrets
            && self.resources == other.resources
            && self.restart == other.restart
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(image: &str, restart: u64, revision: u64) -> Template {
        Template {
            executor: Executor { kind: "k".into(), image: Some(image.into()) },
            secrets: vec!["gh".into()],
            resources: Resources { cpus: Some(0.5), memory_mb: None },
            restart,
            revision,
        }
    }

    #[test]
    fn equal_templates_have_one_id_and_the_revision_is_not_part_of_it() {
        assert_eq!(t("a:1", 0, 1).id(), t("a:1", 0, 9).id());
        assert_ne!(t("a:1", 0, 1).id(), t("a:2", 0, 1).id());
        assert_ne!(t("a:1", 0, 1).id(), t("a:1", 1, 1).id());
        let id = t("a:1", 0, 1).id();
        assert_eq!(SpecId::parse(&id.to_string()), Some(id));
        assert_eq!(id.to_string().len(), 8);
        assert!(fleet_api::validate::is_spec_id(&id.to_string()));
        assert_eq!(SpecId::parse("00000000"), None);
        assert_eq!(SpecId::parse("ABCDEF12"), None);
        assert_eq!(SpecId::parse("abc"), None);
    }
}
