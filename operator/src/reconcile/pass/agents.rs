//! The CP change trigger: the one reader of the CP's agent list (docs/behaviour.md#control-plane-calls-and-agent-descriptions, docs/behaviour.md#the-reconcile-pass).

use crate::clock;
use crate::model::Agent;
use crate::platform::cp::AgentsFetch;
use crate::reconcile::work::Ctx;
use crate::store::db::{AgentsWrite, PassWrite};
use std::cmp::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How often the CP watcher asks whether the agent list changed. With the ETag an unchanged
/// list costs one `304`, so agent changes reach nodes in seconds whatever the tick.
pub const CP_WATCH_EVERY: Duration = Duration::from_secs(2);

/// How long the copy of a changed list waits for a pass to commit what it made of it.
const STORE_WAIT: Duration = Duration::from_secs(10);

/// The `kv` row that holds when the latest CP read a pass has committed began (ms): the
/// rollout view's `cpReadAt` on a replica that does not lead, or leads and has not read yet.
pub const CP_READ_KEY: &str = "cp_read_at_ms";

/// Watches the CP's agent list and triggers a pass when it changed (the "CP change" trigger).
/// It is the only reader of the list: a pass works from the copy in the registry, so it
/// never waits for the CP (reading 20,000 agents takes tens of pages).
pub async fn watch_cp(ctx: Arc<Ctx>) {
    // Whether the stored rows may differ from the registry's list other than by the next
    // change (a write failed, or no pass committed the last change in time): the next write
    // replaces them all, once a pass has committed.
    let mut unsure = false;
    // Every pass numbered above this one works from the registry's list.
    let mut listed_before = 0;
    loop {
        // A new term opens its gate a moment after it starts (docs/behaviour.md#high-availability):
        // the first read waits for it rather than fail and wait a whole round.
        ctx.gate.opened().await;
        let started = tokio::time::Instant::now();
        let began_ms = clock::now_ms();
        let read = refresh_agents(&ctx).await;
        let failed = matches!(read, Read::Failed);
        let change = match read {
            Read::Changed(w) => Some(w),
            Read::Unchanged | Read::Failed => None,
        };
        if change.is_some() {
            listed_before = ctx.pass_clock.last_begun();
            ctx.kick();
        }
        let write = match change {
            Some(w) if !unsure => Some(w),
            _ if unsure => {
                let st = ctx.store.read();
                Some(AgentsWrite::all(st.agents().clone(), st.agents_etag().map(String::from).unwrap_or_default()))
            }
            _ => None,
        };
        // With nothing to write, the list in the registry is one a pass has committed: the
        // loop is sequential, and a list not yet committed is always written (`unsure`).
        let mut passed = true;
        if let Some(w) = write {
            let stored = store_when_passed(&ctx, &w, listed_before).await;
            passed = stored != Stored::NoPass;
            unsure = stored != Stored::Yes;
        }
        if passed && !failed {
            note_read(&ctx, began_ms).await;
        }
        tokio::time::sleep(CP_WATCH_EVERY.saturating_sub(started.elapsed())).await;
    }
}

/// A CP read whose result a pass has committed: the rollout views say so from now on, here
/// and (through the `kv` row, a fenced write) on the other replicas and the next leader.
async fn note_read(ctx: &Ctx, began_ms: i64) {
    ctx.pass_clock.cp_read(began_ms);
    let row = PassWrite { kv: vec![(CP_READ_KEY.to_string(), began_ms.to_string())], ..PassWrite::default() };
    if let Err(e) = ctx.store.db().apply_pass(&row).await {
        // The other replicas show an older read meanwhile: a watcher waits a round longer.
        tracing::debug!(error = %e, "cannot store when the CP was last read");
    }
}

/// Whether a changed list was stored.
#[derive(Debug, PartialEq, Eq)]
enum Stored {
    Yes,
    /// No pass committed it within [`STORE_WAIT`].
    NoPass,
    /// A pass committed it; the write failed.
    WriteFailed,
}

/// Stores the list once a pass that began after it was taken has committed. The stored list
/// and its ETag say what the controller has acted on: a list stored before the pass that
/// starts its rollouts, then a crash or a change of leader, would leave the next leader with
/// the new templates, the ETag that hides the change from it, and no rollout to apply them.
/// The copy waiting also leaves the pass the core while it wakes the nodes. When it was not
/// stored, the next round stores all.
async fn store_when_passed(ctx: &Ctx, w: &AgentsWrite, before: u64) -> Stored {
    if !ctx.pass_clock.committed_after(before, STORE_WAIT).await {
        tracing::warn!("no pass committed the new agent list within 10 s; storing it later");
        return Stored::NoPass;
    }
    match ctx.store.db().store_agents(w).await {
        Ok(()) => Stored::Yes,
        Err(e) => {
            tracing::error!(error = %e, "cannot store the agent list; retrying with the whole list");
            Stored::WriteFailed
        }
    }
}

/// Agents listed before keep the key string they had (both lists in key order): the
/// registry's maps hold that one, and a fresh string an agent would be a second copy of
/// every key (20,000 at full scale) until all of them are rebuilt.
fn keep_keys(old: &[Agent], new: &mut [Agent]) {
    let mut i = 0;
    for a in new.iter_mut() {
        while old.get(i).is_some_and(|o| o.key < a.key) {
            i += 1;
        }
        if let Some(o) = old.get(i).filter(|o| o.key == a.key) {
            a.key = o.key.clone();
        }
    }
}

/// What a read of the CP's agent list found.
enum Read {
    /// The list changed: it is in the registry, and this is what to store.
    Changed(AgentsWrite),
    Unchanged,
    /// The CP did not answer with a list: the registry keeps the last one.
    Failed,
}

/// Reads the agent list; when it changed, puts it in the registry and returns what changed
/// for the caller to store.
async fn refresh_agents(ctx: &Ctx) -> Read {
    let (etag, previous) = {
        let st = ctx.store.read();
        (st.agents_etag().map(String::from), st.agents().clone())
    };
    let fetched = ctx.cp.list_agents(etag.as_deref(), &previous).await;
    drop(previous);
    match fetched {
        Ok(AgentsFetch::NotModified) => {
            ctx.metrics.call("cp", "list_agents", "not_modified");
            Read::Unchanged
        }
        Ok(AgentsFetch::List { mut agents, skipped, warnings, etag }) => {
            ctx.metrics.call("cp", "list_agents", "ok");
            for s in &skipped {
                ctx.metrics.agents_skipped.inc();
                tracing::error!(agent = s.key.as_deref().unwrap_or("?"), reason = %s.reason, "CP agent item skipped");
            }
            for w in &warnings {
                ctx.metrics.agent_fields_replaced.inc();
                tracing::warn!(agent = %w.agent, field = w.field, problem = %w.problem, used = %w.used,
                    "CP agent item has a wrong field; the agent keeps running with the value used");
            }
            // CPs list in key order (devkit does); sorting is only needed when one does not.
            if !agents.is_sorted_by(|a, b| a.key <= b.key) {
                agents.sort_by(|a, b| a.key.cmp(&b.key));
            }
            // Compared outside the lock: the registry's list is shared, not copied.
            let (current, current_etag) = {
                let st = ctx.store.read();
                (st.agents().clone(), st.agents_etag().map(String::from))
            };
            // One walk over both lists says whether anything changed and what to store.
            let (put, delete) = changed(&current, &agents);
            if put.is_empty() && delete.is_empty() {
                if current_etag == etag {
                    return Read::Unchanged;
                }
                // Only the ETag moved: the registry keeps the list it has (the pass and its
                // maps share it; a copy would be a second list of every agent until the next
                // pass) and takes the new ETag, which is stored with no rows.
                drop(agents);
                ctx.store.set_agents_etag(etag.clone());
                let etag = etag.unwrap_or_default();
                return Read::Changed(AgentsWrite { list: current, put, delete, replace_all: false, etag });
            }
            agents.shrink_to_fit();
            keep_keys(&current, &mut agents);
            let agents = Arc::new(agents);
            let old = ctx.store.set_agents(agents.clone(), etag.clone());
            // The old list is freed here, outside the lock.
            drop((old, current));
            Read::Changed(AgentsWrite { list: agents, put, delete, replace_all: false, etag: etag.unwrap_or_default() })
        }
        Err(e) => {
            ctx.metrics.call("cp", "list_agents", e.outcome());
            tracing::warn!(error = %e, "cannot read agents from the CP; using the last known list");
            Read::Failed
        }
    }
}

/// What of `new` differs from `old`, both in key order: the positions in `new` of agents that
/// are new or changed, and the keys of agents that are gone.
fn changed(old: &[Agent], new: &[Agent]) -> (Vec<usize>, Vec<String>) {
    let (mut put, mut delete) = (vec![], vec![]);
    let (mut i, mut j) = (0, 0);
    loop {
        let order = match (old.get(i), new.get(j)) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(o), Some(n)) => o.key.cmp(&n.key),
        };
        match order {
            Ordering::Less => {
                delete.push(old[i].key.to_string());
                i += 1;
            }
            Ordering::Greater => {
                put.push(j);
                j += 1;
            }
            Ordering::Equal => {
                if old[i] != new[j] {
                    put.push(j);
                }
                i += 1;
                j += 1;
            }
        }
    }
    (put, delete)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agents(items: &[(&str, u64)]) -> Vec<Agent> {
        let raw = crate::model::raw_items(
            items
                .iter()
                .map(|(key, revision)| {
                    serde_json::json!({"key": key, "revision": revision, "state": "running",
                        "identity": {"kind": "agent"}, "executor": {"kind": "claude-code"}})
                })
                .collect(),
        );
        crate::model::parse_agents(&raw, &[], &mut Default::default()).agents
    }

    #[test]
    fn only_new_changed_and_gone_agents_are_written() {
        let old = agents(&[("a", 1), ("b", 1), ("c", 1), ("e", 1)]);
        let new = agents(&[("b", 1), ("c", 2), ("d", 1), ("e", 1), ("f", 1)]);
        let (put, delete) = changed(&old, &new);
        let keys: Vec<&str> = put.iter().map(|&i| new[i].key.as_ref()).collect();
        assert_eq!(keys, ["c", "d", "f"]);
        assert_eq!(delete, ["a"]);
        assert_eq!(changed(&new, &new), (vec![], vec![]));
        assert_eq!(changed(&[], &new).0.len(), new.len());
        assert_eq!(changed(&new, &[]).1.len(), new.len());
    }

    /// An agent still listed (changed or not) keeps the old list's key string; a new one
    /// has its own.
    #[test]
    fn listed_agents_keep_their_key_string() {
        let old = agents(&[("a", 1), ("b", 1), ("c", 1), ("e", 1)]);
        let mut new = agents(&[("b", 1), ("c", 2), ("d", 1), ("e", 1), ("f", 1)]);
        keep_keys(&old, &mut new);
        let shared: Vec<bool> = new.iter().map(|n| old.iter().any(|o| Arc::ptr_eq(&o.key, &n.key))).collect();
        assert_eq!(shared, [true, true, false, true, false]);
        let keys: Vec<&str> = new.iter().map(|a| a.key.as_ref()).collect();
        assert_eq!(keys, ["b", "c", "d", "e", "f"]);
    }
}
