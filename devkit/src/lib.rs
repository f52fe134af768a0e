#![forbid(unsafe_code)]
//! devkit: the platform's Control Plane and IAM (docs/behaviour.md#the-platform-control-plane-and-iam), in memory, for development,
//! tests and the simulator. It is a faithful double: pagination and ETags, idempotency keys
//! replayed with the token, the IAM TTL cap and scope admissibility, the controller's own
//! grants, a JWKS with a generated Ed25519 key to mint admin tokens, and switchable faults.
//! Test-only endpoints live under `/devkit/`.

mod controller_env;
mod cp;
mod iam;
pub mod keys;
pub mod kube;
pub mod postgres;
pub mod redirects;
pub mod state;

pub use state::{DevState, Faults, PatRecord};

use axum::Router;
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::Arc;

/// How a devkit starts.
#[derive(Debug, Clone)]
pub struct DevkitConfig {
    pub tenant: String,
    pub client_id: String,
    pub client_secret: String,
    /// Agents per page of `GET /api/v1/agents`.
    pub page_size: usize,
}

impl Default for DevkitConfig {
    fn default() -> Self {
        DevkitConfig {
            tenant: "dev".into(),
            client_id: "fleet-controller".into(),
            client_secret: "dev-secret".into(),
            page_size: 100,
        }
    }
}

/// A running devkit. Clone freely; all clones share the state.
#[derive(Clone)]
pub struct Devkit {
    pub addr: SocketAddr,
    pub url: String,
    pub config: DevkitConfig,
    pub state: Arc<Mutex<DevState>>,
    /// The key admin tokens are signed with; `rotate_signing_key` replaces it.
    signer: Arc<parking_lot::RwLock<Arc<keys::Signer>>>,
}

impl Devkit {
    /// Starts on `addr` (use port 0 for any free port).
    pub async fn start(config: DevkitConfig, addr: SocketAddr) -> std::io::Result<Devkit> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let url = format!("http://{addr}");
        let dk = Devkit {
            addr,
            url: url.clone(),
            config: config.clone(),
            state: Arc::new(Mutex::new(DevState::new(&config))),
            signer: Arc::new(parking_lot::RwLock::new(Arc::new(keys::Signer::generate(&url)))),
        };
        let app = dk.router();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(dk)
    }

    fn router(&self) -> Router {
        let counted = axum::middleware::from_fn_with_state(self.clone(), count_replica);
        let mut r = Router::new().merge(cp::routes()).merge(iam::routes());
        if self.addr.ip().is_loopback() {
            r = r.merge(cp::mint_route());
        } else {
            tracing::warn!(addr = %self.addr, "devkit: POST /devkit/admin-token is not served on a non-loopback address");
        }
        r.layer(counted).with_state(self.clone())
    }

    /// Requests a controller replica sent (its `x-fleet-replica` header), of every kind.
    pub fn calls_from(&self, replica: &str) -> u64 {
        self.state.lock().calls_from.get(replica).copied().unwrap_or(0)
    }

    /// Every request a replica sent: the replica it named, when it arrived, when it was made.
    pub fn call_log(&self) -> Vec<state::Call> {
        self.state.lock().call_log.iter().cloned().collect()
    }

    /// The issuer admin tokens carry.
    pub fn issuer(&self) -> String {
        self.url.clone()
    }

    pub fn jwks_url(&self) -> String {
        format!("{}/.well-known/jwks.json", self.url)
    }

    /// The current signing key.
    pub fn signer(&self) -> Arc<keys::Signer> {
        self.signer.read().clone()
    }

    /// Replaces the signing key: the JWKS shows only the new one from now on, as when IAM
    /// rotates its key and retires the old one.
    pub fn rotate_signing_key(&self) {
        let fresh = Arc::new(keys::Signer::generate(&self.url));
        *self.signer.write() = fresh;
    }

    /// Mints an admin token for `audience` with `scopes`, valid `ttl_seconds` (negative: expired).
    pub fn mint(&self, audience: &str, scopes: &[&str], ttl_seconds: i64) -> String {
        self.signer().mint(audience, &scopes.join(" "), ttl_seconds)
    }

    /// Inserts or replaces an agent (CP JSON), bumping the list's ETag.
    pub fn put_agent(&self, agent: serde_json::Value) {
        self.state.lock().put_agent(agent);
    }

    /// Inserts or replaces several agents at once: the CP never shows half of them.
    pub fn put_agents(&self, agents: Vec<serde_json::Value>) {
        let mut st = self.state.lock();
        for a in agents {
            st.put_agent(a);
        }
    }

    /// Calls of one name the devkit answered (e.g. `list_agents`, `put_status`).
    pub fn calls(&self, name: &str) -> u64 {
        self.state.lock().calls.get(name).copied().unwrap_or(0)
    }

    /// Applies `f` to an agent's JSON and bumps the ETag. Returns false if unknown.
    pub fn edit_agent(&self, key: &str, f: impl FnOnce(&mut serde_json::Value)) -> bool {
        self.state.lock().edit_agent(key, f)
    }

    /// Gives the list a new ETag with the same agents, as a CP may for reasons of its own
    /// (the ETag is opaque, docs/behaviour.md#control-plane-calls-and-agent-descriptions).
    pub fn touch(&self) {
        self.state.lock().version += 1;
    }

    pub fn remove_agent(&self, key: &str) -> bool {
        self.state.lock().remove_agent(key)
    }

    pub fn set_faults(&self, faults: Faults) {
        self.state.lock().faults = faults;
    }

    /// The last status the CP accepted for `key`.
    pub fn status(&self, key: &str) -> Option<serde_json::Value> {
        self.state.lock().statuses.get(key).and_then(|v| v.last().cloned())
    }

    /// Every status body accepted for `key`, oldest first.
    pub fn status_history(&self, key: &str) -> Vec<serde_json::Value> {
        self.state.lock().statuses.get(key).cloned().unwrap_or_default()
    }

    pub fn identity(&self, key: &str) -> Option<serde_json::Value> {
        self.state.lock().identities.get(key).cloned()
    }

    /// Issued PATs, including revoked ones.
    pub fn pats(&self) -> Vec<PatRecord> {
        self.state.lock().pats.clone()
    }
}

/// Counts each request by the replica that names itself in `x-fleet-replica`, and keeps when
/// it arrived and when it was made (`x-fleet-call-at`).
async fn count_replica(
    axum::extract::State(dk): axum::extract::State<Devkit>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if let Some(r) = req.headers().get("x-fleet-replica").and_then(|v| v.to_str().ok()) {
        let replica: String = r.chars().take(64).collect();
        let made = req.headers().get("x-fleet-call-at").and_then(|v| v.to_str().ok()?.parse::<f64>().ok());
        let made = made.filter(|ms| ms.is_finite() && *ms >= 0.0);
        let made = made.map(|ms| std::time::UNIX_EPOCH + std::time::Duration::from_micros((ms * 1e3).round() as u64));
        let mut s = dk.state.lock();
        *s.calls_from.entry(replica.clone()).or_default() += 1;
        if s.call_log.len() == state::CALL_LOG_MAX {
            s.call_log.pop_front();
        }
        s.call_log.push_back(state::Call { replica, arrived: std::time::SystemTime::now(), made });
    }
    next.run(req).await
}
