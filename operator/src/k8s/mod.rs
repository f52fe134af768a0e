//! Kubernetes (docs/behaviour.md#kubernetes-mirror): the `FleetNode` / `FleetPlacement` custom resources and the mirror
//! that projects the store into them when `FLEET_KUBERNETES_MIRROR=true`.

pub mod crd;
pub mod desired;
pub mod mirror;
pub mod names;

use crate::metrics::Metrics;
use crate::store::Store;
use futures::StreamExt;
use kube::runtime::{watcher, WatchStreamExt};
use mirror::{Kind, Mirror, Seen, MANAGED_BY};
use std::sync::Arc;
use std::time::Duration;

/// How often the mirror compares the store with what it believes the API server shows.
pub const SYNC_PERIOD: Duration = Duration::from_secs(2);

/// Connects to the cluster (in-cluster service account, else kubeconfig) and checks the CRDs.
/// Any failure is a start-up error that says what to do.
pub async fn connect(namespace: Option<&str>, metrics: Arc<Metrics>) -> anyhow::Result<Mirror> {
    let client = kube::Client::try_default().await.map_err(|e| {
        anyhow::anyhow!("FLEET_KUBERNETES_MIRROR=true but no Kubernetes API is reachable (in-cluster service account or kubeconfig): {e}")
    })?;
    let ns = namespace.map(str::to_string).unwrap_or_else(|| client.default_namespace().to_string());
    let mirror = Mirror::new(client, &ns, metrics);
    mirror.check().await?;
    tracing::info!(namespace = %ns, "Kubernetes mirror on: FleetNode and FleetPlacement objects follow the store");
    Ok(mirror)
}

fn events(m: &Mirror, kind: Kind) -> impl futures::Stream<Item = (Kind, Seen)> + Send + 'static {
    let cfg = watcher::Config::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1));
    watcher(m.api(kind), cfg).default_backoff().filter_map(move |ev| async move {
        match ev {
            Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => Some((kind, Seen::Applied(Box::new(o)))),
            Ok(watcher::Event::Delete(o)) => o.metadata.name.map(|n| (kind, Seen::Deleted(n))),
            Ok(watcher::Event::Init) => Some((kind, Seen::Relist)),
            Ok(watcher::Event::InitDone) => Some((kind, Seen::RelistDone)),
            Err(e) => {
                tracing::warn!(kind = kind.name(), error = %e, "mirror watch failed; retrying");
                None
            }
        }
    })
}

/// The mirror's task: watch events correct the belief, and every [`SYNC_PERIOD`] the store is
/// compared with it and the differences written.
pub async fn run(mut mirror: Mirror, store: Arc<Store>, offline_after: Duration) {
    let mut seen =
        futures::stream::select(events(&mirror, Kind::Node).boxed(), events(&mirror, Kind::Placement).boxed());
    let mut tick = tokio::time::interval(SYNC_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            Some((kind, ev)) = seen.next() => mirror.seen(kind, ev),
            _ = tick.tick() => {
                let snap = {
                    let st = store.read();
                    desired::snapshot(&st, crate::clock::now_ms(), offline_after)
                };
                let wanted = desired::wanted(snap);
                let n = mirror.sync(&wanted).await;
                if n > 0 {
                    tracing::debug!(writes = n, "mirror round");
                }
            }
        }
    }
}
