//! The end-to-end harness: devkit in-process; the controller and every node as real
//! processes of the workspace's binaries, against the real Docker engine. Faults are real:
//! `SIGKILL`, restarts, a TCP proxy the test controls, a dead `dockerUrl`.
#![allow(dead_code)]

use fleet_devkit::{Devkit, DevkitConfig};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A workspace binary, built if this test run did not build it.
pub fn bin(name: &str) -> PathBuf {
    let dir = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().to_path_buf();
    let path = dir.join(name);
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo).args(["build", "--workspace", "--bin", name]).status().unwrap();
        assert!(st.success(), "cargo build --bin {name}");
    }
    path
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

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
        assert!(Instant::now() < deadline, "timed out after {secs} s waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(bin: &Path, args: &[&str], env: &HashMap<String, String>, log: &Path) -> Proc {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        let child = Command::new(bin)
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env)
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap();
        Proc { child, log: log.to_path_buf() }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, as an orchestrator stops it, and waits for it to end.
    pub fn term(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        self.child.wait().unwrap()
    }

    /// Exit status once the process has ended by itself.
    pub async fn exited(&mut self, secs: u64) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < deadline, "process did not exit; log:\n{}", self.log_text());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nginx terminating TLS with a self-signed CA and stripping `/fleet`, in front of `upstream`.
pub struct TlsProxy {
    pub url: String,
    pub ca: PathBuf,
    child: Child,
}

impl TlsProxy {
    pub fn start(dir: &Path, upstream: &str) -> TlsProxy {
        std::fs::create_dir_all(dir).unwrap();
        let p = |n: &str| dir.join(n).display().to_string();
        let run = |c: &mut Command| {
            let o = c.output().unwrap();
            assert!(o.status.success(), "{c:?}: {}", String::from_utf8_lossy(&o.stderr));
        };
        run(Command::new("openssl")
            .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=fleet-test-ca"])
            .args(["-keyout", &p("ca.key"), "-out", &p("ca.pem")]));
        run(Command::new("openssl").args(["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1"]).args([
            "-keyout",
            &p("srv.key"),
            "-out",
            &p("srv.csr"),
        ]));
        std::fs::write(
            dir.join("ext.cnf"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        run(Command::new("openssl")
            .args(["x509", "-req", "-days", "2", "-in", &p("srv.csr"), "-CA", &p("ca.pem"), "-CAkey", &p("ca.key")])
            .args(["-CAcreateserial", "-out", &p("srv.pem"), "-extfile", &p("ext.cnf")]));
        let port = free_port();
        std::fs::write(
            dir.join("nginx.conf"),
            format!(
                "daemon off;\nworker_processes 1;\npid {pid};\nerror_log {err};\nevents {{}}\nhttp {{\n  access_log off;\n  client_body_temp_path {t}/body;\n  proxy_temp_path {t}/proxy;\n\
                 server {{\n    listen 127.0.0.1:{port} ssl;\n    ssl_certificate {crt};\n    ssl_certificate_key {key};\n\
                 location /fleet/ {{\n      proxy_pass http://{upstream}/;\n      proxy_http_version 1.1;\n      proxy_read_timeout 120s;\n      proxy_buffering off;\n    }}\n  }}\n}}\n",
                pid = p("nginx.pid"),
                err = p("error.log"),
                t = dir.display(),
                crt = p("srv.pem"),
                key = p("srv.key"),
            ),
        )
        .unwrap();
        let child = Command::new("nginx")
            .args(["-c", &p("nginx.conf"), "-p", &dir.display().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx runs (apt-get install nginx-light)");
        TlsProxy { url: format!("https://127.0.0.1:{port}/fleet"), ca: dir.join("ca.pem"), child }
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        // SIGTERM lets the master take its workers down (SIGKILL would orphan them).
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

/// Whether nodes reach the controller through the TLS proxy (`FLEET_E2E_TLS=1`).
pub fn via_tls() -> bool {
    std::env::var("FLEET_E2E_TLS").as_deref() == Ok("1")
}

/// devkit + the controller process.
pub struct Fleet {
    /// What nodes use as `controllerUrl`: the controller, or the TLS proxy in front of it.
    pub public_url: String,
    pub tls: Option<TlsProxy>,
    pub dir: tempfile::TempDir,
    pub devkit: Devkit,
    pub env: HashMap<String, String>,
    pub controller: Option<Proc>,
    pub url: String,
    pub http: reqwest::Client,
    pub admin_token: String,
    pub prefix: String,
}

impl Fleet {
    pub async fn start(prefix: &str) -> Fleet {
        let mut f = Fleet::new(prefix).await;
        f.start_controller().await;
        f
    }

    /// devkit and the controller's environment; no controller started.
    pub async fn new(prefix: &str) -> Fleet {
        fleet_e2e::cleanup(prefix);
        let devkit = Devkit::start(DevkitConfig::default(), "127.0.0.1:0".parse().unwrap()).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let env: HashMap<String, String> = [
            ("FLEET_LISTEN", format!("127.0.0.1:{port}")),
            ("FLEET_METRICS_LISTEN", format!("127.0.0.1:{}", free_port())),
            ("FLEET_DATA_DIR", dir.path().join("controller").display().to_string()),
            ("FLEET_TOKEN_SCOPES", "control-plane:read".into()),
            ("FLEET_RECONCILE_SECONDS", "2".into()),
            ("FLEET_NODE_OFFLINE_SECONDS", "3".into()),
            ("FLEET_TOKEN_REVOKE_GRACE_SECONDS", "2".into()),
            ("RUST_LOG", "info".into()),
        ]
        .into_iter()
        .chain(devkit.controller_env())
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let admin_token = devkit.mint("fleet", &["fleet:admin"], 3600);
        let url = format!("http://127.0.0.1:{port}");
        let tls = via_tls().then(|| TlsProxy::start(&dir.path().join("tls"), url.trim_start_matches("http://")));
        Fleet {
            public_url: tls.as_ref().map(|t| t.url.clone()).unwrap_or_else(|| url.clone()),
            tls,
            dir,
            devkit,
            env,
            controller: None,
            url,
            http: reqwest::Client::new(),
            admin_token,
            prefix: prefix.to_string(),
        }
    }

    pub async fn start_controller(&mut self) {
        let log = self.dir.path().join("controller.log");
        let mut proc = Proc::spawn(&bin("fleet-controller"), &["serve"], &self.env, &log);
        let started = Instant::now();
        let deadline = started + Duration::from_secs(60);
        loop {
            let health = self.http.get(format!("{}/healthz", self.url)).send().await;
            if health.is_ok_and(|r| r.status() == 200) {
                break;
            }
            // A controller that ended, or one slow to come up, is reported with its own words:
            // a flake seen only under CI's load is otherwise a bare timeout.
            if let Some(status) = proc.child.try_wait().unwrap() {
                panic!("the controller exited ({status}) before it was healthy; its log:\n{}", proc.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "timed out after 60 s waiting for the controller to be healthy; its log:\n{}",
                proc.log_text()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let took = started.elapsed();
        if took > Duration::from_secs(10) {
            eprintln!("the controller took {took:?} to be healthy; its log:\n{}", proc.log_text());
        }
        self.controller = Some(proc);
    }

    pub fn kill_controller(&mut self) {
        if let Some(mut c) = self.controller.take() {
            c.kill9();
        }
    }

    pub fn controller_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("controller.log")).unwrap_or_default()
    }

    pub async fn admin_get(&self, path: &str) -> Value {
        self.http
            .get(format!("{}{path}", self.url))
            .bearer_auth(&self.admin_token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap_or(Value::Null)
    }

    pub async fn join_key(&self) -> String {
        let v: Value = self
            .http
            .post(format!("{}/api/v1/join-keys", self.url))
            .bearer_auth(&self.admin_token)
            .json(&json!({"ttlSeconds": 600}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["joinKey"].as_str().unwrap().to_string()
    }

    pub async fn node_view(&self, name: &str) -> Option<Value> {
        self.admin_get("/api/v1/nodes").await["items"].as_array()?.iter().find(|n| n["name"] == name).cloned()
    }

    /// A node directory with node.yaml; not started.
    /// `short` becomes the fleet-unique node name `<prefix>-<short>`.
    pub async fn node(&self, short: &str, extra: &str) -> NodeDir {
        self.node_sized(short, 4, extra).await
    }

    /// [`Fleet::node`] with `slots` slots.
    pub async fn node_sized(&self, short: &str, slots: u32, extra: &str) -> NodeDir {
        let name = format!("{}-{short}", self.prefix);
        let name = name.as_str();
        let root = self.dir.path().join(short);
        std::fs::create_dir_all(root.join("secrets")).unwrap();
        let key = self.join_key().await;
        std::fs::write(root.join("join-key"), &key).unwrap();
        // Every node reaches the engine through its own docker-guard, as the shipped compose
        // file has it, unless the test names another engine.
        let guarded = !extra.contains("dockerUrl:");
        let guard = if guarded {
            format!("dockerUrl: unix://{r}/guard.sock\nguardDir: {r}/guard\n", r = root.display())
        } else {
            String::new()
        };
        let yaml = format!(
            "controllerUrl: {url}\nname: {name}\ncapacity: {{slots: {slots}}}\n\
             executors:\n  k: {{image: \"{img}\", dataPath: /data, images: [\"fleet-test-agent:*\"]}}\n\
             stateDir: {root}/state\nsecretsDir: {root}/secrets\njoinKeyFile: {root}/join-key\n\
             observeSeconds: 5\ncontainerPrefix: {name}\n{guard}{ca}{extra}",
            url = self.public_url,
            ca = self.tls.as_ref().map(|t| format!("caFile: {}\n", t.ca.display())).unwrap_or_default(),
            img = fleet_e2e::image("sleep"),
            root = root.display(),
        );
        std::fs::write(root.join("node.yaml"), yaml).unwrap();
        NodeDir { root, name: name.to_string(), prefix: name.to_string(), proc: None, guarded, guard: None }
    }

    /// The last status the CP accepted for `agent`, once `pred` holds.
    pub async fn status_where(&self, agent: &str, secs: u64, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        eventually(secs, what, || async { self.devkit.status(agent).filter(|s| pred(s)) }).await
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        fleet_e2e::cleanup(&self.prefix);
    }
}

pub struct NodeDir {
    pub root: PathBuf,
    pub name: String,
    pub prefix: String,
    pub proc: Option<Proc>,
    /// Whether the node reaches the engine through its docker-guard.
    pub guarded: bool,
    /// The guard, started with the node and kept across the node's restarts (a process of
    /// its own, as in the compose file).
    pub guard: Option<Proc>,
}

impl NodeDir {
    pub fn config(&self) -> PathBuf {
        self.root.join("node.yaml")
    }

    pub fn start(&mut self) {
        self.start_with(&[]);
    }

    /// Starts the node with extra environment (and its guard, the first time).
    pub fn start_with(&mut self, extra: &[(&str, &str)]) {
        let mut env: HashMap<String, String> = [("RUST_LOG".to_string(), "info".to_string())].into();
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let cfg = self.config().display().to_string();
        if self.guarded && self.guard.is_none() {
            self.start_guard(&cfg, &env);
        }
        self.proc = Some(Proc::spawn(&bin("fleet-node"), &["--config", &cfg], &env, &self.root.join("node.log")));
    }

    fn start_guard(&mut self, cfg: &str, env: &HashMap<String, String>) {
        // The node's state directory exists before the guard starts (the compose file's step
        // 2): the guard learns the node's user from its owner.
        std::fs::create_dir_all(self.root.join("state")).unwrap();
        let listen = format!("unix://{}", self.root.join("guard.sock").display());
        let args = ["--config", cfg, "docker-guard", "--listen", &listen];
        self.guard = Some(Proc::spawn(&bin("fleet-node"), &args, env, &self.root.join("guard.log")));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.root.join("guard.sock").exists() {
            assert!(Instant::now() < deadline, "the docker-guard did not listen:\n{}", self.guard_log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn guard_log(&self) -> String {
        std::fs::read_to_string(self.root.join("guard.log")).unwrap_or_default()
    }

    pub fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill9();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("node.log")).unwrap_or_default()
    }

    pub fn container(&self, agent: &str, replica: u32) -> String {
        format!("{}-{agent}-{replica}", self.prefix)
    }
}

/// `docker inspect` of a container: (id, running, started-at, image, restart count unused).
pub fn container(name: &str) -> Option<Value> {
    fleet_e2e::inspect(name).and_then(|s| serde_json::from_str::<Value>(&s).ok()).map(|v| v[0].clone())
}

pub fn logs(name: &str) -> String {
    let o = Command::new("docker").args(["logs", name]).output().unwrap();
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// The PAT an agent container printed at its latest start.
pub fn pat_seen_by(name: &str) -> Option<String> {
    logs(name).lines().rev().find_map(|l| l.strip_prefix("pat=").map(str::to_string))
}

/// Live (not revoked) PATs IAM issued for `agent`.
pub fn live_pats(f: &Fleet, agent: &str) -> Vec<fleet_devkit::PatRecord> {
    f.devkit.pats().into_iter().filter(|p| p.agent_key.as_deref() == Some(agent) && !p.revoked).collect()
}

/// The tokens of those PATs.
pub fn live_pat(f: &Fleet, agent: &str) -> Vec<String> {
    live_pats(f, agent).into_iter().map(|p| p.token).collect()
}

pub fn agent(key: &str, replicas: u32) -> Value {
    json!({"key": key, "revision": 1, "state": "running", "identity": {"kind": "agent"},
           "executor": {"kind": "k", "image": null},
           "placement": {"replicas": replicas, "requires": [], "secrets": []}, "drainSeconds": 2})
}

/// A TCP proxy the test can cut: while `open` is false it refuses and drops connections.
pub struct Partition {
    pub port: u16,
    pub open: Arc<AtomicBool>,
}

impl Partition {
    pub async fn start(target: String) -> Partition {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(true));
        let o = open.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut c, _)) = listener.accept().await else { return };
                if !o.load(Ordering::SeqCst) {
                    drop(c);
                    continue;
                }
                let target = target.clone();
                let o = o.clone();
                tokio::spawn(async move {
                    let Ok(mut s) = tokio::net::TcpStream::connect(&target).await else { return };
                    // Cut established connections too when the partition starts.
                    let cut = async {
                        while o.load(Ordering::SeqCst) {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut c, &mut s) => {}
                        _ = cut => {}
                    }
                });
            }
        });
        Partition { port, open }
    }

    pub fn set(&self, open: bool) {
        self.open.store(open, Ordering::SeqCst);
    }
}

/// What a Kubernetes Service does for several controller replicas: each new connection goes
/// to the next backend in turn, skipping one that refuses it (a dead replica is out of the
/// endpoints).
pub struct Spread {
    pub url: String,
    backends: Arc<parking_lot::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Spread {
    pub async fn start(backends: Vec<String>) -> Spread {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let backends = Arc::new(parking_lot::Mutex::new(backends));
        let held = backends.clone();
        let task = tokio::spawn(async move {
            let mut next = 0usize;
            loop {
                let Ok((mut c, _)) = listener.accept().await else { return };
                let backends = held.lock().clone();
                let order: Vec<String> =
                    (0..backends.len()).map(|i| backends[(next + i) % backends.len()].clone()).collect();
                next = next.wrapping_add(1);
                tokio::spawn(async move {
                    for b in order {
                        if let Ok(mut s) = tokio::net::TcpStream::connect(&b).await {
                            let _ = tokio::io::copy_bidirectional(&mut c, &mut s).await;
                            return;
                        }
                    }
                });
            }
        });
        Spread { url, backends, task }
    }

    /// New connections go to these backends from now on (a Service's endpoints changing).
    pub fn set(&self, backends: Vec<String>) {
        *self.backends.lock() = backends;
    }
}

impl Drop for Spread {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An HTTP/1.1 proxy that forwards request by request and, for the first join it sees, lets
/// the controller answer and then drops the answer: a `201` lost on the way back (docs/behaviour.md#node-lifecycle).
pub struct LosesFirstJoin {
    pub url: String,
    /// Joins that passed through, the lost one included.
    pub joins: Arc<std::sync::atomic::AtomicUsize>,
}

impl LosesFirstJoin {
    pub async fn start(upstream: String) -> LosesFirstJoin {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let joins = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = joins.clone();
        tokio::spawn(async move {
            loop {
                let Ok((c, _)) = listener.accept().await else { return };
                let (upstream, seen) = (upstream.clone(), seen.clone());
                tokio::spawn(async move {
                    let _ = relay(c, &upstream, &seen).await;
                });
            }
        });
        LosesFirstJoin { url, joins }
    }
}

/// One client connection: each request goes upstream whole and its answer comes back whole,
/// except the answer to the first join overall, after which the connection is dropped.
async fn relay(
    mut client: tokio::net::TcpStream,
    upstream: &str,
    joins: &std::sync::atomic::AtomicUsize,
) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut server = tokio::net::TcpStream::connect(upstream).await?;
    let (mut from_client, mut from_server) = (Vec::new(), Vec::new());
    loop {
        let Some(request) = read_message(&mut client, &mut from_client).await? else { return Ok(()) };
        let is_join = request.starts_with(b"POST /api/v1/nodes:join ");
        server.write_all(&request).await?;
        let Some(answer) = read_message(&mut server, &mut from_server).await? else { return Ok(()) };
        if is_join && joins.fetch_add(1, Ordering::SeqCst) == 0 {
            return Ok(()); // the controller answered; the node never hears it
        }
        client.write_all(&answer).await?;
    }
}

/// One HTTP/1.1 message (head and a `Content-Length` body) from `s`, `buf` holding what was
/// read past it; `None` at a clean end of stream.
async fn read_message(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Option<Vec<u8>>> {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)))
                .unwrap_or(0);
            let total = end + 4 + len;
            while buf.len() < total {
                let n = s.read(&mut chunk).await?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            let rest = buf.split_off(total);
            return Ok(Some(std::mem::replace(buf, rest)));
        }
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}
