//! One simulated node: joins with its key, gets its desired state and reports every replica it
//! was given as `running` on a jittered period (and soon after each change), as a real
//! fleet-node does once its containers run. Thousands run as tokio tasks in one process. By
//! default each speaks the exchange over one connection of its own, as a real fleet-node does
//! with a controller that offers it; with `--protocol two-routes` it long-polls through one
//! shared HTTP client and reports over a connection of its own (see [`ReportConn`]).

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use rand::Rng;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::Notify;

pub struct Shared {
    pub http: reqwest::Client,
    /// The exchange (one connection per node, [`exchange`]) instead of the two routes.
    pub exchange: bool,
    /// Two routes: reports go over a connection of each node's own ([`ReportConn`]), not
    /// through `http`.
    pub own_report_connections: bool,
    /// The controller replicas (one, or several on PostgreSQL). A node joins and long-polls
    /// on one and reports to the next, as a Service spreading connections may send them.
    pub urls: Vec<String>,
    pub report_period: Duration,
    pub reports_ok: AtomicU64,
    pub reports_failed: AtomicU64,
    pub joined: AtomicU64,
    /// Nodes whose join was refused (a client error other than 429): the run cannot converge.
    pub refused: AtomicU64,
    /// First moment any node received (agent, revision).
    pub received: Mutex<HashMap<(String, u64), Instant>>,
    /// Replicas that say they are busy (the rollout phase's `--rollout-busy-percent`).
    pub busy: Busy,
}

/// Which replicas say they are busy, and from when: a replica is busy by a hash of its agent
/// and number, for 0–120 s from `from_unix` (0: none is).
#[derive(Default)]
pub struct Busy {
    pub percent: u32,
    pub from_unix: std::sync::atomic::AtomicI64,
}

impl Busy {
    /// Replicas are busy from now on.
    pub fn start_now(&self) {
        self.from_unix.store(unix_now(), Ordering::Relaxed);
    }

    /// `busyUntil` of a running replica, while it is busy.
    fn until(&self, agent: &str, replica: u64, now_unix: i64) -> Option<String> {
        use std::hash::{Hash, Hasher};
        let from = self.from_unix.load(Ordering::Relaxed);
        if self.percent == 0 || from == 0 {
            return None;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (agent, replica).hash(&mut h);
        let h = h.finish();
        let until = from + (h / 100 % 121) as i64;
        let busy = h % 100 < u64::from(self.percent) && now_unix < until;
        busy.then(|| {
            let t = chrono::DateTime::from_timestamp(until, 0).unwrap_or_default();
            t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        })
    }
}

/// Seconds since the Unix epoch.
fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// Knuth's multiplicative hash of a node's index.
fn spread(i: usize) -> usize {
    ((i as u64).wrapping_mul(2_654_435_761) >> 16) as usize
}

use fleet_api::protocol::OBSERVED_PATH;

impl Shared {
    /// Where node `i` joins and long-polls: spread by a hash of `i`, as a Service spreads
    /// connections — independent of what a node holds (labels and secrets follow `i mod k`,
    /// and a replica taking every node with a secret would skew placement).
    pub fn poll_url(&self, i: usize) -> &str {
        &self.urls[spread(i) % self.urls.len()]
    }

    /// Where node `i` reports: the replica after its long-poll's.
    pub fn report_url(&self, i: usize) -> &str {
        &self.urls[(spread(i) + 1) % self.urls.len()]
    }

    /// A report PUT through the shared client's pool.
    fn pooled_report(&self, i: usize, token: &str, body: &Value) -> reqwest::RequestBuilder {
        self.http.put(format!("{}{OBSERVED_PATH}", self.report_url(i))).bearer_auth(token).json(body)
    }

    fn count_report(&self, ok: bool) {
        let counter = if ok { &self.reports_ok } else { &self.reports_failed };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Desired {
    generation: u64,
    agents: Vec<DesiredAgent>,
}

/// What a node keeps of one desired agent.
struct DesiredAgent {
    key: String,
    revision: u64,
    replicas: Vec<u64>,
    /// The template's name, reported back on each replica.
    spec: Option<String>,
    /// A template the rollout phase made to crash ([`CRASHING_CPUS`]).
    crashes: bool,
}

/// `resources.cpus` of a template that crash-loops on the simulated nodes: the rollout
/// phase gives it to the agents it means to fail.
pub const CRASHING_CPUS: f64 = 0.25;

pub struct SimNode {
    pub index: usize,
    pub name: String,
    pub labels: Vec<String>,
    pub secrets: Vec<String>,
    pub slots: u32,
    pub silent: AtomicBool,
    desired: Mutex<Desired>,
    changed: Notify,
    token: Mutex<String>,
    seq: AtomicU64,
}

impl SimNode {
    /// Node `index` of a fleet in `zones` zones: with four, the even nodes have `gpu`; with
    /// more, half of each zone's nodes.
    pub fn new(index: usize, slots: u32, zones: usize) -> SimNode {
        let mut labels = vec![format!("zone=z{}", index % zones)];
        let gpu = if zones == 4 { index } else { index / zones };
        if gpu.is_multiple_of(2) {
            labels.push("gpu".into());
        }
        let secrets = if index.is_multiple_of(3) { vec!["github-token".to_string()] } else { vec![] };
        SimNode {
            index,
            name: format!("sim-{index:05}"),
            labels,
            secrets,
            slots,
            silent: AtomicBool::new(false),
            desired: Mutex::new(Desired::default()),
            changed: Notify::new(),
            token: Mutex::new(String::new()),
            seq: AtomicU64::new(0),
        }
    }

    /// Replicas this node was given.
    pub fn replica_count(&self) -> usize {
        self.desired.lock().agents.iter().map(|a| a.replicas.len()).sum()
    }

    fn announce(&self) -> Value {
        json!({"labels": self.labels, "executorKinds": ["claude-code", "observer"], "executorImages": {},
               "capacity": {"slots": self.slots}, "secrets": self.secrets})
    }
}

pub async fn run(node: Arc<SimNode>, sh: Arc<Shared>, join_key: String) {
    use base64::Engine;
    let (_sk, pk) = fleet_api::seal::generate_keypair();
    let mut body = node.announce();
    body["joinKey"] = json!(join_key);
    body["name"] = json!(node.name);
    body["publicKey"] = json!(base64::engine::general_purpose::STANDARD.encode(pk));
    body["version"] = json!("sim");
    if sh.exchange {
        return exchange(node, sh, body).await;
    }
    loop {
        match sh.http.post(format!("{}/api/v1/nodes:join", sh.poll_url(node.index))).json(&body).send().await {
            Ok(r) if r.status() == 201 => {
                let v: Value = r.json().await.unwrap_or_default();
                *node.token.lock() = v["nodeToken"].as_str().unwrap_or_default().to_string();
                break;
            }
            Ok(r) if r.status().is_client_error() && r.status() != 429 => {
                eprintln!("{}: join refused: {} {}", node.name, r.status(), r.text().await.unwrap_or_default());
                sh.refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
            _ => {
                let ms = 500 + rand::thread_rng().gen_range(0..500);
                tokio::time::sleep(Duration::from_millis(ms)).await
            }
        }
    }
    sh.joined.fetch_add(1, Ordering::Relaxed);
    let poller = tokio::spawn(poll(node.clone(), sh.clone()));
    report_loop(node, sh).await;
    poller.abort();
}

async fn poll(node: Arc<SimNode>, sh: Arc<Shared>) {
    let token = node.token.lock().clone();
    loop {
        if node.silent.load(Ordering::Relaxed) {
            return;
        }
        let since = node.desired.lock().generation;
        let r = sh
            .http
            .get(format!("{}/api/v1/nodes/me/desired", sh.poll_url(node.index)))
            .query(&[("since", since.to_string()), ("wait", "30".into())])
            .bearer_auth(&token)
            .timeout(Duration::from_secs(40))
            .send()
            .await;
        match r {
            Ok(r) if r.status() == 200 => {
                let Ok(v) = r.json::<Value>().await else { continue };
                take_desired(&node, &sh, &v);
            }
            Ok(r) if r.status() == 304 => {}
            _ => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// Records a desired state the node received.
fn take_desired(node: &SimNode, sh: &Shared, v: &Value) {
    let now = Instant::now();
    let agents: Vec<DesiredAgent> = v["agents"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|a| DesiredAgent {
                    key: a["agentKey"].as_str().unwrap_or_default().to_string(),
                    revision: a["revision"].as_u64().unwrap_or(0),
                    replicas: a["replicaIndexes"]
                        .as_array()
                        .map(|i| i.iter().filter_map(Value::as_u64).collect())
                        .unwrap_or_default(),
                    spec: a["specId"].as_str().map(str::to_string),
                    crashes: a["resources"]["cpus"].as_f64() == Some(CRASHING_CPUS),
                })
                .collect()
        })
        .unwrap_or_default();
    {
        let mut seen = sh.received.lock();
        for a in &agents {
            seen.entry((a.key.clone(), a.revision)).or_insert(now);
        }
    }
    *node.desired.lock() = Desired { generation: v["generation"].as_u64().unwrap_or(0), agents };
    node.changed.notify_one();
}

/// The exchange (docs/behaviour.md#desired-state-and-observed-report): the node's one connection carries its join, then one request
/// after another that reports and is held until the desired state changes or the report
/// period (±10 % jitter) runs out. A new desired state is reported on within half a second,
/// as a node that just started its containers would.
async fn exchange(node: Arc<SimNode>, sh: Arc<Shared>, join: Value) {
    let mut conn = ReportConn::new(sh.poll_url(node.index));
    let token = loop {
        match conn.send(hyper::Method::POST, "/api/v1/nodes:join", None, &join).await {
            Ok((s, b)) if s == StatusCode::CREATED => {
                let v: Value = serde_json::from_slice(&b).unwrap_or_default();
                break v["nodeToken"].as_str().unwrap_or_default().to_string();
            }
            Ok((s, b)) if s.is_client_error() && s != StatusCode::TOO_MANY_REQUESTS => {
                eprintln!("{}: join refused: {s} {}", node.name, String::from_utf8_lossy(&b));
                sh.refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
            _ => {
                let ms = 500 + rand::thread_rng().gen_range(0..500);
                tokio::time::sleep(Duration::from_millis(ms)).await
            }
        }
    };
    *node.token.lock() = token.clone();
    sh.joined.fetch_add(1, Ordering::Relaxed);
    let boot = format!("boot-{}", node.index);
    let period = sh.report_period;
    loop {
        if node.silent.load(Ordering::Relaxed) {
            return;
        }
        let body = report_body(&node, &sh, &boot);
        let since = node.desired.lock().generation;
        let wait = period.mul_f64(rand::thread_rng().gen_range(0.9..1.1)).as_secs().clamp(1, 60);
        let path = format!("{}?since={since}&wait={wait}", fleet_api::protocol::EXCHANGE_PATH);
        let r = tokio::time::timeout(
            Duration::from_secs(wait + 10),
            conn.send(hyper::Method::POST, &path, Some(&token), &body),
        )
        .await;
        match r {
            Ok(Ok((s, b))) if s == StatusCode::OK => {
                sh.count_report(true);
                if let Ok(v) = serde_json::from_slice::<Value>(&b) {
                    take_desired(&node, &sh, &v);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Ok(Ok((s, _))) if s == StatusCode::NOT_MODIFIED => sh.count_report(true),
            _ => {
                sh.count_report(false);
                conn.sender = None;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

async fn report_loop(node: Arc<SimNode>, sh: Arc<Shared>) {
    let token = node.token.lock().clone();
    let boot = format!("boot-{}", node.index);
    let period = sh.report_period;
    let mut conn = sh.own_report_connections.then(|| ReportConn::new(sh.report_url(node.index)));
    // Spread the fleet's reports evenly over the period.
    let first = rand::thread_rng().gen_range(0..period.as_millis() as u64);
    tokio::time::sleep(Duration::from_millis(first)).await;
    loop {
        if node.silent.load(Ordering::Relaxed) {
            return;
        }
        let body = report_body(&node, &sh, &boot);
        let ok = match &mut conn {
            Some(c) => {
                matches!(tokio::time::timeout(Duration::from_secs(30), c.put(&token, &body)).await, Ok(Ok(s)) if s.is_success())
            }
            None => {
                let r = sh.pooled_report(node.index, &token, &body).timeout(Duration::from_secs(30)).send().await;
                matches!(r, Ok(r) if r.status().is_success())
            }
        };
        sh.count_report(ok);
        // ±10 % jitter; a change is reported within half a second, as a node that just
        // started its containers would.
        let jitter = rand::thread_rng().gen_range(0.9..1.1);
        tokio::select! {
            _ = tokio::time::sleep(period.mul_f64(jitter)) => {}
            _ = node.changed.notified() => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// A node's own keep-alive connection. On the exchange it carries everything the node sends,
/// as a real fleet-node's one connection does. On the two routes it carries the reports: a
/// real fleet-node holds one beside the connection its long-poll occupies, so the controller
/// carries two per node (its idle keep-alive outlasts the 20 s report period). Sent through
/// the shared client's pool, the simulated nodes' requests would share a few connections and
/// the run would under-state the controller's memory.
struct ReportConn {
    /// host:port of the controller.
    addr: String,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl ReportConn {
    fn new(url: &str) -> ReportConn {
        ReportConn { addr: url.trim_start_matches("http://").trim_end_matches('/').to_string(), sender: None }
    }

    /// PUTs one report.
    async fn put(&mut self, token: &str, body: &Value) -> anyhow::Result<StatusCode> {
        Ok(self.send(hyper::Method::PUT, OBSERVED_PATH, Some(token), body).await?.0)
    }

    /// One request and its whole answer; a closed or failed connection is replaced on the
    /// next call.
    async fn send(
        &mut self,
        method: hyper::Method,
        path: &str,
        token: Option<&str>,
        body: &Value,
    ) -> anyhow::Result<(StatusCode, Bytes)> {
        let mut sender = match self.sender.take() {
            Some(s) if !s.is_closed() => s,
            _ => {
                let stream = TcpStream::connect(&self.addr).await?;
                let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                // Drives the connection; ends when either side closes it.
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                sender
            }
        };
        sender.ready().await?;
        let mut req = Request::builder().method(method).uri(path).header(HOST, &self.addr);
        if let Some(token) = token {
            req = req.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let req =
            req.header(CONTENT_TYPE, "application/json").body(Full::new(Bytes::from(serde_json::to_vec(body)?)))?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        // Read to the end so the connection can carry the next request.
        let bytes = resp.into_body().collect().await?.to_bytes();
        self.sender = Some(sender);
        Ok((status, bytes))
    }
}

/// What a node reports: every replica it was given, `running` at its revision on the
/// template it was sent — `crashloop` for a template the rollout phase made to crash.
fn report_body(node: &SimNode, sh: &Shared, boot: &str) -> Value {
    let d = node.desired.lock();
    let now_unix = unix_now();
    let replicas: Vec<Value> = d
        .agents
        .iter()
        .flat_map(|a| {
            let (state, message) =
                if a.crashes { ("crashloop", json!("exited with code 1")) } else { ("running", Value::Null) };
            a.replicas.iter().map(move |i| {
                let busy = if a.crashes { None } else { sh.busy.until(&a.key, *i, now_unix) };
                let mut r = json!({"agentKey": a.key, "replica": i, "state": state, "revision": a.revision,
                                   "restarts": 0, "lastExitCode": null, "message": message, "specId": a.spec});
                // Left out when idle, as fleet-node does: an older controller refuses the field.
                if let Some(until) = busy {
                    r["busyUntil"] = json!(until);
                }
                r
            })
        })
        .collect();
    let mut b = node.announce();
    b["appliedGeneration"] = json!(d.generation);
    b["health"] = json!("ok");
    b["version"] = json!("sim");
    b["bootId"] = json!(boot);
    b["seq"] = json!(node.seq.fetch_add(1, Ordering::Relaxed) + 1);
    b["observeSeconds"] = json!(sh.report_period.as_secs());
    b["replicas"] = json!(replicas);
    b
}

/// The throughput probe: this node reports back-to-back until `stop`.
pub async fn burst(node: Arc<SimNode>, sh: Arc<Shared>, stop: Arc<AtomicBool>) {
    let token = node.token.lock().clone();
    while !stop.load(Ordering::Relaxed) {
        let body = report_body(&node, &sh, &format!("boot-{}", node.index));
        let r = sh.pooled_report(node.index, &token, &body).send().await;
        sh.count_report(matches!(r, Ok(r) if r.status().is_success()));
    }
}
