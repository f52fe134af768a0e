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

/// A read of the registry: hold it briefly, never across `.await`.
pub type Reader<'a> = RwLockReadGuard<'a, State>;

#[derive(Default)]
pub struct Registry {
    state: RwLock<State>,
}

impl Registry {
    pub fn new(state: State) -> Registry {
        Registry { state: RwLock::new(state) }
    }

    pub fn read(&self) -> Reader<'_> {
        self.state.read()
    }

    /// Puts a freshly loaded registry in place, for the next pass to start from scratch;
    /// returns the one it replaces.
    pub(in crate::store) fn replace(&self, mut fresh: State) -> State {
        fresh.rebuild_next();
        std::mem::replace(&mut *self.state.write(), fresh)
    }

    /// The write side, for the store's write-through methods only.
    pub(in crate::store) fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write()
    }
}
