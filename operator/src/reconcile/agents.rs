//! The CP change trigger: the one reader of the CP's agent list (SPEC §2.2, §3.4).

use crate::context::Ctx;
use crate::model::AgentList;
use crate::platform::cp::AgentsFetch;
use crate::store::db::PassWrite;
use std::sync::Arc;
use std::time::Duration;

/// How often the CP watcher asks whether the agent list changed. With the ETag an unchanged
/// list costs one `304`, so agent changes reach nodes in seconds whatever the tick.
pub const CP_WATCH_EVERY: Duration = Duration::from_secs(2);

/// How long after a changed list is handed to the pass its copy is written to the store.
const STORE_AFTER: Duration = Duration::from_millis(500);

/// Watches the CP's agent list and triggers a pass when it changed (the "CP change" trigger).
/// It is the only reader of the list: a pass works from the copy in the registry, so it
/// never waits for the CP (reading 20,000 agents takes tens of pages).
pub async fn watch_cp(ctx: Arc<Ctx>) {
    loop {
        let mut pause = CP_WATCH_EVERY;
        if let Some((agents, etag)) = refresh_agents(&ctx).await {
            // The pass starts first: the stored list is only a cache of the CP's (a start
            // reads the CP again), and serialising 20,000 agents takes tens of milliseconds
            // of a core the pass is using to wake the nodes, so the copy is written a moment
            // later (within the same watch period).
            ctx.kick();
            tokio::time::sleep(STORE_AFTER).await;
            pause = pause.saturating_sub(STORE_AFTER);
            let mut w = PassWrite::default();
            w.kv.push(("agents".into(), serde_json::to_string(&*agents).unwrap_or_else(|_| "[]".into())));
            w.kv.push(("agents_etag".into(), etag.unwrap_or_default()));
            drop(agents);
            if let Err(e) = ctx.store.db.apply_pass(&w).await {
                tracing::error!(error = %e, "cannot store the agent list");
            }
        }
        tokio::time::sleep(pause).await;
    }
}

/// Reads the agent list; when it changed, puts it in the registry and returns it with its
/// ETag (for the caller to store).
async fn refresh_agents(ctx: &Ctx) -> Option<(AgentList, Option<String>)> {
    let etag = ctx.store.state.read().agents_etag.clone();
    match ctx.cp.list_agents(etag.as_deref()).await {
        Ok(AgentsFetch::NotModified) => {
            ctx.metrics.call("cp", "list_agents", "not_modified");
            None
        }
        Ok(AgentsFetch::List { mut agents, skipped, etag }) => {
            ctx.metrics.call("cp", "list_agents", "ok");
            for s in &skipped {
                ctx.metrics.agents_skipped.inc();
                tracing::error!(agent = s.key.as_deref().unwrap_or("?"), reason = %s.reason, "CP agent item skipped");
            }
            // CPs list in key order (devkit does); sorting is only needed when one does not.
            if !agents.is_sorted_by(|a, b| a.key <= b.key) {
                agents.sort_by(|a, b| a.key.cmp(&b.key));
            }
            // Compared outside the lock: the registry's list is shared, not copied.
            let (current, current_etag) = {
                let st = ctx.store.state.read();
                (st.agents.clone(), st.agents_etag.clone())
            };
            if *current == agents && current_etag == etag {
                return None;
            }
            let agents = Arc::new(agents);
            let old = {
                let mut st = ctx.store.state.write();
                st.agents_etag = etag.clone();
                st.set_agents(agents.clone())
            };
            // The old list is freed here, outside the lock.
            drop((old, current));
            Some((agents, etag))
        }
        Err(e) => {
            ctx.metrics.call("cp", "list_agents", e.outcome());
            tracing::warn!(error = %e, "cannot read agents from the CP; using the last known list");
            None
        }
    }
}
