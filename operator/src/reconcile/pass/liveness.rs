//! Node liveness (docs/behaviour.md#node-liveness): which nodes crossed their offline threshold, or came back,
//! since the last pass. Liveness is time, not an event, so the pass asks every time.
//!
//! No online node can go offline before the earliest deadline the last whole scan found (last
//! seen only grows), so the whole fleet is scanned only once that instant has come; in
//! between, only the nodes that reported after being offline, changed their report period
//! or joined are looked at.

use super::memo::Memo;
use crate::model::Id;
use crate::reconcile::rules::placement::NodeFacts;
use crate::store::{Changes, State};
use std::time::Duration;

/// Updates each looked-at node's online state in the memo and returns the nodes whose state
/// flipped. A node going offline is logged with the age of its last report.
pub fn check(st: &State, memo: &mut Memo, changes: &Changes, full: bool, now: i64, offline_after: Duration) -> Vec<Id> {
    let mut flips = Vec::new();
    let mut check = |f: &mut NodeFacts, next: &mut i64| {
        let Some(n) = st.node(&f.id) else { return };
        let online = n.online(now, offline_after);
        if online != f.online {
            f.online = online;
            if !online {
                let age = age_text(now - n.last_seen_ms);
                tracing::warn!(node = %n.name, "node {} is offline (last report {age} ago)", n.name);
            }
            flips.push(f.id.clone());
        }
        if online {
            *next = (*next).min(n.last_seen_ms + n.threshold(offline_after).as_millis() as i64 + 1);
        }
    };
    if full || now >= memo.next_check {
        let mut next = i64::MAX;
        for f in memo.facts.iter_mut() {
            check(f, &mut next);
        }
        memo.next_check = next;
    } else {
        let mut next = memo.next_check;
        for id in changes.seen.iter().chain(changes.facts.iter()) {
            if let Some(&i) = memo.fact_at.get(id) {
                check(&mut memo.facts[i], &mut next);
            }
        }
        memo.next_check = next;
    }
    flips
}

/// A duration as an admin reads it in a log line: `45s`, `12m`, `3h`.
pub fn age_text(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        _ => format!("{}h", s / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_in_the_unit_that_fits() {
        assert_eq!(age_text(61_500), "61s");
        assert_eq!(age_text(720_000), "12m");
        assert_eq!(age_text(3 * 3_600_000 + 5), "3h");
        assert_eq!(age_text(-5), "0s");
    }
}
