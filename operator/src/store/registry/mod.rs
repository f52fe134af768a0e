//! The registry: every read path (API, long-poll, pass) reads memory. Its lock is private:
//! readers take a [`Reader`] and see the tables through its accessors; only the store's
//! write-through methods take the write side, and they change the tables through setters
//! that record each change for the pass in the same critical section (the shape of
//! kube-runtime's `reflector::Store`, where only the writer mutates). Locks are
//! `parking_lot` and are never held across `.await`.

mod changes;
mod creds;
mod load;
mod nodes;
mod pairs;
mod publish;
mod state;

pub use changes::Changes;
pub use nodes::ReportOutcome;
pub use state::{same_keys, AgentIndex, State};

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::ops::{Deref, DerefMut};
use std::panic::Location;
use std::time::{Duration, Instant};

/// A read of the registry: hold it briefly, never across `.await`.
pub type Reader<'a> = Timed<RwLockReadGuard<'a, State>>;

/// A registry lock waited for or held longer than this is logged (debug, target
/// `fleet_controller::store::registry`) with where it was taken: every task that needs the
/// registry waits behind it, and on two cores a thread blocked here is half the runtime.
const SLOW: Duration = Duration::from_millis(100);

#[derive(Default)]
pub struct Registry {
    state: RwLock<State>,
}

impl Registry {
    pub fn new(state: State) -> Registry {
        Registry { state: RwLock::new(state) }
    }

    #[track_caller]
    pub fn read(&self) -> Reader<'_> {
        Timed::take(|| self.state.read(), "read")
    }

    /// Puts a freshly loaded registry in place, for the next pass to start from scratch;
    /// returns the one it replaces.
    pub(in crate::store) fn replace(&self, mut fresh: State) -> State {
        fresh.rebuild_next();
        std::mem::replace(&mut *self.state.write(), fresh)
    }

    /// The write side, for the store's write-through methods only.
    #[track_caller]
    pub(in crate::store) fn write(&self) -> Timed<RwLockWriteGuard<'_, State>> {
        Timed::take(|| self.state.write(), "write")
    }
}

/// A registry guard that notes a slow lock: one waited for, or held, longer than [`SLOW`].
pub struct Timed<G> {
    guard: G,
    since: Instant,
    at: &'static Location<'static>,
    side: &'static str,
}

impl<G> Timed<G> {
    #[track_caller]
    fn take(lock: impl FnOnce() -> G, side: &'static str) -> Timed<G> {
        let at = Location::caller();
        let asked = Instant::now();
        let guard = lock();
        let since = Instant::now();
        let waited = since - asked;
        if waited > SLOW {
            tracing::debug!(waited_ms = waited.as_millis() as u64, side, at = %at, "waited long for the registry");
        }
        Timed { guard, since, at, side }
    }
}

impl<G> Drop for Timed<G> {
    fn drop(&mut self) {
        let held = self.since.elapsed();
        if held > SLOW {
            tracing::debug!(held_ms = held.as_millis() as u64, side = self.side, at = %self.at, "held the registry long");
        }
    }
}

impl<G: Deref> Deref for Timed<G> {
    type Target = G::Target;
    fn deref(&self) -> &G::Target {
        &self.guard
    }
}

impl<G: DerefMut> DerefMut for Timed<G> {
    fn deref_mut(&mut self) -> &mut G::Target {
        &mut self.guard
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_lock_held_long_is_logged_with_where_it_was_taken() {
        let out = Buffer::default();
        let writer = out.clone();
        let logs = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let line = tracing::subscriber::with_default(logs, || {
            let registry = Registry::default();
            drop(registry.read());
            let (guard, line) = (registry.write(), line!());
            std::thread::sleep(SLOW + Duration::from_millis(50));
            drop(guard);
            drop(registry.read());
            line
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.matches("held the registry long").count(), 1, "{text}");
        assert!(text.contains(&format!("side=\"write\" at={}:{line}:", file!())), "{text}");
    }
}
