//! What the registry keeps of identities and PATs: an agent's IAM principal, an (agent, node)
//! pair's PAT counter and live credential, and a credential with its sealed box. Sizes
//! matter here: a fleet of 10,000 nodes holds 100,000 live PATs.

use super::sealed::Sealed;
use crate::model::Id;
use std::sync::Arc;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityRec {
    /// Shared with every credential of the agent (one string, not one per PAT).
    pub principal_id: Id,
    /// The CP has accepted `PUT …/identity`.
    pub bound: bool,
}

/// What the registry keeps of an (agent, node) pair: one record, one table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PairRec {
    /// The n of the pair's next PAT (docs/behaviour.md#iam-calls). A stored row's `pending_n` (left by a version
    /// that kept the n in flight) is this n until the PAT it keyed is stored.
    pub next_n: u64,
    /// The pair's live credential, held here rather than in a map by id: a PAT is found by
    /// its pair far more often than by its id, and only a retiring one is ever looked up by id.
    pub live: Option<Arc<Cred>>,
}

/// An instant in ms that may be unset, in 8 bytes (`Option<i64>` takes 16): with it a
/// credential fits jemalloc's 128-byte class instead of the 160-byte one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaybeMs(i64);

impl MaybeMs {
    pub const NONE: MaybeMs = MaybeMs(i64::MIN);

    pub fn get(self) -> Option<i64> {
        (self != Self::NONE).then_some(self.0)
    }
}

impl From<Option<i64>> for MaybeMs {
    fn from(v: Option<i64>) -> MaybeMs {
        // i64::MIN is no instant a clock gives.
        v.map_or(Self::NONE, MaybeMs)
    }
}

/// A PAT as the registry keeps it. Its (agent, node) pair is where it is kept — the pair
/// table for the live one, [`RetiringCred`] for one waiting for its revocation — not in the
/// record: 100,000 live PATs at 10,000 nodes, 32 bytes each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cred {
    /// The PAT's id and sealed box ([`Cred::id`]).
    pub sealed: Sealed,
    pub n: u64,
    pub principal_id: Id,
    pub expires_ms: i64,
    pub issued_ms: i64,
    /// Set once the credential is no longer wanted: revoke at this instant.
    pub revoke_ms: MaybeMs,
}

impl Cred {
    /// The PAT's id (IAM's credential id).
    pub fn id(&self) -> std::borrow::Cow<'_, str> {
        self.sealed.id()
    }

    /// The same PAT with its sealed box left to the database (see [`Sealed::id_only`]).
    pub fn without_box(&self) -> Cred {
        Cred { sealed: self.sealed.id_only(), principal_id: self.principal_id.clone(), ..*self }
    }
}

/// A credential no longer live, waiting for its revocation, with its (agent, node) pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetiringCred {
    pub pair: (Id, Id),
    pub cred: Arc<Cred>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_fits_in_80_bytes() {
        // With its Arc's two counters, in jemalloc's 80-byte class.
        assert!(std::mem::size_of::<Cred>() + 16 <= 80, "Cred is {} bytes", std::mem::size_of::<Cred>());
    }

    #[test]
    fn an_unset_instant_reads_back_as_none() {
        assert_eq!(MaybeMs::from(None).get(), None);
        assert_eq!(MaybeMs::from(Some(5)).get(), Some(5));
        assert_eq!(std::mem::size_of::<MaybeMs>(), 8);
    }
}
