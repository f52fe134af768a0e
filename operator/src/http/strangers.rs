//! The one budget for bytes held for peers that have not authenticated
//! (docs/behaviour.md#hardening): unfinished request heads and join bodies. Each connection is
//! a [`Guest`] that says how many such bytes it holds before it holds them; when a byte would
//! take the total past `FLEET_UNAUTH_BUFFER_BYTES`, the connection holding the most is closed
//! and counted, so a node's head of a few hundred bytes keeps passing while 60 KiB heads are
//! shed. The per-connection deadlines bound how long bytes are held; this bounds how many.
//!
//! A guest also counts the credentials that failed on its connection (the third closes it)
//! and keeps the connection's place in `FLEET_MAX_CONNECTIONS_PER_IP`: what the listener
//! knows of a connection that has not proven itself lives in one allocation, not in every
//! connection's task.
//!
//! The ledger is one lock, never held across an `.await`: holders by size in a `BTreeSet`, so
//! the largest is found in O(log n). A connection that holds nothing (a node waiting on its
//! long-poll) is not in it.

use super::limits::MAX_FAILED_CREDENTIALS;
use super::peers::AddressSlot;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use tokio::task::AbortHandle;

/// The budget every unauthenticated buffer of one listener comes out of.
pub struct Strangers {
    limit: usize,
    ledger: Mutex<Ledger>,
    next_id: AtomicU64,
    /// Connections closed to stay within the budget.
    shed: Counter,
    /// Bytes held right now.
    held: Gauge,
}

#[derive(Default)]
struct Ledger {
    total: usize,
    /// (bytes, guest id) of every holder: the largest is the last.
    by_size: BTreeSet<(usize, u64)>,
    holders: FxHashMap<u64, (usize, Weak<Guest>)>,
}

/// One connection's share of the budget. Dropping it returns what it held.
pub struct Guest {
    id: u64,
    budget: Arc<Strangers>,
    /// Closes the connection's task when it is shed while it waits.
    task: OnceLock<AbortHandle>,
    /// Shed: the connection may hold nothing more (its task may not have been aborted yet,
    /// when it was shed before its abort handle was known).
    shed: AtomicBool,
    /// In the ledger (holds more than nothing).
    listed: AtomicBool,
    /// `401`s answered on the connection.
    refused: AtomicU8,
    /// Released with the connection.
    _address: Option<AddressSlot>,
}

impl Strangers {
    pub fn new(limit: usize, shed: Counter, held: Gauge) -> Arc<Strangers> {
        Arc::new(Strangers { limit, ledger: Mutex::new(Ledger::default()), next_id: AtomicU64::new(0), shed, held })
    }

    /// A share for a new connection, which keeps its per-address `address` slot;
    /// [`Guest::closes`] tells it how to close that connection.
    pub fn guest(self: &Arc<Self>, address: Option<AddressSlot>) -> Arc<Guest> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        Arc::new(Guest {
            id,
            budget: self.clone(),
            task: OnceLock::new(),
            shed: AtomicBool::new(false),
            listed: AtomicBool::new(false),
            refused: AtomicU8::new(0),
            _address: address,
        })
    }

    /// Bytes held by every guest together.
    pub fn total(&self) -> usize {
        self.ledger.lock().total
    }
}

impl Ledger {
    fn forget(&mut self, id: u64) -> Option<Weak<Guest>> {
        let (held, guest) = self.holders.remove(&id)?;
        self.by_size.remove(&(held, id));
        self.total -= held;
        Some(guest)
    }

    /// Sets what `guest` holds to `bytes`, first shedding the largest holders while the
    /// total would pass `limit`. The guests shed, `guest` among them when it is the largest
    /// (then it holds nothing).
    fn hold(&mut self, guest: &Arc<Guest>, bytes: usize, limit: usize) -> SmallVec<[Weak<Guest>; 2]> {
        let mut shed = SmallVec::new();
        self.forget(guest.id);
        while self.total + bytes > limit {
            match self.by_size.last().copied() {
                Some((largest, id)) if largest > bytes => shed.extend(self.forget(id)),
                // This one is the largest (a tie included): it goes.
                _ => {
                    shed.push(Arc::downgrade(guest));
                    return shed;
                }
            }
        }
        if bytes > 0 {
            self.by_size.insert((bytes, guest.id));
            self.holders.insert(guest.id, (bytes, Arc::downgrade(guest)));
            self.total += bytes;
        }
        shed
    }
}

impl Guest {
    /// Tells the guest which task to abort when it is shed.
    pub fn closes(&self, task: AbortHandle) {
        let _ = self.task.set(task);
        // Shed before it knew its task: close it now.
        if self.shed.load(Ordering::Acquire) {
            self.close();
        }
    }

    /// Declares that this connection now holds `bytes` for a peer not yet authenticated
    /// (before allocating them). `false`: the budget cannot hold them and this connection is
    /// the largest holder; it must close.
    pub fn hold(self: &Arc<Self>, bytes: usize) -> bool {
        if self.shed.load(Ordering::Acquire) {
            return false;
        }
        if bytes == 0 && !self.listed.load(Ordering::Relaxed) {
            return true;
        }
        let budget = &self.budget;
        let (shed, total) = {
            let mut ledger = budget.ledger.lock();
            let shed = ledger.hold(self, bytes, budget.limit);
            (shed, ledger.total)
        };
        budget.held.set(total as i64);
        let mut me = false;
        for guest in shed.iter().filter_map(Weak::upgrade) {
            budget.shed.inc();
            if Arc::ptr_eq(&guest, self) {
                me = true;
            } else {
                guest.close();
            }
        }
        let listed = !me && bytes > 0;
        self.listed.store(listed, Ordering::Relaxed);
        if me {
            // Its own task ends at its next wait, whichever path it is on.
            self.close();
        }
        !me
    }

    /// Counts a `401` answered on the connection; `true` at the third, after which the
    /// connection closes (docs/behaviour.md#hardening).
    pub fn refused(&self) -> bool {
        self.refused.fetch_add(1, Ordering::AcqRel).saturating_add(1) >= MAX_FAILED_CREDENTIALS
    }

    /// Holds nothing any more: the peer authenticated, or its buffer is gone.
    pub fn release(self: &Arc<Self>) {
        self.hold(0);
    }

    fn close(&self) {
        self.shed.store(true, Ordering::Release);
        if let Some(task) = self.task.get() {
            task.abort();
        }
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if self.listed.load(Ordering::Relaxed) {
            let mut ledger = self.budget.ledger.lock();
            ledger.forget(self.id);
            self.budget.held.set(ledger.total as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(limit: usize) -> Arc<Strangers> {
        Strangers::new(limit, Counter::default(), Gauge::default())
    }

    #[test]
    fn the_largest_holder_is_shed_and_small_ones_pass() {
        let b = budget(100);
        let (big, mid, small) = (b.guest(None), b.guest(None), b.guest(None));
        assert!(big.hold(60));
        assert!(mid.hold(30));
        assert!(small.hold(5));
        assert_eq!(b.total(), 95);
        // 95 + 10 > 100: the 60-byte holder goes, the small one grows.
        assert!(small.hold(15));
        assert!(big.shed.load(Ordering::Relaxed));
        assert!(!big.hold(1), "a shed guest holds nothing more");
        assert_eq!(b.total(), 45);
        assert_eq!(b.shed.get(), 1);
    }

    #[test]
    fn a_guest_that_is_itself_the_largest_is_refused() {
        let b = budget(100);
        let (a, c) = (b.guest(None), b.guest(None));
        assert!(a.hold(40));
        assert!(!c.hold(70), "70 is more than anyone else holds");
        assert_eq!(b.total(), 40);
        assert!(!a.shed.load(Ordering::Relaxed));
        assert!(!c.hold(0), "shed for good");
    }

    #[test]
    fn what_a_guest_held_comes_back_when_it_releases_or_goes() {
        let b = budget(100);
        let (a, c) = (b.guest(None), b.guest(None));
        assert!(a.hold(50));
        assert!(c.hold(50));
        a.release();
        assert_eq!(b.total(), 50);
        drop(c);
        assert_eq!(b.total(), 0);
        assert!(b.ledger.lock().holders.is_empty());
    }

    /// Every connection of the API port has a guest: 10,000 nodes keep 10,000.
    #[test]
    fn a_guest_is_small() {
        let size = std::mem::size_of::<Guest>();
        eprintln!("a guest: {size} bytes");
        assert!(size <= 80, "a guest is {size} bytes");
    }

    #[tokio::test]
    async fn a_shed_guest_s_task_is_aborted() {
        let b = budget(100);
        let (a, c) = (b.guest(None), b.guest(None));
        let task = tokio::spawn(std::future::pending::<()>());
        a.closes(task.abort_handle());
        assert!(a.hold(80));
        assert!(c.hold(30));
        assert!(task.await.unwrap_err().is_cancelled());
    }
}
