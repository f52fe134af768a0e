//! What the reconciler and the workers need, shared behind one `Arc`.

use crate::config::Config;
use crate::metrics::Metrics;
use crate::platform::cp::CpClient;
use crate::platform::iam::IamClient;
use crate::platform::token::TokenSource;
use crate::reconcile::queue::{Backoff, WorkQueue};
use crate::reconcile::rotation::Rotations;
use crate::reconcile::work::WorkKey;
use crate::store::Store;
use crate::trigger::{PassClock, Trigger};
use std::sync::Arc;
use std::time::Duration;

pub struct Ctx {
    pub cfg: Config,
    pub store: Arc<Store>,
    pub cp: CpClient,
    pub iam: IamClient,
    pub metrics: Arc<Metrics>,
    /// Wakes the pass loop; shared with the HTTP side.
    pub trigger: Arc<Trigger>,
    /// When the last pass finished; shared with `/readyz`.
    pub pass_clock: Arc<PassClock>,
    pub queue: WorkQueue<WorkKey>,
    /// When each live PAT is rotated (its work is queued then).
    pub rotations: Rotations,
}

impl Ctx {
    pub fn new(
        cfg: Config,
        store: Arc<Store>,
        metrics: Arc<Metrics>,
        trigger: Arc<Trigger>,
        pass_clock: Arc<PassClock>,
    ) -> Arc<Ctx> {
        let http = crate::platform::http_client_trusting(&cfg.ca_certs);
        let tokens = Arc::new(TokenSource::new(http.clone(), &cfg.iam_url, cfg.credentials.clone()));
        let cp = CpClient::new(http.clone(), &cfg.control_plane_url, tokens.clone());
        let iam = IamClient::new(http, &cfg.iam_url, &cfg.iam_tenant, tokens);
        Arc::new(Ctx {
            cfg,
            store,
            cp,
            iam,
            metrics,
            trigger,
            pass_clock,
            queue: WorkQueue::new(Backoff { base: Duration::from_secs(1), max: Duration::from_secs(300) }),
            rotations: Rotations::default(),
        })
    }

    pub fn kick(&self) {
        self.trigger.kick();
    }
}
