//! The reconciler's context: the services it shares with the rest of the controller
//! ([`crate::context::Context`]) and its own work — the keyed work queue and the PAT rotation
//! schedule, which no one outside the reconciler touches.

use super::key::WorkKey;
use super::queue::{Backoff, WorkQueue};
use super::rotating::Rotating;
use super::rotation::Rotations;
use std::time::Duration;

/// What the pass, the workers and the audit take.
pub type Ctx = crate::context::Context<Work>;

/// The reconciler's own queue and schedule.
pub struct Work {
    pub queue: WorkQueue<WorkKey>,
    /// When each live PAT is rotated (its work is queued then).
    pub rotations: Rotations,
    /// PAT rotations under way, each a step in its agent's disruption budget.
    pub rotating: Rotating,
}

impl Default for Work {
    fn default() -> Work {
        Work {
            // A status refresh waits for the work a replica placed needs: its identity, its PAT.
            queue: WorkQueue::with_lanes(
                Backoff { base: Duration::from_secs(1), max: Duration::from_secs(300) },
                |k| matches!(k, WorkKey::Status(_)),
            ),
            rotations: Rotations::default(),
            rotating: Rotating::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new leader's status refreshes, wanted first (20,000 of them, fed to the queue), do not
    /// hold back the PAT of a replica placed after them: it is the next key a worker takes.
    #[tokio::test]
    async fn a_pat_of_a_new_placement_goes_before_any_status_refresh() {
        let work = std::sync::Arc::new(Work::default());
        let feeder = work.clone();
        tokio::spawn(async move {
            feeder.rotations.run(&feeder.queue, Duration::ZERO, |_: &crate::model::Id| Vec::new()).await
        });
        work.rotations.want_now((0..20_000).map(|i| WorkKey::Status(format!("agent-{i:05}").into())));
        let pat = WorkKey::Pat("new".into(), "n1".into());
        work.rotations.want_now([pat.clone()]);
        for _ in 0..500 {
            if work.queue.scheduled(&pat) && work.queue.depth() > 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert!(work.queue.scheduled(&pat), "the PAT was fed to the queue");
        assert!(work.queue.depth() > 1, "statuses wait in the queue too: {}", work.queue.depth());
        tokio::time::sleep(Duration::from_millis(20)).await;
        let first = tokio::time::timeout(Duration::from_secs(5), work.queue.next()).await.expect("a key");
        assert_eq!(first, pat, "taken before the statuses queued ahead of it");
    }
}
