//! An observed report: taken into memory first, normalised (lists sorted, images only of
//! announced kinds), split once under the node's allowance into what it may claim and what is
//! refused (docs/behaviour.md#what-a-node-may-claim), and persisted by the flusher a chunk of
//! nodes at a time.

use super::db::DbError;
use super::parts::Parts;
use super::records::claims::{claimed_of, refused_changed, refused_event};
use super::records::node::sorted;
use super::records::{NodeInfo, Seen};
use super::registry::ReportOutcome;
use crate::model::Id;
use fleet_api::ObservedReport;
use std::time::Duration;

/// Nodes whose reports one transaction writes ([`Parts::flush_reports`]). Each chunk's rows
/// are held three times while it is written — serialised, copied by sqlx into its
/// arguments, and copied again by SQLite — ~9 MB for 1,000 nodes of ten replicas, which a
/// fleet-wide change's reports added to its passes' own peak
/// (docs/performance.md#whole-program-lto-the-eleventh-run).
pub const FLUSH_CHUNK: usize = 250;

/// Nodes one flush writes at most; the rest wait for the next (a second away).
const FLUSH_MOST: usize = 20_000;

impl Parts {
    /// Takes an observed report (validated). Memory first; the flusher persists it.
    pub fn report(&self, node: &Id, r: ObservedReport, now: i64, offline_after: Duration) -> ReportOutcome {
        // Normalised before the lock is taken: nothing in it reads the registry.
        let secrets = sorted(&r.secrets);
        let claimed = claimed_of(&r.labels, &r.executor_kinds, &r.executor_images, &r.executor_secrets, &secrets);
        let mut st = self.registry.write();
        let Some(rec) = st.node(node) else { return ReportOutcome::Stale };
        if let (Some(b), Some(seq), Some((old_b, old_seq))) = (&r.boot_id, r.seq, st.last_report(node)) {
            if b == old_b && seq <= old_seq {
                return ReportOutcome::Stale;
            }
        }
        // Kept until the next report, at its length, each agent's key the list's own. Collected
        // into a vector of its own: collected in place, it would keep the parsed list's
        // buffer, grown by doubling for the wire's larger items (1.4 KB a node with ten
        // replicas instead of 720 bytes).
        let index = st.agent_index();
        let known = |key: &str| index.get_key_value(key).map(|(k, _)| k.clone());
        let busy = super::records::node::busy_of(&r.replicas, now);
        let mut replicas: Vec<Seen> = Vec::with_capacity(r.replicas.len());
        replicas.extend(r.replicas.into_iter().map(|p| Seen::of(p, known)));
        let mut info = NodeInfo {
            capacity: r.capacity,
            secrets,
            version: r.version,
            health: Some(r.health),
            observe_seconds: r.observe_seconds,
            replicas,
            maintenance_windows: NodeInfo::windows_from(&r.maintenance_windows),
            applied_generation: r.applied_generation,
            boot_id: r.boot_id.map(Into::into),
            seq: r.seq,
            ..Default::default()
        };
        info.admit(claimed, rec.allowed.as_deref());
        // The event is about a change of what is refused, not every report that repeats it.
        let refused = refused_changed(&rec.info, &info).then(|| info.refused_facts());
        let name = rec.name.clone();
        let mut outcome = st.observe(node, info, now, now, offline_after, true);
        if st.set_busy(node, busy) {
            if let ReportOutcome::Accepted { changed, .. } = &mut outcome {
                *changed = true;
            }
        }
        drop(st);
        if let Some(refused) = refused.filter(|r| !r.is_empty()) {
            tracing::warn!(node = %name, refused = %refused.describe(), "node claims what its allowance refuses");
            self.events.record(refused_event(&refused).node(node, &name));
        }
        outcome
    }

    /// Persists reported node state; called periodically and at shutdown. Returns how many
    /// nodes were written. A fleet that reports at once (10,000 nodes coming up, a burst) is
    /// serialised and written [`FLUSH_CHUNK`] nodes at a time: all at once its rows would be
    /// ~15 MB held together. Nodes whose rows could not be written stay dirty.
    pub async fn flush_reports(&self) -> Result<usize, DbError> {
        self.flush_reports_by(FLUSH_CHUNK).await
    }

    pub async fn flush_reports_by(&self, chunk: usize) -> Result<usize, DbError> {
        let mut written = 0;
        loop {
            let (ids, rows) = self.registry.write().take_dirty(chunk);
            if rows.is_empty() {
                return Ok(written);
            }
            if let Err(e) = self.db.update_nodes(&rows).await {
                self.registry.write().mark_dirty(ids);
                return Err(e);
            }
            written += rows.len();
            // Reports that land meanwhile wait for the next flush (a second away).
            if ids.len() < chunk || written >= FLUSH_MOST.max(chunk) {
                return Ok(written);
            }
        }
    }
}
