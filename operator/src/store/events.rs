//! The event history (docs/behaviour.md#events): recorded where the state changes, in memory first (a
//! bounded queue, so recording never waits), written by the report flusher every second,
//! and kept bounded in the database — the last [`KEEP_TOTAL`], at most [`KEEP_PER_SUBJECT`]
//! per agent or node — so it survives a restart.

use super::db::sql::{on, pg, sqlite, Pool};
use super::db::{Db, DbError};
pub use super::records::event::{Batch, Event, Filter, Kind, PER_PASS};
use fleet_api::EventView;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Events kept in the database at most.
pub const KEEP_TOTAL: i64 = 10_000;
/// Events kept per agent and per node at most.
pub const KEEP_PER_SUBJECT: i64 = 100;
/// Events one call returns at most.
pub const PAGE: u32 = 500;
/// Events waiting for the flusher at most; past it the oldest are dropped and counted.
const PENDING_MAX: usize = 20_000;

/// Events recorded and not yet written.
#[derive(Default)]
pub struct Pending {
    queue: Mutex<VecDeque<Event>>,
    pub dropped: AtomicU64,
    /// A pass wrote events with its rows and left the trimming to the next flush: a pass's
    /// transaction does not pay for a walk of the whole history.
    untrimmed: AtomicBool,
}

impl Pending {
    pub fn record(&self, e: Event) {
        tracing::debug!(kind = e.kind.as_str(), agent = ?e.agent, node = ?e.node, message = %e.message, "event");
        let mut q = self.queue.lock();
        if q.len() >= PENDING_MAX {
            q.pop_front();
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        q.push_back(e);
    }

    pub fn record_all(&self, events: Vec<Event>) {
        for e in events {
            self.record(e);
        }
    }

    /// A pass wrote events of its own: the next flush trims the history.
    pub fn written_by_pass(&self) {
        self.untrimmed.store(true, Ordering::Relaxed);
    }

    fn take(&self) -> Vec<Event> {
        self.queue.lock().drain(..).collect()
    }

    /// Puts back events whose write failed, ahead of newer ones.
    fn restore(&self, events: Vec<Event>) {
        let mut q = self.queue.lock();
        for e in events.into_iter().rev() {
            if q.len() >= PENDING_MAX {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            q.push_front(e);
        }
    }
}

/// Writes the pending events and trims the history; returns how many were written.
pub async fn flush(db: &Db, pending: &Pending) -> Result<usize, DbError> {
    let events = pending.take();
    let untrimmed = pending.untrimmed.swap(false, Ordering::Relaxed);
    if events.is_empty() && !untrimmed {
        return Ok(0);
    }
    match on!(db.pool(), write_events(&events, KEEP_PER_SUBJECT, KEEP_TOTAL)) {
        Ok(()) => Ok(events.len()),
        Err(e) => {
            pending.untrimmed.fetch_or(untrimmed, Ordering::Relaxed);
            pending.restore(events);
            Err(e)
        }
    }
}

pub async fn read(db: &Db, f: &Filter) -> Result<Vec<EventView>, DbError> {
    let limit = i64::from(f.limit.clamp(1, PAGE));
    on!(db.pool(), read_events(f, limit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Id;

    use crate::store::db::testing::{count, each};

    /// The history stays bounded per agent, per node and in all, and reads page by `since`.
    #[tokio::test]
    async fn history_is_bounded_per_subject_and_in_all_and_pages_by_seq() {
        for fresh in each() {
            eprintln!("on {}", fresh.backend);
            let db = Db::open(&fresh.url).await.unwrap();
            history_on(&db).await;
        }
    }

    async fn history_on(pool: &Db) {
        let pending = Pending::default();
        let (a, n, name): (Id, Id, Id) = ("a".into(), "n-id".into(), "n".into());
        for i in 0..150 {
            pending.record(Event::new(Kind::ReplicaPlaced, format!("a {i}")).agent(&a).replica(0));
            pending.record(Event::new(Kind::NodeOnline, format!("n {i}")).node(&n, &name));
        }
        assert_eq!(flush(pool, &pending).await.unwrap(), 300);
        let of_a = read(pool, &Filter { agent: Some("a".into()), limit: 500, ..Default::default() }).await.unwrap();
        assert_eq!(of_a.len(), 100);
        assert_eq!(of_a[0].message, "a 50", "the oldest are trimmed first");
        let by_name = read(pool, &Filter { node: Some("n".into()), limit: 500, ..Default::default() }).await.unwrap();
        let by_id = read(pool, &Filter { node: Some("n-id".into()), limit: 500, ..Default::default() }).await.unwrap();
        assert_eq!((by_name.len(), by_id.len()), (100, 100));
        let page = read(pool, &Filter { since: of_a[9].seq, limit: 3, ..Default::default() }).await.unwrap();
        assert_eq!(page.len(), 3);
        assert!(page.iter().all(|e| e.seq > of_a[9].seq) && page.windows(2).all(|w| w[0].seq < w[1].seq));
        // Newest first: the last ten of the agent's, then the ten before them.
        let newest = Filter { agent: Some("a".into()), limit: 10, newest_first: true, ..Default::default() };
        let first = read(pool, &newest).await.unwrap();
        let messages: Vec<_> = first.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(messages[..3], ["a 149", "a 148", "a 147"]);
        let back = read(pool, &Filter { before: Some(first[9].seq), ..newest.clone() }).await.unwrap();
        assert_eq!((back[0].message.as_str(), back[9].message.as_str()), ("a 139", "a 130"));

        // In all: many subjects, each under its own bound.
        for i in 0..(KEEP_TOTAL + 500) {
            let key: Id = format!("agent-{i}").into();
            pending.record(Event::new(Kind::AgentPhase, "running").agent(&key));
        }
        flush(pool, &pending).await.unwrap();
        assert_eq!(count(pool, "events").await, KEEP_TOTAL);
        let all = read(pool, &Filter { limit: 10_000, ..Default::default() }).await.unwrap();
        assert_eq!(all.len(), PAGE as usize, "one call returns at most {PAGE}");
    }

    /// Events a pass wrote with its rows are trimmed by the next flush, even one with nothing
    /// of its own to write.
    #[tokio::test]
    async fn events_a_pass_wrote_are_trimmed_by_the_next_flush() {
        for fresh in each() {
            eprintln!("on {}", fresh.backend);
            let db = crate::store::db::testing::open_leading(&fresh.url).await;
            let a: Id = "a".into();
            let events = (0..KEEP_PER_SUBJECT + 10).map(|i| Event::new(Kind::RolloutStep, i.to_string()).agent(&a));
            let w = crate::store::db::PassWrite { events: events.collect(), ..Default::default() };
            db.apply_pass(&w).await.unwrap();
            let pending = Pending::default();
            assert_eq!(flush(&db, &pending).await.unwrap(), 0);
            assert_eq!(count(&db, "events").await, KEEP_PER_SUBJECT + 10, "no flush without a reason");
            pending.written_by_pass();
            assert_eq!(flush(&db, &pending).await.unwrap(), 0);
            assert_eq!(count(&db, "events").await, KEEP_PER_SUBJECT);
        }
    }

    #[test]
    fn a_pass_records_a_bounded_number_and_summarises_the_rest() {
        let mut b = Batch::default();
        for i in 0..PER_PASS + 30 {
            b.push(Event::new(if i % 2 == 0 { Kind::ReplicaPlaced } else { Kind::ReplicaMoved }, "x"));
        }
        let events = b.finish();
        assert_eq!(events.len(), PER_PASS + 2);
        let summaries: Vec<&str> = events[PER_PASS..].iter().map(|e| e.message.as_str()).collect();
        assert_eq!(
            summaries,
            [
                "15 more replica_placed events in this pass (a pass records 1000 one by one)",
                "15 more replica_moved events in this pass (a pass records 1000 one by one)"
            ]
        );

        // Those taken out for a commit in the middle of the pass still count.
        let mut b = Batch::default();
        for _ in 0..PER_PASS - 1 {
            b.push(Event::new(Kind::RolloutStep, "x"));
        }
        assert_eq!(b.take_recorded().len(), PER_PASS - 1);
        for _ in 0..3 {
            b.push(Event::new(Kind::RolloutStep, "y"));
        }
        let rest: Vec<String> = b.finish().into_iter().map(|e| e.message).collect();
        assert_eq!(rest, ["y", "2 more rollout_step events in this pass (a pass records 1000 one by one)"]);
    }

    #[test]
    fn the_pending_queue_drops_its_oldest_past_its_bound() {
        let p = Pending::default();
        for i in 0..PENDING_MAX + 5 {
            p.record(Event::new(Kind::NodeOnline, i.to_string()));
        }
        assert_eq!(p.dropped.load(Ordering::Relaxed), 5);
        let taken = p.take();
        assert_eq!(taken.len(), PENDING_MAX);
        assert_eq!(taken[0].message, "5");
    }
}
