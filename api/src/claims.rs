//! What a node may claim (docs/behaviour.md#what-a-node-may-claim): the label patterns and
//! executor kinds a join key, and then the node it made, allows; and the split of what a node
//! claims into what it is taken for (the effective facts placement sees) and what is refused.
//! Both the controller (at every report) and `fleetctl` (before asking) use these rules.

use crate::{names, validate::FieldError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// Most entries in each allowance list.
pub const MAX_ALLOWED: usize = 64;

/// A node's allowance: `None` in a list allows anything of it (a key without it, as before).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Allowance {
    /// Label patterns: `name`, `name=value` or `name=*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_labels: Option<Vec<String>>,
    /// Executor kinds, by exact name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_kinds: Option<Vec<String>>,
}

impl Allowance {
    /// Whether it restricts nothing (a key without allowances).
    pub fn is_open(&self) -> bool {
        self.allowed_labels.is_none() && self.allowed_kinds.is_none()
    }

    /// Each list sorted and deduplicated, so that an equal allowance compares equal.
    pub fn normalised(mut self) -> Allowance {
        for list in [&mut self.allowed_labels, &mut self.allowed_kinds].into_iter().flatten() {
            list.sort();
            list.dedup();
        }
        self
    }

    pub fn label_allowed(&self, label: &str) -> bool {
        self.allowed_labels.as_ref().is_none_or(|ps| ps.iter().any(|p| pattern_admits(p, label)))
    }

    pub fn kind_allowed(&self, kind: &str) -> bool {
        self.allowed_kinds.as_ref().is_none_or(|ks| ks.iter().any(|k| k == kind))
    }

    /// Every bad entry is an error naming it: patterns as labels (or `name=*`), kinds as kinds.
    pub fn validate(&self) -> Result<(), FieldError> {
        let bad = |field: String, message: String| FieldError { field, message };
        if let Some(ps) = &self.allowed_labels {
            if ps.len() > MAX_ALLOWED {
                return Err(bad("allowedLabels".into(), format!("at most {MAX_ALLOWED} patterns")));
            }
            if let Some((i, p)) = ps.iter().enumerate().find(|(_, p)| !is_label_pattern(p)) {
                let rule = "is not a label pattern (name, name=value or name=*)";
                return Err(bad(format!("allowedLabels[{i}]"), format!("{p:?} {rule}")));
            }
        }
        if let Some(ks) = &self.allowed_kinds {
            if ks.len() > MAX_ALLOWED {
                return Err(bad("allowedKinds".into(), format!("at most {MAX_ALLOWED} kinds")));
            }
            if let Some((i, k)) = ks.iter().enumerate().find(|(_, k)| !names::is_executor_kind(k)) {
                return Err(bad(format!("allowedKinds[{i}]"), format!("{k:?} is not an executor kind")));
            }
        }
        Ok(())
    }
}

/// `name`, `name=value` or `name=*`.
pub fn is_label_pattern(p: &str) -> bool {
    match p.strip_suffix("=*") {
        Some(name) => !name.contains('=') && names::is_label(name),
        None => names::is_label(p),
    }
}

/// Whether a pattern admits a label: `name` only the bare label `name`, `name=value` only that
/// label, `name=*` every `name=<value>` (not the bare `name`).
pub fn pattern_admits(pattern: &str, label: &str) -> bool {
    match pattern.strip_suffix("=*") {
        Some(name) => label.strip_prefix(name).is_some_and(|rest| rest.starts_with('=') && rest.len() > 1),
        None => pattern == label,
    }
}

/// The labels and kinds a node claimed and its allowance refused (the node view's
/// `refusedFacts`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RefusedFacts {
    #[serde(default)]
    pub labels: Vec<String>,
    #[serde(default)]
    pub kinds: Vec<String>,
}

impl RefusedFacts {
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.kinds.is_empty()
    }

    /// `labels gpu, ssd; kinds observer`: what an event names.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.labels.is_empty() {
            parts.push(format!("labels {}", self.labels.join(", ")));
        }
        if !self.kinds.is_empty() {
            parts.push(format!("kinds {}", self.kinds.join(", ")));
        }
        parts.join("; ")
    }
}

/// What a node claims of itself, each list sorted: the part an allowance filters. Kept as
/// JSON beside a node's effective facts for the part that was refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Claimed {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<String>,
    /// Image allow-lists by kind.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub images: BTreeMap<String, Vec<String>>,
    /// Secret lists by kind, for kinds that list theirs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, Vec<String>>,
}

impl Claimed {
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.kinds.is_empty() && self.images.is_empty() && self.secrets.is_empty()
    }
}

/// Splits a claim into what the allowance admits and what it refuses: the lists of a refused
/// kind (images, secrets) go with it.
pub fn split(claimed: Claimed, allowance: &Allowance) -> (Claimed, Claimed) {
    let (labels, refused_labels) = claimed.labels.into_iter().partition(|l| allowance.label_allowed(l));
    let (kinds, refused_kinds): (Vec<String>, Vec<String>) =
        claimed.kinds.into_iter().partition(|k| allowance.kind_allowed(k));
    let (images, refused_images) = claimed.images.into_iter().partition(|(k, _)| kinds.contains(k));
    let (secrets, refused_secrets) = claimed.secrets.into_iter().partition(|(k, _)| kinds.contains(k));
    let kept = Claimed { labels, kinds, images, secrets };
    let refused =
        Claimed { labels: refused_labels, kinds: refused_kinds, images: refused_images, secrets: refused_secrets };
    (kept, refused)
}

/// The claim again, from its two parts.
pub fn merge(kept: Claimed, refused: Claimed) -> Claimed {
    let sorted = |mut a: Vec<String>, b: Vec<String>| {
        a.extend(b);
        a.sort();
        a.dedup();
        a
    };
    let mut images = kept.images;
    images.extend(refused.images);
    let mut secrets = kept.secrets;
    secrets.extend(refused.secrets);
    Claimed { labels: sorted(kept.labels, refused.labels), kinds: sorted(kept.kinds, refused.kinds), images, secrets }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn patterns_admit_as_the_docs_say() {
        let cases = [
            ("zone=*", "zone=eu", true),
            ("zone=*", "zone", false),
            ("zone=*", "zones=eu", false),
            ("zone=*", "gpu", false),
            ("gpu", "gpu", true),
            ("gpu", "gpu=a100", false),
            ("gpu=a100", "gpu=a100", true),
            ("gpu=a100", "gpu=h100", false),
        ];
        for (pattern, label, want) in cases {
            assert_eq!(pattern_admits(pattern, label), want, "{pattern} on {label}");
        }
        for (p, ok) in [
            ("zone=*", true),
            ("gpu", true),
            ("gpu=a100", true),
            ("=*", false),
            ("a=b=*", false),
            ("Zone=*", false),
            ("*", false),
        ] {
            assert_eq!(is_label_pattern(p), ok, "{p}");
        }
    }

    #[test]
    fn an_allowance_splits_a_claim_and_merge_gives_it_back() {
        let allowance = Allowance { allowed_labels: Some(strings(&["zone=*"])), allowed_kinds: Some(strings(&["k"])) };
        let claimed = Claimed {
            labels: strings(&["gpu", "zone=eu"]),
            kinds: strings(&["k", "observer"]),
            images: [("observer".to_string(), strings(&["a:1"]))].into(),
            secrets: [("k".to_string(), strings(&["gh"])), ("observer".to_string(), strings(&["mail"]))].into(),
        };
        let (kept, refused) = split(claimed.clone(), &allowance);
        assert_eq!((kept.labels.clone(), kept.kinds.clone()), (strings(&["zone=eu"]), strings(&["k"])));
        assert!(kept.images.is_empty() && kept.secrets.keys().eq(["k"]));
        assert_eq!((refused.labels.clone(), refused.kinds.clone()), (strings(&["gpu"]), strings(&["observer"])));
        assert!(refused.images.keys().eq(["observer"]) && refused.secrets.keys().eq(["observer"]));
        assert_eq!(merge(kept, refused), claimed);
        let (kept, refused) = split(claimed.clone(), &Allowance::default());
        assert_eq!((kept, refused), (claimed, Claimed::default()), "no allowance refuses nothing");
    }

    #[test]
    fn bad_entries_are_named() {
        let a = Allowance { allowed_labels: Some(strings(&["zone=*", "Bad"])), allowed_kinds: None };
        assert_eq!(a.validate().unwrap_err().field, "allowedLabels[1]");
        let a = Allowance { allowed_labels: None, allowed_kinds: Some(strings(&["k", "no kind"])) };
        assert_eq!(a.validate().unwrap_err().field, "allowedKinds[1]");
        let a = Allowance { allowed_labels: Some(vec!["x".into(); MAX_ALLOWED + 1]), allowed_kinds: None };
        assert_eq!(a.validate().unwrap_err().field, "allowedLabels");
        Allowance { allowed_labels: Some(vec![]), allowed_kinds: Some(strings(&["claude-code"])) }.validate().unwrap();
    }

    #[test]
    fn refused_facts_name_what_was_refused() {
        let r = RefusedFacts { labels: strings(&["gpu", "ssd"]), kinds: strings(&["observer"]) };
        assert_eq!(r.describe(), "labels gpu, ssd; kinds observer");
        assert!(RefusedFacts::default().is_empty());
    }
}
