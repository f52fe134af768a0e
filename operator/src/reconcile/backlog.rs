//! The work a pass wants now and the queue has no room for yet, in the pass's order: PAT keys
//! (and any other key) in a line, and each agent's status once, behind the keys that were
//! wanted before it.
//!
//! A status is wanted again by every pass that sees the agent change, and a fleet coming up
//! changes each agent's status with every PAT and every report: kept in the line like the
//! other keys, 20,000 agents' statuses were wanted again and again behind 100,000 PATs, and
//! the line grew to 12.8 MB at 10,000 nodes — the largest allocation of a cold start
//! (heaptrack, docs/performance.md, session 16). Here an agent's status waiting to go out is
//! one entry where it was first wanted: the work item sends what the status says when it
//! runs, so a later want adds nothing until it has gone out. (Moved back to its latest want
//! instead, every status waited for the whole fleet's PATs, and cold convergence took 11 s
//! longer.)

use super::work::WorkKey;
use crate::model::Id;
use rustc_hash::FxHashMap as HashMap;
use std::collections::{BTreeSet, VecDeque};

#[derive(Debug, Default)]
pub struct Backlog {
    /// Keys other than statuses, first in first out.
    line: VecDeque<WorkKey>,
    /// How many keys have left the line since the start: its front's position.
    taken: u64,
    /// (keys of the line to go out before it, agent): each agent's status once.
    statuses: BTreeSet<(u64, Id)>,
    /// The agents in `statuses`, with their position there.
    status_at: HashMap<Id, u64>,
}

impl Backlog {
    pub fn push(&mut self, key: WorkKey) {
        match key {
            WorkKey::Status(agent) => {
                if self.status_at.contains_key(&agent) {
                    return;
                }
                let at = self.taken + self.line.len() as u64;
                self.status_at.insert(agent.clone(), at);
                self.statuses.insert((at, agent));
            }
            key => self.line.push_back(key),
        }
    }

    /// Takes up to `room` keys in order: a status goes out once the keys wanted before it have.
    pub fn take(&mut self, room: usize) -> Vec<WorkKey> {
        let mut out = Vec::with_capacity(room.min(self.len()));
        while out.len() < room {
            if let Some((at, _)) = self.statuses.first() {
                if *at <= self.taken {
                    let (_, agent) = self.statuses.pop_first().expect("looked at");
                    self.status_at.remove(&agent);
                    out.push(WorkKey::Status(agent));
                    continue;
                }
            }
            let Some(key) = self.line.pop_front() else { break };
            self.taken += 1;
            out.push(key);
        }
        // A fleet's backlog is let go once it is fed.
        let len = self.line.len();
        if self.line.capacity() > 256 && self.line.capacity() > 4 * len {
            self.line.shrink_to(len * 2);
        }
        if self.status_at.is_empty() && self.status_at.capacity() > 256 {
            self.status_at.shrink_to_fit();
        }
        out
    }

    pub fn len(&self) -> usize {
        self.line.len() + self.statuses.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The keys of the line (not the statuses).
    pub fn line(&self) -> impl Iterator<Item = &WorkKey> {
        self.line.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pat(a: &str) -> WorkKey {
        WorkKey::Pat(a.into(), "n".into())
    }

    fn status(a: &str) -> WorkKey {
        WorkKey::Status(a.into())
    }

    /// A status goes out behind the keys wanted before it, once however often it is wanted
    /// while it waits; wanted after it went out, it waits again.
    #[test]
    fn a_status_goes_out_once_behind_the_keys_wanted_before_it() {
        let mut b = Backlog::default();
        for k in [pat("a1"), status("x"), pat("a2"), status("y"), pat("a3"), status("x"), status("x")] {
            b.push(k);
        }
        assert_eq!(b.len(), 5, "three PATs and two statuses");
        assert_eq!(b.take(2), [pat("a1"), status("x")], "x where it was first wanted");
        b.push(pat("a4"));
        b.push(status("x"));
        assert_eq!(b.take(10), [pat("a2"), status("y"), pat("a3"), pat("a4"), status("x")]);
        assert!(b.is_empty());
        // Positions keep counting across takes.
        b.push(pat("b1"));
        b.push(status("z"));
        assert_eq!(b.take(1), [pat("b1")]);
        assert_eq!(b.take(1), [status("z")]);
        assert!(b.is_empty() && b.line().next().is_none());
    }

    /// 20,000 agents wanted fifty times each behind 1,000 PATs hold 20,000 entries.
    #[test]
    fn statuses_wanted_many_times_are_held_once() {
        let mut b = Backlog::default();
        for round in 0..50 {
            for i in 0..20 {
                b.push(pat(&format!("p{round}-{i}")));
            }
            for i in 0..20_000 {
                b.push(status(&format!("agent-{i}")));
            }
        }
        assert_eq!(b.len(), 1_000 + 20_000);
        let out = b.take(usize::MAX);
        assert_eq!(out.len(), 21_000);
        assert!(out[..20].iter().all(|k| matches!(k, WorkKey::Pat(..))), "the first round's PATs");
        assert!(out[20..20_020].iter().all(|k| matches!(k, WorkKey::Status(..))), "then every status, once");
    }
}
