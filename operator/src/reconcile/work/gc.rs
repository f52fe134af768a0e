//! `FLEET_NODE_GC_SECONDS` (docs/behaviour.md#node-lifecycle): a node offline longer than this is deleted as by
//! `DELETE /api/v1/nodes/{id}`. Off by default. The controller's own restart counts as a
//! report from every node (the store loads last-seen as max(stored, now)), so an outage of
//! the controller never collects a fleet.

use super::queues::Ctx;
use crate::model::Id;
use std::sync::Arc;
use std::time::Duration;

pub async fn run(ctx: Arc<Ctx>, after: Duration) {
    let every = (after / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
    let why = format!("offline longer than FLEET_NODE_GC_SECONDS={}", after.as_secs());
    loop {
        tokio::time::sleep(every).await;
        let now = crate::clock::now_ms();
        let due: Vec<Id> = {
            let st = ctx.store.read();
            st.nodes()
                .filter(|n| {
                    !n.online(now, ctx.cfg.node_offline_after) && now - n.last_seen_ms > after.as_millis() as i64
                })
                .map(|n| n.id.clone())
                .collect()
        };
        for id in due {
            match ctx.store.delete_node(&id, &why).await {
                Ok(Some(_)) => ctx.kick(),
                Ok(None) => {}
                Err(e) => tracing::error!(node = %id, error = %e, "cannot delete an offline node; retrying"),
            }
        }
    }
}
