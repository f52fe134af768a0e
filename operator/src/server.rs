//! Starting the controller: open the store, start the pass loop and workers (unless in the
//! not-configured mode), the report flusher, and the API and metrics listeners, every one of
//! them a core task under the [`Supervisor`].

use crate::config::Config;
use crate::http::{self, auth::Jwks, App, Reconciler};
use crate::leader::{self, Role};
use crate::metrics::Metrics;
use crate::reconcile::work::Ctx;
use crate::store::Store;
use crate::supervisor::{Ended, Supervisor};
use crate::trigger::{PassClock, Trigger};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub struct Running {
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub store: Arc<Store>,
    pub ctx: Option<Arc<Ctx>>,
    stop: watch::Sender<bool>,
    tasks: Supervisor,
    /// On SQLite, the lock that says this controller serves the store (let go when it stops):
    /// a restore, an offline copy and a second controller are refused meanwhile.
    _serving: Option<crate::backup::serving::ServeLock>,
}

impl Running {
    /// Waits until a core task ends or panics — a fault: the caller exits non-zero.
    pub async fn ended(&mut self) -> Ended {
        self.tasks.ended().await
    }

    /// Stops serving, gives the lease up (PostgreSQL), flushes reports to the database and
    /// returns.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        self.tasks.abort_all();
        if let (Some(pool), Ok(Some(fence))) = (self.store.db().pg(), self.store.db().fence()) {
            self.store.db().set_fence(None);
            match crate::store::lease::release(pool, &fence).await {
                Ok(()) => tracing::info!(epoch = fence.epoch, "released the lease"),
                Err(e) => tracing::warn!(error = %e, "cannot release the lease; it expires by itself"),
            }
        }
        if let Err(e) = self.store.flush_reports().await {
            tracing::error!(error = %e, "final flush of node reports failed");
        }
        if let Err(e) = self.store.flush_events().await {
            tracing::error!(error = %e, "final flush of events failed");
        }
    }
}

pub use crate::config::redact;

async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen for the {what} on {addr}: {e}"))
}

pub async fn start(cfg: Config) -> anyhow::Result<Running> {
    let (serving, store) = open_store(&cfg).await?;
    let metrics = Arc::new(Metrics::default());
    let mut tasks = Supervisor::default();
    if let Some(writer) = store.db().take_writer_task() {
        tasks.adopt("writer", writer);
    }
    let shared = shared_state(&cfg, &store, &metrics);
    let ctx = start_role(&cfg, &shared, &mut tasks).await?;
    if cfg.kubernetes.mirror && cfg.credentials.is_some() {
        tasks.spawn("mirror", crate::k8s::task::run(mirror_setup(&cfg, &shared)));
    }
    tasks.spawn("report-flusher", flush_every_second(store.clone()));
    let http = crate::platform::http_client_trusting(&cfg.ca_certs);
    let jwks = Arc::new(Jwks::new(http, &cfg.jwks_url, &cfg.iam_issuer, &cfg.audience, cfg.jwks_refresh));
    tasks.spawn("jwks-refresher", jwks.clone().run());
    let proxies = http::peers::TrustedProxies::new(cfg.trusted_proxies.clone());
    let app = build_app(&cfg, &shared, jwks, proxies.clone());
    let (addr, metrics_addr, stop) = serve(&cfg, app, &metrics, proxies, &mut tasks).await?;
    tracing::info!(%addr, %metrics_addr, configured = cfg.credentials.is_some(), "fleet-controller serving");
    Ok(Running { addr, metrics_addr, store, ctx, stop, tasks, _serving: serving })
}

/// The store, and on SQLite the lock saying this controller serves it.
async fn open_store(cfg: &Config) -> anyhow::Result<(Option<crate::backup::serving::ServeLock>, Arc<Store>)> {
    let url = &cfg.store.database_url;
    let serving = crate::backup::serving::ServeLock::take(url)
        .map_err(|e| anyhow::anyhow!("cannot serve the store {}: {e}", redact(url)))?;
    let store = Store::open_as(url, &cfg.replica_name)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open the store {}: {e}", redact(url)))?;
    Ok((serving, Arc::new(store)))
}

fn shared_state(cfg: &Config, store: &Arc<Store>, metrics: &Arc<Metrics>) -> leader::Shared {
    let shared_store = store.db().is_shared();
    leader::Shared {
        cfg: cfg.clone(),
        store: store.clone(),
        metrics: metrics.clone(),
        trigger: Arc::new(Trigger::default()),
        pass_clock: Arc::new(PassClock::new(cfg.reconcile_every, crate::clock::now_ms())),
        role: if shared_store { Arc::new(Role::default()) } else { Role::single() },
        gate: call_gate(&cfg.replica_name, shared_store),
    }
}

/// One replica of several campaigns for the lease and follows meanwhile; a lone controller
/// leads at once; without credentials nothing reconciles.
async fn start_role(cfg: &Config, shared: &leader::Shared, tasks: &mut Supervisor) -> anyhow::Result<Option<Arc<Ctx>>> {
    match &cfg.credentials {
        Some(_) if shared.store.db().is_shared() => {
            tracing::info!(replica = %cfg.replica_name, url = %cfg.advertise_url, "on PostgreSQL: serving as one replica of several; campaigning for the lease");
            let (follower, trigger, followed) = (shared.role.clone(), shared.trigger.clone(), shared.store.clone());
            let (me, offline_after) = (cfg.replica_name.clone(), cfg.node_offline_after);
            tasks.spawn("follower", async move {
                followed.follow(me, offline_after, move || follower.leading(), move || trigger.kick()).await
            });
            tasks.spawn("lease", leader::campaign(shared.clone()));
            Ok(None)
        }
        Some(_) => {
            shared.metrics.leader.set(1);
            Ok(Some(leader::start_term(shared, tasks).await?))
        }
        None => {
            tracing::warn!("FLEET_CLIENT_ID / FLEET_CLIENT_SECRET are not set: every route but /healthz answers 503 not_configured");
            Ok(None)
        }
    }
}

fn mirror_setup(cfg: &Config, shared: &leader::Shared) -> crate::k8s::task::Setup {
    crate::k8s::task::Setup {
        cfg: cfg.kubernetes.clone(),
        store: shared.store.clone(),
        role: shared.role.clone(),
        gate: shared.gate.clone(),
        metrics: shared.metrics.clone(),
        offline_after: cfg.node_offline_after,
    }
}

fn build_app(cfg: &Config, shared: &leader::Shared, jwks: Arc<Jwks>, proxies: http::peers::TrustedProxies) -> Arc<App> {
    let reconciler = cfg.credentials.as_ref().map(|_| Reconciler {
        trigger: shared.trigger.clone(),
        pass_clock: shared.pass_clock.clone(),
        role: shared.role.clone(),
        forward: crate::http::forward::Forwarder::new(
            &cfg.ca_certs,
            cfg.replica_secret.as_ref().map(|s| s.0.as_slice()),
        ),
        replica: cfg.replica_name.clone(),
        rollout_defaults: cfg.rollout.clone(),
    });
    let m = &shared.metrics;
    let strangers =
        http::strangers::Strangers::new(cfg.unauth_buffer_bytes, m.unauth_shed.clone(), m.unauth_buffer_bytes.clone());
    let guards = http::app::Guards { strangers, proxies };
    App::new(shared.store.clone(), m.clone(), reconciler, jwks, cfg.node_offline_after, guards)
}

/// The API and metrics listeners, each a core task stopped through the returned sender.
async fn serve(
    cfg: &Config,
    app: Arc<App>,
    metrics: &Arc<Metrics>,
    proxies: http::peers::TrustedProxies,
    tasks: &mut Supervisor,
) -> anyhow::Result<(SocketAddr, SocketAddr, watch::Sender<bool>)> {
    let api = bind(cfg.listen, "API").await?;
    let met = bind(cfg.metrics_listen, "metrics").await?;
    let (addr, metrics_addr) = (api.local_addr()?, met.local_addr()?);
    let (stop, stop_rx) = watch::channel(false);
    let shutdown = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let router = http::router(app.clone());
    let timeouts = cfg.http_timeouts;
    let limit = http::serve::ConnLimit::new(cfg.max_connections, metrics.connections_refused.clone()).per_address(
        cfg.max_connections_per_ip,
        proxies,
        metrics.connections_refused_per_ip.clone(),
    );
    let rx = stop_rx.clone();
    tasks.spawn("api-listener", http::serve::serve(api, router, Some(app), timeouts, limit, shutdown(rx)));
    let mrouter = http::metrics_router(metrics.clone());
    // The metrics port is scraped by one or two collectors: a small cap of its own.
    let mlimit = http::serve::ConnLimit::new(64, metrics.connections_refused.clone());
    tasks.spawn("metrics-listener", http::serve::serve(met, mrouter, None, timeouts, mlimit, shutdown(stop_rx)));
    Ok((addr, metrics_addr, stop))
}

fn call_gate(replica: &str, shared_store: bool) -> Arc<crate::platform::CallGate> {
    if shared_store {
        crate::platform::CallGate::leased(replica)
    } else {
        crate::platform::CallGate::always(replica)
    }
}

/// Persists what reports and events were taken, once a second.
async fn flush_every_second(store: Arc<Store>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        if let Err(e) = store.flush_reports().await {
            tracing::error!(error = %e, "cannot persist node reports; retrying");
        }
        if let Err(e) = store.flush_events().await {
            tracing::error!(error = %e, "cannot persist events; retrying");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn a_database_url_is_shown_without_its_password() {
        assert_eq!(redact("postgres://fleet:s3cret@db:5432/fleet"), "postgres://fleet:***@db:5432/fleet");
        assert_eq!(redact("postgres://fleet@db/fleet"), "postgres://fleet:***@db/fleet");
        assert_eq!(redact("sqlite:///data/fleet.sqlite"), "sqlite:///data/fleet.sqlite");
    }

    /// The message an operator sees when PostgreSQL is not there names the URL, not the password.
    #[tokio::test]
    async fn an_unreachable_database_is_named_without_its_password() {
        let dk = fleet_devkit::Devkit::start(Default::default(), "127.0.0.1:0".parse().unwrap()).await.unwrap();
        let env = |k: &str| -> Option<String> {
            Some(match k {
                "FLEET_DATABASE_URL" => "postgres://fleet:s3cret@127.0.0.1:1/fleet".into(),
                "FLEET_REPLICA_SECRET" => "a-replica-secret-of-32-characters-or-more".into(),
                "FLEET_CONTROL_PLANE_URL" | "FLEET_IAM_URL" => dk.url.clone(),
                "FLEET_IAM_ISSUER" => dk.issuer(),
                "FLEET_IAM_TENANT" => "t".into(),
                "FLEET_JWKS_URL" => dk.jwks_url(),
                "FLEET_LISTEN" | "FLEET_METRICS_LISTEN" => "127.0.0.1:0".into(),
                _ => return None,
            })
        };
        let cfg = crate::config::Config::from_lookup(&env).unwrap();
        let err = super::start(cfg).await.err().expect("no database there").to_string();
        assert!(err.starts_with("cannot open the store postgres://fleet:***@127.0.0.1:1/fleet: database:"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
    }
}
