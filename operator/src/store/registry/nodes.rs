//! The registry's node writers: a node joining, reporting, rejoining, changing lifecycle,
//! followed from another replica's write, and deleted. Each records its change for the pass.

use super::load::node_from_row;
use super::state::State;
use crate::model::Id;
use crate::store::db::NodeRow;
use crate::store::records::claims::refused_changed;
use crate::store::records::{Deleted, DesiredRec, DrainProgress, Lifecycle, NodeInfo, NodeRec};
use fleet_api::claims::{Allowance, RefusedFacts};
use std::sync::Arc;
use std::time::Duration;

impl State {
    /// Puts a node in the registry with its token and name indexes.
    pub(super) fn insert_node(&mut self, rec: NodeRec) {
        self.by_token.insert(rec.token_hash, rec.id.clone());
        self.by_name.insert(rec.name.clone(), rec.id.clone());
        self.read_windows(&rec.id, &rec.name, rec.info.windows());
        self.nodes.insert(rec.id.clone(), Box::new(rec));
    }

    /// A node's maintenance windows, read again from what it announced.
    fn read_windows(&mut self, id: &Id, name: &str, list: &[fleet_api::windows::MaintenanceWindow]) {
        match crate::store::records::node::windows_of(name, list) {
            Some(w) => self.windows.insert(id.clone(), w),
            None => self.windows.remove(id),
        };
    }

    /// A node's maintenance windows (none: always open).
    pub fn node_windows(&self, node: &Id) -> &[fleet_api::windows::Window] {
        self.windows.get(node).map(|w| &**w).unwrap_or_default()
    }

    /// A node that joined now (here or on another replica): in the registry, in the pass's
    /// changes, and with the first desired state unless it has one. Returns whether that
    /// desired state was made (its long-polls are to be woken with generation 1).
    pub(in crate::store) fn add_joined_node(&mut self, rec: NodeRec) -> bool {
        let id = rec.id.clone();
        self.insert_node(rec);
        self.changes.facts.insert(id.clone());
        if self.desired.contains_key(&id) {
            return false;
        }
        self.desired.insert(id, DesiredRec::new(1, "[]"));
        true
    }

    /// Gives node `id` the token hashing to `new`: the previous token stops working.
    pub(in crate::store) fn set_token(&mut self, id: &Id, new: [u8; 32]) {
        let Some(rec) = self.nodes.get_mut(id) else { return };
        let old = std::mem::replace(&mut rec.token_hash, new);
        if old != new {
            self.by_token.remove(&old);
            self.by_token.insert(new, id.clone());
        }
    }

    /// Takes what a node reported (normalised) and seen at `seen_ms`, recording what changed
    /// for the pass. Whether the node was online before it is judged at `now`, as the pass
    /// judges it (a report read back from another replica was seen a moment earlier).
    /// `persist`: the database copy is older (a report taken here, not one read back from
    /// another replica's write).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::store) fn observe(
        &mut self,
        node: &Id,
        info: NodeInfo,
        seen_ms: i64,
        now: i64,
        offline_after: Duration,
        persist: bool,
    ) -> ReportOutcome {
        let Some(rec) = self.nodes.get_mut(node) else { return ReportOutcome::Stale };
        // Compared after normalising, so list order alone is never a change.
        let old = &rec.info;
        let facts_changed = old.labels != info.labels
            || old.executor_kinds != info.executor_kinds
            || old.executor_images != info.executor_images
            || old.capacity != info.capacity
            || old.secrets != info.secrets
            || old.executor_secrets != info.executor_secrets
            || old.maintenance_windows != info.maintenance_windows;
        let reports_changed = old.replicas != info.replicas || old.health != info.health;
        let period_changed = old.observe_seconds != info.observe_seconds;
        let was_online = rec.online(now, offline_after);
        let applied = info.applied_generation;
        let ahead = self.desired.get(node).is_some_and(|d| applied > d.generation);
        rec.last_seen_ms = seen_ms.max(rec.last_seen_ms);
        rec.reported = true;
        let windows_changed = (rec.info.maintenance_windows != info.maintenance_windows)
            .then(|| (rec.name.clone(), info.windows().to_vec()));
        rec.set_info(info);
        if let Some((name, list)) = windows_changed {
            self.read_windows(node, &name, &list);
        }
        // The node has the body of the generation it applied, whichever replica served it:
        // a replica that did not serve it learns so only here, and would hold it otherwise.
        self.delivered(node, applied);
        if persist {
            self.dirty_nodes.insert(node.clone());
        }
        if facts_changed {
            self.changes.facts.insert(node.clone());
        }
        if reports_changed {
            self.changes.reports.insert(node.clone());
        }
        if !was_online || period_changed {
            self.changes.seen.insert(node.clone());
        }
        if ahead {
            self.changes.ahead.insert(node.clone());
        }
        ReportOutcome::Accepted { changed: facts_changed || reports_changed || ahead, was_online }
    }

    /// A node's busy replicas as its last report says ([`crate::store::records::node::busy_of`]);
    /// a change is a change of its reports for the pass. Whether it changed.
    pub(in crate::store) fn set_busy(&mut self, node: &Id, busy: Option<Box<[u32]>>) -> bool {
        let changed = match &busy {
            Some(b) => self.busy.insert(node.clone(), b.clone()).as_deref() != Some(&**b),
            None => self.busy.remove(node).is_some(),
        };
        if changed {
            self.changes.reports.insert(node.clone());
        }
        changed
    }

    /// Until when (ms) a replica said it is busy, if after `now_ms` (docs/behaviour.md#busy-replicas).
    pub fn busy_until_ms(&self, node: &Id, agent: &str, replica: u32, now_ms: i64) -> Option<i64> {
        let busy = self.busy.get(node)?;
        self.nodes.get(node)?.info.busy_until_ms(Some(busy), agent, replica, now_ms)
    }

    /// Every busy replica whose lease ends after `now_ms` with its node and the lease's end:
    /// (node, agent, replica, until ms). Walks only the nodes that have one.
    pub fn busy_leases(&self, now_ms: i64) -> impl Iterator<Item = (&Id, &str, u32, i64)> + '_ {
        self.busy.iter().filter_map(|(id, b)| Some((id, self.nodes.get(id)?, b))).flat_map(move |(id, n, b)| {
            n.info.replicas.iter().zip(b.iter()).filter_map(move |(p, &secs)| {
                let until = i64::from(secs) * 1000;
                (until > now_ms).then_some((id, &*p.agent_key, p.replica, until))
            })
        })
    }

    /// Every replica that says it is busy now: (agent, replica). Only nodes with a busy replica
    /// are looked at.
    pub fn busy_replicas(&self, now_ms: i64) -> Vec<(Arc<str>, u32)> {
        self.busy_leases(now_ms).map(|(_, agent, replica, _)| (Arc::from(agent), replica)).collect()
    }

    /// A node's replicas as the API shows them, with their busy leases.
    pub fn replica_reports(&self, n: &NodeRec, now_ms: i64) -> Vec<fleet_api::ReplicaReport> {
        n.info.reports(self.busy.get(&n.id).map(|b| &**b), now_ms)
    }
}

impl State {
    /// Gives a node another allowance and splits what it last claimed again under it, so the
    /// change reaches placement now, not with the node's next report. Returns the node's name
    /// and, when the refused labels or kinds changed, what is refused now.
    pub(in crate::store) fn put_allowance(
        &mut self,
        id: &Id,
        allowed: Option<Box<Allowance>>,
    ) -> Option<(Id, Option<RefusedFacts>)> {
        let rec = self.nodes.get_mut(id)?;
        let before = rec.info.refused_facts();
        rec.allowed = allowed;
        rec.readmit();
        let after = rec.info.refused_facts();
        let refused = (after != before).then_some(after);
        let name = rec.name.clone();
        // Not marked dirty: the stored report keeps the split it was written with, and every
        // read of a stored row splits it again under the stored allowance; writing this copy
        // could put an older report over one another replica took.
        self.changes.facts.insert(id.clone());
        Some((name, refused))
    }

    /// Sets a node's lifecycle and records the change for the pass.
    pub(in crate::store) fn put_lifecycle(&mut self, id: &Id, after: Lifecycle) {
        if let Some(n) = self.nodes.get_mut(id) {
            n.lifecycle = after;
        }
        if after.draining().is_none() {
            self.drains.remove(id);
        } else if !self.drains.contains_key(id) {
            // Until the next pass says otherwise, everything bound there remains (one
            // scan of the bindings per drain asked: an admin's action, not a hot path).
            let remaining = self.outcome.bindings.count_on(id);
            self.drains.insert(id.clone(), DrainProgress { remaining, blocked: Vec::new() });
        }
        self.changes.facts.insert(id.clone());
    }

    /// Removes every trace of a deleted node from the registry.
    pub(in crate::store) fn forget_node(&mut self, rec: &NodeRec, now: i64) -> Deleted {
        let id = rec.id.clone();
        self.by_token.remove(&rec.token_hash);
        self.deleted_tokens.insert(rec.token_hash);
        self.by_name.remove(&rec.name);
        self.desired.remove(&id);
        self.desired_hashes.remove(&id);
        self.dirty_nodes.remove(&id);
        self.drains.remove(&id);
        self.busy.remove(&id);
        self.windows.remove(&id);
        let live: Vec<((Id, Id), Id)> = self
            .pairs
            .of_node(&id)
            .iter()
            .filter_map(|(agent, p)| Some(((agent.clone(), id.clone()), Id::from(p.live.as_ref()?.id()))))
            .collect();
        let retiring: Vec<((Id, Id), Id)> = self
            .retiring
            .values()
            .filter(|r| r.pair.1 == id)
            .map(|r| (r.pair.clone(), Id::from(r.cred.id())))
            .collect();
        let mut revoke = Vec::new();
        for (pair, cid) in live.into_iter().chain(retiring) {
            self.schedule_revoke(&pair, &cid, |at| at.map_or(now, |at| at.min(now)));
            revoke.push(cid.to_string());
        }
        self.pairs.remove_node(&id);
        self.changes.rebuild = true;
        self.changes.revoke_now.extend(revoke.iter().cloned());
        Deleted { id, name: rec.name.clone(), revoke }
    }
}

impl State {
    /// Takes another replica's copy of a node this replica knows: its token and lifecycle
    /// always (they change only by a join or an admin, in the database first), its report
    /// when it is newer than the one held here (a later sequence of the same boot, or a
    /// later sighting of another boot). `true` when the pass has work from it.
    pub(in crate::store) fn follow_node(&mut self, stored: NodeRec, now: i64, offline_after: Duration) -> bool {
        let id = stored.id.clone();
        self.set_token(&id, stored.token_hash);
        let Some(rec) = self.nodes.get(&id) else { return false };
        let lifecycle_changed = rec.lifecycle != stored.lifecycle;
        let allowance_changed = rec.allowed != stored.allowed;
        let newer = newer_report(&rec.info, rec.last_seen_ms, &stored.info, stored.last_seen_ms);
        if lifecycle_changed {
            self.put_lifecycle(&id, stored.lifecycle);
        }
        // An allowance changed elsewhere: what this replica holds is split again under it.
        if allowance_changed {
            self.put_allowance(&id, stored.allowed.clone());
        }
        let lifecycle_changed = lifecycle_changed || allowance_changed;
        if newer {
            let seen = self.observe(&id, stored.info, stored.last_seen_ms, now, offline_after, false);
            return lifecycle_changed
                || matches!(seen, ReportOutcome::Accepted { changed, was_online } if changed || !was_online);
        }
        // The same report, seen later elsewhere: a sighting that may bring the node back.
        let Some(rec) = self.nodes.get_mut(&id) else { return lifecycle_changed };
        let was_online = rec.online(now, offline_after);
        rec.last_seen_ms = rec.last_seen_ms.max(stored.last_seen_ms);
        let back = !was_online && rec.online(now, offline_after);
        if back {
            self.changes.seen.insert(id);
        }
        lifecycle_changed || back
    }
}

/// Whether the stored report is newer than the one held: same boot, higher sequence; or
/// another boot seen later.
fn newer_report(held: &NodeInfo, held_seen: i64, stored: &NodeInfo, stored_seen: i64) -> bool {
    match (&held.boot_id, held.seq, &stored.boot_id, stored.seq) {
        (Some(hb), Some(hs), Some(sb), Some(ss)) if hb == sb => ss > hs,
        _ => stored_seen > held_seen && stored != held,
    }
}

/// What became of a report.
#[derive(Debug, PartialEq, Eq)]
pub enum ReportOutcome {
    /// `changed`: something placement or status depends on differs from the last report;
    /// `was_online`: the node was online before this report.
    Accepted { changed: bool, was_online: bool },
    /// Same boot, sequence not above the last one: ignored.
    Stale,
}

/// The rest of a node's writers: a rejoin, a node removed, and the report flusher's marks.
impl State {
    /// A node that joined again with its key: the new token, what it announced now (its
    /// reported replicas kept) split under its own allowance, seen now. Returns its name and,
    /// when the refused labels or kinds changed, what is refused now; `None` if it is gone.
    pub(in crate::store) fn rejoin(
        &mut self,
        id: &Id,
        token_hash: [u8; 32],
        info: NodeInfo,
        now: i64,
    ) -> Option<(Id, Option<RefusedFacts>)> {
        self.set_token(id, token_hash);
        let rec = self.nodes.get_mut(id)?;
        rec.last_seen_ms = now.max(rec.last_seen_ms);
        let mut before = std::mem::take(&mut rec.info);
        let mut info = NodeInfo { replicas: std::mem::take(&mut before.replicas), ..info };
        info.admit(info.claimed(), rec.allowed.as_deref());
        let refused = refused_changed(&before, &info).then(|| info.refused_facts()).filter(|r| !r.is_empty());
        rec.set_info(info);
        let name = rec.name.clone();
        // Not marked dirty: the stored report keeps the split it was written with, and every
        // read of a stored row splits it again under the stored allowance; writing this copy
        // could put an older report over one another replica took.
        self.changes.facts.insert(id.clone());
        Some((name, refused))
    }

    /// Takes a node out of the registry (its traces go with [`State::forget_node`]).
    pub(in crate::store) fn remove_node(&mut self, id: &Id) -> Option<Box<NodeRec>> {
        self.nodes.remove(id)
    }

    /// The last sequence of the boot a node reports from, to drop a stale report.
    pub fn last_report(&self, id: &Id) -> Option<(&str, u64)> {
        let info = &self.nodes.get(id)?.info;
        Some((info.boot_id.as_deref()?, info.seq?))
    }

    /// Up to `chunk` nodes whose reports the database does not have yet, as rows, no longer
    /// marked (a failed write marks them again: [`State::mark_dirty`]). Sorted by id: every
    /// replica's flush then locks the rows it shares with another's in the same order, where
    /// two orders deadlock (PostgreSQL ends one after a second, and it is retried).
    pub(in crate::store) fn take_dirty(&mut self, chunk: usize) -> (Vec<Id>, Vec<(String, i64, String)>) {
        let mut ids: Vec<Id> = self.dirty_nodes.iter().take(chunk).cloned().collect();
        ids.sort_unstable();
        for id in &ids {
            self.dirty_nodes.remove(id);
        }
        let rows = ids
            .iter()
            .filter_map(|id| self.nodes.get(id))
            .map(|n| (n.id.to_string(), n.last_seen_ms, serde_json::to_string(&n.info).unwrap_or_default()))
            .collect();
        (ids, rows)
    }

    pub(in crate::store) fn mark_dirty(&mut self, ids: Vec<Id>) {
        self.dirty_nodes.extend(ids);
    }

    /// The next pass starts from scratch.
    pub(in crate::store) fn rebuild_next(&mut self) {
        self.changes.rebuild = true;
    }

    /// Sets a draining node's lifecycle to done.
    pub(in crate::store) fn set_drained(&mut self, id: &Id, lifecycle: Lifecycle) {
        if let Some(n) = self.nodes.get_mut(id) {
            n.lifecycle = lifecycle;
        }
    }
}

/// What following other replicas' node rows did here.
#[derive(Debug, Default)]
pub struct Followed {
    /// The pass has work from them.
    pub changed: bool,
    /// Nodes new here whose first desired state was made (generation 1, to wake).
    pub joined: Vec<Id>,
    pub deleted: Vec<Deleted>,
}

impl State {
    /// Applies the stored rows of the nodes `asked` for: a row is a node joined or changed
    /// elsewhere; a node asked for without a row was deleted elsewhere.
    pub(in crate::store) fn follow_nodes(
        &mut self,
        asked: &[String],
        rows: Vec<NodeRow>,
        now: i64,
        offline_after: Duration,
    ) -> Followed {
        let mut out = Followed::default();
        let mut found = std::collections::HashSet::with_capacity(rows.len());
        for row in rows {
            found.insert(row.id.clone());
            // A node new here gets the liveness grace of a join; a known one keeps its own
            // last sighting, compared with the stored one.
            let known = self.nodes.contains_key(row.id.as_str());
            let Some(stored) = node_from_row(row, if known { i64::MIN } else { now }) else { continue };
            if known {
                out.changed |= self.follow_node(stored, now, offline_after);
                continue;
            }
            tracing::debug!(node = %stored.name, id = %stored.id, "node joined on another replica");
            let id = stored.id.clone();
            if self.add_joined_node(stored) {
                out.joined.push(id);
            }
            out.changed = true;
        }
        for id in asked.iter().filter(|id| !found.contains(*id)) {
            let id: Id = id.as_str().into();
            if let Some(rec) = self.nodes.remove(&id) {
                out.deleted.push(self.forget_node(&rec, now));
                out.changed = true;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(boot: &str, seq: u64) -> NodeInfo {
        NodeInfo { boot_id: Some(boot.into()), seq: Some(seq), ..Default::default() }
    }

    #[test]
    fn a_stored_report_is_taken_only_when_newer() {
        assert!(newer_report(&info("a", 1), 10, &info("a", 2), 5), "a higher sequence of the same boot");
        assert!(!newer_report(&info("a", 2), 5, &info("a", 2), 10), "the same report read back");
        assert!(!newer_report(&info("a", 3), 5, &info("a", 2), 10), "an older sequence");
        assert!(newer_report(&info("a", 9), 5, &info("b", 1), 10), "a new boot seen later");
        assert!(!newer_report(&info("b", 1), 10, &info("a", 9), 5), "the old boot seen earlier");
    }
}
