//! Long-poll hub: one `watch` of the generation per node, so a generation bump wakes exactly
//! the node that changed; plus a count of polls held per node to cap them (SPEC §3.3).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::watch;

/// Most long-polls one node may hold at once.
pub const MAX_HELD_PER_NODE: usize = 4;

#[derive(Default)]
pub struct Hub {
    nodes: Mutex<HashMap<Arc<str>, Slot>>,
    held_total: Arc<AtomicUsize>,
}

struct Slot {
    tx: watch::Sender<u64>,
    held: Arc<AtomicUsize>,
}

/// A held poll; releases its place when dropped.
pub struct HeldGuard {
    held: Arc<AtomicUsize>,
    total: Arc<AtomicUsize>,
}

impl Drop for HeldGuard {
    fn drop(&mut self) {
        self.held.fetch_sub(1, Ordering::SeqCst);
        self.total.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Hub {
    fn slot<'a>(map: &'a mut HashMap<Arc<str>, Slot>, node: &Arc<str>) -> &'a mut Slot {
        map.entry(node.clone()).or_insert_with(|| Slot { tx: watch::channel(0).0, held: Arc::new(AtomicUsize::new(0)) })
    }

    /// Announces `generation` for `node`, waking its held polls if it changed.
    pub fn publish(&self, node: &Arc<str>, generation: u64) {
        let mut map = self.nodes.lock();
        Self::slot(&mut map, node).tx.send_if_modified(|g| {
            let changed = *g != generation;
            *g = generation;
            changed
        });
    }

    pub fn subscribe(&self, node: &Arc<str>) -> watch::Receiver<u64> {
        Self::slot(&mut self.nodes.lock(), node).tx.subscribe()
    }

    /// Registers a held poll; `None` when the node already holds the maximum.
    pub fn hold(&self, node: &Arc<str>) -> Option<HeldGuard> {
        let held = Self::slot(&mut self.nodes.lock(), node).held.clone();
        if held.fetch_add(1, Ordering::SeqCst) >= MAX_HELD_PER_NODE {
            held.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        self.held_total.fetch_add(1, Ordering::SeqCst);
        Some(HeldGuard { held, total: self.held_total.clone() })
    }

    /// Forgets a deleted node: its held polls wake (their channel closes) and answer.
    pub fn remove(&self, node: &Arc<str>) {
        self.nodes.lock().remove(node);
    }

    pub fn held_total(&self) -> usize {
        self.held_total.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(*rx.borrow_and_update(), 2);
        let guards: Vec<_> = (0..MAX_HELD_PER_NODE).map(|_| hub.hold(&n).unwrap()).collect();
        assert!(hub.hold(&n).is_none());
        assert_eq!(hub.held_total(), MAX_HELD_PER_NODE);
        drop(guards);
        assert!(hub.hold(&n).is_some());
    }
}
