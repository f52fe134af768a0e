//! Two loops over one state (SPEC §6.2–§6.3): the **link** to the controller gets the desired
//! state, saves it to `desired.json` and hands it to the supervisor, and reports what the node
//! has at least every `observeSeconds` — over one exchange request when the controller offers
//! it, else as the pull and report loops over the two routes of §4.2. The supervisor loop converges containers on every new desired state and
//! every second. At start the node applies `desired.json` from disk before the controller
//! answers, so without the controller it keeps working.

use crate::client::{retry_delay, Client, ClientError, Offer};
use crate::config::NodeConfig;
use crate::plan::{self, NodePlan};
use crate::runtime::docker::DockerRuntime;
use crate::runtime::Runtime;
use crate::state::{Identity, StateDir};
use crate::supervisor::Supervisor;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use fleet_api::{DesiredState, Health, JoinRequest, ObservedReport, ReplicaReport};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

pub const NOT_JOINED: &str = "node is not joined and no join key file is configured";
pub const CREDENTIAL_REJECTED: &str = "the controller no longer accepts this node's credential";
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Ends the process with a message and a non-zero exit.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Fatal(pub String);

impl From<crate::state::StateError> for Fatal {
    fn from(e: crate::state::StateError) -> Self {
        Fatal(e.to_string())
    }
}

/// What the loops share.
#[derive(Default)]
pub struct Shared {
    pub reports: Mutex<Vec<ReplicaReport>>,
    pub degraded: AtomicBool,
    pub applied_generation: AtomicU64,
}

/// Runs the node; `exchange`: speak the exchange when the controller offers it (else only the
/// two routes).
pub async fn run(cfg: NodeConfig, exchange: bool) -> Result<(), Fatal> {
    let state = StateDir::open(&cfg.state_dir)?;
    let client = Client::new(&cfg.controller_url, cfg.ca_file.as_deref()).map_err(|e| Fatal(e.to_string()))?;
    if !exchange {
        tracing::info!("node protocol: the two routes (--protocol two-routes)");
        client.decline();
    }
    let identity = match state.identity()? {
        Some(i) => i,
        None => join(&cfg, &state, &client).await?,
    };
    let rt = DockerRuntime::connect(&cfg.docker_url, &cfg.name).map_err(|e| Fatal(e.to_string()))?;
    run_with(Arc::new(cfg), state, client, identity, rt).await
}

fn join_request(cfg: &NodeConfig, key: &str, public_key: &[u8; 32]) -> JoinRequest {
    JoinRequest {
        join_key: key.to_string(),
        name: cfg.name.clone(),
        public_key: B64.encode(public_key),
        labels: cfg.sorted_labels(),
        executor_kinds: cfg.kinds(),
        executor_images: cfg.images(),
        capacity: cfg.capacity(),
        secrets: plan::read_secrets(&cfg.secrets_dir).into_iter().collect(),
        version: VERSION.to_string(),
    }
}

async fn join(cfg: &NodeConfig, state: &StateDir, client: &Client) -> Result<Identity, Fatal> {
    let Some(key_file) = &cfg.join_key_file else {
        return Err(Fatal(NOT_JOINED.into()));
    };
    let key = std::fs::read_to_string(key_file)
        .map_err(|e| Fatal(format!("joinKeyFile {}: {e}", key_file.display())))?
        .trim()
        .to_string();
    // The key pair is saved before joining: a crash after the join keeps the key the
    // controller seals to.
    let secret_key = match state.saved_secret_key()? {
        Some(k) => k,
        None => {
            let (sk, _) = fleet_api::seal::generate_keypair();
            state.save_keys(&sk)?;
            sk
        }
    };
    let public_key = fleet_api::seal::public_of(&secret_key);
    let req = join_request(cfg, &key, &public_key);
    let mut attempt = 0;
    loop {
        match client.join(&req).await {
            Ok(resp) => {
                state.save_identity(&resp.node_id, &resp.node_token)?;
                tracing::info!("joined the fleet as {}", resp.node_id);
                return Ok(Identity { node_id: resp.node_id, token: resp.node_token, secret_key, public_key });
            }
            Err(ClientError::Unauthorized(m) | ClientError::BadRequest(m) | ClientError::Conflict(m)) => {
                return Err(Fatal(format!("the controller refused the join: {m}")));
            }
            Err(e) => {
                let d = retry_delay(attempt);
                tracing::warn!(error = %e, retry_in = ?d, "cannot join yet");
                tokio::time::sleep(d).await;
                attempt += 1;
            }
        }
    }
}

/// The desired-state decoder: public for the fuzz target.
pub fn parse_desired(bytes: &[u8]) -> Result<DesiredState, String> {
    serde_json::from_slice(bytes).map_err(|e| e.to_string())
}

pub async fn run_with<R: Runtime>(
    cfg: Arc<NodeConfig>,
    state: StateDir,
    client: Client,
    identity: Identity,
    rt: R,
) -> Result<(), Fatal> {
    let initial = match state.desired()? {
        Some(text) => match parse_desired(text.as_bytes()) {
            Ok(d) => {
                tracing::info!(generation = d.generation, agents = d.agents.len(), "applying the saved desired state");
                Some(Arc::new(d))
            }
            Err(e) => {
                tracing::error!(error = %e, "the saved desired.json is unreadable; waiting for the controller");
                None
            }
        },
        None => None,
    };
    let (tx, rx) = watch::channel(initial);
    let (fatal_tx, mut fatal_rx) = mpsc::channel::<Fatal>(4);
    let shared = Arc::new(Shared::default());
    let identity = Arc::new(identity);

    let mut loops = tokio::task::JoinSet::new();
    let link = Link {
        cfg: cfg.clone(),
        client,
        identity: identity.clone(),
        state: state.clone(),
        reporter: Reporter::new(cfg.clone(), shared.clone()),
    };
    // `fatal_tx` itself stays here: were the loop's clone the only sender, a loop that ended
    // would also close the channel, and `recv` could win the race below with `None` instead
    // of the loop's name (it did, under load in CI).
    loops.spawn(looping("controller", link.run(tx, fatal_tx.clone())));
    loops.spawn(looping("supervisor", supervise(cfg, state, identity, rt, rx, shared)));
    let result = tokio::select! {
        Some(f) = fatal_rx.recv() => Err(f),
        ended = loops.join_next() => {
            // A loop that stopped on purpose (401) said why first; anything else is a fault
            // the orchestrator should restart the node for.
            Err(fatal_rx.try_recv().unwrap_or_else(|_| Fatal(loop_ended(ended))))
        }
        _ = shutdown_signal() => {
            tracing::info!("shutting down; agent containers keep running");
            Ok(())
        }
    };
    loops.abort_all();
    result
}

/// Runs one of the node's loops, named for the message if it ends. With the failpoint
/// `end-<name>` on it ends as if it had returned (tests of this supervision).
async fn looping(name: &'static str, body: impl std::future::Future<Output = ()>) -> &'static str {
    let failpoint = async {
        if !fleet_api::failpoint::enabled() {
            return std::future::pending().await;
        }
        let point = format!("end-{name}");
        while !fleet_api::failpoint::on(&point) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::select! {
        () = body => {}
        () = failpoint => {}
    }
    name
}

/// The message for a loop that ended or panicked.
fn loop_ended(ended: Option<Result<&'static str, tokio::task::JoinError>>) -> String {
    match ended {
        Some(Ok(name)) => format!("the node's {name} loop ended; exiting so that it is restarted"),
        Some(Err(e)) if e.is_panic() => {
            format!("one of the node's loops panicked ({e}); exiting so that it is restarted")
        }
        _ => "the node's loops ended; exiting so that it is restarted".into(),
    }
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
}

/// The node's side of the conversation with the controller (SPEC §6.3): the exchange while
/// the controller offers it — one request that reports and long-polls, so one connection —
/// else the two loops over the two routes of §4.2 (an older controller).
struct Link {
    cfg: Arc<NodeConfig>,
    client: Client,
    identity: Arc<Identity>,
    state: StateDir,
    reporter: Reporter,
}

/// Builds the observed reports: one boot id per process, a rising `seq`.
struct Reporter {
    cfg: Arc<NodeConfig>,
    shared: Arc<Shared>,
    boot_id: String,
    seq: AtomicU64,
}

impl Reporter {
    fn new(cfg: Arc<NodeConfig>, shared: Arc<Shared>) -> Reporter {
        Reporter { cfg, shared, boot_id: uuid::Uuid::new_v4().simple().to_string(), seq: AtomicU64::new(0) }
    }

    fn next(&self) -> ObservedReport {
        let (cfg, shared) = (&self.cfg, &self.shared);
        ObservedReport {
            applied_generation: shared.applied_generation.load(Ordering::SeqCst),
            health: if shared.degraded.load(Ordering::SeqCst) { Health::Degraded } else { Health::Ok },
            labels: cfg.sorted_labels(),
            executor_kinds: cfg.kinds(),
            executor_images: cfg.images(),
            capacity: cfg.capacity(),
            secrets: plan::read_secrets(&cfg.secrets_dir).into_iter().collect(),
            replicas: shared.reports.lock().clone(),
            version: VERSION.to_string(),
            boot_id: Some(self.boot_id.clone()),
            seq: Some(self.seq.fetch_add(1, Ordering::SeqCst) + 1),
            observe_seconds: Some(cfg.observe_seconds),
        }
    }
}

/// Why the exchange stopped.
enum Stopped {
    /// The process must end (the loop has sent the reason).
    Fatal,
    /// Back to the two routes for good.
    Declined,
}

type DesiredTx = watch::Sender<Option<Arc<DesiredState>>>;

impl Link {
    async fn run(self, tx: DesiredTx, fatal: mpsc::Sender<Fatal>) {
        // Let the supervisor look at Docker once before the first report.
        tokio::time::sleep(Duration::from_millis(300)).await;
        loop {
            if self.client.offer() == Offer::Offered {
                match self.exchange_loop(&tx, &fatal).await {
                    Stopped::Fatal => return,
                    Stopped::Declined => self.client.decline(),
                }
            }
            let two_routes = async {
                tokio::select! {
                    () = self.pull_loop(&tx, &fatal) => {}
                    () = self.report_loop(&fatal) => {}
                }
            };
            tokio::select! {
                // Either loop ends only to stop the process.
                () = two_routes => return,
                () = self.client.offered(), if self.client.offer() == Offer::Unknown => {}
            }
        }
    }

    fn since(tx: &DesiredTx) -> Option<u64> {
        tx.borrow().as_ref().map(|d| d.generation)
    }

    /// Saves and hands on a new desired state; `false` when it cannot be read.
    fn take_desired(&self, tx: &DesiredTx, bytes: &[u8]) -> bool {
        match parse_desired(bytes) {
            Ok(d) => {
                if let Err(e) = self.state.save_desired(bytes) {
                    tracing::error!(error = %e, "cannot save desired.json");
                }
                tracing::info!(generation = d.generation, agents = d.agents.len(), "new desired state");
                let _ = tx.send(Some(Arc::new(d)));
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "the controller sent a desired state this node cannot read");
                false
            }
        }
    }

    /// Takes a new desired state (the backoff starts again), or waits out the backoff when
    /// it cannot be read.
    async fn take_or_back_off(&self, tx: &DesiredTx, bytes: &[u8], attempt: &mut u32) {
        if self.take_desired(tx, bytes) {
            *attempt = 0;
        } else {
            tokio::time::sleep(retry_delay(*attempt)).await;
            *attempt += 1;
        }
    }

    /// Report and long-poll in one request, `wait` = the report period (at most 60 s): the
    /// node reports at least every period and hears of a new desired state at once.
    async fn exchange_loop(&self, tx: &DesiredTx, fatal: &mpsc::Sender<Fatal>) -> Stopped {
        tracing::info!("the controller offers the exchange: reports and the desired state share one connection");
        let wait = u64::from(self.cfg.observe_seconds).min(60);
        let mut attempt = 0;
        loop {
            let report = self.reporter.next();
            match self.client.exchange(&self.identity.token, Self::since(tx), wait, &report).await {
                Ok(Some(bytes)) => self.take_or_back_off(tx, &bytes, &mut attempt).await,
                Ok(None) => attempt = 0,
                Err(ClientError::Unauthorized(_)) => {
                    let _ = fatal.send(Fatal(CREDENTIAL_REJECTED.into())).await;
                    return Stopped::Fatal;
                }
                // The desired state must keep coming while the report is refused: the two
                // routes carry it, and log the refusal every period as before.
                Err(ClientError::BadRequest(m)) => {
                    tracing::error!(message = %m, "the controller refused the report (upgrade the controller before the nodes); using the two-route protocol");
                    return Stopped::Declined;
                }
                Err(ClientError::Other(code @ (404 | 405), _)) => {
                    tracing::warn!(code, "the controller does not serve the exchange; using the two-route protocol");
                    return Stopped::Declined;
                }
                Err(e) => {
                    let d = retry_delay(attempt);
                    tracing::warn!(error = %e, retry_in = ?d, "exchange with the controller failed");
                    tokio::time::sleep(d).await;
                    attempt += 1;
                }
            }
        }
    }

    /// Two-route protocol: long-poll `desired?since=&wait=60`; returns only to stop the process.
    async fn pull_loop(&self, tx: &DesiredTx, fatal: &mpsc::Sender<Fatal>) {
        let mut attempt = 0;
        loop {
            match self.client.desired(&self.identity.token, Self::since(tx), 60).await {
                Ok(Some(bytes)) => self.take_or_back_off(tx, &bytes, &mut attempt).await,
                Ok(None) => attempt = 0,
                Err(ClientError::Unauthorized(_)) => {
                    let _ = fatal.send(Fatal(CREDENTIAL_REJECTED.into())).await;
                    return;
                }
                Err(e) => {
                    let d = retry_delay(attempt);
                    tracing::warn!(error = %e, retry_in = ?d, "desired-state poll failed");
                    tokio::time::sleep(d).await;
                    attempt += 1;
                }
            }
        }
    }

    /// Two-route protocol: `PUT observed` every `observeSeconds`; returns only to stop the
    /// process.
    async fn report_loop(&self, fatal: &mpsc::Sender<Fatal>) {
        let mut tick = tokio::time::interval(Duration::from_secs(u64::from(self.cfg.observe_seconds)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.client.observed(&self.identity.token, &self.reporter.next()).await {
                Ok(()) => {}
                Err(ClientError::Unauthorized(_)) => {
                    let _ = fatal.send(Fatal(CREDENTIAL_REJECTED.into())).await;
                    return;
                }
                Err(ClientError::BadRequest(m)) => {
                    tracing::error!(message = %m, "the controller refused the report (upgrade the controller before the nodes)")
                }
                Err(e) => tracing::warn!(error = %e, "report failed; the next period tries again"),
            }
        }
    }
}

async fn supervise<R: Runtime>(
    cfg: Arc<NodeConfig>,
    state: StateDir,
    identity: Arc<Identity>,
    rt: R,
    mut rx: watch::Receiver<Option<Arc<DesiredState>>>,
    shared: Arc<Shared>,
) {
    let mut sup = Supervisor::new(rt);
    let wake = sup.wake.clone();
    let replan_every = Duration::from_secs(u64::from(cfg.observe_seconds));
    let mut current = rx.borrow_and_update().clone();
    let mut node_plan = NodePlan::default();
    let mut planned_at: Option<tokio::time::Instant> = None;
    let mut planned_gen: Option<u64> = None;
    loop {
        // Re-plan on a new desired state, and every report period (secrets come and go).
        let gen = current.as_ref().map(|d| d.generation);
        if gen != planned_gen || planned_at.is_none_or(|t| t.elapsed() >= replan_every) {
            if let Some(d) = &current {
                node_plan = plan::plan(d, &cfg, &state, &identity.secret_key);
                let keep: std::collections::HashSet<&str> = d.agents.iter().map(|a| a.agent_key.as_str()).collect();
                for gone in state.prune_pats(&|a| keep.contains(a)) {
                    tracing::info!(agent = %gone, "deleted the opened PAT of a departed agent");
                }
            }
            planned_gen = gen;
            planned_at = Some(tokio::time::Instant::now());
        }
        if current.is_some() {
            match sup.tick(&node_plan.wanted, &node_plan.drains, &cfg.container_prefix).await {
                Ok(()) => {
                    if shared.degraded.swap(false, Ordering::SeqCst) {
                        tracing::info!("Docker is reachable again");
                    }
                    shared.applied_generation.store(gen.unwrap_or(0), Ordering::SeqCst);
                }
                Err(e) => {
                    if !shared.degraded.swap(true, Ordering::SeqCst) {
                        tracing::error!(error = %e, "Docker is unreachable; health degraded, retrying");
                    }
                }
            }
            *shared.reports.lock() = sup.reports(&node_plan.wanted);
        } else if let Err(e) = sup.runtime().ping().await {
            if !shared.degraded.swap(true, Ordering::SeqCst) {
                tracing::error!(error = %e, "Docker is unreachable; health degraded, retrying");
            }
        } else {
            shared.degraded.store(false, Ordering::SeqCst);
        }
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    return;
                }
                current = rx.borrow_and_update().clone();
            }
            _ = wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    //! The link's choice of protocol against a stand-in controller on a real socket: the
    //! offer is taken from an answer's header, and an exchange refused with `404` sends the
    //! node back to the two routes for good.
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Answers every request with `answer(request line)`: (status line, extra headers, body).
    async fn stand_in(answer: fn(&str) -> (&'static str, &'static str, &'static str)) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let exchanges = Arc::new(AtomicUsize::new(0));
        let seen = exchanges.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else { return };
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut tmp = [0u8; 8192];
                    loop {
                        let Ok(n) = sock.read(&mut tmp).await else { return };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&tmp[..n]);
                        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
                        let head = String::from_utf8_lossy(&buf[..end]).to_string();
                        let len: usize = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap())
                            })
                            .unwrap_or(0);
                        if buf.len() < end + 4 + len {
                            continue;
                        }
                        buf.drain(..end + 4 + len);
                        let line = head.lines().next().unwrap_or("").to_string();
                        if line.contains(fleet_api::protocol::EXCHANGE_PATH) {
                            seen.fetch_add(1, Ordering::SeqCst);
                        }
                        let (status, headers, body) = answer(&line);
                        let out = format!("HTTP/1.1 {status}\r\n{headers}content-length: {}\r\n\r\n{body}", body.len());
                        if sock.write_all(out.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, exchanges)
    }

    fn link(url: &str, dir: &std::path::Path) -> (Link, DesiredTx) {
        let yaml = format!(
            "controllerUrl: {url}\nname: w1\ncapacity: {{slots: 1}}\nexecutors: {{k: {{image: img:1}}}}\nstateDir: {}\nsecretsDir: {}\nobserveSeconds: 5\n",
            dir.join("state").display(),
            dir.join("secrets").display()
        );
        let cfg = Arc::new(NodeConfig::parse(&yaml, "node.yaml", &|_| None).unwrap());
        let (secret_key, public_key) = fleet_api::seal::generate_keypair();
        let identity = Arc::new(Identity { node_id: "n1".into(), token: "fnt_x".into(), secret_key, public_key });
        let link = Link {
            client: Client::new(url, None).unwrap(),
            state: StateDir::open(&cfg.state_dir).unwrap(),
            reporter: Reporter::new(cfg.clone(), Arc::new(Shared::default())),
            identity,
            cfg,
        };
        (link, watch::channel(None).0)
    }

    const DESIRED: &str = r#"{"generation":4,"agents":[]}"#;
    const OFFER: &str = "fleet-node-exchange: /api/v1/nodes/me/exchange\r\n";

    #[tokio::test]
    async fn the_offer_is_taken_and_a_refused_exchange_declines_it() {
        // A controller that offers the exchange but answers it 404 (a proxy that does not
        // pass the route): the node tries it once, then keeps to the two routes.
        let (url, exchanges) = stand_in(|line| {
            if line.starts_with("POST /api/v1/nodes/me/exchange") {
                ("404 Not Found", OFFER, r#"{"error":"not_found","message":"no such route"}"#)
            } else if line.starts_with("GET /api/v1/nodes/me/desired") {
                ("200 OK", OFFER, DESIRED)
            } else {
                ("204 No Content", OFFER, "")
            }
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let (link, tx) = link(&url, dir.path());
        assert_eq!(link.client.offer(), Offer::Unknown);
        let (fatal, _rx) = mpsc::channel(1);
        let mut rx = tx.subscribe();
        tokio::spawn(link.run(tx, fatal));
        // The pull loop gets the desired state and sees the offer; the exchange is refused.
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|d| d.as_ref().is_some_and(|d| d.generation == 4)))
            .await
            .expect("the desired state arrives")
            .unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(exchanges.load(Ordering::SeqCst), 1, "tried once, then the two routes for good");
    }

    #[tokio::test]
    async fn an_offered_exchange_carries_reports_and_the_desired_state() {
        let (url, exchanges) = stand_in(|line| {
            if line.starts_with("POST /api/v1/nodes/me/exchange") && !line.contains("since=4") {
                ("200 OK", OFFER, DESIRED)
            } else if line.starts_with("POST /api/v1/nodes/me/exchange") {
                ("304 Not Modified", OFFER, "")
            } else {
                ("200 OK", OFFER, DESIRED)
            }
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let (link, tx) = link(&url, dir.path());
        let (fatal, _rx) = mpsc::channel(1);
        let mut rx = tx.subscribe();
        tokio::spawn(link.run(tx, fatal));
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|d| d.is_some())).await.unwrap().unwrap();
        // After the first answer it asks with since=4, and the stand-in answers 304 at once:
        // one exchange after another.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(exchanges.load(Ordering::SeqCst) >= 3, "the node speaks the exchange");
        assert!(dir.path().join("state/desired.json").exists(), "the desired state is saved");
    }
}
