//! The controller's core tasks under one watch (docs/behaviour.md#hardening, supervision): the pass loop, the
//! workers, the database writer, the CP watcher, the report flusher, the mirror and the
//! listeners. None of them is meant to end while the controller runs, so the first one that
//! ends or panics is reported by name and the controller exits non-zero: an orchestrator
//! restarts a process, but nobody restarts a task that died inside one that looks healthy.
//!
//! Chosen over restarting tasks in place: every task's state lives in the registry and the
//! database, which a restart reloads whole (and the liveness grace of docs/behaviour.md#node-liveness covers the
//! gap), whereas a task restarted in place would resume beside whatever broke it.

use std::collections::HashMap;
use std::future::Future;
use tokio::task::{Id, JoinSet};

/// How a core task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub task: &'static str,
    /// The panic message, when it panicked; `None` when it returned.
    pub panic: Option<String>,
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.panic {
            Some(p) => write!(f, "the {} task panicked: {p}", self.task),
            None => write!(f, "the {} task ended", self.task),
        }
    }
}

#[derive(Default)]
pub struct Supervisor {
    set: JoinSet<()>,
    names: HashMap<Id, &'static str>,
}

impl Supervisor {
    /// Runs `task` as the core task `name`. With the failpoint `end-<name>` on, it ends
    /// as if it had returned (tests of this supervision).
    pub fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let handle = self.set.spawn(async move {
            tokio::select! {
                () = task => {}
                () = failpoint(name) => {}
            }
        });
        self.names.insert(handle.id(), name);
    }

    /// Watches a task spawned elsewhere (the database writer) as the core task `name`.
    pub fn adopt(&mut self, name: &'static str, handle: tokio::task::JoinHandle<()>) {
        self.spawn(name, async move {
            if let Err(e) = handle.await {
                if e.is_panic() {
                    std::panic::resume_unwind(e.into_panic());
                }
            }
        });
    }

    /// Waits until a core task ends; pending forever when there are none.
    pub async fn ended(&mut self) -> Ended {
        let Some(result) = self.set.join_next_with_id().await else {
            return std::future::pending().await;
        };
        let (id, panic) = match result {
            Ok((id, ())) => (id, None),
            Err(e) => (e.id(), e.is_panic().then(|| panic_text(e.into_panic()))),
        };
        Ended { task: self.names.get(&id).copied().unwrap_or("unknown"), panic }
    }

    /// Stops every task (shutdown).
    pub fn abort_all(&mut self) {
        self.set.abort_all();
    }
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// Resolves once the failpoint `end-<name>` is on; never without failpoints.
async fn failpoint(name: &'static str) {
    if !fleet_api::failpoint::enabled() {
        return std::future::pending().await;
    }
    let point = format!("end-{name}");
    while !fleet_api::failpoint::on(&point) {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_task_to_end_is_named_and_a_panic_says_why() {
        let mut s = Supervisor::default();
        s.spawn("forever", std::future::pending());
        s.spawn("short", async {});
        assert_eq!(s.ended().await, Ended { task: "short", panic: None });
        s.spawn("broken", async { panic!("out of cheese") });
        let e = s.ended().await;
        assert_eq!(e, Ended { task: "broken", panic: Some("out of cheese".into()) });
        assert_eq!(e.to_string(), "the broken task panicked: out of cheese");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        s.adopt("writer", tokio::spawn(async move { drop(rx.await) }));
        drop(tx);
        assert_eq!(s.ended().await.task, "writer");
    }
}
