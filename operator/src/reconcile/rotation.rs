//! When each live PAT falls due for rotation: one ordered index of (due, agent, node) and one
//! task that queues a pair's PAT work when its time comes, instead of a delayed work-queue
//! key per PAT (at 100,000 PATs the queue's two entries per key were ~250 bytes each; an
//! entry here is a B-tree slot of 40 bytes). The PAT work item itself decides whether a
//! rotation is due (`work::pat`), so an entry left behind by a credential that was replaced
//! meanwhile costs one look and is dropped: the item schedules the real due time again,
//! which lands on the same entry when it is already there.

use super::queue::WorkQueue;
use super::work::WorkKey;
use crate::clock;
use crate::model::Id;
use parking_lot::Mutex;
use rustc_hash::FxHashSet as HashSet;
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::sync::Notify;

#[derive(Default)]
pub struct Rotations {
    /// (due, in ms since the epoch; agent; node).
    due: Mutex<BTreeSet<(i64, Id, Id)>>,
    /// Woken when an entry becomes the earliest, so the timer sleeps to the right instant.
    earlier: Notify,
}

impl Rotations {
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
        self.due.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.due.lock().is_empty()
    }

    /// Every pair with a rotation waiting (for the audit: built once, looked up per pair).
    pub fn pairs(&self) -> HashSet<(Id, Id)> {
        self.due.lock().iter().map(|(_, a, n)| (a.clone(), n.clone())).collect()
    }

    /// Takes the entries due at `now_ms`; `Err` is when the next one falls due, if any.
    fn take_due(&self, now_ms: i64) -> Result<Vec<(Id, Id)>, Option<i64>> {
        let mut due = self.due.lock();
        let mut out = Vec::new();
        while let Some(first) = due.first() {
            if first.0 > now_ms {
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

    /// Queues each pair's PAT work when its rotation falls due, for the life of the term.
    pub async fn run(&self, queue: &WorkQueue<WorkKey>) {
        loop {
            let earlier = self.earlier.notified();
            match self.take_due(clock::now_ms()) {
                Ok(pairs) => {
                    for (agent, node) in pairs {
                        queue.add(WorkKey::Pat(agent, node));
                    }
                }
                Err(next) => {
                    // At most a minute at a time: a wall clock that jumps is followed.
                    let wait = next.map_or(Duration::from_secs(60), |at| {
                        Duration::from_millis((at - clock::now_ms()).clamp(1, 60_000) as u64)
                    });
                    tokio::select! {
                        _ = earlier => {}
                        _ = tokio::time::sleep(wait) => {}
                    }
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
        assert_eq!(r.take_due(50), Err(Some(100)));
        assert_eq!(r.take_due(100), Ok(vec![pair("a", "n1")]));
        assert_eq!(r.take_due(299), Err(Some(300)));
        assert_eq!(r.take_due(1_000), Ok(vec![pair("a", "n2")]));
        assert_eq!(r.take_due(1_000), Err(None));
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
        tokio::spawn(async move { r2.run(&q2).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        r.schedule("soon".into(), "n".into(), now + 100);
        let key = tokio::time::timeout(Duration::from_secs(5), q.next()).await.expect("queued when due");
        assert_eq!(key, WorkKey::Pat("soon".into(), "n".into()));
        assert!(clock::now_ms() >= now + 100, "not before it was due");
        assert_eq!(r.len(), 1, "the later entry waits");
    }
}
