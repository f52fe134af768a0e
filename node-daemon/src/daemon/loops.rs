//! The node's loops and how they end: each runs as a task under its name, and the node ends
//! at the first loop that ends — with the reason it sent, else saying which one stopped, so
//! that the orchestrator restarts it — or at a shutdown signal.

use super::fatal::Fatal;
use std::future::Future;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::{JoinError, JoinSet};

/// The running loops and the channel on which a loop says why the process must end.
pub(super) struct Loops {
    tasks: JoinSet<&'static str>,
    // The sender stays here while the loops run: were the loops' clones the only senders, a
    // loop that ended would also close the channel, and `recv` could win the race in `run`
    // with `None` instead of the loop's name (it did, under load in CI).
    fatal_tx: mpsc::Sender<Fatal>,
    fatal_rx: mpsc::Receiver<Fatal>,
}

impl Loops {
    pub(super) fn new() -> Loops {
        let (fatal_tx, fatal_rx) = mpsc::channel(4);
        Loops { tasks: JoinSet::new(), fatal_tx, fatal_rx }
    }

    /// A sender for a loop that may have to end the process.
    pub(super) fn fatal(&self) -> mpsc::Sender<Fatal> {
        self.fatal_tx.clone()
    }

    pub(super) fn spawn(&mut self, name: &'static str, body: impl Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(looping(name, body));
    }

    /// Waits for the first loop to end, or for a shutdown signal; then stops the others.
    pub(super) async fn run(mut self) -> Result<(), Fatal> {
        let result = tokio::select! {
            Some(f) = self.fatal_rx.recv() => Err(f),
            ended = self.tasks.join_next() => {
                // A loop that stopped on purpose (401) said why first; anything else is a fault
                // the orchestrator should restart the node for.
                Err(self.fatal_rx.try_recv().unwrap_or_else(|_| Fatal(loop_ended(ended))))
            }
            _ = shutdown_signal() => {
                tracing::info!("shutting down; agent containers keep running");
                Ok(())
            }
        };
        self.tasks.abort_all();
        result
    }
}

/// Runs one of the node's loops, named for the message if it ends. With the failpoint
/// `end-<name>` on it ends as if it had returned (tests of this supervision).
async fn looping(name: &'static str, body: impl Future<Output = ()>) -> &'static str {
    let failpoint = async {
        if !fleet_api::failpoint::enabled() {
            return std::future::pending().await;
        }
        let point = format!("end-{name}");
        while !fleet_api::failpoint::on(&point) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::select! {
        () = body => {}
        () = failpoint => {}
    }
    name
}

/// The message for a loop that ended or panicked.
fn loop_ended(ended: Option<Result<&'static str, JoinError>>) -> String {
    match ended {
        Some(Ok(name)) => format!("the node's {name} loop ended; exiting so that it is restarted"),
        Some(Err(e)) if e.is_panic() => {
            format!("one of the node's loops panicked ({e}); exiting so that it is restarted")
        }
        _ => "the node's loops ended; exiting so that it is restarted".into(),
    }
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
}
