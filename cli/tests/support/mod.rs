//! What the fleetctl and web-view tests share: a dev controller in-process, nodes joined over
//! HTTP, the fleetctl binary.
#![allow(dead_code)]

pub mod webdriver;

use base64::Engine;
use fleet_controller::dev::{self, DevArgs, DevFleet};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub fn dev_args(dir: &std::path::Path) -> DevArgs {
    DevArgs {
        dir: dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        devkit_listen: "127.0.0.1:0".parse().unwrap(),
        agents: None,
        executor_kind: "claude-code".into(),
        image: "fleet-agent:dev".into(),
        node_name: "dev-node".into(),
        with_node: false,
        print_and_exit: false,
    }
}

pub struct Ctl {
    pub url: String,
    pub token: String,
}

impl Ctl {
    pub fn run(&self, args: &[&str]) -> Output {
        self.run_with_token(Some(&self.token), args)
    }

    pub fn run_with_token(&self, token: Option<&str>, args: &[&str]) -> Output {
        let mut c = Command::new(env!("CARGO_BIN_EXE_fleetctl"));
        c.env_remove("FLEET_TOKEN").env("FLEET_URL", &self.url).args(args).stdin(Stdio::null());
        if let Some(t) = token {
            c.env("FLEET_TOKEN", t);
        }
        c.output().unwrap()
    }

    /// stdout of a command that must succeed.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(o.status.success(), "fleetctl {args:?}: {}{}", text(&o.stdout), text(&o.stderr));
        text(&o.stdout)
    }

    /// stderr of a command that must fail with exit code 1.
    pub fn fails(&self, token: Option<&str>, args: &[&str]) -> String {
        let o = self.run_with_token(token, args);
        assert_eq!(o.status.code(), Some(1), "fleetctl {args:?}: {}", text(&o.stdout));
        text(&o.stderr)
    }
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A node joined over HTTP that reports every 500 ms (no containers: enough to be online).
/// Joins a node (a fresh key pair) over HTTP; returns its token and what it announced.
pub async fn join(http: &reqwest::Client, url: &str, key: &str, name: &str, slots: u32) -> (String, Value) {
    let announce = json!({"labels": ["zone=eu"], "executorKinds": ["claude-code"], "capacity": {"slots": slots}, "secrets": [], "executorImages": {}});
    join_announcing(http, url, key, name, announce).await
}

/// Joins a node announcing `announce`; returns its token and `announce`.
pub async fn join_announcing(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    name: &str,
    announce: Value,
) -> (String, Value) {
    let (_, pk) = fleet_api::seal::generate_keypair();
    let mut body = announce.clone();
    body["joinKey"] = json!(key);
    body["name"] = json!(name);
    body["publicKey"] = json!(base64::engine::general_purpose::STANDARD.encode(pk));
    body["version"] = json!("0.1.0");
    let r = http.post(format!("{url}/api/v1/nodes:join")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 201);
    let token = r.json::<Value>().await.unwrap()["nodeToken"].as_str().unwrap().to_string();
    (token, announce)
}

pub async fn join_node(url: &str, key: &str, name: &str, slots: u32) -> tokio::task::JoinHandle<()> {
    let http = reqwest::Client::new();
    let (token, announce) = join(&http, url, key, name, slots).await;
    let url = url.to_string();
    tokio::spawn(async move {
        for seq in 1.. {
            let mut report = announce.clone();
            report["appliedGeneration"] = json!(0);
            report["health"] = json!("ok");
            report["replicas"] = json!([]);
            report["version"] = json!("0.1.0");
            report["bootId"] = json!("b");
            report["seq"] = json!(seq);
            let _ = http.put(format!("{url}/api/v1/nodes/me/observed")).bearer_auth(&token).json(&report).send().await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(20), "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn dev_fleet(dir: &std::path::Path) -> (DevFleet, Ctl) {
    let fleet = dev::start(&dev_args(dir)).await.unwrap();
    let ctl = Ctl { url: format!("http://{}", fleet.controller.addr), token: fleet.admin_token.clone() };
    (fleet, ctl)
}

/// Busy leases the following nodes report: (agent, replica) → `busyUntil` (RFC 3339).
pub type Busy = Arc<Mutex<HashMap<(String, u64), String>>>;

/// A node joined over HTTP that follows its desired state as fleet-node would: every replica
/// it is given reports `running` on the template it was sent, or `crashloop` when the image's
/// tag is `bad`. Reports every 300 ms.
pub async fn following_node(url: &str, key: &str, name: &str, slots: u32) -> tokio::task::JoinHandle<()> {
    following_node_busy(url, key, name, slots, Busy::default()).await
}

/// [`following_node`], whose running replicas report the leases in `busy` as theirs.
pub async fn following_node_busy(
    url: &str,
    key: &str,
    name: &str,
    slots: u32,
    busy: Busy,
) -> tokio::task::JoinHandle<()> {
    let http = reqwest::Client::new();
    let announce = json!({"labels": [], "executorKinds": ["claude-code"], "capacity": {"slots": slots}, "secrets": [],
                          "executorImages": {"claude-code": ["fleet-agent:*"]}});
    let (token, announce) = join_announcing(&http, url, key, name, announce).await;
    let url = url.to_string();
    tokio::spawn(async move {
        for seq in 1.. {
            let desired: Value =
                match http.get(format!("{url}/api/v1/nodes/me/desired")).bearer_auth(&token).send().await {
                    Ok(r) => r.json().await.unwrap_or(Value::Null),
                    Err(_) => Value::Null,
                };
            let mut replicas = Vec::new();
            for a in desired["agents"].as_array().into_iter().flatten() {
                let bad = a["executor"]["image"].as_str().is_some_and(|i| i.ends_with(":bad"));
                for r in a["replicaIndexes"].as_array().into_iter().flatten() {
                    let mut replica = json!({"agentKey": a["agentKey"], "replica": r, "revision": a["revision"],
                        "state": if bad { "crashloop" } else { "running" }, "restarts": 0, "specId": a["specId"],
                        "message": if bad { json!("exited with code 1") } else { Value::Null }});
                    let lease = (a["agentKey"].as_str().unwrap_or_default().to_string(), r.as_u64().unwrap_or(0));
                    if let Some(until) = busy.lock().unwrap().get(&lease).filter(|_| !bad) {
                        replica["busyUntil"] = json!(until);
                    }
                    replicas.push(replica);
                }
            }
            let mut report = announce.clone();
            report["appliedGeneration"] = desired["generation"].as_u64().map_or(json!(0), |g| json!(g));
            report["health"] = json!("ok");
            report["replicas"] = json!(replicas);
            report["version"] = json!("0.1.0");
            report["bootId"] = json!("b");
            report["seq"] = json!(seq);
            let _ = http.put(format!("{url}/api/v1/nodes/me/observed")).bearer_auth(&token).json(&report).send().await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

/// Gives the dev agent `reviewer` the image `image` (a new template) and a policy of one
/// replica at a time, ready after a second; `false` when there is no such agent.
pub fn set_reviewer_image(fleet: &DevFleet, image: &str) -> bool {
    let image = image.to_string();
    fleet.devkit.edit_agent("reviewer", move |a| {
        a["executor"]["image"] = json!(image);
        a["placement"]["rollout"] = json!({"maxUnavailable": 1, "minReadySeconds": 1});
        a["revision"] = json!(a["revision"].as_u64().unwrap_or(1) + 1);
    })
}

/// A dev controller with two nodes that follow their desired states, and the dev agent
/// `reviewer` rolled out to `fleet-agent:1` (complete, both replicas ready): the start of the
/// rollout tests. The nodes run while their handles are kept.
pub async fn reviewer_rolled_out(dir: &std::path::Path) -> (DevFleet, Ctl, Vec<tokio::task::JoinHandle<()>>) {
    reviewer_rolled_out_busy(dir, Busy::default()).await
}

/// [`reviewer_rolled_out`] with nodes that report the leases in `busy`.
pub async fn reviewer_rolled_out_busy(
    dir: &std::path::Path,
    busy: Busy,
) -> (DevFleet, Ctl, Vec<tokio::task::JoinHandle<()>>) {
    let (fleet, ctl) = dev_fleet(dir).await;
    let key2 = ctl.ok(&["join-key"]);
    let nodes = vec![
        following_node_busy(&ctl.url, &fleet.join_key, "node-a", 2, busy.clone()).await,
        following_node_busy(&ctl.url, key2.trim(), "node-b", 2, busy).await,
    ];
    assert!(set_reviewer_image(&fleet, "fleet-agent:1"));
    let c = &ctl;
    eventually("reviewer complete on fleet-agent:1", || {
        let s = c.ok(&["rollout", "status", "reviewer"]);
        s.contains("complete 2/2 updated, 2/2 ready") && s.contains("fleet-agent:1")
    })
    .await;
    (fleet, ctl, nodes)
}
