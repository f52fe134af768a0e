//! A node's desired state (docs/behaviour.md#desired-state-and-observed-report) from what the pass knows: the agents bound there, their
//! replica indexes and each pair's sealed credential; and the hash that lets a pass skip
//! serialising a node whose inputs did not change.

use crate::clock;
use crate::model::{Agent, SpecId, Template};
use crate::store::Cred;
use fleet_api::{DesiredAgent, DesiredIdentity, Executor, SealedCredential};
use rustc_hash::{FxHashMap as HashMap, FxHasher as DefaultHasher};
use std::borrow::Cow;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// One agent on one node: the agent, replica indexes of it there, the pair's credential and
/// the template those replicas are sent. The credential and template are handles, so entries
/// taken under the registry's lock outlive it. An agent whose replicas on the node run
/// different templates (a rollout stepping them one at a time) has an entry for each, with
/// its own replicas: the node keeps each replica's container to its own entry.
pub type Entry<'a> = (&'a Agent, Cow<'a, [u32]>, Arc<Cred>, Look);

/// Which template a node is sent for an agent (docs/behaviour.md#rolling-out-a-change).
#[derive(Debug, Clone, PartialEq)]
pub enum Look {
    /// The agent's own, as the CP describes it (no rollout holds it elsewhere): its id.
    Own(SpecId),
    /// The one a rollout hands this node.
    Rolled(Arc<Template>),
}

impl Look {
    pub fn id(&self) -> SpecId {
        match self {
            Look::Own(id) => *id,
            Look::Rolled(t) => t.id(),
        }
    }
}

/// Hash of what a node's desired state is built from: when it is unchanged the body is too,
/// and the pass skips serialising it.
///
/// It is stored with the body, so a new leader skips the bodies whose inputs did not change
/// since another replica built them: `salt` ([`hash_salt`]) holds what else the body is made
/// of — this build's body format and the configured tenant — so a replica that would write a
/// body differently does not take another's hash for its own.
pub fn input_hash(salt: u64, entries: &[Entry], fingerprint: impl Fn(&str) -> Option<u64>) -> u64 {
    let mut h = DefaultHasher::default();
    salt.hash(&mut h);
    for (a, reps, c, look) in entries {
        a.key.hash(&mut h);
        fingerprint(&a.key).hash(&mut h);
        reps.hash(&mut h);
        look.id().hash(&mut h);
        if let Look::Rolled(t) = look {
            t.revision.hash(&mut h);
        }
        // The PAT's id, not its box: the same whether the registry still holds the box.
        c.sealed.id_bytes().hash(&mut h);
    }
    h.finish()
}

/// Raised whenever [`write_agents`] would write a body differently from the same inputs: a
/// stored input hash then no longer matches, and the next leader builds every body again.
/// `the_body_format_is_pinned` fails until it is raised.
pub const BODY_FORMAT: u32 = 1;

/// What a body is made of besides its entries: the format, this version and the tenant.
pub fn hash_salt(tenant: &str) -> u64 {
    let mut h = DefaultHasher::default();
    (BODY_FORMAT, env!("CARGO_PKG_VERSION"), tenant).hash(&mut h);
    h.finish()
}

/// Sealed boxes read back from the database for credentials the registry keeps without
/// theirs: id → ciphertext as stored.
pub type Boxes = HashMap<String, String>;

/// The ids of the entries' credentials whose boxes are in the database only.
pub fn stored_boxes<'e>(entries: &'e [Entry]) -> impl Iterator<Item = String> + 'e {
    entries.iter().filter(|(_, _, c, _)| !c.sealed.has_box()).map(|(_, _, c, _)| c.id().into_owned())
}

/// A credential's sealed box, from the registry or from `boxes`.
fn ciphertext(c: &Cred, boxes: &Boxes) -> Option<String> {
    c.sealed.ciphertext().or_else(|| boxes.get(c.id().as_ref()).cloned())
}

/// The first of the entries' credentials whose box is nowhere (its row is gone).
pub fn missing_box(entries: &[Entry], boxes: &Boxes) -> Option<String> {
    entries
        .iter()
        .find(|(_, _, c, _)| !c.sealed.has_box() && !boxes.contains_key(c.id().as_ref()))
        .map(|(_, _, c, _)| c.id().into_owned())
}

/// Everything of an agent that goes into a desired state.
pub fn agent_fingerprint(a: &Agent) -> u64 {
    let mut h = DefaultHasher::default();
    a.revision.hash(&mut h);
    a.executor.hash(&mut h);
    serde_json::to_string(&a.placement).unwrap_or_default().hash(&mut h);
    a.drain_seconds.hash(&mut h);
    h.finish()
}

fn desired_agent(a: &Agent, reps: &[u32], c: &Cred, look: &Look, tenant: &str, boxes: &Boxes) -> DesiredAgent {
    let identity = DesiredIdentity {
        principal_id: c.principal_id.to_string(),
        tenant_id: tenant.to_string(),
        credential: SealedCredential {
            credential_id: c.id().into_owned(),
            ciphertext: ciphertext(c, boxes).unwrap_or_default(),
            expires_at: clock::rfc3339_ms(c.expires_ms),
        },
    };
    let (revision, executor, secrets, resources, restart) = match look {
        Look::Own(_) => {
            let secrets = a.placed_spec().map(|s| s.secrets.to_strings()).unwrap_or_default();
            (a.revision, a.executor.clone(), secrets, a.resources(), 0)
        }
        Look::Rolled(t) => (t.revision, t.executor.clone(), t.secrets.clone(), t.resources.clone(), t.restart),
    };
    DesiredAgent {
        agent_key: a.key.to_string(),
        revision,
        replica_indexes: reps.to_vec(),
        executor: Executor { kind: executor.kind, image: executor.image },
        secrets,
        resources,
        drain_seconds: a.drain_seconds,
        identity,
        spec_id: Some(look.id().to_string()),
        restart,
    }
}

/// Appends the JSON array of a node's desired agents to `out` (the served body's buffer),
/// serialising each agent straight into it. A credential the registry keeps without its box
/// takes it from `boxes` (the caller checked with [`missing_box`] that it is there).
pub fn write_agents(out: &mut Vec<u8>, entries: &[Entry], tenant: &str, boxes: &Boxes) {
    let start = out.len();
    // Serialising plain structs into memory cannot fail; were it ever to, the node is sent
    // no agents rather than half an array.
    if serde_json::to_writer(&mut *out, &Agents(entries, tenant, boxes)).is_err() {
        out.truncate(start);
        out.extend_from_slice(b"[]");
    }
}

/// The JSON array of a node's desired agents (what [`write_agents`] appends).
pub fn desired_json(entries: &[Entry], tenant: &str, boxes: &Boxes) -> Vec<u8> {
    let mut out = Vec::new();
    write_agents(&mut out, entries, tenant, boxes);
    out
}

/// A node's entries as the JSON array of its desired agents, without collecting them first.
struct Agents<'a, 'b>(&'a [Entry<'b>], &'a str, &'a Boxes);

impl serde::Serialize for Agents<'_, '_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|(a, reps, c, look)| desired_agent(a, reps, c, look, self.1, self.2)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::records::cred::MaybeMs;
    use crate::store::records::sealed::Sealed;
    use serde_json::json;

    fn agent() -> Agent {
        serde_json::from_value(json!({"key": "coder", "revision": 3, "state": "running",
            "identity": {"kind": "agent"}, "executor": {"kind": "k", "image": "img:1"}, "drainSeconds": 7}))
        .unwrap()
    }

    fn cred() -> Arc<Cred> {
        Arc::new(Cred {
            sealed: Sealed::raw("pat-1", b"box"),
            n: 1,
            principal_id: "principal-1".into(),
            expires_ms: 1_800_000_000_000,
            issued_ms: 1_700_000_000_000,
            revoke_ms: MaybeMs::NONE,
        })
    }

    /// A stored input hash stands for the body another replica built: a change to how bodies
    /// are written must raise [`BODY_FORMAT`], or a new leader keeps the old bodies.
    #[test]
    fn the_body_format_is_pinned() {
        let a = agent();
        let look = Look::Own(Template::of(&a, 0).id());
        let entries: Vec<Entry> = vec![(&a, Cow::Borrowed(&[0, 2]), cred(), look)];
        let body = String::from_utf8(desired_json(&entries, "tenant-1", &Boxes::default())).unwrap();
        let pinned = r#"[{"agentKey":"coder","revision":3,"replicaIndexes":[0,2],"executor":{"kind":"k","image":"img:1"},"secrets":[],"resources":{"cpus":null,"memoryMb":null},"drainSeconds":7,"identity":{"principalId":"principal-1","tenantId":"tenant-1","credential":{"credentialId":"pat-1","ciphertext":"Ym94","expiresAt":"2027-01-15T08:00:00Z"}},"specId":"8976bc58"}]"#;
        assert_eq!(body, pinned, "the body changed: raise BODY_FORMAT (now {BODY_FORMAT}) and pin the new one here");
    }

    #[test]
    fn the_input_hash_holds_the_tenant_and_the_format() {
        let a = agent();
        let look = Look::Own(Template::of(&a, 0).id());
        let entries: Vec<Entry> = vec![(&a, Cow::Borrowed(&[0]), cred(), look)];
        let h = |salt| input_hash(salt, &entries, |_| Some(1));
        assert_eq!(h(hash_salt("tenant-1")), h(hash_salt("tenant-1")));
        assert_ne!(h(hash_salt("tenant-1")), h(hash_salt("tenant-2")));
    }
}
