//! The work a pass wants now and the queue has no room for yet: PAT keys (and any other key)
//! in a line, in the pass's order, and statuses behind the keys that were wanted before them.
//!
//! A status is wanted again by every pass that sees the agent change, and a fleet coming up
//! changes each agent's status with every PAT and every report. Kept in the line like the
//! other keys, 20,000 agents' statuses wanted again and again would grow the line to ~13 MB
//! at 10,000 nodes, the largest allocation of a cold start. Once the fleet has joined no PAT
//! is wanted any more, and every later want of an agent's status lands at the same place,
//! the end of the line: those copies are all one entry. Here a status is held once per
//! place: (keys of the line to go out before it, agent), a set.
//!
//! The copies at different places are kept, because where a status waits decides when the CP
//! hears that the agent runs (the work item sends what the status says when it runs): a copy
//! wanted while the fleet joined sits behind that agent's PATs of the moment, and is often
//! the first to go out once the agent runs. One entry per agent instead — kept where it was
//! first wanted, where it was last wanted, or behind the agent's own last PAT — slows a
//! fleet's cold convergence by a fifth to a half.

use super::key::WorkKey;
use crate::model::Id;
use std::collections::{BTreeSet, VecDeque};

#[derive(Debug, Default)]
pub struct Backlog {
    /// Keys other than statuses, first in first out.
    line: VecDeque<WorkKey>,
    /// How many keys have left the line since the start: its front's position.
    taken: u64,
    /// (keys of the line to go out before it, agent): a status wanted twice at one place is
    /// one entry.
    statuses: BTreeSet<(u64, Id)>,
}

impl Backlog {
    pub fn push(&mut self, key: WorkKey) {
        match key {
            WorkKey::Status(agent) => {
                self.statuses.insert((self.taken + self.line.len() as u64, agent));
            }
            key => self.line.push_back(key),
        }
    }

    /// Takes up to `room` keys in order: a status goes out once the keys wanted before it have.
    pub fn take(&mut self, room: usize) -> Vec<WorkKey> {
        let mut out = Vec::with_capacity(room.min(self.len()));
        while out.len() < room {
            if self.statuses.first().is_some_and(|(at, _)| *at <= self.taken) {
                let (_, agent) = self.statuses.pop_first().expect("looked at");
                out.push(WorkKey::Status(agent));
                continue;
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

    /// A status goes out behind the keys wanted before it; wanted again at another place it
    /// waits there too, wanted again at the same place it is one entry.
    #[test]
    fn a_status_goes_out_behind_the_keys_wanted_before_it_once_per_place() {
        let mut b = Backlog::default();
        for k in [pat("a1"), status("x"), pat("a2"), status("y"), pat("a3"), status("x"), status("x")] {
            b.push(k);
        }
        assert_eq!(b.len(), 6, "three PATs, y, and x at two places");
        assert_eq!(b.take(2), [pat("a1"), status("x")]);
        b.push(pat("a4"));
        b.push(status("y"));
        assert_eq!(b.take(10), [pat("a2"), status("y"), pat("a3"), status("x"), pat("a4"), status("y")]);
        assert!(b.is_empty() && b.line().next().is_none());
    }

    /// Wanted fifty times each after the last PAT was wanted, 20,000 agents' statuses are
    /// 20,000 entries, behind every PAT.
    #[test]
    fn statuses_wanted_many_times_at_the_end_are_held_once() {
        let mut b = Backlog::default();
        for i in 0..1_000 {
            b.push(pat(&format!("p{i}")));
        }
        for _ in 0..50 {
            for i in 0..20_000 {
                b.push(status(&format!("agent-{i}")));
            }
        }
        assert_eq!(b.len(), 1_000 + 20_000);
        let out = b.take(usize::MAX);
        assert_eq!(out.len(), 21_000);
        assert!(out[..1_000].iter().all(|k| matches!(k, WorkKey::Pat(..))), "the PATs first");
    }
}
