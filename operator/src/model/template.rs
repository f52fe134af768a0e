//! An agent's template (docs/behaviour.md#rolling-out-a-change): what forces a recreate on
//! every node and is the same everywhere — executor, secrets, resources and the restart
//! stamp — and the `specId` that names it.

use super::agent::Agent;
use fleet_api::{Executor, Resources};
use rustc_hash::FxHashMap as HashMap;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::hash_map::Entry;
use std::fmt;
use std::sync::Arc;

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

/// What a replica runs, apart from its identity and PAT. Its id is computed once, when it is
/// built (`new`, `of`, `restarted`, read back): a pass compares and sends ids of every node's
/// entries, and a SHA-256 of the JSON each time would be most of a rollout pass's desired
/// states. So the fields the id covers are never changed in place; `revision` may be.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "Fields")]
pub struct Template {
    pub executor: Executor,
    pub secrets: Vec<String>,
    pub resources: Resources,
    pub restart: u64,
    /// The revision of the CP item this template was last seen in: a node still on it is sent
    /// that revision, so `observedRevision` shows how far a rollout got. Not part of the id.
    pub revision: u64,
    #[serde(skip)]
    id: SpecId,
}

/// The stored form: the fields without the id, which is computed from them.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Fields {
    executor: Executor,
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default)]
    resources: Resources,
    #[serde(default)]
    restart: u64,
    revision: u64,
}

impl From<Fields> for Template {
    fn from(f: Fields) -> Template {
        Template::new(f.executor, f.secrets, f.resources, f.restart, f.revision)
    }
}

impl Template {
    pub fn new(
        executor: Executor,
        secrets: Vec<String>,
        resources: Resources,
        restart: u64,
        revision: u64,
    ) -> Template {
        let id = id_of(&executor, &secrets, &resources, restart);
        Template { executor, secrets, resources, restart, revision, id }
    }

    /// The same template under the next restart stamp: every container recreated.
    pub fn restarted(&self) -> Template {
        self.with_restart(self.restart + 1)
    }

    /// The agent's template as the CP describes it now, with the restart stamp given.
    pub fn of(a: &Agent, restart: u64) -> Template {
        let mut secrets = a.placed_spec().map(|s| s.secrets.to_strings()).unwrap_or_default();
        secrets.sort();
        secrets.dedup();
        Template::new(a.executor.clone(), secrets, a.resources(), restart, a.revision)
    }

    /// The same containers with another restart stamp.
    pub fn with_restart(&self, restart: u64) -> Template {
        Template::new(self.executor.clone(), self.secrets.clone(), self.resources.clone(), restart, self.revision)
    }

    pub fn id(&self) -> SpecId {
        self.id
    }

    /// Whether the two run the same containers (the revision aside).
    pub fn same(&self, other: &Template) -> bool {
        self.executor == other.executor
            && self.secrets == other.secrets
            && self.resources == other.resources
            && self.restart == other.restart
    }
}

/// Equal templates as one allocation. A change made across the fleet gives thousands of
/// agents the same template at once (one image for every agent of a kind), and each rollout
/// holds its target and the template it replaces: kept apart, 20,000 rollouts would hold
/// 40,000 copies (~6 MB). Equal means equal in every field, the revision too; two templates
/// whose ids collide stay apart.
#[derive(Default)]
pub struct Shared(HashMap<(SpecId, u64), Arc<Template>>);

impl Shared {
    pub fn share(&mut self, t: Template) -> Arc<Template> {
        self.share_arc(Arc::new(t))
    }

    /// The one allocation of a template equal to `t` (for records read back one by one).
    pub fn share_arc(&mut self, t: Arc<Template>) -> Arc<Template> {
        match self.0.entry((t.id(), t.revision)) {
            Entry::Occupied(e) if *e.get() == t => e.get().clone(),
            Entry::Occupied(_) => t,
            Entry::Vacant(v) => v.insert(t).clone(),
        }
    }
}

/// 32 bits of a SHA-256 of what the id covers, never 0.
fn id_of(executor: &Executor, secrets: &[String], resources: &Resources, restart: u64) -> SpecId {
    let mut h = Sha256::new();
    // Serialising plain data cannot fail.
    h.update(serde_json::to_vec(&(executor, secrets, resources, restart)).unwrap_or_default());
    let d = h.finalize();
    SpecId(u32::from_be_bytes([d[0], d[1], d[2], d[3]]).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(image: &str, restart: u64, revision: u64) -> Template {
        let executor = Executor { kind: "k".into(), image: Some(image.into()) };
        Template::new(executor, vec!["gh".into()], Resources { cpus: Some(0.5), memory_mb: None }, restart, revision)
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
        assert_eq!(t("a:1", 0, 1).restarted().id(), t("a:1", 1, 1).id());
        // Read back, the id is computed again from the fields.
        let back: Template = serde_json::from_str(&serde_json::to_string(&t("a:1", 2, 3)).unwrap()).unwrap();
        assert_eq!((back.id(), back), (t("a:1", 2, 3).id(), t("a:1", 2, 3)));
    }

    #[test]
    fn equal_templates_are_shared_and_others_kept_apart() {
        let mut shared = Shared::default();
        let a = shared.share(t("a:1", 0, 2));
        assert!(Arc::ptr_eq(&a, &shared.share(t("a:1", 0, 2))));
        assert!(Arc::ptr_eq(&a, &shared.share_arc(Arc::new(t("a:1", 0, 2)))));
        let other_revision = shared.share(t("a:1", 0, 3));
        assert!(!Arc::ptr_eq(&a, &other_revision));
        assert_eq!(*other_revision, t("a:1", 0, 3));
        assert!(!Arc::ptr_eq(&a, &shared.share(t("a:2", 0, 2))));
        // A template whose id collides with another's is not taken for it.
        let mut colliding = t("a:9", 0, 2);
        colliding.id = a.id();
        let kept = shared.share(colliding.clone());
        assert_eq!(kept.executor.image.as_deref(), Some("a:9"));
        assert!(!Arc::ptr_eq(&a, &shared.share_arc(Arc::new(colliding))));
    }
}
