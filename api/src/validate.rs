//! Validation of what a node announces (join body and observed report). Every problem names
//! the field, so `400 invalid_request` tells the operator exactly what to fix.

use crate::{images, names, Capacity, JoinRequest, ObservedReport};
use std::collections::BTreeMap;

/// A bad field with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for FieldError {}

fn bad(field: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError { field: field.into(), message: message.into() }
}

pub const MAX_SLOTS: u32 = 100;
pub const MIN_MEMORY_MB: u64 = 64;
/// Bounds on list lengths a node may announce: enough for any real machine, small enough
/// that a hostile body cannot make the registry grow without bound.
pub const MAX_LABELS: usize = 64;
pub const MAX_KINDS: usize = 64;
pub const MAX_SECRETS: usize = 1024;
pub const MAX_REPLICAS_REPORTED: usize = 1000;
pub const MAX_MESSAGE: usize = 4096;

pub fn capacity(c: &Capacity, field: &str) -> Result<(), FieldError> {
    if c.slots > MAX_SLOTS {
        return Err(bad(format!("{field}.slots"), format!("must be 0–{MAX_SLOTS}, got {}", c.slots)));
    }
    if let Some(cpus) = c.cpus {
        if !(cpus.is_finite() && cpus > 0.0 && cpus <= 4096.0) {
            return Err(bad(format!("{field}.cpus"), format!("must be a positive number, got {cpus}")));
        }
    }
    if let Some(m) = c.memory_mb {
        if m < MIN_MEMORY_MB {
            return Err(bad(format!("{field}.memoryMb"), format!("must be at least {MIN_MEMORY_MB}, got {m}")));
        }
    }
    Ok(())
}

pub fn labels(labels: &[String], field: &str) -> Result<(), FieldError> {
    if labels.len() > MAX_LABELS {
        return Err(bad(field, format!("at most {MAX_LABELS} labels")));
    }
    for (i, l) in labels.iter().enumerate() {
        if !names::is_label(l) {
            return Err(bad(format!("{field}[{i}]"), format!("{l:?} is not a label (name or name=value)")));
        }
    }
    Ok(())
}

pub fn secrets(secrets: &[String], field: &str) -> Result<(), FieldError> {
    if secrets.len() > MAX_SECRETS {
        return Err(bad(field, format!("at most {MAX_SECRETS} secrets")));
    }
    for (i, s) in secrets.iter().enumerate() {
        if !names::is_secret_name(s) {
            return Err(bad(format!("{field}[{i}]"), format!("{s:?} is not a secret name")));
        }
    }
    Ok(())
}

pub fn kinds_and_images(kinds: &[String], images_by_kind: &BTreeMap<String, Vec<String>>) -> Result<(), FieldError> {
    if kinds.len() > MAX_KINDS {
        return Err(bad("executorKinds", format!("at most {MAX_KINDS} kinds")));
    }
    for (i, k) in kinds.iter().enumerate() {
        if !names::is_executor_kind(k) {
            return Err(bad(format!("executorKinds[{i}]"), format!("{k:?} is not an executor kind")));
        }
    }
    for (kind, list) in images_by_kind {
        let field = format!("executorImages.{kind}");
        if !kinds.contains(kind) {
            return Err(bad(field, "names a kind not in executorKinds"));
        }
        if list.len() > images::MAX_ENTRIES {
            return Err(bad(field, format!("at most {} entries", images::MAX_ENTRIES)));
        }
        if let Err(errs) = images::AllowList::parse(list) {
            return Err(bad(field, errs[0].to_string()));
        }
    }
    Ok(())
}

/// Per-kind secret lists (docs/behaviour.md#secrets): of announced kinds, each entry a secret
/// name, at most [`MAX_SECRETS`] a kind.
pub fn secrets_by_kind(kinds: &[String], by_kind: &BTreeMap<String, Vec<String>>) -> Result<(), FieldError> {
    if by_kind.len() > MAX_KINDS {
        return Err(bad("executorSecrets", format!("at most {MAX_KINDS} kinds")));
    }
    for (kind, list) in by_kind {
        let field = format!("executorSecrets.{kind}");
        if !kinds.contains(kind) {
            return Err(bad(field, "names a kind not in executorKinds"));
        }
        secrets(list, &field)?;
    }
    Ok(())
}

pub fn join(r: &JoinRequest) -> Result<(), FieldError> {
    if !names::is_node_name(&r.name) {
        return Err(bad("name", "must match ^[a-z0-9][a-z0-9.-]*$ and be at most 100 characters"));
    }
    match crate::seal::decode_public_key(&r.public_key) {
        None => return Err(bad("publicKey", "must be a base64 X25519 public key (32 bytes)")),
        Some(k) if crate::seal::is_small_order(&k) => {
            return Err(bad("publicKey", "is a point of small order, which anyone could open boxes sealed to"))
        }
        Some(_) => {}
    }
    if r.version.len() > 64 {
        return Err(bad("version", "at most 64 characters"));
    }
    labels(&r.labels, "labels")?;
    kinds_and_images(&r.executor_kinds, &r.executor_images)?;
    capacity(&r.capacity, "capacity")?;
    secrets(&r.secrets, "secrets")?;
    secrets_by_kind(&r.executor_kinds, &r.executor_secrets)
}

pub fn observed(r: &ObservedReport) -> Result<(), FieldError> {
    labels(&r.labels, "labels")?;
    kinds_and_images(&r.executor_kinds, &r.executor_images)?;
    capacity(&r.capacity, "capacity")?;
    secrets(&r.secrets, "secrets")?;
    secrets_by_kind(&r.executor_kinds, &r.executor_secrets)?;
    if r.version.len() > 64 {
        return Err(bad("version", "at most 64 characters"));
    }
    if let Some(b) = &r.boot_id {
        if b.is_empty() || b.len() > 64 {
            return Err(bad("bootId", "1–64 characters"));
        }
    }
    if let Some(s) = r.observe_seconds {
        if !(5..=300).contains(&s) {
            return Err(bad("observeSeconds", format!("must be 5–300, got {s}")));
        }
    }
    if r.replicas.len() > MAX_REPLICAS_REPORTED {
        return Err(bad("replicas", format!("at most {MAX_REPLICAS_REPORTED} replicas")));
    }
    for (i, rep) in r.replicas.iter().enumerate() {
        if !names::is_agent_key(&rep.agent_key) {
            return Err(bad(format!("replicas[{i}].agentKey"), "not an agent key"));
        }
        if rep.state == crate::ReplicaState::Pending {
            return Err(bad(format!("replicas[{i}].state"), "pending is not a state a node reports"));
        }
        if rep.message.as_ref().is_some_and(|m| m.len() > MAX_MESSAGE) {
            return Err(bad(format!("replicas[{i}].message"), format!("at most {MAX_MESSAGE} bytes")));
        }
        if rep.spec_id.as_ref().is_some_and(|s| !is_spec_id(s)) {
            return Err(bad(format!("replicas[{i}].specId"), "at most 64 characters of a-z, 0-9 and -"));
        }
    }
    Ok(())
}

/// A template's name as the controller makes them (docs/behaviour.md#rolling-out-a-change).
pub fn is_spec_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Health;

    fn report() -> ObservedReport {
        ObservedReport {
            applied_generation: 0,
            health: Health::Ok,
            labels: vec!["repos".into()],
            executor_kinds: vec!["claude-code".into()],
            executor_images: BTreeMap::new(),
            capacity: Capacity { slots: 4, cpus: Some(8.0), memory_mb: Some(16384) },
            secrets: vec!["github-token".into()],
            executor_secrets: BTreeMap::new(),
            replicas: vec![],
            version: "0.1.0".into(),
            boot_id: None,
            seq: None,
            observe_seconds: Some(20),
            maintenance_windows: Vec::new(),
        }
    }

    #[test]
    fn good_report_passes() {
        observed(&report()).unwrap();
    }

    type Mutation = Box<dyn Fn(&mut ObservedReport)>;

    #[test]
    fn each_bad_field_is_named() {
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|r| r.capacity.slots = 101), "capacity.slots"),
            (Box::new(|r| r.capacity.memory_mb = Some(63)), "capacity.memoryMb"),
            (Box::new(|r| r.capacity.cpus = Some(-1.0)), "capacity.cpus"),
            (Box::new(|r| r.labels = vec!["Bad".into()]), "labels[0]"),
            (Box::new(|r| r.secrets = vec!["agent-pat".into()]), "secrets[0]"),
            (Box::new(|r| r.executor_kinds = vec!["Bad Kind".into()]), "executorKinds[0]"),
            (
                Box::new(|r| {
                    r.executor_images.insert("claude-code".into(), vec!["a*:1".into()]);
                }),
                "executorImages.claude-code",
            ),
            (
                Box::new(|r| {
                    r.executor_images.insert("other".into(), vec!["a:1".into()]);
                }),
                "executorImages.other",
            ),
            (Box::new(|r| r.observe_seconds = Some(4)), "observeSeconds"),
            (
                Box::new(|r| {
                    r.executor_secrets.insert("other".into(), vec!["gh".into()]);
                }),
                "executorSecrets.other",
            ),
            (
                Box::new(|r| {
                    r.executor_secrets.insert("claude-code".into(), vec!["agent-pat".into()]);
                }),
                "executorSecrets.claude-code[0]",
            ),
            // docs/behaviour.md#hardening: labels at most 127 characters, allow-list entries at most 512.
            (Box::new(|r| r.labels = vec!["a".repeat(128)]), "labels[0]"),
            (
                Box::new(|r| {
                    r.executor_images.insert("claude-code".into(), vec![format!("reg/{}:*", "a".repeat(510))]);
                }),
                "executorImages.claude-code",
            ),
        ];
        for (mutate, field) in cases {
            let mut r = report();
            mutate(&mut r);
            assert_eq!(observed(&r).unwrap_err().field, field);
        }
    }

    #[test]
    fn a_join_with_a_small_order_key_is_refused() {
        use base64::Engine;
        let b64 = |k: [u8; 32]| base64::engine::general_purpose::STANDARD.encode(k);
        let mut r = JoinRequest {
            join_key: "fjk_x".into(),
            name: "n1".into(),
            public_key: b64([0u8; 32]),
            labels: vec![],
            executor_kinds: vec!["k".into()],
            executor_images: BTreeMap::new(),
            capacity: Capacity { slots: 1, cpus: None, memory_mb: None },
            secrets: vec![],
            executor_secrets: BTreeMap::new(),
            version: "0.1.0".into(),
            maintenance_windows: Vec::new(),
        };
        let e = join(&r).unwrap_err();
        assert_eq!(e.field, "publicKey");
        assert!(e.message.contains("small order"), "{e}");
        r.public_key = b64(crate::seal::generate_keypair().1);
        join(&r).unwrap();
    }

    #[test]
    fn capacity_edges() {
        capacity(&Capacity { slots: 0, cpus: None, memory_mb: None }, "c").unwrap();
        capacity(&Capacity { slots: 100, cpus: None, memory_mb: Some(64) }, "c").unwrap();
    }
}
