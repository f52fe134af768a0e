//! What the mirror believes the API server holds, object by object (docs/behaviour.md#kubernetes-mirror), learnt only
//! from the server: the objects its writes' answers return and its watches' events. What it
//! sent never counts — an apply the server merged with another manager's fields answers with
//! those fields, and the belief keeps them, so the next round takes them back.
//!
//! Each object is kept as a few hashes and flags, not as JSON: at 10,000 nodes the belief is
//! a few MiB.

use super::desired::{hash_json, status_key};
use super::fields::{foreign_status_managers, labels_ok};
use super::kind::Kind;
use kube::api::DynamicObject;
use rustc_hash::FxHashMap;
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// What the server shows of one object.
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    pub uid: Option<String>,
    /// Hash of the canonical spec.
    pub spec: u64,
    /// Both of this fleet's labels are on it.
    pub labels_ok: bool,
    /// Hash of the canonical status without `lastSeenAt`; 0 for none.
    pub status: u64,
    pub last_seen: Option<String>,
    /// Which optional status fields the server holds (bits of [`Kind::optional_status_fields`]).
    pub optional: u16,
    /// Other field managers owning part of the status, with their position in `managedFields`.
    pub foreign: Vec<(usize, String)>,
    /// When the status was last written (or first seen): paces `lastSeenAt` refreshes.
    pub at: Instant,
}

impl Shown {
    /// The belief of an object the server returned or a watch showed; `at` as given.
    pub fn of(kind: Kind, obj: &DynamicObject, fleet_id: &str, manager: &str, at: Instant) -> Shown {
        let (spec, status) = kind.canonical(obj);
        let (status_hash, last_seen) = if status.is_null() { (0, None) } else { status_key(&status) };
        Shown {
            uid: obj.metadata.uid.clone(),
            spec: hash_json(&spec),
            labels_ok: labels_ok(obj, fleet_id),
            status: status_hash,
            last_seen,
            optional: kind.optional_mask(obj.data.get("status")),
            foreign: foreign_status_managers(obj, manager),
            at,
        }
    }
}

/// A watch event, reduced to what the mirror needs.
#[derive(Debug, Clone)]
pub enum Seen {
    /// The object exists with this content (added, modified, or listed).
    Applied(Box<DynamicObject>),
    Deleted(String),
    /// A relist begins; objects not listed before `RelistDone` are gone.
    Relist,
    RelistDone,
}

/// The belief about one kind's objects, and the objects the server refused lately.
#[derive(Default)]
pub struct Belief {
    pub shown: FxHashMap<String, Shown>,
    relisted: Option<HashSet<String>>,
    /// Objects the API server refused: not asked again before the instant, then with the
    /// delay doubled. Only wanted or believed objects keep an entry.
    pub refused: FxHashMap<String, (Instant, Duration)>,
}

impl Belief {
    /// Learns an object the server returned (the answer to a write): `written_status` when
    /// the write was the status's, which restarts the `lastSeenAt` pacing.
    pub fn learn(&mut self, kind: Kind, obj: &DynamicObject, ids: (&str, &str), written_status: bool) {
        let Some(name) = obj.metadata.name.clone() else { return };
        let now = Instant::now();
        let at = match self.shown.get(&name) {
            Some(old) if !written_status => old.at,
            _ => now,
        };
        self.shown.insert(name, Shown::of(kind, obj, ids.0, ids.1, at));
    }

    /// Feeds a watch event in. An object whose content differs from the belief (a hand edit)
    /// replaces it, so the next sync puts the wanted content back; a delete forgets it, so the
    /// next sync recreates it. `ids` is this fleet's id and field manager.
    pub fn seen(&mut self, kind: Kind, event: Seen, ids: (&str, &str)) {
        match event {
            Seen::Applied(obj) => {
                if let (Some(r), Some(name)) = (self.relisted.as_mut(), obj.metadata.name.as_ref()) {
                    r.insert(name.clone());
                }
                self.learn(kind, &obj, ids, false);
            }
            Seen::Deleted(name) => {
                self.shown.remove(&name);
            }
            Seen::Relist => self.relisted = Some(Default::default()),
            Seen::RelistDone => {
                if let Some(r) = self.relisted.take() {
                    self.shown.retain(|k, _| r.contains(k));
                }
            }
        }
    }

    /// Forgets everything (this replica stopped leading: another one mirrors now).
    pub fn clear(&mut self) {
        *self = Belief::default();
    }
}
