//! Which writes a mirror round makes (docs/behaviour.md#kubernetes-mirror): the wanted objects
//! against the belief of what the server holds, with no I/O.
//!
//! - unknown to the belief → create it, then write its status (also after a delete by hand);
//! - spec or labels differ → apply them (a change, or a hand edit put back);
//! - status (without `lastSeenAt`) differs → apply it; when the server holds an optional field
//!   the store does not want, or another manager owns part of the status, take it back;
//! - only `lastSeenAt` differs → refresh at most once a minute;
//! - believed but no longer wanted → delete (vanished node or placement);
//! - an object the server refused lately waits for its own backoff.

use super::belief::{Belief, Shown};
use super::desired::Want;
use std::time::{Duration, Instant};

/// `lastSeenAt` alone refreshes a mirror at most this often.
pub const LAST_SEEN_REFRESH: Duration = Duration::from_secs(60);

/// How the status is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusOp {
    Keep,
    /// Apply the wanted status.
    Apply,
    /// Apply it with `null` in the extra optional fields, then without them, then drop the
    /// other managers still listed (`fields`).
    TakeBack,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `idx` is the wanted item's position.
    Write {
        idx: usize,
        create: bool,
        spec: bool,
        status: StatusOp,
    },
    Delete {
        uid: Option<String>,
    },
}

impl Op {
    /// Requests it takes at most, for the rate limit.
    pub fn cost(&self) -> usize {
        match self {
            Op::Delete { .. } => 1,
            Op::Write { create, spec, status, .. } => {
                let status = match status {
                    StatusOp::Keep => 0,
                    StatusOp::Apply => 1,
                    StatusOp::TakeBack => 3,
                };
                usize::from(*create || *spec) + status
            }
        }
    }
}

/// The writes that bring the server to `items`, in the items' order, deletes last.
pub fn plan(b: &mut Belief, items: &[Want], now: Instant) -> Vec<(String, Op)> {
    let mut ops = Vec::new();
    let mut wanted = std::collections::HashSet::with_capacity(items.len());
    let waits = |b: &Belief, name: &str| b.refused.get(name).is_some_and(|(until, _)| now < *until);
    for (idx, w) in items.iter().enumerate() {
        wanted.insert(w.name.as_str());
        if waits(b, &w.name) {
            continue;
        }
        if let Some(op) = write_of(b.shown.get(&w.name), w, idx, now) {
            ops.push((w.name.clone(), op));
        }
    }
    let mut gone: Vec<(String, Op)> = b
        .shown
        .iter()
        .filter(|(k, _)| !wanted.contains(k.as_str()) && !waits(b, k))
        .map(|(k, s)| (k.clone(), Op::Delete { uid: s.uid.clone() }))
        .collect();
    gone.sort_by(|a, b| a.0.cmp(&b.0));
    ops.extend(gone);
    let shown = &b.shown;
    b.refused.retain(|k, _| wanted.contains(k.as_str()) || shown.contains_key(k));
    ops
}

fn write_of(shown: Option<&Shown>, w: &Want, idx: usize, now: Instant) -> Option<Op> {
    let Some(s) = shown else {
        return Some(Op::Write { idx, create: true, spec: false, status: StatusOp::Apply });
    };
    let spec = s.spec != w.spec_hash || !s.labels_ok;
    let status = if s.optional & !w.optional != 0 || !s.foreign.is_empty() {
        StatusOp::TakeBack
    } else if s.status != w.status_hash || (s.last_seen != w.last_seen && now.duration_since(s.at) >= LAST_SEEN_REFRESH)
    {
        StatusOp::Apply
    } else {
        StatusOp::Keep
    };
    (spec || status != StatusOp::Keep).then_some(Op::Write { idx, create: false, spec, status })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn want(name: &str, status: serde_json::Value, optional: u16) -> Want {
        let (status_hash, last_seen) = super::super::desired::status_key(&status);
        Want { name: name.into(), spec: json!({}), status, spec_hash: 1, status_hash, last_seen, optional }
    }

    fn shown(w: &Want, at: Instant) -> Shown {
        Shown {
            uid: Some("u1".into()),
            spec: w.spec_hash,
            labels_ok: true,
            status: w.status_hash,
            last_seen: w.last_seen.clone(),
            optional: w.optional,
            foreign: vec![],
            at,
        }
    }

    /// One row per rule of the module doc.
    #[test]
    fn each_difference_makes_its_write() {
        let now = Instant::now();
        let w = want("a", json!({"status": "online", "lastSeenAt": "t1"}), 0);
        let write = |s: Option<Shown>| write_of(s.as_ref(), &w, 0, now);
        let same = shown(&w, now);
        assert_eq!(write(None), Some(Op::Write { idx: 0, create: true, spec: false, status: StatusOp::Apply }));
        assert_eq!(write(Some(same.clone())), None, "unchanged: nothing");
        let labels = Shown { labels_ok: false, ..same.clone() };
        assert_eq!(write(Some(labels)), Some(Op::Write { idx: 0, create: false, spec: true, status: StatusOp::Keep }));
        let status = Shown { status: 7, ..same.clone() };
        assert_eq!(
            write(Some(status)),
            Some(Op::Write { idx: 0, create: false, spec: false, status: StatusOp::Apply })
        );
        let extra = Shown { optional: 0b100, ..same.clone() };
        let take_back = Some(Op::Write { idx: 0, create: false, spec: false, status: StatusOp::TakeBack });
        assert_eq!(write(Some(extra)), take_back, "an optional field the store does not want");
        let foreign = Shown { foreign: vec![(3, "kubectl-patch".into())], ..same.clone() };
        assert_eq!(write(Some(foreign)), take_back, "another manager owns part of the status");
        let seen_later = Shown { last_seen: Some("t0".into()), ..same.clone() };
        assert_eq!(write(Some(seen_later.clone())), None, "lastSeenAt alone waits for its minute");
        let a_minute_ago = Shown { at: now - LAST_SEEN_REFRESH, ..seen_later };
        assert_eq!(
            write(Some(a_minute_ago)),
            Some(Op::Write { idx: 0, create: false, spec: false, status: StatusOp::Apply })
        );
    }

    #[test]
    fn objects_no_longer_wanted_are_deleted_by_uid_and_refused_ones_wait() {
        let now = Instant::now();
        let a = want("a", json!({}), 0);
        let mut b = Belief::default();
        b.shown.insert("a".into(), shown(&a, now));
        b.shown.insert("old".into(), shown(&a, now));
        b.refused.insert("new".into(), (now + Duration::from_secs(1), Duration::from_secs(1)));
        b.refused.insert("forgotten".into(), (now + Duration::from_secs(1), Duration::from_secs(1)));
        let items = [a.clone(), want("new", json!({}), 0)];
        let ops = plan(&mut b, &items, now);
        assert_eq!(ops, [("old".to_string(), Op::Delete { uid: Some("u1".into()) })]);
        assert!(b.refused.contains_key("new") && !b.refused.contains_key("forgotten"), "only wanted or believed");
    }
}
