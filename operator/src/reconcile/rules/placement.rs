//! Placement (docs/behaviour.md#placement) as a pure function: `(demands, nodes, previous bindings) → outcome`.
//!
//! Cost matters at 10,000 nodes × 100,000 replicas. Agents with the same requirements
//! (kind, image, labels, secrets, resources) share a *signature*; each signature's static
//! candidate set is filtered once, and new replicas pick "most free slots, ties by name" from
//! a lazy max-heap per signature. Free capacity only falls while new replicas are placed, so
//! a heap entry is an upper bound of its node's real free slots: pop, and if the entry is
//! stale push it back with the true value. Sticky replicas are checked one by one, in order.

use crate::model::Id;
use fleet_api::{codes, images::AllowList, labels, Capacity};
use rustc_hash::FxHashMap as HashMap;
use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;

/// What placement needs to know about one node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeFacts {
    pub id: Arc<str>,
    pub name: Arc<str>,
    pub online: bool,
    /// Not cordoned or draining (docs/behaviour.md#node-lifecycle): new replicas may come here.
    pub schedulable: bool,
    /// `Some(force)` while draining: its replicas move off.
    pub draining: Option<bool>,
    pub kinds: Vec<String>,
    pub images: BTreeMap<String, AllowList>,
    pub labels: Vec<String>,
    /// Sorted, for binary search.
    pub secrets: Vec<String>,
    /// The secrets offered to each kind that lists its own (sorted); other kinds are offered
    /// `secrets` (docs/behaviour.md#secrets).
    pub kind_secrets: BTreeMap<String, Vec<String>>,
    pub capacity: Capacity,
}

impl NodeFacts {
    /// Its replicas leave by a drain the agents' budgets pace: draining without force, and
    /// online (a replica on an offline node is unavailable already).
    pub fn drain_paced(&self) -> bool {
        self.draining == Some(false) && self.online
    }
}

/// One placed agent's demand. Its requirements borrow the agent's, and [`place`] takes the
/// demands one by one, keeping of each only its key, replica count and signature: one for
/// every agent, kept for the run, would be ~3 MB at 20,000 agents (152 bytes each), at the
/// controller's peak.
#[derive(Debug, Clone, PartialEq)]
pub struct Demand<'a> {
    pub key: Arc<str>,
    pub replicas: u32,
    pub kind: Cow<'a, str>,
    pub image: Option<Cow<'a, str>>,
    pub requires: Cow<'a, [Id]>,
    pub secrets: Cow<'a, [Id]>,
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
    /// The label whose values the replicas spread over (docs/behaviour.md#spread-and-priority).
    pub spread: Option<Cow<'a, str>>,
    /// Placement order, highest first; a replica short only of room may take the room of
    /// strictly lower ones (docs/behaviour.md#spread-and-priority).
    pub priority: i32,
}

/// A view of a demand borrowing its requirements, so a list of demands can be placed without
/// giving them up (`place(&demands, …)`).
impl<'a, 'b> From<&'a Demand<'b>> for Demand<'a> {
    fn from(d: &'a Demand<'b>) -> Demand<'a> {
        Demand {
            key: d.key.clone(),
            replicas: d.replicas,
            kind: Cow::Borrowed(&d.kind),
            image: d.image.as_deref().map(Cow::Borrowed),
            requires: Cow::Borrowed(&d.requires),
            secrets: Cow::Borrowed(&d.secrets),
            cpus: d.cpus,
            memory_mb: d.memory_mb,
            spread: d.spread.as_deref().map(Cow::Borrowed),
            priority: d.priority,
        }
    }
}

pub use crate::store::kept::{Bindings, Free, Outcome, Preemption, ReplicaKey};

pub use preempt::MAX_PREEMPTIONS;
use preempt::{Bound, Ledger};
use room::{Need, Room};

/// What placement starts from: last run's bindings, and the replicas that were preempted and
/// still wait (so they keep waiting as `preempted`).
#[derive(Clone, Copy)]
pub struct Before<'a> {
    pub bindings: &'a Bindings,
    pub preempted: Option<&'a BTreeSet<ReplicaKey>>,
}

impl<'a> From<&'a Bindings> for Before<'a> {
    fn from(bindings: &'a Bindings) -> Self {
        Before { bindings, preempted: None }
    }
}

impl<'a> From<&'a Outcome> for Before<'a> {
    fn from(o: &'a Outcome) -> Self {
        Before { bindings: &o.bindings, preempted: Some(&o.preempted) }
    }
}

/// Cpus as thousandths, the unit placement compares in.
pub(crate) fn milli(c: f64) -> u64 {
    (c * 1000.0).round().max(0.0) as u64
}

/// Requirements that decide static fit; agents sharing them share a candidate set. Taken
/// from a demand as it comes: borrowed when the demand borrows them (a pass: the agents'), so
/// a signature costs no copy of them.
#[derive(Hash, PartialEq, Eq, Clone)]
struct Signature<'a> {
    kind: Cow<'a, str>,
    image: Option<Cow<'a, str>>,
    requires: Vec<Cow<'a, str>>,
    secrets: Vec<Cow<'a, str>>,
    cpus: Option<u64>,
    mem: Option<u64>,
    spread: Option<Cow<'a, str>>,
}

impl<'a> Signature<'a> {
    /// A demand's signature, and what else of it a run keeps: its key, replica count and
    /// priority.
    fn of(d: Demand<'a>) -> (Signature<'a>, Id, u32, i32) {
        let Demand { key, replicas, kind, image, requires, secrets, cpus, memory_mb, spread, priority } = d;
        let sig = Signature {
            kind,
            image,
            requires: set_of(requires),
            secrets: set_of(secrets),
            cpus: cpus.map(milli),
            mem: memory_mb,
            spread,
        };
        (sig, key, replicas, priority)
    }
}

/// A list of requirements as a sorted set, each borrowed when the list is.
fn set_of(list: Cow<'_, [Id]>) -> Vec<Cow<'_, str>> {
    let mut set: Vec<Cow<str>> = match list {
        Cow::Borrowed(l) => l.iter().map(|s| Cow::Borrowed(&**s)).collect(),
        Cow::Owned(l) => l.into_iter().map(|s| Cow::Owned(s.to_string())).collect(),
    };
    set.sort_unstable();
    set.dedup();
    set
}

/// Where `schedulable` sits in the filter order (docs/behaviour.md#why-an-agent-is-where-it-is: right after `online`).
const SCHEDULABLE: usize = 1;

/// Which static filter a node fails first, in the order of docs/behaviour.md#placement; `None` when it passes all.
/// `cordon_counts`: whether an unschedulable node fails (new replicas) or not (replicas
/// already on a cordoned node stay).
fn first_failure(sig: &Signature, n: &NodeFacts, cordon_counts: bool) -> Option<usize> {
    if !n.online {
        return Some(0);
    }
    if cordon_counts && !n.schedulable {
        return Some(SCHEDULABLE);
    }
    if !n.kinds.iter().any(|k| *k == sig.kind) {
        return Some(2);
    }
    if let Some(img) = &sig.image {
        if !n.images.get(&*sig.kind).is_some_and(|l| l.admits(img)) {
            return Some(3);
        }
    }
    if !labels::all_met(&sig.requires, &n.labels) {
        return Some(4);
    }
    let offered = n.kind_secrets.get(&*sig.kind).unwrap_or(&n.secrets);
    if !sig.secrets.iter().all(|s| offered.binary_search_by(|x| x.as_str().cmp(&**s)).is_ok()) {
        return Some(5);
    }
    None
}

/// The waiting reason of each filter, in order; the last is capacity.
pub const REASONS: [&str; 7] = [
    codes::NO_NODE,
    codes::NO_SCHEDULABLE_NODE,
    codes::NO_EXECUTOR_KIND,
    codes::IMAGE_NOT_ALLOWED,
    codes::NO_LABEL,
    codes::NO_SECRET,
    codes::NO_CAPACITY,
];
const CAPACITY: usize = REASONS.len() - 1;

/// Free slots and name rank of a candidate node: a lazy max-heap of them picks "most free
/// slots, ties by name".
type Candidates = BinaryHeap<(u32, Reverse<u32>)>;

struct SigState {
    /// Statically fitting nodes, as a lazy max-heap of (free slots, name rank).
    heap: Candidates,
    /// With a spread: the same nodes split by their value of the label, in value order.
    by_value: Vec<(Box<str>, Candidates)>,
    /// Reason when the static filters leave no candidate (index into REASONS), else capacity.
    empty_reason: usize,
}

/// Places `demands` (sorted or not) on `nodes` given last pass's `previous` bindings. Takes
/// them one by one (owned, or `&demands` as borrowed views) and keeps of each only its key,
/// replica count and signature.
pub fn place<'a, 'b, D: Into<Demand<'a>>>(
    demands: impl IntoIterator<Item = D>,
    nodes: &[NodeFacts],
    previous: impl Into<Before<'b>>,
) -> Outcome {
    place_within(demands, nodes, previous, MoveBudget::default())
}

/// Drain moves the agents' disruption budgets allow this run (docs/behaviour.md#rolling-out-a-change):
/// a ready replica on a draining node (not forced, online) moves only while its agent has
/// budget left and it is not busy within its hold (docs/behaviour.md#busy-replicas), and stays
/// there, held, otherwise: the idle ones take the budget first. Agents not listed move
/// freely; a replica not ready costs nothing to move.
#[derive(Debug, Clone, Default)]
pub struct MoveBudget {
    /// Agent → moves of ready replicas it may take.
    pub left: HashMap<Arc<str>, u32>,
    /// The ready replicas on draining nodes, sorted.
    pub ready: Vec<(Arc<str>, u32)>,
    /// The ready replicas among them that are busy and within their hold, sorted, with when
    /// their lease or hold ends (ms), whichever is sooner.
    pub busy: Vec<((Arc<str>, u32), i64)>,
    /// When the first of those ends its lease or its hold (ms): the pass looks again then.
    pub busy_ends: Option<i64>,
    /// Every replica that says it is busy, sorted: a preemption takes idle ones first.
    pub busy_anywhere: Vec<(Arc<str>, u32)>,
}

/// Whether a replica on a draining node leaves it in this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leave {
    Now,
    /// Its agent's budget is spent.
    HeldForBudget,
    /// It is busy: it waits without spending the budget.
    HeldWhileBusy,
}

impl MoveBudget {
    /// Whether replica `r` of `key` may leave its draining node now; takes one move if so.
    fn take(&mut self, key: &Arc<str>, r: u32) -> Leave {
        let Some(left) = self.left.get_mut(key) else { return Leave::Now };
        if self.ready.binary_search_by(|(k, x)| (&**k, *x).cmp(&(&**key, r))).is_err() {
            return Leave::Now;
        }
        if self.busy.binary_search_by(|((k, x), _)| (&**k, *x).cmp(&(&**key, r))).is_ok() {
            return Leave::HeldWhileBusy;
        }
        if *left == 0 {
            return Leave::HeldForBudget;
        }
        *left -= 1;
        Leave::Now
    }
}

/// [`place`] with the drain moves limited by `budget`.
pub fn place_within<'a, 'b, D: Into<Demand<'a>>>(
    demands: impl IntoIterator<Item = D>,
    nodes: &[NodeFacts],
    previous: impl Into<Before<'b>>,
    mut budget: MoveBudget,
) -> Outcome {
    let previous = previous.into();
    let (mut ds, sigs) = signatures(demands.into_iter().map(Into::into));
    ds.sort_by(|a, b| a.key.cmp(&b.key)); // stable, and linear when in key order (a pass's)
    let mut p = Placer::new(ds, sigs, nodes);
    p.busy_anywhere = std::mem::take(&mut budget.busy_anywhere);
    let mut out = Outcome::default();
    let unbound = p.sticky(previous.bindings);
    p.place_new(unbound, &mut budget, previous.preempted, &mut out);
    out.busy_ends = budget.busy_ends.filter(|_| !out.held_busy.is_empty());
    let (table, position) = p.node_table();
    out.free = p.free(&position);
    out.bindings = p.bindings(table, &position);
    out
}

/// What a placement run keeps of a demand: 32 bytes.
struct Wanted {
    key: Id,
    replicas: u32,
    /// Its signature: an index into the run's list.
    sig: u32,
    priority: i32,
}

/// No node: a replica not (yet) bound.
const UNBOUND: u32 = u32::MAX;

/// A replica still to place: (demand, replica, its previous node).
type Unbound = (usize, u32, Option<u32>);

/// One placement run: the nodes in name order with their remaining room, the demands (by
/// agent key) with their signatures, and the static fit of each (signature, node).
struct Placer<'a> {
    nodes: &'a [NodeFacts],
    ds: Vec<Wanted>,
    /// Node indexes by name; `rank[i]` is node i's position in that order.
    order: Vec<u32>,
    rank: Vec<u32>,
    by_id: HashMap<&'a str, u32>,
    room: Vec<Room>,
    /// Where each demand's replicas start in `assigned`, and the node (index into `nodes`)
    /// each replica is bound to, [`UNBOUND`] if none: the bindings are written from it in
    /// (agent, replica) order at the end, with no map or sort.
    first: Vec<usize>,
    assigned: Vec<u32>,
    sigs: Vec<Signature<'a>>,
    /// Static fit of (signature, node), memoised: dense when small enough, else computed.
    dense: bool,
    fit_memo: Vec<u8>,
    /// The demands (indexes) in placement order: priority, highest first, then key.
    by_priority: Vec<u32>,
    /// Preemptions: what this run did and may still do.
    ledger: Ledger,
    /// The budget's busy replicas, sorted: a preemption takes idle ones first.
    busy_anywhere: Vec<(Arc<str>, u32)>,
}

impl<'a> Placer<'a> {
    fn new(ds: Vec<Wanted>, sigs: Vec<Signature<'a>>, nodes: &'a [NodeFacts]) -> Placer<'a> {
        let mut order: Vec<u32> = (0..nodes.len() as u32).collect();
        order.sort_by(|&a, &b| nodes[a as usize].name.cmp(&nodes[b as usize].name));
        let mut rank = vec![0u32; nodes.len()];
        for (r, &i) in order.iter().enumerate() {
            rank[i as usize] = r as u32;
        }
        let by_id = nodes.iter().enumerate().map(|(i, n)| (&*n.id, i as u32)).collect();
        let room = nodes
            .iter()
            .map(|n| Room { slots: n.capacity.slots, cpus: n.capacity.cpus.map(milli), mem: n.capacity.memory_mb })
            .collect();
        let mut first = Vec::with_capacity(ds.len());
        let mut wanted = 0usize;
        for d in &ds {
            first.push(wanted);
            wanted += d.replicas as usize;
        }
        let assigned = vec![UNBOUND; wanted];
        let dense = sigs.len().saturating_mul(nodes.len()) <= 8_000_000;
        let fit_memo = if dense { vec![0; sigs.len() * nodes.len()] } else { Vec::new() };
        let mut by_priority: Vec<u32> = (0..ds.len() as u32).collect();
        // Stable: equal priorities keep key order (the demands are sorted by key).
        by_priority.sort_by_key(|&di| Reverse(ds[di as usize].priority));
        let ledger = Ledger::new(ds.iter().map(|d| d.priority));
        let busy_anywhere = Vec::new();
        Placer {
            nodes,
            ds,
            order,
            rank,
            by_id,
            room,
            first,
            assigned,
            sigs,
            dense,
            fit_memo,
            by_priority,
            ledger,
            busy_anywhere,
        }
    }

    fn static_fit(&mut self, sig: usize, ni: u32) -> bool {
        if !self.dense {
            return first_failure(&self.sigs[sig], &self.nodes[ni as usize], true).is_none();
        }
        let slot = &mut self.fit_memo[sig * self.nodes.len() + ni as usize];
        if *slot == 0 {
            *slot = if first_failure(&self.sigs[sig], &self.nodes[ni as usize], true).is_none() { 1 } else { 2 };
        }
        *slot == 1
    }

    /// Whether a replica already on node `ni` may stay: it fits, or the node is only
    /// cordoned (not draining) and it fits otherwise.
    fn may_stay(&mut self, sig: usize, ni: u32) -> bool {
        if self.static_fit(sig, ni) {
            return true;
        }
        let n = &self.nodes[ni as usize];
        !n.schedulable && n.draining.is_none() && first_failure(&self.sigs[sig], n, false).is_none()
    }

    /// The node ids sorted (the outcome's node table), and each node's position in it.
    fn node_table(&self) -> (Vec<Id>, Vec<u32>) {
        let mut by_id: Vec<u32> = (0..self.nodes.len() as u32).collect();
        by_id.sort_unstable_by(|&a, &b| self.nodes[a as usize].id.cmp(&self.nodes[b as usize].id));
        let mut position = vec![0u32; self.nodes.len()];
        for (at, &i) in by_id.iter().enumerate() {
            position[i as usize] = at as u32;
        }
        (by_id.iter().map(|&i| self.nodes[i as usize].id.clone()).collect(), position)
    }

    /// Each node's room left, in the node table's order.
    fn free(&self, position: &[u32]) -> Vec<Free> {
        let mut free = vec![Free::default(); self.room.len()];
        for (r, &at) in self.room.iter().zip(position) {
            free[at as usize] = Free { slots: r.slots, cpus_milli: r.cpus, memory_mb: r.mem };
        }
        free
    }

    /// The bindings, in (agent, replica) order as the demands are sorted.
    fn bindings(&self, table: Vec<Id>, position: &[u32]) -> Bindings {
        let count = self.assigned.iter().filter(|&&n| n != UNBOUND).count();
        let rows = self.bound().map(|(di, r, ni)| (self.ds[di].key.clone(), r, position[ni as usize]));
        Bindings::from_sorted(table, count, rows)
    }

    /// Every bound replica as (demand, replica, node), in (agent, replica) order.
    fn bound(&self) -> impl Iterator<Item = (usize, u32, u32)> + '_ {
        self.ds.iter().enumerate().flat_map(move |(di, d)| {
            let at = self.first[di];
            let nodes = &self.assigned[at..at + d.replicas as usize];
            nodes.iter().enumerate().filter(|(_, &ni)| ni != UNBOUND).map(move |(r, &ni)| (di, r as u32, ni))
        })
    }

    fn bind(&mut self, di: usize, r: u32, ni: u32) {
        self.assigned[self.first[di] + r as usize] = ni;
        self.ledger.bound((di as u32, r), ni, self.ds[di].priority);
    }

    fn need(&self, sig: usize) -> Need {
        Need { cpus: self.sigs[sig].cpus, mem: self.sigs[sig].mem }
    }

    /// Step 1: sticky replicas keep their node when it still fits after those before them,
    /// in placement order; returns the rest, in that order.
    fn sticky(&mut self, previous: &Bindings) -> Vec<Unbound> {
        let prev_nodes = self.previous_nodes(previous);
        let mut unbound = Vec::new();
        for at in 0..self.by_priority.len() {
            let di = self.by_priority[at] as usize;
            let (replicas, sig) = (self.ds[di].replicas, self.ds[di].sig as usize);
            let need = self.need(sig);
            for r in 0..replicas {
                let prev = Some(prev_nodes[self.first[di] + r as usize]).filter(|&ni| ni != UNBOUND);
                match prev {
                    Some(ni) if self.may_stay(sig, ni) && self.room[ni as usize].fits(&need) => {
                        self.room[ni as usize].take(&need);
                        self.bind(di, r, ni);
                    }
                    _ => unbound.push((di, r, prev)),
                }
            }
        }
        unbound
    }

    /// Each wanted replica's previous node (this run's index), [`UNBOUND`] if none, laid out
    /// as `assigned`. `previous` and the demands are both ordered by agent key: walk them
    /// together.
    fn previous_nodes(&self, previous: &Bindings) -> Vec<u32> {
        // The previous node table's positions as this run's node indexes, looked up once.
        let now_at: Vec<u32> =
            previous.nodes().iter().map(|n| self.by_id.get(&**n).copied().unwrap_or(UNBOUND)).collect();
        let mut prev_nodes = vec![UNBOUND; self.assigned.len()];
        let mut prev_iter = previous.positions().peekable();
        for (di, d) in self.ds.iter().enumerate() {
            while prev_iter.peek().is_some_and(|(k, _, _)| ***k < *d.key) {
                prev_iter.next();
            }
            while let Some(&(k, r, at)) = prev_iter.peek() {
                if **k != *d.key {
                    break;
                }
                if r < d.replicas {
                    prev_nodes[self.first[di] + r as usize] = now_at[at as usize];
                }
                prev_iter.next();
            }
        }
        prev_nodes
    }

    /// Step 2: new (and moving) replicas, in placement order: each to the fitting node with
    /// the most free slots, else to room taken from lower priorities, else stuck on its
    /// offline node, else waiting.
    fn place_new(
        &mut self,
        unbound: Vec<Unbound>,
        budget: &mut MoveBudget,
        preempted_before: Option<&BTreeSet<ReplicaKey>>,
        out: &mut Outcome,
    ) {
        let mut states: HashMap<usize, SigState> = HashMap::default();
        // The spread agent being placed and its replicas per value of the label so far (the
        // unbound come grouped by agent).
        let mut spread_of: Option<(usize, HashMap<Box<str>, u32>)> = None;
        for (di, r, prev) in unbound {
            if let Some(ni) = prev.filter(|&ni| self.nodes[ni as usize].drain_paced()) {
                let leave = budget.take(&self.ds[di].key, r);
                if leave != Leave::Now {
                    // It stays, held, until another is ready or it is idle.
                    self.bind(di, r, ni);
                    out.held.insert((self.ds[di].key.clone(), r));
                    if leave == Leave::HeldWhileBusy {
                        out.held_busy.insert((self.ds[di].key.clone(), r));
                    }
                    continue;
                }
            }
            let sig = self.ds[di].sig as usize;
            let need = self.need(sig);
            let st = states.entry(sig).or_insert_with(|| self.sig_state(sig, &need));
            let picked = match &self.sigs[sig].spread {
                Some(label) => {
                    if spread_of.as_ref().is_none_or(|(d, _)| *d != di) {
                        spread_of = Some((di, self.counts_by_value(di, label)));
                    }
                    let counts = &mut spread_of.as_mut().expect("set above").1;
                    pick_spread(st, &mut self.room, &self.order, &need, counts)
                }
                None => pick(&mut st.heap, &mut self.room, &self.order, &need),
            };
            let empty_reason = st.empty_reason;
            let capacity_only = empty_reason == CAPACITY;
            let picked = match picked {
                None if capacity_only => {
                    let label = self.sigs[sig].spread.clone();
                    let counts = spread_of.as_mut().filter(|(d, _)| *d == di).map(|(_, c)| c);
                    let taken = self.preempt(di, r, &need, label.as_deref().zip(counts), out);
                    if let Some(ni) = taken {
                        self.refresh(&mut states, ni);
                    }
                    taken
                }
                found => found.map(|ni| ni as u32),
            };
            match picked {
                Some(ni) => self.bind(di, r, ni),
                // Nowhere to go and the old node is offline: stay bound, return with it.
                None => match prev {
                    Some(ni) if !self.nodes[ni as usize].online => {
                        self.bind(di, r, ni);
                        out.stuck.insert((self.ds[di].key.clone(), r));
                    }
                    // Draining without force: a replica with nowhere to go stays, blocked.
                    Some(ni) if self.nodes[ni as usize].draining == Some(false) => {
                        self.bind(di, r, ni);
                        out.blocked.insert((self.ds[di].key.clone(), r));
                    }
                    _ => {
                        let key = (self.ds[di].key.clone(), r);
                        let was_preempted = preempted_before.is_some_and(|p| p.contains(&key));
                        let reason = if was_preempted && capacity_only {
                            out.preempted.insert(key.clone());
                            codes::PREEMPTED
                        } else {
                            REASONS[empty_reason]
                        };
                        wait(out, key.0, reason);
                    }
                },
            }
        }
    }

    /// Room a preemption gave back on node `ni` (what the preemptor left of it) is seen by
    /// the signatures placed so far: the heaps assume room only falls, so the node gets a
    /// fresh entry wherever it fits.
    fn refresh(&mut self, states: &mut HashMap<usize, SigState>, ni: u32) {
        let entry = (self.room[ni as usize].slots, Reverse(self.rank[ni as usize]));
        for (&sig, st) in states.iter_mut() {
            if !self.static_fit(sig, ni) || !self.room[ni as usize].fits(&self.need(sig)) {
                continue;
            }
            match self.sigs[sig].spread.as_deref() {
                None => st.heap.push(entry),
                Some(label) => {
                    let value = labels::value_of(&self.nodes[ni as usize].labels, label);
                    match st.by_value.binary_search_by(|(v, _)| (**v).cmp(value)) {
                        Ok(at) => st.by_value[at].1.push(entry),
                        Err(at) => st.by_value.insert(at, (Box::from(value), BinaryHeap::from([entry]))),
                    }
                }
            }
        }
    }

    /// A signature's candidates as a heap (split by value with a spread), and the reason
    /// when the static filters leave none.
    fn sig_state(&self, sig: usize, need: &Need) -> SigState {
        let mut deepest = 0usize;
        let mut heap = BinaryHeap::new();
        let mut by_value: BTreeMap<&str, Candidates> = BTreeMap::new();
        let spread = self.sigs[sig].spread.as_deref();
        for (i, n) in self.nodes.iter().enumerate() {
            match first_failure(&self.sigs[sig], n, true) {
                None => {
                    deepest = CAPACITY;
                    if self.room[i].fits(need) {
                        let entry = (self.room[i].slots, Reverse(self.rank[i]));
                        match spread {
                            Some(label) => by_value.entry(labels::value_of(&n.labels, label)).or_default().push(entry),
                            None => heap.push(entry),
                        }
                    }
                }
                Some(f) => deepest = deepest.max(f),
            }
        }
        let by_value = by_value.into_iter().map(|(v, h)| (Box::from(v), h)).collect();
        SigState { heap, by_value, empty_reason: deepest }
    }

    /// Demand `di`'s replicas bound so far (sticky ones, and those placed before in this run)
    /// per value of `label`.
    fn counts_by_value(&self, di: usize, label: &str) -> HashMap<Box<str>, u32> {
        let first = self.first[di];
        let mut counts: HashMap<Box<str>, u32> = HashMap::default();
        for &ni in &self.assigned[first..first + self.ds[di].replicas as usize] {
            if ni != UNBOUND {
                *counts.entry(Box::from(labels::value_of(&self.nodes[ni as usize].labels, label))).or_default() += 1;
            }
        }
        counts
    }
}

/// Preemption (docs/behaviour.md#spread-and-priority): the placer's side of [`preempt`].
impl Placer<'_> {
    /// Room for replica `r` of demand `di` by unbinding lower-priority replicas on the
    /// fitting node where the fewest must go (ties: their priorities, then node name); the
    /// node, with the room taken, or `None` when nothing may go.
    /// With a spread (`spread`: the label and the agent's replicas per value so far), nodes
    /// whose value holds fewer of the agent's replicas come first, as for a free node.
    fn preempt(&mut self, di: usize, r: u32, need: &Need, mut spread: Spread, out: &mut Outcome) -> Option<u32> {
        let (sig, priority) = (self.ds[di].sig as usize, self.ds[di].priority);
        if !self.ledger.may_try(sig, priority) {
            return None;
        }
        if !self.ledger.indexed() {
            // Collected first: the ledger is written while the placer is read.
            let bound: Vec<_> = self.bound().map(|(di, r, ni)| (di as u32, r, ni, self.ds[di].priority)).collect();
            self.ledger.index(self.nodes.len(), bound.into_iter());
        }
        // ((the agent's replicas on the node's value, the victims' cost, name rank), node, victims)
        type Choice = ((u32, preempt::Cost, u32), u32, Vec<Bound>);
        let mut best: Option<Choice> = None;
        for ni in 0..self.nodes.len() as u32 {
            let has_room = self.room[ni as usize].fits(need);
            if !(has_room || self.ledger.below_on(ni, priority)) || !self.static_fit(sig, ni) {
                continue;
            }
            let below: Vec<Bound> =
                self.ledger.on(ni).iter().map(|&at| self.weigh(at)).filter(|b| b.priority < priority).collect();
            if let Some((cost, taken)) = preempt::victims(self.room[ni as usize], below, need) {
                let there = spread.as_ref().map_or(0, |(label, counts)| self.count_at(ni, label, counts));
                let rank = (there, cost, self.rank[ni as usize]);
                if best.as_ref().is_none_or(|b| rank < b.0) {
                    best = Some((rank, ni, taken));
                }
            }
        }
        let Some((_, ni, taken)) = best else {
            self.ledger.found_none(sig, priority);
            return None;
        };
        if !self.ledger.admit(taken.len()) {
            return None;
        }
        for v in taken {
            self.unbind_victim(v, ni, (di, r), out);
        }
        self.room[ni as usize].take(need);
        if let Some((label, counts)) = spread.as_mut() {
            let value = labels::value_of(&self.nodes[ni as usize].labels, label);
            *counts.entry(Box::from(value)).or_default() += 1;
        }
        Some(ni)
    }

    /// The agent's replicas on node `ni`'s value of `label`.
    fn count_at(&self, ni: u32, label: &str, counts: &HashMap<Box<str>, u32>) -> u32 {
        counts.get(labels::value_of(&self.nodes[ni as usize].labels, label)).copied().unwrap_or(0)
    }

    fn weigh(&self, (di, r): (u32, u32)) -> Bound {
        let d = &self.ds[di as usize];
        let busy = self.busy_anywhere.binary_search_by(|(k, x)| (&**k, *x).cmp(&(&*d.key, r))).is_ok();
        Bound { at: (di, r), priority: d.priority, need: self.need(d.sig as usize), busy }
    }

    /// Unbinds a victim from node `ni` for replica `by`: its room goes back, its agent waits
    /// as `preempted`, and the run records who took the room.
    fn unbind_victim(&mut self, v: Bound, ni: u32, by: (usize, u32), out: &mut Outcome) {
        let (vdi, vr) = (v.at.0 as usize, v.at.1);
        self.assigned[self.first[vdi] + vr as usize] = UNBOUND;
        self.ledger.unbound(v.at, ni);
        self.room[ni as usize].give(&v.need);
        let victim = (self.ds[vdi].key.clone(), vr);
        out.preempted.insert(victim.clone());
        wait(out, victim.0.clone(), codes::PREEMPTED);
        out.preemptions.push(Preemption {
            victim,
            victim_priority: v.priority,
            node: self.nodes[ni as usize].id.clone(),
            by: (self.ds[by.0].key.clone(), by.1),
            by_priority: self.ds[by.0].priority,
        });
    }
}

/// A spread agent's label and its replicas per value so far, for preemption.
type Spread<'s> = Option<(&'s str, &'s mut HashMap<Box<str>, u32>)>;

/// One more replica of `key` waits; `preempted` wins over the agent's other reasons.
fn wait(out: &mut Outcome, key: Arc<str>, reason: &'static str) {
    let e = out.waiting.entry(key).or_insert((0, reason));
    e.0 += 1;
    if reason == codes::PREEMPTED {
        e.1 = reason;
    }
}

/// What the run keeps of each demand (in the order given), and the signatures, agents with
/// the same requirements sharing one.
fn signatures<'a>(ds: impl Iterator<Item = Demand<'a>>) -> (Vec<Wanted>, Vec<Signature<'a>>) {
    let mut sig_of: HashMap<Signature, u32> = HashMap::default();
    let mut sigs: Vec<Signature> = Vec::new();
    let (fewest, most) = ds.size_hint();
    let mut wanted = Vec::with_capacity(most.unwrap_or(fewest));
    for d in ds {
        let (s, key, replicas, priority) = Signature::of(d);
        let sig = match sig_of.get(&s) {
            Some(&at) => at,
            None => {
                sigs.push(s.clone());
                sig_of.insert(s, sigs.len() as u32 - 1);
                sigs.len() as u32 - 1
            }
        };
        wanted.push(Wanted { key, replicas, sig, priority });
    }
    (wanted, sigs)
}

/// Takes a slot on the candidate with the most free slots (ties by name) from a lazy heap.
fn pick(heap: &mut Candidates, room: &mut [Room], order: &[u32], need: &Need) -> Option<usize> {
    let (_, Reverse(rk)) = top(heap, room, order, need)?;
    heap.pop();
    let ni = order[rk as usize] as usize;
    room[ni].take(need);
    if room[ni].fits(need) {
        heap.push((room[ni].slots, Reverse(rk)));
    }
    Some(ni)
}

/// The heap's best candidate that still fits, as it stands: an entry is an upper bound of its
/// node's free slots (capacity only falls while placing), so a stale one is pushed back with
/// the true value and one that no longer fits is dropped.
fn top(heap: &mut Candidates, room: &[Room], order: &[u32], need: &Need) -> Option<(u32, Reverse<u32>)> {
    while let Some(&(slots, Reverse(rk))) = heap.peek() {
        let ni = order[rk as usize] as usize;
        if !room[ni].fits(need) {
            heap.pop();
        } else if room[ni].slots != slots {
            heap.pop();
            heap.push((room[ni].slots, Reverse(rk)));
        } else {
            return Some((slots, Reverse(rk)));
        }
    }
    None
}

/// With a spread: a slot on the best candidate of the value holding the fewest of the agent's
/// replicas (then most free slots, then name), counted in `counts`. Costs one look at each
/// value's heap: the values of a label, not the nodes.
fn pick_spread(
    st: &mut SigState,
    room: &mut [Room],
    order: &[u32],
    need: &Need,
    counts: &mut HashMap<Box<str>, u32>,
) -> Option<usize> {
    // (replicas of the agent there, most free slots, name rank; the value's index).
    let mut best: Option<(u32, Reverse<u32>, u32, usize)> = None;
    for (vi, (value, heap)) in st.by_value.iter_mut().enumerate() {
        let Some((slots, Reverse(rk))) = top(heap, room, order, need) else { continue };
        let key = (counts.get(value).copied().unwrap_or(0), Reverse(slots), rk, vi);
        if best.is_none_or(|b| key < b) {
            best = Some(key);
        }
    }
    let (_, _, _, vi) = best?;
    let (value, heap) = &mut st.by_value[vi];
    let ni = pick(heap, room, order, need)?;
    *counts.entry(value.clone()).or_default() += 1;
    Some(ni)
}

mod preempt;
mod room;
#[cfg(test)]
mod tests;
