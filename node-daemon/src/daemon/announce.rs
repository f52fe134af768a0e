//! What the node says of itself (docs/behaviour.md#desired-state-and-observed-report): the same facts — labels, executors, capacity,
//! secret names (and those each kind is offered), version — in its join request and in every observed report, kept side by
//! side so that the two stay alike.

use super::shared::Shared;
use crate::config::NodeConfig;
use crate::plan;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use fleet_api::{Health, JoinRequest, ObservedReport};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub(super) fn join_request(cfg: &NodeConfig, key: &str, public_key: &[u8; 32]) -> JoinRequest {
    let secrets = plan::read_secrets(&cfg.secrets_dir);
    JoinRequest {
        join_key: key.to_string(),
        name: cfg.name.clone(),
        public_key: B64.encode(public_key),
        labels: cfg.sorted_labels(),
        executor_kinds: cfg.kinds(),
        executor_images: cfg.images(),
        capacity: cfg.capacity(),
        executor_secrets: cfg.offered_secrets(&secrets),
        secrets: secrets.into_iter().collect(),
        version: VERSION.to_string(),
    }
}

/// Builds the observed reports: one boot id per process, a rising `seq`.
pub(super) struct Reporter {
    cfg: Arc<NodeConfig>,
    shared: Arc<Shared>,
    boot_id: String,
    seq: AtomicU64,
}

impl Reporter {
    pub(super) fn new(cfg: Arc<NodeConfig>, shared: Arc<Shared>) -> Reporter {
        Reporter { cfg, shared, boot_id: uuid::Uuid::new_v4().simple().to_string(), seq: AtomicU64::new(0) }
    }

    pub(super) fn next(&self) -> ObservedReport {
        let (cfg, shared) = (&self.cfg, &self.shared);
        let secrets = plan::read_secrets(&cfg.secrets_dir);
        ObservedReport {
            applied_generation: shared.applied_generation.load(Ordering::SeqCst),
            health: if shared.degraded.load(Ordering::SeqCst) { Health::Degraded } else { Health::Ok },
            labels: cfg.sorted_labels(),
            executor_kinds: cfg.kinds(),
            executor_images: cfg.images(),
            capacity: cfg.capacity(),
            executor_secrets: cfg.offered_secrets(&secrets),
            secrets: secrets.into_iter().collect(),
            replicas: shared.reports.lock().clone(),
            version: VERSION.to_string(),
            boot_id: Some(self.boot_id.clone()),
            seq: Some(self.seq.fetch_add(1, Ordering::SeqCst) + 1),
            observe_seconds: Some(cfg.observe_seconds),
        }
    }
}
