//! Long-poll hub: one slot per node with its current generation and a `Notify`, so a
//! generation bump wakes exactly the node that changed; plus a count of polls held per node to
//! cap them (docs/reference.md#http-api). A slot is ~80 bytes (a `watch` channel would be
//! ~500 with its eight notifiers), and every node of the fleet has one.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// Most long-polls one node may hold at once.
pub const MAX_HELD_PER_NODE: usize = 4;

#[derive(Default)]
pub struct Hub {
    nodes: Mutex<HashMap<Arc<str>, Arc<Slot>>>,
    held_total: Arc<AtomicUsize>,
}

#[derive(Default)]
struct Slot {
    generation: AtomicU64,
    changed: Notify,
    held: AtomicUsize,
    /// The node was deleted: its receivers end.
    closed: AtomicBool,
}

/// A held poll; releases its place when dropped.
pub struct HeldGuard {
    slot: Arc<Slot>,
    total: Arc<AtomicUsize>,
}

impl Drop for HeldGuard {
    fn drop(&mut self) {
        self.slot.held.fetch_sub(1, Ordering::SeqCst);
        self.total.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One node's generation as a poll last saw it.
pub struct Receiver {
    slot: Arc<Slot>,
    seen: u64,
}

/// The node was deleted while a poll waited.
#[derive(Debug, PartialEq, Eq)]
pub struct Closed;

impl Receiver {
    /// Waits until the generation differs from the one last seen, and sees it.
    pub async fn changed(&mut self) -> Result<(), Closed> {
        loop {
            let notified = self.slot.changed.notified();
            let mut notified = std::pin::pin!(notified);
            // Enabled before the check: a publish between the check and the wait still wakes.
            notified.as_mut().enable();
            if self.has_changed()? {
                self.seen = self.slot.generation.load(Ordering::SeqCst);
                return Ok(());
            }
            notified.await;
        }
    }

    pub fn has_changed(&self) -> Result<bool, Closed> {
        if self.slot.closed.load(Ordering::SeqCst) {
            return Err(Closed);
        }
        Ok(self.slot.generation.load(Ordering::SeqCst) != self.seen)
    }
}

impl Hub {
    fn slot(&self, node: &Arc<str>) -> Arc<Slot> {
        self.nodes.lock().entry(node.clone()).or_default().clone()
    }

    /// Announces `generation` for `node`, waking its held polls if it changed.
    pub fn publish(&self, node: &Arc<str>, generation: u64) {
        let slot = self.slot(node);
        if slot.generation.swap(generation, Ordering::SeqCst) != generation {
            slot.changed.notify_waiters();
        }
    }

    pub fn subscribe(&self, node: &Arc<str>) -> Receiver {
        let slot = self.slot(node);
        let seen = slot.generation.load(Ordering::SeqCst);
        Receiver { slot, seen }
    }

    /// Registers a held poll; `None` when the node already holds the maximum.
    pub fn hold(&self, node: &Arc<str>) -> Option<HeldGuard> {
        let slot = self.slot(node);
        if slot.held.fetch_add(1, Ordering::SeqCst) >= MAX_HELD_PER_NODE {
            slot.held.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        self.held_total.fetch_add(1, Ordering::SeqCst);
        Some(HeldGuard { slot, total: self.held_total.clone() })
    }

    /// Forgets a deleted node: its held polls wake and answer.
    pub fn remove(&self, node: &Arc<str>) {
        let Some(slot) = self.nodes.lock().remove(node) else { return };
        slot.closed.store(true, Ordering::SeqCst);
        slot.changed.notify_waiters();
    }

    pub fn held_total(&self) -> usize {
        self.held_total.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn publish_wakes_only_on_change_and_caps_holds() {
        let hub = Hub::default();
        let n: Arc<str> = "n1".into();
        hub.publish(&n, 1);
        let mut rx = hub.subscribe(&n);
        hub.publish(&n, 1);
        assert!(!rx.has_changed().unwrap());
        hub.publish(&n, 2);
        assert!(rx.has_changed().unwrap());
        rx.changed().await.unwrap();
        assert!(!rx.has_changed().unwrap(), "seen once it is taken");
        let guards: Vec<_> = (0..MAX_HELD_PER_NODE).map(|_| hub.hold(&n).unwrap()).collect();
        assert!(hub.hold(&n).is_none());
        assert_eq!(hub.held_total(), MAX_HELD_PER_NODE);
        drop(guards);
        assert!(hub.hold(&n).is_some());
    }

    #[tokio::test]
    async fn a_waiting_poll_wakes_on_a_bump_of_its_node_only_and_ends_when_the_node_goes() {
        let hub = Arc::new(Hub::default());
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let mut rx = hub.subscribe(&a);
        let waiting = tokio::spawn(async move { rx.changed().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        hub.publish(&b, 5);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "another node's bump does not wake it");
        hub.publish(&a, 1);
        assert_eq!(tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap(), Ok(()));

        let mut rx = hub.subscribe(&a);
        let waiting = tokio::spawn(async move { rx.changed().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        hub.remove(&a);
        assert_eq!(tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap(), Err(Closed));
    }
}
