//! The supervisor and the bollard runtime against the real Docker engine, with locally built
//! FROM-scratch test images. Every scenario runs three times: on the engine's socket, through
//! a restricting proxy owned by the test that admits only the endpoints of docs/behaviour.md#the-agent-container and
//! records anything else, and through `fleet-node docker-guard` (docs/behaviour.md#packaging-and-the-docker-guard), which must let the
//! node's whole container lifecycle through while refusing what a compromised node might try.

use fleet_api::{
    DesiredAgent, DesiredIdentity, DesiredState, Executor, ReplicaReport, ReplicaState, Resources, SealedCredential,
};
use fleet_e2e::{cleanup, docker_available, ensure_test_images, image, inspect};
use fleet_node::config::NodeConfig;
use fleet_node::plan;
use fleet_node::runtime::docker::DockerRuntime;
use fleet_node::state::StateDir;
use fleet_node::supervisor::Supervisor;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Harness {
    _dir: tempfile::TempDir,
    cfg: NodeConfig,
    state: StateDir,
    sk: [u8; 32],
    pk: [u8; 32],
    sup: Supervisor<DockerRuntime>,
    prefix: String,
}

/// How the node reaches the engine.
#[derive(Clone)]
enum Via {
    /// This URL (the socket, or the test's restricting proxy).
    Url(String),
    /// A docker-guard started for each harness's node.yaml, in front of the socket.
    Guard,
}

/// Starts a docker-guard for `cfg` in front of the engine's socket; returns its address.
async fn start_guard(cfg: &NodeConfig) -> String {
    use fleet_node::guard::{self, Upstream};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let upstream = Upstream::parse("unix:///var/run/docker.sock").unwrap();
    let guard = guard::prepare(cfg, None, upstream).expect("the guard prepares");
    tokio::spawn(guard::serve(guard, guard::Listener::Tcp(listener)));
    format!("tcp://{addr}")
}

impl Harness {
    async fn new(via: &Via, prefix: &str) -> Harness {
        Harness::with_yaml(via, prefix, "").await
    }

    /// `extra`: more node.yaml lines.
    async fn with_yaml(via: &Via, prefix: &str, extra: &str) -> Harness {
        let docker_url = match via {
            Via::Url(u) => u.clone(),
            Via::Guard => "tcp://127.0.0.1:1".into(),
        };
        let mut h = Harness::with_url(&docker_url, prefix, extra);
        if let Via::Guard = via {
            let url = start_guard(&h.cfg).await;
            h.cfg.docker_url = url.clone();
            h.sup = Supervisor::new(DockerRuntime::connect(&url, &h.cfg.name).unwrap());
        }
        h
    }

    fn with_url(docker_url: &str, prefix: &str, extra: &str) -> Harness {
        cleanup(prefix);
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "controllerUrl: http://127.0.0.1:1\nname: {prefix}-node\ncapacity: {{slots: 4}}\n\
             executors:\n  k: {{image: \"{img}\", dataPath: /data, env: {{SHARED: kind, KIND_ONLY: x}},\n      images: [\"fleet-test-agent:sleep*\", \"fleet-test-agent:exit*\"]}}\n\
             stateDir: {d}/state\nsecretsDir: {d}/secrets\nguardDir: {d}/guard\nagentEnv: {{SHARED: agent, AGENT_ONLY: y}}\n\
             dockerUrl: {docker_url}\ncontainerPrefix: {prefix}\n{extra}",
            img = image("sleep"),
            d = dir.path().display()
        );
        let cfg = NodeConfig::parse(&text, "test", &|_| None).unwrap();
        std::fs::create_dir_all(&cfg.secrets_dir).unwrap();
        let state = StateDir::open(&cfg.state_dir).unwrap();
        let (sk, pk) = fleet_api::seal::generate_keypair();
        let rt = DockerRuntime::connect(docker_url, &cfg.name).unwrap();
        Harness { _dir: dir, cfg, state, sk, pk, sup: Supervisor::new(rt), prefix: prefix.to_string() }
    }

    fn agent(&self, key: &str, image: Option<&str>, secrets: &[&str], cred: &str) -> DesiredAgent {
        DesiredAgent {
            agent_key: key.into(),
            revision: 1,
            replica_indexes: vec![0],
            executor: Executor { kind: "k".into(), image: image.map(str::to_string) },
            secrets: secrets.iter().map(|s| s.to_string()).collect(),
            resources: Resources { cpus: Some(0.5), memory_mb: Some(64) },
            drain_seconds: 5,
            identity: DesiredIdentity {
                principal_id: "prn_test".into(),
                tenant_id: "tenant".into(),
                credential: SealedCredential {
                    credential_id: cred.into(),
                    ciphertext: fleet_api::seal::seal(&self.pk, format!("pat-for-{key}").as_bytes()),
                    expires_at: "2030-01-01T00:00:00Z".into(),
                },
            },
            spec_id: None,
            restart: 0,
        }
    }

    async fn tick(&mut self, d: &DesiredState) -> Vec<ReplicaReport> {
        let p = plan::plan(d, &self.cfg, &self.state, &self.sk);
        self.sup.tick(&p.wanted, &p.drains, &self.prefix).await.unwrap();
        self.sup.reports(&p.wanted)
    }

    /// Ticks every 500 ms until `pred` holds for the first replica, or fails after `secs`.
    async fn until(
        &mut self,
        d: &DesiredState,
        secs: u64,
        what: &str,
        pred: impl Fn(&ReplicaReport) -> bool,
    ) -> ReplicaReport {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let r = self.tick(d).await.remove(0);
            if pred(&r) {
                return r;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}; last report {r:?}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        cleanup(&self.prefix);
    }
}

fn doc(name: &str) -> Value {
    serde_json::from_str::<Value>(&inspect(name).unwrap_or_else(|| panic!("{name} exists"))).unwrap()[0].clone()
}

fn state(d: Vec<DesiredAgent>) -> DesiredState {
    DesiredState { generation: 1, agents: d }
}

async fn scenarios(via: Via, tag: &str) {
    // docs/behaviour.md#the-agent-container exactly, as `docker inspect` shows it.
    let mut h = Harness::new(&via, &format!("fte{tag}a")).await;
    std::fs::write(h.cfg.secrets_dir.join("github-token"), "gh-secret").unwrap();
    let d = state(vec![h.agent("coder", None, &["github-token"], "cred-1")]);
    let r = h.until(&d, 30, "running", |r| r.state == ReplicaState::Running).await;
    assert_eq!(r.restarts, 0);
    let name = format!("{}-coder-0", h.prefix);
    let c = doc(&name);
    assert_eq!(c["Config"]["Image"], image("sleep"));
    let env: Vec<&str> = c["Config"]["Env"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    for e in [
        "SHARED=kind",
        "AGENT_ONLY=y",
        "KIND_ONLY=x",
        "CONTROL_PLANE_AGENT_KEY=coder",
        "IAM_PRINCIPAL=prn_test",
        "CONTROL_PLANE_IAM_TENANT=tenant",
        "FLEET_REPLICA=0",
    ] {
        assert!(env.contains(&e), "{e} in {env:?}");
    }
    let labels = &c["Config"]["Labels"];
    assert_eq!(labels["fleet.managed"], "1");
    assert_eq!(labels["fleet.node"], h.cfg.name.as_str());
    assert_eq!((labels["fleet.agent"].as_str(), labels["fleet.replica"].as_str()), (Some("coder"), Some("0")));
    assert_eq!(labels["fleet.spec"].as_str().unwrap().len(), 24);
    assert_eq!(c["HostConfig"]["Init"], true);
    assert_eq!(c["HostConfig"]["RestartPolicy"]["Name"], "no");
    assert_eq!(c["HostConfig"]["NanoCpus"], 500_000_000);
    assert_eq!(c["HostConfig"]["Memory"], 64 * 1024 * 1024);
    // docs/behaviour.md#hardening, as the engine shows it: every capability dropped, no new privileges, a pids
    // limit, no swap beyond the memory limit, rotated logs.
    let hc = &c["HostConfig"];
    assert_eq!(hc["CapDrop"], serde_json::json!(["ALL"]));
    assert!(hc["CapAdd"].is_null() || hc["CapAdd"] == serde_json::json!([]), "{}", hc["CapAdd"]);
    assert_eq!(hc["SecurityOpt"], serde_json::json!(["no-new-privileges"]));
    assert_eq!(hc["PidsLimit"], 1024);
    assert_eq!(hc["MemorySwap"], 64 * 1024 * 1024);
    assert_eq!(
        hc["LogConfig"],
        serde_json::json!({"Type": "json-file", "Config": {"max-file": "3", "max-size": "10m"}})
    );
    let mounts = c["Mounts"].as_array().unwrap().clone();
    let m = |dest: &str| {
        mounts.iter().find(|m| m["Destination"] == dest).unwrap_or_else(|| panic!("mount {dest}: {mounts:?}")).clone()
    };
    let pat = m("/run/secrets/agent-pat");
    assert_eq!((pat["Type"].as_str(), pat["RW"].as_bool()), (Some("bind"), Some(false)));
    let sec = m("/run/secrets/github-token");
    assert_eq!((sec["Type"].as_str(), sec["RW"].as_bool()), (Some("bind"), Some(false)));
    let (pat_source, sec_source) = (pat["Source"].as_str().unwrap(), sec["Source"].as_str().unwrap());
    if let Via::Guard = via {
        // docs/behaviour.md#the-guards-own-files: the guard binds its own copies, given to the
        // container's user, never the node's files.
        let dir = std::path::Path::new(pat_source).parent().unwrap();
        assert_eq!(dir.parent(), Some(h.cfg.guard_dir.as_path()), "{pat_source}");
        assert_eq!(std::path::Path::new(sec_source), dir.join("secret-github-token"));
        assert_eq!(std::fs::read(pat_source).unwrap(), b"pat-for-coder");
        assert_eq!(std::fs::read(sec_source).unwrap(), b"gh-secret");
        let meta = std::fs::metadata(pat_source).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!((meta.uid(), meta.mode() & 0o777), (65534, 0o400), "the test's node runs as root: nobody");
    } else {
        assert_eq!(pat_source, h.state.pat_path("coder").display().to_string());
        assert_eq!(sec_source, h.cfg.secrets_dir.join("github-token").display().to_string());
    }
    let data = m("/data");
    let vol = format!("{name}-data");
    assert_eq!(
        (data["Type"].as_str(), data["RW"].as_bool(), data["Name"].as_str()),
        (Some("volume"), Some(true), Some(vol.as_str()))
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let logs = std::process::Command::new("docker").args(["logs", &name]).output().unwrap();
        if String::from_utf8_lossy(&logs.stdout).contains("pat=pat-for-coder") {
            break;
        }
        assert!(Instant::now() < deadline, "the agent reads its PAT: {}", String::from_utf8_lossy(&logs.stdout));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A restarted node adopts its running container: same id, not restarted.
    let id = c["Id"].as_str().unwrap().to_string();
    let started = c["State"]["StartedAt"].as_str().unwrap().to_string();
    h.sup = Supervisor::new(DockerRuntime::connect(&h.cfg.docker_url, &h.cfg.name).unwrap());
    let r = h.until(&d, 10, "adopted", |r| r.state == ReplicaState::Running).await;
    assert_eq!(r.restarts, 0);
    let c = doc(&name);
    assert_eq!((c["Id"].as_str().unwrap(), c["State"]["StartedAt"].as_str().unwrap()), (id.as_str(), started.as_str()));

    // Image change: drain, then recreate; the data volume survives.
    let d2 = state(vec![h.agent("coder", Some(&image("sleep2")), &["github-token"], "cred-1")]);
    let r = h.tick(&d2).await.remove(0);
    assert_eq!(r.state, ReplicaState::Draining);
    h.until(&d2, 30, "recreated", |r| r.state == ReplicaState::Running).await;
    let c = doc(&name);
    assert_ne!(c["Id"].as_str().unwrap(), id);
    assert_eq!(c["Config"]["Image"], image("sleep2"));
    assert!(inspect(&vol).is_some(), "data volume kept");

    // Replica no longer wanted: stopped and removed; the volume stays.
    let p = plan::plan(&state(vec![]), &h.cfg, &h.state, &h.sk);
    h.sup.tick(&p.wanted, &p.drains, &h.prefix).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while inspect(&name).is_some() {
        assert!(Instant::now() < deadline, "container removed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(inspect(&vol).is_some(), "data volumes are never deleted by the node");
    drop(h);

    // Exit 75: restarted at once, the same container.
    let mut h = Harness::new(&via, &format!("fte{tag}b")).await;
    let d = state(vec![h.agent("quick", Some(&image("exit75")), &[], "c")]);
    let r = h.until(&d, 30, "a restart after exit 75", |r| r.restarts >= 1).await;
    assert_eq!(r.last_exit_code, Some(75));
    assert_ne!(r.state, ReplicaState::Crashloop);
    drop(h);

    // Exit 1 three times in a row: crashloop.
    let mut h = Harness::new(&via, &format!("fte{tag}c")).await;
    let d = state(vec![h.agent("crashy", Some(&image("exit1")), &[], "c")]);
    let r = h.until(&d, 60, "crashloop", |r| r.state == ReplicaState::Crashloop).await;
    assert_eq!((r.last_exit_code, r.message.as_deref()), (Some(1), Some("exited with code 1")));
    assert!(r.restarts >= 2);
    drop(h);

    // A disallowed image: no container, zero restarts, the reason in the message.
    let mut h = Harness::new(&via, &format!("fte{tag}d")).await;
    let d = state(vec![h.agent("evil", Some("fleet-test-agent-other:1"), &[], "c")]);
    for _ in 0..3 {
        let r = h.tick(&d).await.remove(0);
        assert_eq!((r.state, r.restarts), (ReplicaState::Stopped, 0));
        assert_eq!(
            r.message.as_deref(),
            Some("image_not_allowed: image fleet-test-agent-other:1 is not allowed for executor kind k")
        );
    }
    assert!(inspect(&format!("{}-evil-0", h.prefix)).is_none());
    drop(h);

    // An allowed but missing image: start failed, retried with backoff.
    let mut h = Harness::new(&via, &format!("fte{tag}e")).await;
    let d = state(vec![h.agent("ghost", Some("fleet-test-agent:sleep-missing"), &[], "c")]);
    let r = h.tick(&d).await.remove(0);
    assert_eq!(r.state, ReplicaState::Starting);
    assert_eq!(
        r.message.as_deref(),
        Some("start failed: No such image: fleet-test-agent:sleep-missing"),
        "Docker's own message, naming the image"
    );
    drop(h);

    // The kind's capabilities, pids limit and user (node.yaml), and its maximum resources.
    let prefix = format!("fte{tag}h");
    let kind = format!(
        "executors:\n  k: {{image: \"{}\", capAdd: [NET_BIND_SERVICE], pidsLimit: 100, user: \"65534:65534\",\n      maxResources: {{memoryMb: 32}}}}\n",
        image("sleep")
    );
    let mut h = Harness::with_yaml(&via, &prefix, "").await;
    let yaml = format!(
        "controllerUrl: http://127.0.0.1:1\nname: x\ncapacity: {{slots: 1}}\n{kind}stateDir: /s\nsecretsDir: /x\n"
    );
    h.cfg.executors = NodeConfig::parse(&yaml, "t", &|_| None).unwrap().executors;
    if let Via::Guard = via {
        // The guard reads the same node.yaml: give it the kind's grants.
        let url = start_guard(&h.cfg).await;
        h.cfg.docker_url = url.clone();
        h.sup = Supervisor::new(DockerRuntime::connect(&url, &h.cfg.name).unwrap());
    }
    let d = state(vec![h.agent("hardened", None, &[], "c")]);
    let r = h.until(&d, 30, "running", |r| r.state == ReplicaState::Running).await;
    assert_eq!(r.message.as_deref(), Some("resources clamped to executors.k.maxResources: memoryMb 64 → 32"));
    let c = doc(&format!("{prefix}-hardened-0"));
    assert_eq!(c["HostConfig"]["CapAdd"], serde_json::json!(["NET_BIND_SERVICE"]));
    assert_eq!(c["HostConfig"]["PidsLimit"], 100);
    assert_eq!(c["HostConfig"]["Memory"], 32 * 1024 * 1024);
    assert_eq!(c["Config"]["User"], "65534:65534");
    drop(h);

    // checkBeforeStop (docs/behaviour.md#rolling-out-a-change): a new template whose image the
    // engine does not have stops nothing; the replica says why in Docker's own words.
    let prefix = format!("fte{tag}g");
    let mut h = Harness::with_yaml(&via, &prefix, "checkBeforeStop: true\n").await;
    h.sup = Supervisor::new(DockerRuntime::connect(&h.cfg.docker_url, &h.cfg.name).unwrap()).checking_before_stop(true);
    let mut a = h.agent("careful", Some(&image("sleep")), &[], "c");
    a.spec_id = Some("0000000a".into());
    let d = state(vec![a.clone()]);
    h.until(&d, 30, "running", |r| r.state == ReplicaState::Running).await;
    let before = doc(&format!("{prefix}-careful-0"));
    assert_eq!(before["Config"]["Labels"]["fleet.spec-id"], "0000000a");
    let missing = format!("{}-missing", image("sleep"));
    let d = state(vec![DesiredAgent {
        executor: Executor { kind: "k".into(), image: Some(missing.clone()) },
        spec_id: Some("0000000b".into()),
        ..a
    }]);
    for _ in 0..3 {
        h.tick(&d).await;
    }
    let r = h.tick(&d).await.remove(0);
    assert_eq!(r.state, ReplicaState::Running, "{r:?}");
    assert_eq!(r.message, Some(format!("update_blocked: No such image: {missing}")), "{r:?}");
    assert_eq!(r.spec_id.as_deref(), Some("0000000a"));
    let after = doc(&format!("{prefix}-careful-0"));
    assert_eq!((after["Id"].clone(), after["State"]["Running"].clone()), (before["Id"].clone(), true.into()));
    drop(h);

    // A network that does not exist: Docker's message names it.
    let prefix = format!("fte{tag}f");
    let mut h = Harness::with_yaml(&via, &prefix, &format!("network: {prefix}-no-such-net\n")).await;
    let d = state(vec![h.agent("netless", None, &[], "c")]);
    let r = h.tick(&d).await.remove(0);
    let m = r.message.clone().unwrap_or_default();
    assert!(m.starts_with("start failed: ") && m.contains(&format!("{}-no-such-net", h.prefix)), "{r:?}");
    assert!(!m.contains("no such container"), "{m}");
    drop(h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_rules_on_the_engine() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    scenarios(Via::Url("unix:///var/run/docker.sock".into()), "u").await;
}

/// Is this request one the node may make (docs/behaviour.md#the-agent-container)?
fn allowed(path: &str) -> bool {
    let p = path.split('?').next().unwrap_or(path);
    // Strip a version segment such as `/v1.41`.
    let p = match p.strip_prefix("/v") {
        Some(rest) => match rest.find('/') {
            Some(i) if i > 0 && rest[..i].bytes().all(|c| c.is_ascii_digit() || c == b'.') => &rest[i..],
            _ => p,
        },
        None => p,
    };
    p == "/_ping"
        || p == "/version"
        || p.starts_with("/containers/")
        || p.starts_with("/volumes")
        || (p.starts_with("/images/") && p.ends_with("/json"))
}

/// A TCP→unix proxy that admits only the allowed endpoints; refusals are recorded.
async fn restricting_proxy(violations: Arc<Mutex<Vec<String>>>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else { return };
            let violations = violations.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match client.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head).to_string();
                let mut first = text.lines().next().unwrap_or("").split_whitespace();
                let (method, path) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
                if !allowed(path) {
                    violations.lock().unwrap().push(format!("{method} {path}"));
                    let _ = client
                        .write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                        .await;
                    return;
                }
                let Ok(mut engine) = tokio::net::UnixStream::connect("/var/run/docker.sock").await else { return };
                if engine.write_all(&head).await.is_err() {
                    return;
                }
                let _ = tokio::io::copy_bidirectional(&mut client, &mut engine).await;
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_rules_through_a_restricting_proxy() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let violations = Arc::new(Mutex::new(Vec::new()));
    let port = restricting_proxy(violations.clone()).await;
    scenarios(Via::Url(format!("tcp://127.0.0.1:{port}")), "p").await;
    let v = violations.lock().unwrap().clone();
    assert!(v.is_empty(), "the node used endpoints outside docs/behaviour.md#the-agent-container: {v:?}");
}

#[test]
fn the_proxy_rule_admits_only_spec_endpoints() {
    assert!(allowed("/v1.41/containers/json?all=true"));
    assert!(allowed("/v1.41/volumes/create"));
    assert!(allowed("/_ping"));
    assert!(allowed("/version"));
    assert!(!allowed("/v1.41/images/create?fromImage=x"));
    assert!(!allowed("/v1.41/networks/create"));
    assert!(!allowed("/v1.41/exec/abc/start"));
    assert!(!allowed("/v1.41/events"));
    assert!(allowed("/volumes/create"), "unversioned paths are matched too");
    assert!(!allowed("/vx/containers/json"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_rules_through_the_docker_guard() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    scenarios(Via::Guard, "g").await;
}

/// What a compromised node might send through the guard: each is refused with 403 and the
/// rule, and the engine never sees it (no container appears).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docker_guard_refuses_what_a_compromised_node_might_try() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let h = Harness::new(&Via::Guard, "ftgr").await;
    let base = h.cfg.docker_url.replace("tcp://", "http://");
    let http = reqwest::Client::new();
    let node = h.cfg.name.clone();
    let body = |host: serde_json::Value, labels: serde_json::Value| serde_json::json!({"Image": image("sleep"), "Labels": labels, "HostConfig": host});
    let mine = serde_json::json!({"fleet.managed": "1", "fleet.node": node});
    let tries = [
        (
            "privileged",
            body(serde_json::json!({"Privileged": true}), mine.clone()),
            "HostConfig.Privileged is not allowed",
        ),
        ("hostbind", body(serde_json::json!({"Binds": ["/:/host"]}), mine.clone()), "HostConfig.Binds is not allowed"),
        (
            "foreign",
            body(serde_json::json!({}), serde_json::json!({"fleet.managed": "1", "fleet.node": "someone-else"})),
            "Labels must carry fleet.managed=1",
        ),
    ];
    for (what, b, rule) in tries {
        let name = format!("{}-{what}", h.prefix);
        let r = http.post(format!("{base}/v1.41/containers/create?name={name}")).json(&b).send().await.unwrap();
        assert_eq!(r.status(), 403, "{what}");
        let msg = r.json::<Value>().await.unwrap()["message"].as_str().unwrap().to_string();
        assert!(msg.starts_with(&format!("docker-guard: {rule}")), "{what}: {msg}");
        assert!(inspect(&name).is_none(), "{what}: the engine never saw it");
    }
    for (method, path) in [("POST", "/v1.41/containers/x/exec"), ("GET", "/v1.41/containers/x/archive?path=/")] {
        let r = http.request(method.parse().unwrap(), format!("{base}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 403, "{path}");
        let msg = r.json::<Value>().await.unwrap()["message"].as_str().unwrap().to_string();
        assert!(msg.ends_with("is not an endpoint fleet-node uses"), "{msg}");
    }
    // A container that is not this node's cannot be stopped or removed through it.
    let other = format!("{}-other", h.prefix);
    let run = std::process::Command::new("docker")
        .args(["run", "-d", "--name", &other, "--label", "fleet.managed=1", "--label", "fleet.node=someone-else"])
        .arg(image("sleep"))
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    // It answers as the engine does for what does not exist: the node learns nothing of it.
    let r = http.post(format!("{base}/v1.41/containers/{other}/stop")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["message"], format!("No such container: {other}"));
    let r = http.delete(format!("{base}/v1.41/containers/{other}?force=true")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let r = http.get(format!("{base}/v1.41/containers/{other}/json")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(doc(&other)["State"]["Running"], true, "still running");
}

/// Runs `script` in container `name` as its own user, as its agent would.
fn agent_runs(name: &str, script: &str) -> bool {
    let out =
        std::process::Command::new("docker").args(["exec", name, "/bin/busybox", "sh", "-c", script]).output().unwrap();
    out.status.success()
}

/// docs/behaviour.md#busy-replicas on the engine: the replica writes its lease from inside
/// its container with nothing but `$FLEET_BUSY_FILE`; the node reports it while the container
/// runs, not a link in its place, not the last run's after a restart, and the directory goes
/// with the container. Through the docker-guard the guard's own directory is bound and read.
async fn busy_leases(via: Via, tag: &str) {
    use fleet_node::lease::Leases;
    use fleet_node::supervisor::LeaseReader;
    let mut h = Harness::new(&via, &format!("f62{tag}lease")).await;
    let leases = LeaseReader::new(Leases::new(&h.cfg.state_dir, h.cfg.host_state_dir()), &h.cfg.docker_url);
    h.sup = Supervisor::new(DockerRuntime::connect(&h.cfg.docker_url, &h.cfg.name).unwrap()).with_leases(leases);
    let d = state(vec![h.agent("worker", None, &[], "c")]);
    h.until(&d, 30, "running", |r| r.state == ReplicaState::Running).await;
    let name = format!("{}-worker-0", h.prefix);
    let busy = "echo $(( $(/bin/busybox date +%s) + 600 )) > \"$FLEET_BUSY_FILE\"";
    assert!(agent_runs(&name, busy), "the container's user writes its lease");
    let r = h.until(&d, 10, "busy", |r| r.busy_until.is_some()).await;
    assert!(r.busy_until.as_deref().is_some_and(|t| t.ends_with('Z')), "{r:?}");
    assert!(!agent_runs(&name, "echo x > /run/fleet/elsewhere"), "nothing else is writable");
    let link = "/bin/busybox rm \"$FLEET_BUSY_FILE\" && /bin/busybox ln -s /proc/1/environ \"$FLEET_BUSY_FILE\"";
    assert!(agent_runs(&name, link));
    h.until(&d, 10, "a link is idle", |r| r.busy_until.is_none()).await;
    assert!(agent_runs(&name, &format!("/bin/busybox rm \"$FLEET_BUSY_FILE\"; {busy}")));
    h.until(&d, 10, "busy again", |r| r.busy_until.is_some()).await;
    // The container ends and is started again: the last run's lease does not count.
    let killed = std::process::Command::new("docker").args(["kill", &name]).output().unwrap();
    assert!(killed.status.success());
    let r = h.until(&d, 60, "restarted", |r| r.restarts == 1 && r.state == ReplicaState::Running).await;
    assert_eq!(r.busy_until, None, "{r:?}");
    let bind = doc(&name)["Mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["Destination"] == "/run/fleet/busy")
        .map(|m| (m["Source"].as_str().unwrap().to_string(), m["RW"].as_bool()))
        .expect("the lease directory is bound");
    assert_eq!(bind.1, Some(true));
    let dir = std::path::PathBuf::from(&bind.0);
    match via {
        Via::Guard => assert!(dir.starts_with(&h.cfg.guard_dir), "the guard's own directory: {dir:?}"),
        Via::Url(_) => assert_eq!(dir, h.cfg.state_dir.join("leases").join(&name)),
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while dir.exists() || inspect(&name).is_some() {
        assert!(Instant::now() < deadline, "the lease directory outlived its container: {dir:?}");
        let p = plan::plan(&state(vec![]), &h.cfg, &h.state, &h.sk);
        h.sup.tick(&p.wanted, &p.drains, &h.prefix).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_leases_on_the_engine() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    busy_leases(Via::Url("unix:///var/run/docker.sock".into()), "u").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_leases_through_the_docker_guard() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    busy_leases(Via::Guard, "g").await;
}
