//! When a pass's PAT and status work is queued: the keys a pass wants run now, in its order
//! (a node's PATs together; statuses behind the PATs wanted before them, [`super::backlog`]), and
//! one ordered index of (due second, node) for rotations. One task feeds both into the work
//! queue, keeping at most [`FEED_AHEAD`] keys ready there: a fleet coming up wants 100,000
//! PATs at once, and the queue holds each key twice (its order and its set, ~180 bytes a key
//! at that size) where the backlog holds one key of 40 bytes. A status waits behind the PATs
//! wanted before it: sent while they are still being issued it is superseded within seconds,
//! and sending each step costs the CP and the controller a fifth more CPU-seconds to bring
//! a fleet up.
//!
//! Rotations are not a delayed work-queue key per PAT either (the queue's two entries per
//! key are ~250 bytes each), nor an entry per PAT here (~60 bytes each in a B-tree of (due
//! ms, agent, node): 6 MB at 100,000 PATs): an entry is a node and the second, rounded up, at
//! which the first of its PATs is due — one entry a node. A node's PATs fall due at spread
//! times (docs/behaviour.md#rolling-out-a-change), and an entry for each of their seconds
//! was ~40 bytes a PAT, 3.9 MB at 100,000. When a node's entry falls due, every pair of that
//! node with a live PAT gets its PAT work queued ([`Rotations::run`]'s `live_agents`). The
//! PAT work item itself decides whether a rotation is due (`items::pat`): a pair not due yet
//! costs one look and schedules its own second again, and the earliest of those is the
//! node's next entry; an entry left behind by a credential that was replaced meanwhile costs
//! the same.

use super::backlog::Backlog;
use super::key::WorkKey;
use super::queue::WorkQueue;
use crate::clock;
use crate::model::Id;
use parking_lot::Mutex;
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::sync::Notify;

/// Keys kept ready in the work queue ahead of its workers (32 run at once): enough that
/// they never wait for the feeder, few enough to cost nothing.
pub const FEED_AHEAD: usize = 1_000;

/// How often the feeder looks for room in the queue while pairs wait for it.
const FEED_EVERY: Duration = Duration::from_millis(10);

/// The second, rounded up, of an instant in ms: a rotation is never early.
pub fn due_second(ms: i64) -> i64 {
    ms.div_euclid(1000) + i64::from(ms.rem_euclid(1000) != 0)
}

/// Each node's earliest due second (since the epoch, rounded up), in order and by node.
#[derive(Default)]
struct Due {
    order: BTreeSet<(i64, Id)>,
    by_node: HashMap<Id, i64>,
}

impl Due {
    /// `false` when the node's entry is at `at` or earlier already.
    fn insert(&mut self, at: i64, node: Id) -> bool {
        match self.by_node.get(&node) {
            Some(&was) if was <= at => return false,
            Some(&was) => {
                self.order.remove(&(was, node.clone()));
            }
            None => {}
        }
        self.by_node.insert(node.clone(), at);
        self.order.insert((at, node))
    }

    fn first(&self) -> Option<&(i64, Id)> {
        self.order.first()
    }

    fn pop_first(&mut self) -> Option<(i64, Id)> {
        let first = self.order.pop_first()?;
        self.by_node.remove(&first.1);
        Some(first)
    }

    fn len(&self) -> usize {
        self.order.len()
    }
}

#[derive(Default)]
pub struct Rotations {
    /// PAT and status keys wanted now, in the pass's order (a duplicate PAT key is harmless:
    /// the queue folds a key that is already there; a status is held once).
    now: Mutex<Backlog>,
    /// Each node's earliest due second.
    due: Mutex<Due>,
    /// Woken when an entry becomes the earliest, so the timer sleeps to the right instant.
    earlier: Notify,
}

impl Rotations {
    /// The keys are queued as soon as the queue has room, in this order (a status with the
    /// debounce `run` was given).
    pub fn want_now(&self, keys: impl IntoIterator<Item = WorkKey>) {
        let mut now = self.now.lock();
        let was_empty = now.is_empty();
        for key in keys {
            now.push(key);
        }
        let woken = was_empty && !now.is_empty();
        drop(now);
        if woken {
            self.earlier.notify_one();
        }
    }

    /// The PAT work of `node`'s pairs is queued at `due_ms`, rounded up to the second, unless
    /// the node's entry is as early already (then the pairs not due at that entry schedule
    /// themselves again).
    pub fn schedule(&self, node: Id, due_ms: i64) {
        let at = due_second(due_ms);
        let mut due = self.due.lock();
        let first = due.first().is_none_or(|f| at < f.0);
        let inserted = due.insert(at, node);
        drop(due);
        if first && inserted {
            self.earlier.notify_one();
        }
    }

    /// Entries waiting, for the queue-depth metric.
    pub fn len(&self) -> usize {
        self.now.lock().len() + self.due.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every pair with PAT work wanted now (for the audit: built once, looked up per pair).
    pub fn wanted_pairs(&self) -> HashSet<(Id, Id)> {
        self.now
            .lock()
            .line()
            .filter_map(|k| match k {
                WorkKey::Pat(a, n) => Some((a.clone(), n.clone())),
                _ => None,
            })
            .collect()
    }

    /// Each node's earliest rotation entry, in ms (for the audit: a pair whose PAT is due at
    /// `d` is covered by an entry of its node at or before `d`).
    pub fn earliest_by_node(&self) -> HashMap<Id, i64> {
        self.due.lock().by_node.iter().map(|(node, at)| (node.clone(), at * 1000)).collect()
    }

    /// Takes up to `room` keys wanted now.
    fn take_now(&self, room: usize) -> Vec<WorkKey> {
        self.now.lock().take(room)
    }

    /// Takes up to `room` (at least one) nodes whose entry is due at `now_ms`; `Err` is when
    /// the next one falls due (ms), if any.
    fn take_due(&self, now_ms: i64, room: usize) -> Result<Vec<Id>, Option<i64>> {
        let mut due = self.due.lock();
        let mut out = Vec::new();
        while let Some(first) = due.first() {
            if first.0 * 1000 > now_ms || out.len() == room {
                break;
            }
            let (_, node) = due.pop_first().expect("looked at");
            out.push(node);
        }
        if out.is_empty() {
            Err(due.first().map(|f| f.0 * 1000))
        } else {
            Ok(out)
        }
    }

    /// Queues the keys wanted now and, when a node's entry falls due, the PAT work of each of
    /// its pairs with a live PAT (`live_agents`: those pairs' agents), with at most
    /// [`FEED_AHEAD`] keys (and one node's pairs) ready in the queue, for the life of the term.
    /// A status is queued `status_debounce` after it is fed, with whatever it says by then.
    pub async fn run(
        &self,
        queue: &WorkQueue<WorkKey>,
        status_debounce: Duration,
        live_agents: impl Fn(&Id) -> Vec<Id>,
    ) {
        loop {
            let earlier = self.earlier.notified();
            let room = FEED_AHEAD.saturating_sub(queue.ready_len());
            if room == 0 {
                // The workers make room within milliseconds.
                tokio::time::sleep(FEED_EVERY).await;
                continue;
            }
            let mut keys = self.take_now(room);
            let due = match room - keys.len() {
                0 => Ok(vec![]),
                left => self.take_due(clock::now_ms(), left),
            };
            match due {
                Ok(nodes) => {
                    for node in nodes {
                        keys.extend(live_agents(&node).into_iter().map(|agent| WorkKey::Pat(agent, node.clone())));
                    }
                }
                Err(_) if !keys.is_empty() => {}
                Err(next) => {
                    // At most a minute at a time: a wall clock that jumps is followed.
                    let wait = next.map_or(Duration::from_secs(60), |at| {
                        Duration::from_millis((at - clock::now_ms()).clamp(1, 60_000) as u64)
                    });
                    tokio::select! {
                        _ = earlier => {}
                        _ = tokio::time::sleep(wait) => {}
                    }
                    continue;
                }
            }
            for key in keys {
                match key {
                    WorkKey::Status(_) => queue.add_after(key, status_debounce),
                    key => queue.add(key),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::work::queue::Backoff;
    use std::sync::Arc;

    fn pair(a: &str, n: &str) -> (Id, Id) {
        (a.into(), n.into())
    }

    #[test]
    fn entries_fall_due_by_node_and_second_in_order_and_repeats_collapse() {
        let r = Rotations::default();
        r.schedule("n2".into(), 3_000);
        r.schedule("n1".into(), 1_100);
        r.schedule("n1".into(), 1_900);
        r.schedule("n1".into(), 2_000);
        assert_eq!(r.len(), 2, "a node's PATs due within one second are one entry, rounded up");
        assert_eq!(r.earliest_by_node().get("n1"), Some(&2_000));
        assert_eq!(r.take_due(1_999, 10), Err(Some(2_000)), "never early");
        assert_eq!(r.take_due(2_000, 10), Ok(vec![Id::from("n1")]));
        assert_eq!(r.take_due(2_999, 10), Err(Some(3_000)));
        r.schedule("n3".into(), 3_000);
        assert_eq!(r.take_due(5_000, 1), Ok(vec![Id::from("n2")]), "at most `room` nodes");
        assert_eq!(r.take_due(5_000, 10), Ok(vec![Id::from("n3")]));
        assert_eq!(r.take_due(5_000, 10), Err(None));
        assert!(r.is_empty());
        assert_eq!((due_second(-1), due_second(0), due_second(1)), (0, 0, 1));
    }

    /// A node holds one entry, its earliest: a later second is left to the pairs not due at
    /// it, an earlier one replaces it.
    #[test]
    fn a_node_keeps_only_its_earliest_entry() {
        let r = Rotations::default();
        r.schedule("n1".into(), 2_000);
        r.schedule("n1".into(), 7_000);
        r.schedule("n2".into(), 9_000);
        assert_eq!(r.len(), 2);
        r.schedule("n2".into(), 4_000);
        assert_eq!(r.len(), 2);
        assert_eq!(r.earliest_by_node(), HashMap::from_iter([("n1".into(), 2_000), ("n2".into(), 4_000)]));
        assert_eq!(r.take_due(10_000, 10), Ok(vec![Id::from("n1"), Id::from("n2")]));
        assert_eq!(r.take_due(10_000, 10), Err(None));
        r.schedule("n1".into(), 7_000);
        assert_eq!(r.earliest_by_node().get("n1"), Some(&7_000), "a node whose entry fell due takes the next");
    }

    /// The timer queues the PAT work of every pair of a node with a live PAT when the node's
    /// entry falls due, and an entry scheduled earlier than the one it sleeps for wakes it.
    #[tokio::test]
    async fn the_timer_queues_a_nodes_pat_work_when_due() {
        let r = Arc::new(Rotations::default());
        let q = Arc::new(WorkQueue::new(Backoff { base: Duration::from_secs(1), max: Duration::from_secs(1) }));
        let now = clock::now_ms();
        r.schedule("late".into(), now + 3_600_000);
        let (r2, q2) = (r.clone(), q.clone());
        let live = |node: &Id| match &**node {
            "soon" => vec![Id::from("a1"), Id::from("a2")],
            _ => vec![Id::from("x")],
        };
        tokio::spawn(async move { r2.run(&q2, Duration::ZERO, live).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        r.schedule("soon".into(), now + 100);
        for agent in ["a1", "a2"] {
            let key = tokio::time::timeout(Duration::from_secs(5), q.next()).await.expect("queued when due");
            assert_eq!(key, WorkKey::Pat(agent.into(), "soon".into()));
        }
        assert!(clock::now_ms() >= now + 100, "not before it was due");
        assert_eq!(r.len(), 1, "the later entry waits");
    }

    /// Pairs wanted now reach the queue in the order given, never more than `FEED_AHEAD`
    /// ready at once, and the rest follow as workers take keys.
    #[tokio::test]
    async fn wanted_pairs_are_fed_in_order_as_the_queue_has_room() {
        let r = Arc::new(Rotations::default());
        let q = Arc::new(WorkQueue::new(Backoff { base: Duration::from_secs(1), max: Duration::from_secs(1) }));
        let (r2, q2) = (r.clone(), q.clone());
        tokio::spawn(async move { r2.run(&q2, Duration::from_millis(1), |_: &Id| Vec::new()).await });
        let total = FEED_AHEAD + 500;
        let pats = (0..total).map(|i| WorkKey::Pat(format!("a{i:05}").into(), "n".into()));
        r.want_now(pats.chain([WorkKey::Status("s".into())]));
        let full = || q.ready_len() == FEED_AHEAD;
        for _ in 0..500 {
            if full() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert!(full(), "the queue is fed up to its bound: {} ready", q.ready_len());
        assert_eq!(r.len(), 501, "the rest waits here");
        assert!(r.wanted_pairs().contains(&pair(&format!("a{:05}", total - 1), "n")), "the audit sees waiting pairs");
        for i in 0..total {
            let key = tokio::time::timeout(Duration::from_secs(5), q.next()).await.expect("fed as workers take keys");
            assert_eq!(key, WorkKey::Pat(format!("a{i:05}").into(), "n".into()));
            q.done(&key, crate::reconcile::work::queue::Outcome::Done);
            assert!(q.ready_len() <= FEED_AHEAD);
        }
        let key = tokio::time::timeout(Duration::from_secs(5), q.next()).await.expect("the status follows");
        assert_eq!(key, WorkKey::Status("s".into()), "after the PATs queued before it");
        assert!(r.is_empty());
    }
}
