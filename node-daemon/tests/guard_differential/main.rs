//! The Docker guard against the real engine (docs/behaviour.md#what-the-guard-checks-and-why):
//! create bodies go through `fleet-node docker-guard` to this machine's engine — the bypasses
//! the engine's decoder once let through, their case and duplicate variants, and a fuzzer's
//! mutations of fleet-node's own body — and every container the guard admits is inspected:
//! no privilege, no host namespace, no device, no capability beyond the kind's, no mount
//! outside the node's directories, masked paths intact, limits set. What the engine decides
//! is the oracle, not the guard's own reading.
//!
//! `FLEET_GUARD_FUZZ_BODIES` (default 1000) mutated bodies are tried; `FLEET_GUARD_FUZZ_SEED`
//! repeats a run. The counts are printed (`--nocapture`).

mod corpus;
mod mutate;
mod oracle;

use fleet_e2e::{cleanup, docker_available, ensure_test_images, image};
use fleet_node::config::NodeConfig;
use fleet_node::guard::{self, Upstream};
use rand::{Rng, SeedableRng};
use serde_json::Value;

/// A node.yaml with one strict kind, its host directories, and a guard in front of the engine.
pub struct Lab {
    pub dir: tempfile::TempDir,
    pub cfg: NodeConfig,
    pub prefix: String,
    url: String,
    http: reqwest::Client,
}

/// What the engine made of one body sent through the guard.
pub enum Outcome {
    /// The guard refused it (403), with its rule.
    Refused(String),
    /// The guard admitted it and the engine created this container.
    Created(Value),
    /// The guard admitted it and the engine refused it.
    EngineRefused(u16, String),
}

impl Lab {
    async fn new(prefix: &str) -> Lab {
        cleanup(prefix);
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let text = format!(
            "controllerUrl: http://127.0.0.1:1\nname: {prefix}-node\ncapacity: {{slots: 4}}\n\
             executors:\n  k: {{image: \"{img}\", dataPath: /data, capAdd: [NET_BIND_SERVICE], pidsLimit: 128,\n\
             \x20     user: \"65534:65534\", maxResources: {{cpus: 1, memoryMb: 256}}}}\n\
             stateDir: {d}/state\nsecretsDir: {d}/secrets\nguardDir: {d}/guard\ncontainerPrefix: {prefix}\n",
            img = image("sleep"),
        );
        let cfg = NodeConfig::parse(&text, "test", &|_| None).unwrap();
        std::fs::create_dir_all(cfg.state_dir.join("agents/coder")).unwrap();
        std::fs::write(cfg.state_dir.join("agents/coder/agent-pat"), "pat").unwrap();
        std::fs::create_dir_all(&cfg.secrets_dir).unwrap();
        std::fs::write(cfg.secrets_dir.join("gh"), "secret").unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let upstream = Upstream::parse("unix:///var/run/docker.sock").unwrap();
        let guard = guard::prepare(&cfg, None, upstream).expect("the guard prepares");
        tokio::spawn(guard::serve(guard, guard::Listener::Tcp(listener)));
        let lab = Lab { dir, cfg, prefix: prefix.to_string(), url, http: reqwest::Client::new() };
        // The replica's data volume, made through the guard first, as fleet-node makes it.
        let volume = fleet_node::runtime::docker::volume_body(&format!("{prefix}-coder-0-data"), &lab.cfg.name);
        let (status, text) = lab.create_volume(&serde_json::to_value(volume).unwrap()).await;
        assert_eq!(status, 201, "{text}");
        lab
    }

    /// fleet-node's own create body for a replica of kind `k`, as plan.rs and bollard make it.
    pub fn own_body(&self) -> Value {
        let agent: fleet_api::DesiredAgent = serde_json::from_value(serde_json::json!({
            "agentKey": "coder", "revision": 1, "replicaIndexes": [0],
            "executor": {"kind": "k"}, "secrets": ["gh"], "resources": {"cpus": 0.5, "memoryMb": 64},
            "drainSeconds": 5,
            "identity": {"principalId": "prn", "tenantId": "t",
                "credential": {"credentialId": "c1", "ciphertext": "x", "expiresAt": "2030-01-01T00:00:00Z"}}
        }))
        .expect("a desired agent");
        let spec = fleet_node::plan::spec(&agent, 0, &image("sleep"), &self.cfg);
        serde_json::to_value(fleet_node::runtime::docker::container_body(&spec)).unwrap()
    }

    /// Sends `body` through the guard as container `name`; inspects what was created, then
    /// removes it.
    pub async fn create(&self, name: &str, body: &[u8]) -> Outcome {
        let url = format!("{}/v1.41/containers/create?name={name}", self.url);
        // The lease directory fleet-node asks for is named by the container: the body made
        // for replica 0 is sent as `name`, so it names `name`'s.
        let own_lease = format!("/leases/{}-coder-0\"", self.prefix);
        let body = match std::str::from_utf8(body) {
            Ok(text) => text.replace(&own_lease, &format!("/leases/{name}\"")).into_bytes(),
            Err(_) => body.to_vec(),
        };
        let r = self.http.post(url).header("content-type", "application/json").body(body).send().await;
        let r = r.expect("the guard answers");
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        let message =
            || serde_json::from_str::<Value>(&text).ok().and_then(|v| v["message"].as_str().map(String::from));
        match status {
            201 => {
                let inspected = fleet_e2e::inspect(name).expect("the created container can be inspected");
                let _ = std::process::Command::new("docker").args(["rm", "-f", name]).output();
                let v: Value = serde_json::from_str(&inspected).unwrap();
                Outcome::Created(v[0].clone())
            }
            403 => Outcome::Refused(message().unwrap_or(text)),
            s => Outcome::EngineRefused(s, message().unwrap_or(text)),
        }
    }

    pub async fn create_volume(&self, body: &Value) -> (u16, String) {
        let url = format!("{}/v1.41/volumes/create", self.url);
        let r = self.http.post(url).json(body).send().await.expect("the guard answers");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        cleanup(&self.prefix);
    }
}

/// The named bypasses and tricks: each refused, with the rule it breaks in the message; and
/// fleet-node's own body admitted and clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_refuses_every_bypass_the_engine_would_take() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let lab = Lab::new("fgdc").await;
    let own = lab.own_body();
    match lab.create("fgdc-own", own.to_string().as_bytes()).await {
        Outcome::Created(c) => oracle::assert_clean(&lab, &c, "fleet-node's own body"),
        Outcome::Refused(m) => panic!("fleet-node's own body refused: {m}"),
        Outcome::EngineRefused(s, m) => panic!("fleet-node's own body refused by the engine: {s} {m}"),
    }
    for (i, case) in corpus::cases(&own, lab.dir.path()).into_iter().enumerate() {
        match lab.create(&format!("fgdc-case{i}"), case.body.as_bytes()).await {
            Outcome::Refused(m) => {
                assert!(m.starts_with("docker-guard: "), "{}: {m}", case.what);
                assert!(m.contains(case.rule), "{}: refused, but not for {:?}: {m}", case.what, case.rule);
            }
            Outcome::Created(c) => panic!("{}: admitted and created: {c}", case.what),
            Outcome::EngineRefused(s, m) => panic!("{}: admitted (the engine refused it: {s} {m})", case.what),
        }
    }
    for (body, rule) in corpus::volume_cases(&lab.prefix, &lab.cfg.name) {
        let (status, text) = lab.create_volume(&body).await;
        assert_eq!(status, 403, "{body}: {text}");
        assert!(text.contains(rule), "{body}: {text}");
    }
}

/// Mutations of fleet-node's own body through the guard to the engine: whatever is admitted
/// and created inspects clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutated_bodies_the_guard_admits_create_only_clean_containers() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let lab = Lab::new("fgdf").await;
    let own = mutate::Json::from(&lab.own_body());
    let bodies: usize = std::env::var("FLEET_GUARD_FUZZ_BODIES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let seed: u64 =
        std::env::var("FLEET_GUARD_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("guard fuzz: {bodies} bodies, FLEET_GUARD_FUZZ_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut admitted, mut engine_refused, mut refused) = (0, 0, 0);
    for i in 0..bodies {
        let mut body = own.clone();
        let steps = rng.gen_range(1..=3);
        let applied: Vec<String> = (0..steps).map(|_| mutate::mutate(&mut body, &mut rng, lab.dir.path())).collect();
        match lab.create(&format!("fgdf-{i}"), body.render().as_bytes()).await {
            Outcome::Created(c) => {
                admitted += 1;
                oracle::assert_clean(&lab, &c, &format!("seed {seed} body {i} ({})", applied.join("; ")));
            }
            Outcome::EngineRefused(..) => engine_refused += 1,
            Outcome::Refused(m) => {
                assert!(m.starts_with("docker-guard: "), "{m}");
                refused += 1;
            }
        }
    }
    eprintln!(
        "guard fuzz: {bodies} bodies tried, {admitted} admitted and created (all inspected clean), \
         {engine_refused} admitted and refused by the engine, {refused} refused by the guard"
    );
    assert!(refused > 0, "the mutations reach the guard's rules");
    assert!(admitted > 0, "some mutations are harmless and reach the engine, so the oracle is exercised");
}
