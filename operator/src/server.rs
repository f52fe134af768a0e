//! Starting the controller: open the store, start the pass loop and workers (unless in the
//! not-configured mode), the report flusher, and the API and metrics listeners, every one of
//! them a core task under the [`Supervisor`].

use crate::config::Config;
use crate::context::Ctx;
use crate::http::{self, auth::Jwks, App, Reconciler};
use crate::metrics::Metrics;
use crate::reconcile::{agents, pass, work};
use crate::store::Store;
use crate::supervisor::{Ended, Supervisor};
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
}

impl Running {
    /// Waits until a core task ends or panics — a fault: the caller exits non-zero.
    pub async fn ended(&mut self) -> Ended {
        self.tasks.ended().await
    }

    /// Stops serving, flushes reports to the database and returns.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        self.tasks.abort_all();
        if let Err(e) = self.store.flush_reports().await {
            tracing::error!(error = %e, "final flush of node reports failed");
        }
        if let Err(e) = self.store.flush_events().await {
            tracing::error!(error = %e, "final flush of events failed");
        }
    }
}

async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen for the {what} on {addr}: {e}"))
}

pub async fn start(cfg: Config) -> anyhow::Result<Running> {
    let store = Arc::new(
        Store::open(&cfg.store.database_url)
            .await
            .map_err(|e| anyhow::anyhow!("cannot open the store {}: {e}", cfg.store.database_url))?,
    );
    let metrics = Arc::new(Metrics::default());
    let mut tasks = Supervisor::default();
    if let Some(writer) = store.db.take_writer_task() {
        tasks.adopt("writer", writer);
    }
    let ctx = match &cfg.credentials {
        Some(_) => {
            let ctx = Ctx::new(cfg.clone(), store.clone(), metrics.clone());
            // Time-driven work survives a restart: re-arm the revocations that were pending.
            let now = crate::clock::now_ms();
            for c in store.state.read().creds() {
                if let Some(at) = c.revoke_ms {
                    ctx.queue.add_after(
                        work::WorkKey::Revoke(c.id.clone()),
                        Duration::from_millis((at - now).max(0) as u64),
                    );
                }
            }
            if cfg.kubernetes_mirror {
                let mirror = crate::k8s::connect(cfg.kubernetes_namespace.as_deref(), metrics.clone()).await?;
                tasks.spawn("mirror", crate::k8s::run(mirror, store.clone(), cfg.node_offline_after));
            }
            for _ in 0..work::WORKERS {
                tasks.spawn("worker", work::worker(ctx.clone()));
            }
            tasks.spawn("pass", pass::run(ctx.clone()));
            if let Some(after) = cfg.node_gc_after {
                tasks.spawn("node-gc", crate::reconcile::gc::run(ctx.clone(), after));
            }
            tasks.spawn("cp-watcher", agents::watch_cp(ctx.clone()));
            ctx.kick();
            Some(ctx)
        }
        None => {
            tracing::warn!("FLEET_CLIENT_ID / FLEET_CLIENT_SECRET are not set: every route but /healthz answers 503 not_configured");
            None
        }
    };
    {
        let store = store.clone();
        tasks.spawn("report-flusher", async move {
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
        });
    }
    let http = crate::platform::http_client_trusting(&cfg.ca_certs);
    let jwks = Arc::new(Jwks::new(http, &cfg.jwks_url, &cfg.iam_issuer, &cfg.audience, cfg.jwks_refresh));
    tasks.spawn("jwks-refresher", jwks.clone().run());
    let reconciler = ctx.as_ref().map(|c| Reconciler { trigger: c.trigger.clone(), pass_clock: c.pass_clock.clone() });
    let app = App::new(store.clone(), metrics.clone(), reconciler, jwks, cfg.node_offline_after);
    let api = bind(cfg.listen, "API").await?;
    let met = bind(cfg.metrics_listen, "metrics").await?;
    let addr = api.local_addr()?;
    let metrics_addr = met.local_addr()?;
    let (stop, stop_rx) = watch::channel(false);
    let shutdown = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let router = http::router(app);
    let rx = stop_rx.clone();
    let timeouts = cfg.http_timeouts;
    let limit = http::serve::ConnLimit::new(cfg.max_connections, metrics.connections_refused.clone());
    tasks.spawn("api-listener", http::serve::serve(api, router, timeouts, limit, shutdown(rx)));
    let mrouter = http::metrics_router(metrics.clone());
    // The metrics port is scraped by one or two collectors: a small cap of its own.
    let mlimit = http::serve::ConnLimit::new(64, metrics.connections_refused.clone());
    tasks.spawn("metrics-listener", http::serve::serve(met, mrouter, timeouts, mlimit, shutdown(stop_rx)));
    tracing::info!(%addr, %metrics_addr, configured = ctx.is_some(), "fleet-controller serving");
    Ok(Running { addr, metrics_addr, store, ctx, stop, tasks })
}
