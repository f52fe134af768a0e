//! What the node says of itself (docs/behaviour.md#desired-state-and-observed-report): the same facts — labels, executors, capacity,
//! secret names (and those each kind is offered), maintenance windows, version — in its join request and in every observed report, kept side by
//! side so that the two stay alike.

use super::shared::Shared;
use crate::config::NodeConfig;
use crate::plan;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use fleet_api::{Health, JoinRequest, ObservedReport};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

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
        maintenance_windows: cfg.maintenance_windows.clone(),
        version: VERSION.to_string(),
    }
}

/// Reports that go before their period (a replica went busy or idle) are at most this frequent.
pub(super) const EARLY_GAP: Duration = Duration::from_secs(1);

/// Builds the observed reports: one boot id per process, a rising `seq`.
pub(super) struct Reporter {
    cfg: Arc<NodeConfig>,
    shared: Arc<Shared>,
    boot_id: String,
    seq: AtomicU64,
    last_early: Mutex<Option<Instant>>,
}

impl Reporter {
    pub(super) fn new(cfg: Arc<NodeConfig>, shared: Arc<Shared>) -> Reporter {
        let boot_id = uuid::Uuid::new_v4().simple().to_string();
        Reporter { cfg, shared, boot_id, seq: AtomicU64::new(0), last_early: Mutex::new(None) }
    }

    /// Returns when a report should not wait for its period: a replica went busy or idle
    /// (the controller steps on it); at most once per [`EARLY_GAP`].
    pub(super) async fn due_early(&self) {
        self.shared.report_now.notified().await;
        let last = *self.last_early.lock();
        if let Some(t) = last {
            tokio::time::sleep_until(t + EARLY_GAP).await;
        }
        *self.last_early.lock() = Some(Instant::now());
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
            maintenance_windows: cfg.maintenance_windows.clone(),
            observe_seconds: Some(cfg.observe_seconds),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &std::path::Path, executors: &str) -> Arc<NodeConfig> {
        let secrets = dir.join("secrets");
        std::fs::create_dir_all(&secrets).unwrap();
        for s in ["github-token", "mail"] {
            std::fs::write(secrets.join(s), "x").unwrap();
        }
        let text = format!(
            "controllerUrl: http://127.0.0.1\nname: w1\ncapacity: {{slots: 1}}\nexecutors: {executors}\nstateDir: {}\nsecretsDir: {}\n",
            dir.join("state").display(),
            secrets.display()
        );
        Arc::new(NodeConfig::parse(&text, "t", &|_| None).unwrap())
    }

    /// docs/behaviour.md#secrets: the join and every report offer each kind that lists its
    /// secrets those of its list present in secretsDir; a node whose kinds list none sends no
    /// `executorSecrets` at all, so it still speaks to a controller that predates the field.
    #[test]
    fn each_kind_is_offered_its_listed_secrets_and_old_controllers_see_nothing_new() {
        let t = tempfile::tempdir().unwrap();
        let cfg = config(t.path(), "{k: {image: a:1}, observer: {image: o:1, secrets: [mail, absent]}}");
        let join = join_request(&cfg, "fjk_x", &[9; 32]);
        let want: std::collections::BTreeMap<String, Vec<String>> = [("observer".into(), vec!["mail".into()])].into();
        assert_eq!(
            (join.secrets.clone(), join.executor_secrets.clone()),
            (vec!["github-token".into(), "mail".into()], want.clone())
        );
        let report = Reporter::new(cfg, Arc::new(Shared::default())).next();
        assert_eq!(report.executor_secrets, want);

        let open = config(t.path(), "{k: {image: a:1}}");
        let report = Reporter::new(open.clone(), Arc::new(Shared::default())).next();
        let wire = serde_json::to_value(&report).unwrap();
        assert!(wire.get("executorSecrets").is_none(), "{wire}");
        let wire = serde_json::to_value(join_request(&open, "fjk_x", &[9; 32])).unwrap();
        assert!(wire.get("executorSecrets").is_none(), "{wire}");
    }

    /// docs/behaviour.md#maintenance-windows: node.yaml's windows go out with the join and
    /// every report, as written; a node without any sends no field at all.
    #[test]
    fn windows_are_announced_in_the_join_and_every_report() {
        let t = tempfile::tempdir().unwrap();
        let plain = config(t.path(), "{k: {image: a:1}}");
        let mut cfg = (*plain).clone();
        cfg.maintenance_windows = vec![fleet_api::windows::MaintenanceWindow {
            schedule: "*/5 * * * *".into(),
            duration_minutes: 2,
            time_zone: "Europe/Paris".into(),
        }];
        let cfg = Arc::new(cfg);
        assert_eq!(join_request(&cfg, "fjk_x", &[9; 32]).maintenance_windows, cfg.maintenance_windows);
        let reporter = Reporter::new(cfg.clone(), Arc::new(Shared::default()));
        for _ in 0..2 {
            assert_eq!(reporter.next().maintenance_windows, cfg.maintenance_windows);
        }
        let wire = serde_json::to_value(Reporter::new(plain.clone(), Arc::new(Shared::default())).next()).unwrap();
        assert!(wire.get("maintenanceWindows").is_none(), "{wire}");
    }
}
