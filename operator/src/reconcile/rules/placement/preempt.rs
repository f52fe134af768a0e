//! Preemption's own bookkeeping and choice (docs/behaviour.md#spread-and-priority): which
//! replicas of a node must go to make room, and what a run has preempted so far. The placer
//! asks when a replica finds no node only for lack of room.
//!
//! Cost: nothing until a replica of a priority above the run's lowest finds no room. Then the
//! replicas bound so far are indexed by node once (two words each), and each attempt looks at
//! the fitting nodes and the replicas on them. A priority that found nothing to take for a
//! signature is remembered, so a full fleet of equals is not searched again per replica.

use super::room::{Need, Room};
use rustc_hash::FxHashMap as HashMap;
use std::cmp::Reverse;

/// At most this many replicas are preempted in one run, so a wrong priority cannot empty the
/// fleet in one step.
pub const MAX_PREEMPTIONS: usize = 100;

/// A replica bound to a node, as preemption weighs it: (demand, replica), its agent's
/// priority and what it takes of the node.
#[derive(Clone, Copy)]
pub struct Bound {
    pub at: (u32, u32),
    pub priority: i32,
    pub need: Need,
    /// It said it is busy (docs/behaviour.md#busy-replicas): taken after the idle ones.
    pub busy: bool,
}

/// What a run has preempted and may still preempt.
pub struct Ledger {
    /// The lowest priority of any demand: a replica at it has nothing below to take from.
    lowest: i32,
    done: usize,
    /// Signature → the highest priority that found nothing to take for it this run.
    none_below: HashMap<usize, i32>,
    /// Node → the replicas bound there (demand, replica); built at the first attempt.
    on_node: Option<Vec<Vec<(u32, u32)>>>,
    /// Node → the lowest priority bound there (`i32::MAX`: none), kept with `on_node`: a
    /// node with nothing below a priority is passed over at a glance.
    lowest_on: Vec<i32>,
}

impl Ledger {
    pub fn new(priorities: impl Iterator<Item = i32>) -> Ledger {
        let lowest = priorities.min().unwrap_or(0);
        Ledger { lowest, done: 0, none_below: HashMap::default(), on_node: None, lowest_on: Vec::new() }
    }

    /// Whether a replica of `priority` and signature `sig` may look for room to take.
    pub fn may_try(&self, sig: usize, priority: i32) -> bool {
        priority > self.lowest && self.done < MAX_PREEMPTIONS && self.none_below.get(&sig).is_none_or(|&p| priority > p)
    }

    /// Nothing to take anywhere for `sig` at `priority`: not asked again this run.
    pub fn found_none(&mut self, sig: usize, priority: i32) {
        self.none_below.insert(sig, priority);
    }

    /// Whether `victims` more fit in the run's limit; when not, the run preempts no more.
    pub fn admit(&mut self, victims: usize) -> bool {
        if self.done + victims > MAX_PREEMPTIONS {
            self.done = MAX_PREEMPTIONS;
            return false;
        }
        self.done += victims;
        true
    }

    pub fn indexed(&self) -> bool {
        self.on_node.is_some()
    }

    /// Indexes the bound replicas by node: `bound` yields (demand, replica, node, priority).
    pub fn index(&mut self, nodes: usize, bound: impl Iterator<Item = (u32, u32, u32, i32)>) {
        let mut on = vec![Vec::new(); nodes];
        self.lowest_on = vec![i32::MAX; nodes];
        for (di, r, ni, priority) in bound {
            on[ni as usize].push((di, r));
            self.lowest_on[ni as usize] = self.lowest_on[ni as usize].min(priority);
        }
        self.on_node = Some(on);
    }

    /// Whether anything below `priority` may be bound to node `ni` (after [`Ledger::index`];
    /// a node that lost replicas may say yes when nothing is left below).
    pub fn below_on(&self, ni: u32, priority: i32) -> bool {
        self.lowest_on.get(ni as usize).is_some_and(|&p| p < priority)
    }

    /// The replicas bound to node `ni` (after [`Ledger::index`]).
    pub fn on(&self, ni: u32) -> &[(u32, u32)] {
        self.on_node.as_ref().map_or(&[], |on| &on[ni as usize])
    }

    /// Keeps the index current once it is built.
    pub fn bound(&mut self, at: (u32, u32), ni: u32, priority: i32) {
        if let Some(on) = self.on_node.as_mut() {
            on[ni as usize].push(at);
            self.lowest_on[ni as usize] = self.lowest_on[ni as usize].min(priority);
        }
    }

    pub fn unbound(&mut self, at: (u32, u32), ni: u32) {
        if let Some(on) = self.on_node.as_mut() {
            on[ni as usize].retain(|&x| x != at);
        }
    }
}

/// How a node's victims compare with another's: fewer, then lower priorities (highest
/// compared first), then fewer busy; the caller breaks ties by node name.
pub type Cost = (usize, Vec<i32>, usize);

/// The fewest of `below` (replicas of lower priority on one node) whose room, given back to
/// `room`, fits `need`: lowest priorities first, idle before busy, then the largest (cpus, then
/// memory), then the newest (last demand, highest index). `None` when even all of them would not do.
///
/// A node with room already costs nothing: room a preemption gave back earlier in the run is
/// taken before anything else goes.
pub fn victims(room: Room, mut below: Vec<Bound>, need: &Need) -> Option<(Cost, Vec<Bound>)> {
    if room.fits(need) {
        return Some(((0, Vec::new(), 0), Vec::new()));
    }
    below.sort_by_key(|b| {
        (b.priority, b.busy, Reverse(b.need.cpus.unwrap_or(0)), Reverse(b.need.mem.unwrap_or(0)), Reverse(b.at))
    });
    let mut room = room;
    let mut taken = Vec::new();
    for b in below {
        if room.fits(need) {
            break;
        }
        room.give(&b.need);
        taken.push(b);
    }
    if taken.is_empty() || !room.fits(need) {
        return None;
    }
    let mut priorities: Vec<i32> = taken.iter().map(|b| b.priority).collect();
    priorities.sort_unstable_by(|a, b| b.cmp(a));
    let busy = taken.iter().filter(|b| b.busy).count();
    Some(((taken.len(), priorities, busy), taken))
}
