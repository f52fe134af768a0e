//! Test harness: devkit in-process, the controller either in-process or as a real child
//! process (so it can be `SIGKILL`ed), and nodes as plain HTTP clients of the node protocol.
#![allow(dead_code)]

pub mod fake_kube;
pub mod ha;
pub mod kube;
pub mod sim;

use fleet_devkit::{Devkit, DevkitConfig};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub async fn devkit() -> Devkit {
    Devkit::start(DevkitConfig::default(), "127.0.0.1:0".parse().unwrap()).await.unwrap()
}

/// The controller's environment for a devkit and a data directory.
pub fn env_for(dk: &Devkit, data: &Path, port: u16, metrics_port: u16) -> HashMap<String, String> {
    [
        ("FLEET_LISTEN", format!("127.0.0.1:{port}")),
        ("FLEET_METRICS_LISTEN", format!("127.0.0.1:{metrics_port}")),
        ("FLEET_DATA_DIR", data.display().to_string()),
        ("FLEET_TOKEN_AUDIENCES", "notification-service".into()),
        ("FLEET_TOKEN_SCOPES", "control-plane:read notification-service=notifications:send".into()),
        ("FLEET_RECONCILE_SECONDS", "3600".into()),
        ("FLEET_NODE_OFFLINE_SECONDS", "3".into()),
        ("RUST_LOG", "info".into()),
    ]
    .into_iter()
    .chain(dk.controller_env())
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The controller binary as a child process.
pub struct ControllerProcess {
    pub child: Child,
    pub url: String,
    pub env: HashMap<String, String>,
    pub log: PathBuf,
}

impl ControllerProcess {
    pub async fn spawn(env: HashMap<String, String>, log: PathBuf) -> ControllerProcess {
        Self::spawn_bin(Path::new(env!("CARGO_BIN_EXE_fleet-controller")), env, log).await
    }

    /// [`ControllerProcess::spawn`] of another build of the controller (an earlier release's).
    pub async fn spawn_bin(bin: &Path, env: HashMap<String, String>, log: PathBuf) -> ControllerProcess {
        let url = format!("http://{}", env["FLEET_LISTEN"]);
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let child =
            Command::new(bin).arg("serve").env_clear().envs(&env).stdout(Stdio::null()).stderr(out).spawn().unwrap();
        let p = ControllerProcess { child, url, env, log };
        p.wait_healthy().await;
        p
    }

    pub async fn wait_healthy(&self) {
        let c = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = c.get(format!("{}/healthz", self.url)).send().await {
                if r.status() == 200 {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "controller did not become healthy; log:\n{}", self.log_text());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, as an orchestrator stops it (a leader gives its lease up), and waits for it.
    pub fn term(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }

    /// `SIGKILL`: no shutdown hook runs.
    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` until it returns `Some`, or panics with `what` after `secs`.
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An admin client.
#[derive(Clone)]
pub struct Admin {
    pub http: reqwest::Client,
    pub url: String,
    pub token: String,
}

impl Admin {
    pub fn new(url: &str, token: String) -> Admin {
        Admin { http: reqwest::Client::new(), url: url.to_string(), token }
    }

    /// A GET is asked again once when a pooled connection was closed under it (the server
    /// closes idle keep-alives; a client retries an idempotent request, as HTTP/1.1 allows).
    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        let send = || self.http.get(format!("{}{path}", self.url)).bearer_auth(&self.token).send();
        let r = match send().await {
            Ok(r) => r,
            Err(e) if e.is_request() => send().await.unwrap(),
            Err(e) => panic!("GET {path}: {e}"),
        };
        let s = r.status();
        (s, r.json().await.unwrap_or(Value::Null))
    }

    /// `None` when no answer came (the replica it reached went away under it).
    pub async fn try_post(&self, path: &str, body: Value) -> Option<(StatusCode, Value)> {
        let r = self.http.post(format!("{}{path}", self.url)).bearer_auth(&self.token).json(&body).send().await.ok()?;
        let s = r.status();
        Some((s, r.json().await.unwrap_or(Value::Null)))
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let r =
            self.http.post(format!("{}{path}", self.url)).bearer_auth(&self.token).json(&body).send().await.unwrap();
        let s = r.status();
        (s, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        let r = self.http.delete(format!("{}{path}", self.url)).bearer_auth(&self.token).send().await.unwrap();
        let s = r.status();
        (s, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn join_key(&self) -> String {
        let r = self
            .http
            .post(format!("{}/api/v1/join-keys", self.url))
            .bearer_auth(&self.token)
            .json(&json!({"ttlSeconds": 600, "note": "test"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        r.json::<Value>().await.unwrap()["joinKey"].as_str().unwrap().to_string()
    }

    pub async fn placements(&self) -> Vec<Value> {
        let (s, v) = self.get("/api/v1/placements").await;
        assert_eq!(s, 200);
        v["items"].as_array().unwrap().clone()
    }

    /// Joins node `n1` (four slots of kind `k`) to the controller at `url` and waits until
    /// `count` placement items say `placed`.
    pub async fn join_one_node_until_placed(&self, url: &str, count: usize) -> TestNode {
        let mut node = TestNode::new(url, "n1", json!({"executorKinds": ["k"], "capacity": {"slots": 4}}));
        node.join(&self.join_key().await).await;
        eventually(15, &format!("{count} placed"), || async {
            (self.placements().await.iter().filter(|i| i["status"] == "placed").count() == count).then_some(())
        })
        .await;
        node
    }

    pub async fn nodes(&self) -> Vec<Value> {
        let (s, v) = self.get("/api/v1/nodes").await;
        assert_eq!(s, 200);
        v["items"].as_array().unwrap().clone()
    }
}

/// A node speaking the protocol over HTTP, with its own X25519 key.
#[derive(Clone)]
pub struct TestNode {
    pub http: reqwest::Client,
    pub url: String,
    pub name: String,
    pub secret_key: [u8; 32],
    pub public_key: [u8; 32],
    pub id: String,
    pub token: String,
    pub announce: Value,
    pub boot: String,
    pub seq: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl TestNode {
    /// `announce`: labels, executorKinds, executorImages, capacity, secrets.
    pub fn new(url: &str, name: &str, announce: Value) -> TestNode {
        let (secret_key, public_key) = fleet_api::seal::generate_keypair();
        TestNode {
            http: reqwest::Client::new(),
            url: url.to_string(),
            name: name.to_string(),
            secret_key,
            public_key,
            id: String::new(),
            token: String::new(),
            announce,
            boot: uuid_like(),
            seq: Default::default(),
        }
    }

    pub fn join_body(&self, key: &str) -> Value {
        use base64::Engine;
        let mut b = self.announce.clone();
        b["joinKey"] = json!(key);
        b["name"] = json!(self.name);
        b["publicKey"] = json!(base64::engine::general_purpose::STANDARD.encode(self.public_key));
        b["version"] = json!("test");
        b
    }

    pub async fn try_join(&self, key: &str) -> (StatusCode, Value) {
        let r =
            self.http.post(format!("{}/api/v1/nodes:join", self.url)).json(&self.join_body(key)).send().await.unwrap();
        let s = r.status();
        (s, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn join(&mut self, key: &str) {
        let (s, v) = self.try_join(key).await;
        assert_eq!(s, 201, "{v}");
        self.id = v["nodeId"].as_str().unwrap().to_string();
        self.token = v["nodeToken"].as_str().unwrap().to_string();
    }

    /// `GET desired`; returns (status, body or Null).
    pub async fn desired(&self, since: Option<u64>, wait: u64) -> (StatusCode, Value) {
        self.try_desired(since, wait).await.expect("the desired state's request")
    }

    /// `None` when no answer came (a replica killed under it).
    pub async fn try_desired(&self, since: Option<u64>, wait: u64) -> Option<(StatusCode, Value)> {
        let q = poll_query(since, wait);
        let r = self
            .http
            .get(format!("{}/api/v1/nodes/me/desired", self.url))
            .query(&q)
            .bearer_auth(&self.token)
            .timeout(Duration::from_secs(wait + 10))
            .send()
            .await
            .ok()?;
        let s = r.status();
        Some((s, r.json().await.unwrap_or(Value::Null)))
    }

    pub async fn generation(&self) -> u64 {
        let (s, v) = self.desired(None, 0).await;
        assert_eq!(s, 200, "{v}");
        v["generation"].as_u64().unwrap()
    }

    /// Reports `replicas` (agentKey, replica, state, revision) as running state.
    pub async fn report(&self, replicas: &[(&str, u32, &str, u64)]) -> StatusCode {
        let b = self.report_body(replicas);
        self.put_observed(&b).await
    }

    /// An observed report of `replicas` (agentKey, replica, state, revision), with the next seq.
    pub fn report_body(&self, replicas: &[(&str, u32, &str, u64)]) -> Value {
        let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let mut b = self.announce.clone();
        b["appliedGeneration"] = json!(0);
        b["health"] = json!("ok");
        b["version"] = json!("test");
        b["bootId"] = json!(self.boot);
        b["seq"] = json!(seq);
        b["replicas"] = json!(replicas
            .iter()
            .map(|(a, r, s, rev)| json!({"agentKey": a, "replica": r, "state": s, "revision": rev,
                                        "restarts": 0, "lastExitCode": null, "message": null}))
            .collect::<Vec<_>>());
        b
    }

    /// `POST exchange` (docs/behaviour.md#desired-state-and-observed-report): (status, body or null, whether the exchange was offered).
    pub async fn exchange(&self, since: Option<u64>, wait: u64, report: &Value) -> (StatusCode, Value, bool) {
        let q = poll_query(since, wait);
        let r = self
            .http
            .post(format!("{}/api/v1/nodes/me/exchange", self.url))
            .query(&q)
            .bearer_auth(&self.token)
            .json(report)
            .timeout(Duration::from_secs(wait + 10))
            .send()
            .await
            .unwrap();
        let offered = r.headers().get("fleet-node-exchange").is_some_and(|v| v == "/api/v1/nodes/me/exchange");
        (r.status(), r.json().await.unwrap_or(Value::Null), offered)
    }

    pub async fn put_observed(&self, body: &Value) -> StatusCode {
        self.try_put_observed(body).await.expect("the observed report's request")
    }

    /// `None` when no answer came.
    pub async fn try_put_observed(&self, body: &Value) -> Option<StatusCode> {
        let put = self.http.put(format!("{}/api/v1/nodes/me/observed", self.url)).bearer_auth(&self.token).json(body);
        Some(put.send().await.ok()?.status())
    }

    /// Opens the sealed PAT of `agent` in a desired state.
    pub fn open_pat(&self, desired: &Value, agent: &str) -> Option<String> {
        let a = desired["agents"].as_array()?.iter().find(|a| a["agentKey"] == agent)?;
        let ct = a["identity"]["credential"]["ciphertext"].as_str()?;
        let plain = fleet_api::seal::open(&self.secret_key, ct).ok()?;
        String::from_utf8(plain).ok()
    }
}

fn uuid_like() -> String {
    format!("{:016x}", rand_u64())
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos() as u64);
    h.finish()
}

/// The query of a long-poll or an exchange.
fn poll_query(since: Option<u64>, wait: u64) -> Vec<(&'static str, String)> {
    let mut q = vec![("wait", wait.to_string())];
    if let Some(s) = since {
        q.push(("since", s.to_string()));
    }
    q
}

/// A CP agent item.
pub fn agent(key: &str, kind: &str, replicas: u32) -> Value {
    json!({"key": key, "revision": 1, "state": "running",
           "identity": {"kind": "agent"}, "executor": {"kind": kind, "image": null},
           "placement": {"replicas": replicas, "requires": [], "secrets": []}, "drainSeconds": 5})
}

pub fn in_process_config(dk: &Devkit, data: &Path) -> fleet_controller::config::Config {
    let env = env_for(dk, data, 0, 0);
    let mut cfg = fleet_controller::config::Config::from_lookup(&|k| env.get(k).cloned()).unwrap();
    cfg.listen = "127.0.0.1:0".parse::<SocketAddr>().unwrap();
    cfg.metrics_listen = "127.0.0.1:0".parse::<SocketAddr>().unwrap();
    // A pass over more than two changed nodes stores their bodies in chunks, as a
    // fleet-wide change does at full scale.
    cfg.desired_nodes_at_once = 2;
    // And a pass that changes more than two rollouts commits them as its rollout phase goes.
    cfg.rollouts_at_once = 2;
    cfg
}

pub type Reported = std::sync::Arc<parking_lot::Mutex<Vec<(String, u32, String, u64)>>>;

/// Reports every 500 ms while not paused.
pub struct Reporter {
    pub replicas: Reported,
    pub paused: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Reporter {
    pub fn start(node: TestNode) -> Reporter {
        let replicas: Reported = Default::default();
        let paused = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (r, p) = (replicas.clone(), paused.clone());
        let task = tokio::spawn(async move {
            loop {
                if !p.load(std::sync::atomic::Ordering::SeqCst) {
                    let list = r.lock().clone();
                    let refs: Vec<(&str, u32, &str, u64)> =
                        list.iter().map(|(a, i, s, v)| (a.as_str(), *i, s.as_str(), *v)).collect();
                    let _ = tokio::time::timeout(Duration::from_secs(2), node.report(&refs)).await;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        Reporter { replicas, paused, task }
    }

    pub fn set(&self, v: &[(&str, u32, &str, u64)]) {
        *self.replicas.lock() = v.iter().map(|(a, i, s, r)| (a.to_string(), *i, s.to_string(), *r)).collect();
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A JSON value edited by `f`.
pub fn with(mut a: Value, f: impl FnOnce(&mut Value)) -> Value {
    f(&mut a);
    a
}

/// Keeps `nodes` online: each reports (no replicas) every 500 ms until the task is aborted.
pub fn keep_reporting(nodes: Vec<TestNode>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            for n in &nodes {
                let _ = tokio::time::timeout(Duration::from_secs(2), n.report(&[])).await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}
