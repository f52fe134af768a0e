//! When a pass's PAT and status work is queued: the keys a pass wants run now, in its order
//! (a node's PATs together, the statuses after them), and one ordered index of (due, agent,
//! node) for rotations. One task feeds both into the work queue, keeping at most
//! [`FEED_AHEAD`] keys ready there: a fleet coming up wants 100,000 PATs at once, and the
//! queue holds each key twice (its order and its set, ~180 bytes a key at that size) where
//! the backlog holds one key of 40 bytes. Statuses wait behind the PATs queued before them,
//! as they did in the queue: an agent's status sent while its PATs are still being issued is
//! superseded within seconds, and sending each step cost the CP and the controller a fifth
//! more CPU-seconds to bring a fleet up.
//!
//! Rotations are not a delayed work-queue key per PAT either (the queue's two entries per
//! key were ~250 bytes each; an entry here is a B-tree slot of 40 bytes). The PAT work item
//! itself decides whether a rotation is due (`work::pat`), so an entry left behind by a
//! credential that was replaced meanwhile costs one look and is dropped: the item schedules
//! the real due time again, which lands on the same entry when it is already there.

use super::queue::WorkQueue;
use super::work::WorkKey;
use crate::clock;
use crate::model::Id;
use parking_lot::Mutex;
use rustc_hash::FxHashSet as HashSet;
use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;
use tokio::sync::Notify;

/// Keys kept ready in the work queue ahead of its workers (32 run at once): enough that
/// they never wait for the feeder, few enough to cost nothing.
pub const FEED_AHEAD: usize = 1_000;

/// How often the feeder looks for room in the queue while pairs wait for it.
const FEED_EVERY: Duration = Duration::from_millis(10);

#[derive(Default)]
pub struct Rotations {
    /// PAT and status keys wanted now, first come first queued (duplicates are harmless: the
    /// queue folds a key that is already there).
    now: Mutex<VecDeque<WorkKey>>,
    /// (due, in ms since the epoch; agent; node).
    due: Mutex<BTreeSet<(i64, Id, Id)>>,
    /// Woken when an entry becomes the earliest, so the timer sleeps to the right instant.
    earlier: Notify,
}

impl Rotations {
    /// The keys are queued as soon as the queue has room, in this order (a status with the
    /// debounce `run` was given).
    pub fn want_now(&self, keys: impl IntoIterator<Item = WorkKey>) {
        let mut now = self.now.lock();
        let was_empty = now.is_empty();
        now.extend(keys);
        let woken = was_empty && !now.is_empty();
        drop(now);
        if woken {
            self.earlier.notify_one();
        }
    }

    /// The pair's PAT work is queued at `due_ms` (an entry already there for that instant is
    /// kept).
    pub fn schedule(&self, agent: Id, node: Id, due_ms: i64) {
        let mut due = self.due.lock();
        let first = due.first().is_none_or(|f| due_ms < f.0);
        due.insert((due_ms, agent, node));
        drop(due);
        if first {
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

    /// Every pair with PAT work waiting here, now or at a rotation (for the audit: built
    /// once, looked up per pair).
    pub fn pairs(&self) -> HashSet<(Id, Id)> {
        let mut pairs: HashSet<(Id, Id)> = self
            .now
            .lock()
            .iter()
            .filter_map(|k| match k {
                WorkKey::Pat(a, n) => Some((a.clone(), n.clone())),
                _ => None,
            })
            .collect();
        pairs.extend(self.due.lock().iter().map(|(_, a, n)| (a.clone(), n.clone())));
        pairs
    }

    /// Takes up to `room` keys wanted now.
    fn take_now(&self, room: usize) -> Vec<WorkKey> {
        let mut now = self.now.lock();
        let n = room.min(now.len());
        let taken = now.drain(..n).collect();
        // A fleet's backlog is let go once it is fed.
        let len = now.len();
        if now.capacity() > 256 && now.capacity() > 4 * len {
            now.shrink_to(len * 2);
        }
        taken
    }

    /// Takes up to `room` (at least one) entries due at `now_ms`; `Err` is when the next one
    /// falls due, if any.
    fn take_due(&self, now_ms: i64, room: usize) -> Result<Vec<(Id, Id)>, Option<i64>> {
        let mut due = self.due.lock();
        let mut out = Vec::new();
        while let Some(first) = due.first() {
            if first.0 > now_ms || out.len() == room {
                break;
            }
            let (_, agent, node) = due.pop_first().expect("looked at");
            out.push((agent, node));
        }
        if out.is_empty() {
            Err(due.first().map(|f| f.0))
        } else {
            Ok(out)
        }
    }

    /// Queues the keys wanted now and each pair's PAT work when its rotation falls due, with
    /// at most [`FEED_AHEAD`] keys ready in the queue, for the life of the term. A status is
    /// queued `status_debounce` after it is fed, with whatever it says by then.
    pub async fn run(&self, queue: &WorkQueue<WorkKey>, status_debounce: Duration) {
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
                Ok(more) => keys.extend(more.into_iter().map(|(agent, node)| WorkKey::Pat(agent, node))),
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
    use crate::reconcile::queue::Backoff;
    use std::sync::Arc;

    fn pair(a: &str, n: &str) -> (Id, Id) {
        (a.into(), n.into())
    }

    #[test]
    fn entries_fall_due_in_order_and_repeats_collapse() {
        let r = Rotations::default();
        r.schedule("a".into(), "n2".into(), 300);
        r.schedule("a".into(), "n1".into(), 100);
        r.schedule("a".into(), "n1".into(), 100);
        assert_eq!(r.len(), 2, "the same pair at the same instant is one entry");
        assert_eq!(r.take_due(50, 10), Err(Some(100)));
        assert_eq!(r.take_due(100, 10), Ok(vec![pair("a", "n1")]));
        assert_eq!(r.take_due(299, 10), Err(Some(300)));
        assert_eq!(r.take_due(1_000, 10), Ok(vec![pair("a", "n2")]));
        assert_eq!(r.take_due(1_000, 10), Err(None));
        assert!(r.is_empty());
    }

    /// The timer queues the pair's PAT work when it falls due, and an entry scheduled earlier
    /// than the one it sleeps for wakes it.
    #[tokio::test]
    async fn the_timer_queues_pat_work_when_due() {
        let r = Arc::new(Rotations::default());
        let q = Arc::new(WorkQueue::new(Backoff { base: Duration::from_secs(1), max: Duration::from_secs(1) }));
        let now = clock::now_ms();
        r.schedule("late".into(), "n".into(), now + 3_600_000);
        let (r2, q2) = (r.clone(), q.clone());
        tokio::spawn(async move { r2.run(&q2, Duration::ZERO).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        r.schedule("soon".into(), "n".into(), now + 100);
        let key = tokio::time::timeout(Duration::from_secs(5), q.next()).await.expect("queued when due");
        assert_eq!(key, WorkKey::Pat("soon".into(), "n".into()));
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
        tokio::spawn(async move { r2.run(&q2, Duration::from_millis(1)).await });
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
        assert!(r.pairs().contains(&pair(&format!("a{:05}", total - 1), "n")), "the audit sees waiting pairs");
        for i in 0..total {
            let key = tokio::time::timeout(Duration::from_secs(5), q.next()).await.expect("fed as workers take keys");
            assert_eq!(key, WorkKey::Pat(format!("a{i:05}").into(), "n".into()));
            q.done(&key, crate::reconcile::queue::Outcome::Done);
            assert!(q.ready_len() <= FEED_AHEAD);
        }
        let key = tokio::time::timeout(Duration::from_secs(5), q.next()).await.expect("the status follows");
        assert_eq!(key, WorkKey::Status("s".into()), "after the PATs queued before it");
        assert!(r.is_empty());
    }
}
