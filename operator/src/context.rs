//! The services the reconciler and the workers share behind one `Arc`: configuration, the
//! store, the CP and IAM clients, metrics, the pass trigger and clock. It knows nothing of
//! the reconciler: the reconciler's own state (its work queue and rotation schedule) rides in
//! `work`, typed by the reconciler (`reconcile::work::Ctx`).

use crate::config::Config;
use crate::metrics::Metrics;
use crate::platform::cp::CpClient;
use crate::platform::iam::IamClient;
use crate::platform::token::TokenSource;
use crate::platform::CallGate;
use crate::store::Store;
use crate::trigger::{PassClock, Trigger};
use std::sync::Arc;

pub struct Context<W> {
    pub cfg: Config,
    pub store: Arc<Store>,
    pub cp: CpClient,
    pub iam: IamClient,
    pub metrics: Arc<Metrics>,
    /// Wakes the pass loop; shared with the HTTP side.
    pub trigger: Arc<Trigger>,
    /// When the last pass finished; shared with `/readyz`.
    pub pass_clock: Arc<PassClock>,
    /// Whether outside calls may start (the lease; always on SQLite).
    pub gate: Arc<CallGate>,
    /// The state of the one who runs on this context.
    pub work: W,
}

impl<W> Context<W> {
    pub fn new(
        cfg: Config,
        store: Arc<Store>,
        metrics: Arc<Metrics>,
        trigger: Arc<Trigger>,
        pass_clock: Arc<PassClock>,
        gate: Arc<CallGate>,
        work: W,
    ) -> Arc<Context<W>> {
        let http = crate::platform::http_client_trusting(&cfg.ca_certs);
        let tokens = Arc::new(TokenSource::new(http.clone(), &cfg.iam_url, cfg.credentials.clone(), gate.clone()));
        let cp = CpClient::new(http.clone(), &cfg.control_plane_url, tokens.clone(), gate.clone());
        let iam = IamClient::new(http, &cfg.iam_url, &cfg.iam_tenant, tokens, gate.clone());
        Arc::new(Context { cfg, store, cp, iam, metrics, trigger, pass_clock, gate, work })
    }

    pub fn kick(&self) {
        self.trigger.kick();
    }
}
