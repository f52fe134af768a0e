//! High availability end to end (docs/behaviour.md#high-availability): three controller processes on one
//! PostgreSQL behind a Service-like spreader, each with the environment the Helm chart renders
//! for an operator's values (real Helm, charts/tests/render_env.py), real `fleet-node`s on
//! Docker. The leader is
//! `SIGKILL`ed while the fleet comes up and again in steady state; PostgreSQL is stopped for
//! 30 s and started again; the leader's connection to PostgreSQL is cut so another replica
//! takes over, and the old leader, back in touch and still believing it leads, calls nothing
//! out (its lease ran out by its own clock) while the new leader's work stands.
//! Throughout: nodes keep their containers, no placement is lost, no (agent, node) pair holds
//! two live PATs beyond the rotation grace, statuses converge, and no node's generation ever
//! goes backwards through any replica.

mod support;

use fleet_devkit::postgres::Postgres;
use fleet_e2e::{docker_available, ensure_test_images};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::*;

struct Replica {
    name: String,
    env: HashMap<String, String>,
    addr: String,
    metrics: String,
    /// Between this replica and PostgreSQL: the test cuts it.
    pg: Partition,
    failpoints: PathBuf,
    log: PathBuf,
    proc: Option<Proc>,
}

impl Replica {
    async fn start(&mut self) {
        self.proc = Some(Proc::spawn(&bin("fleet-controller"), &["serve"], &self.env, &self.log));
        let url = format!("http://{}/healthz", self.addr);
        eventually(30, "a replica healthy", || async { reqwest::get(&url).await.ok().filter(|r| r.status() == 200) })
            .await;
    }

    fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill9();
        }
    }

    async fn leads(&self) -> bool {
        self.proc.is_some()
            && match reqwest::get(&self.metrics).await {
                Ok(r) => r.text().await.unwrap_or_default().lines().any(|l| l == "fleet_leader 1"),
                Err(_) => false,
            }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

struct Ha {
    f: Fleet,
    pg: Postgres,
    replicas: Vec<Replica>,
    _spread: Spread,
}

impl Ha {
    /// Three replicas (the chart's `replicas`) with the environment the chart renders for an
    /// operator's values — the platform's addresses and credentials, the scope ceiling and a
    /// database URL, everything else the chart's defaults (its lease, its generated replica
    /// secret) — but for what a pod has of its own: addresses, data directory, name.
    async fn start(prefix: &str) -> Option<Ha> {
        let pg = Postgres::start().unwrap();
        let db = pg.database().unwrap();
        let mut f = Fleet::new(prefix).await;
        let (count, chart) = chart_env(&operator_values(&f.env, &db))?;
        assert_eq!(count, 3, "the chart's HA replicas");
        let mut replicas = Vec::new();
        for i in 0..count {
            let partition = Partition::start(format!("127.0.0.1:{}", pg.port())).await;
            let (port, mport) = (free_port(), free_port());
            let failpoints = f.dir.path().join(format!("fp-{i}"));
            std::fs::create_dir_all(&failpoints).unwrap();
            let name = format!("ctl-{i}");
            let mut env = chart.clone();
            env.remove("POD_IP");
            env.insert("FLEET_LISTEN".into(), format!("127.0.0.1:{port}"));
            env.insert("FLEET_METRICS_LISTEN".into(), format!("127.0.0.1:{mport}"));
            env.insert("FLEET_ADVERTISE_URL".into(), format!("http://127.0.0.1:{port}"));
            env.insert("FLEET_DATA_DIR".into(), f.dir.path().join(&name).display().to_string());
            env.insert("FLEET_DATABASE_URL".into(), pg.via_port(&db, partition.port));
            env.insert("FLEET_REPLICA_NAME".into(), name.clone());
            env.insert("FLEET_FAILPOINTS".into(), failpoints.display().to_string());
            let mut r = Replica {
                name,
                env,
                addr: format!("127.0.0.1:{port}"),
                metrics: format!("http://127.0.0.1:{mport}/metrics"),
                pg: partition,
                failpoints,
                log: f.dir.path().join(format!("ctl-{i}.log")),
                proc: None,
            };
            r.start().await;
            replicas.push(r);
        }
        let spread = Spread::start(replicas.iter().map(|r| r.addr.clone()).collect()).await;
        f.url = spread.url.clone();
        f.public_url = spread.url.clone();
        f.tls = None;
        Some(Ha { f, pg, replicas, _spread: spread })
    }

    /// The lease the replicas run with.
    fn lease(&self) -> Duration {
        Duration::from_secs(self.replicas[0].env["FLEET_LEADER_LEASE_SECONDS"].parse().unwrap())
    }

    /// The index of the one live replica that leads, once exactly one does.
    async fn leader(&self, secs: u64) -> usize {
        eventually(secs, "exactly one replica leads", || async {
            let mut leading = Vec::new();
            for (i, r) in self.replicas.iter().enumerate() {
                if r.leads().await {
                    leading.push(i);
                }
            }
            (leading.len() == 1).then(|| leading[0])
        })
        .await
    }

    /// Kills the leader and waits for another to take over; returns (killed, new leader).
    async fn kill_leader(&mut self) -> (usize, usize) {
        let old = self.leader(30).await;
        self.replicas[old].kill9();
        let new = self.leader(30).await;
        assert_ne!(old, new);
        (old, new)
    }

    fn logs(&self) -> String {
        self.replicas.iter().map(|r| format!("==== {}\n{}", r.name, tail(&r.log_text(), 40))).collect()
    }
}

/// The values an operator gives the chart for this fleet: the platform (from the test
/// fleet's environment), the PATs' scope ceiling, and the database.
fn operator_values(env: &HashMap<String, String>, db: &str) -> serde_json::Value {
    json!({
        "controlPlane": {"url": env["FLEET_CONTROL_PLANE_URL"]},
        "iam": {"url": env["FLEET_IAM_URL"], "issuer": env["FLEET_IAM_ISSUER"], "tenant": env["FLEET_IAM_TENANT"],
                "jwksUrl": env["FLEET_JWKS_URL"]},
        "credentials": {"clientId": env["FLEET_CLIENT_ID"], "clientSecret": env["FLEET_CLIENT_SECRET"]},
        "token": {"scopes": env["FLEET_TOKEN_SCOPES"].split(' ').collect::<Vec<_>>()},
        "database": {"url": db},
    })
}

/// (replicas, the controller's environment) as the chart renders them for `values`, by real
/// Helm (charts/tests/render_env.py); `None`, said on stderr, when helm-python-sdk is not
/// installed and `FLEET_E2E=1` does not make it mandatory.
fn chart_env(values: &serde_json::Value) -> Option<(u64, HashMap<String, String>)> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/tests/render_env.py");
    let has_helm = std::process::Command::new("python3").args(["-c", "import helm_python, yaml"]).status();
    if !has_helm.is_ok_and(|s| s.success()) {
        let msg = "helm-python-sdk is not installed: python3 -m pip install helm-python-sdk==0.2.2 pyyaml";
        assert!(std::env::var("FLEET_E2E").as_deref() != Ok("1"), "{msg}");
        eprintln!("{msg}: skipping the HA end-to-end test");
        return None;
    }
    let out = std::process::Command::new("python3").arg(script).arg(values.to_string()).output().unwrap();
    assert!(out.status.success(), "rendering the chart: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let env = v["env"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()));
    Some((v["replicas"].as_u64().unwrap(), env.collect()))
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Running containers of this test by name, with their ids.
fn running_containers(prefix: &str) -> BTreeMap<String, String> {
    let out = std::process::Command::new("docker")
        .args(["ps", "--filter", &format!("name=^{prefix}"), "--format", "{{.Names}} {{.ID}}"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(n, id)| (n.to_string(), id.to_string())))
        .collect()
}

/// Every node's generation through every live replica, polled as a node polls (`since` the
/// generation it has) in the background: a replica answering with an older generation than
/// the node has fails the test.
fn watch_generations(
    tokens: Vec<(String, String)>,
    addrs: Vec<String>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<HashMap<String, u64>> {
    tokio::spawn(async move {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().unwrap();
        let mut last: HashMap<String, u64> = HashMap::new();
        while !stop.load(Ordering::SeqCst) {
            for (node, token) in &tokens {
                for a in &addrs {
                    let since = last.get(node).map(|g| format!("&since={g}")).unwrap_or_default();
                    let url = format!("http://{a}/api/v1/nodes/me/desired?wait=0{since}");
                    let Ok(r) = http.get(url).bearer_auth(token).send().await else { continue };
                    let Ok(d) = r.json::<serde_json::Value>().await else { continue }; // 304: the same
                    let Some(g) = d["generation"].as_u64() else { continue };
                    let seen = last.entry(node.clone()).or_default();
                    assert!(g >= *seen, "{node} has generation {seen}, and {a} answered with {g}");
                    *seen = g;
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        last
    })
}

fn running_with(s: &serde_json::Value, ready: u64) -> bool {
    s["phase"] == "running" && s["readyReplicas"].as_u64() == Some(ready)
}

/// At most one live PAT per (agent, node) pair, once the rotation grace has passed.
async fn one_live_pat_per_pair(f: &Fleet) {
    eventually(30, "one live PAT per (agent, node) pair", || async {
        let mut per_pair: HashMap<String, u32> = HashMap::new();
        for p in f.devkit.pats().iter().filter(|p| !p.revoked) {
            *per_pair.entry(p.description.clone()).or_default() += 1;
        }
        per_pair.values().all(|n| *n == 1).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_keep_the_fleet_through_kills_an_outage_and_a_cut() {
    if !docker_available() || !fleet_devkit::postgres::usable("the HA end-to-end test") {
        return;
    }
    ensure_test_images();
    let prefix = "e2eha";
    let Some(mut ha) = Ha::start(prefix).await else { return };
    ha.f.devkit.put_agents(vec![agent("alpha", 2), agent("beta", 2)]);
    let mut nodes = Vec::new();
    for short in ["a", "b", "c"] {
        let mut n = ha.f.node(short, "").await;
        n.start();
        nodes.push(n);
    }

    // 1. The leader dies while the fleet comes up.
    let (killed, _) = ha.kill_leader().await;
    for a in ["alpha", "beta"] {
        ha.f.status_where(a, 120, &format!("{a} running with both replicas"), |s| running_with(s, 2)).await;
    }
    ha.replicas[killed].start().await;
    let tokens: Vec<(String, String)> = nodes
        .iter()
        .map(|n| (n.name.clone(), std::fs::read_to_string(n.root.join("state/token")).unwrap().trim().to_string()))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_generations(tokens, ha.replicas.iter().map(|r| r.addr.clone()).collect(), stop.clone());
    let before = running_containers(prefix);
    assert_eq!(before.len(), 4, "four replicas run: {before:?}\n{}", ha.logs());

    // 2. And again in steady state: the new leader places a new agent; nothing else moves.
    let (killed, new) = ha.kill_leader().await;
    assert!(ha.replicas[new].log_text().contains("became the leader (epoch"), "{}", ha.logs());
    ha.f.devkit.put_agent(agent("gamma", 1));
    ha.f.status_where("gamma", 60, "gamma placed and running by the new leader", |s| running_with(s, 1)).await;
    ha.replicas[killed].start().await;
    let after = running_containers(prefix);
    for (name, id) in &before {
        assert_eq!(after.get(name), Some(id), "{name} kept its container through the takeover");
    }

    // 3. PostgreSQL away for 30 s: nodes keep their containers and long-polls; then a leader
    // takes the lease again and the fleet converges on a change made meanwhile in the CP.
    let steady = running_containers(prefix);
    ha.pg.stop();
    ha.f.devkit.edit_agent("beta", |v| v["revision"] = json!(2));
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(running_containers(prefix), steady, "the outage stops nothing");
    tokio::time::sleep(Duration::from_secs(15)).await;
    ha.pg.restart().unwrap();
    let leader = ha.leader(60).await;
    ha.f.status_where("beta", 120, "beta at revision 2 after the outage", |s| {
        running_with(s, 2) && s["observedRevision"].as_u64() == Some(2)
    })
    .await;
    let now = running_containers(prefix);
    for (name, id) in steady.iter().filter(|(n, _)| !n.contains("-beta-")) {
        assert_eq!(now.get(name), Some(id), "{name} kept its container through the outage");
    }

    // 4. The leader's link to PostgreSQL is cut while it is stalled: another replica takes
    // over, and the old leader stays silent after the link is back.
    let old = leader;
    std::fs::write(ha.replicas[old].failpoints.join("lease-stall"), "").unwrap();
    // A lock check already under way when the failpoint appears would still notice the cut.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    ha.replicas[old].pg.set(false);
    let new = eventually(30, "another replica takes over", || async {
        for (i, r) in ha.replicas.iter().enumerate() {
            if i != old && r.leads().await {
                return Some(i);
            }
        }
        None
    })
    .await;
    // Back in touch, it still believes it leads; its lease ran out by its own clock, so it
    // calls nothing out (it cannot even learn of the CP change), and any write it attempts
    // meets the fence. Calls on the wire at the cut land within a lease.
    tokio::time::sleep(ha.lease()).await;
    let calls_before = ha.f.devkit.calls_from(&ha.replicas[old].name);
    ha.replicas[old].pg.set(true);
    ha.f.devkit.edit_agent("alpha", |v| v["revision"] = json!(2));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(ha.replicas[old].leads().await, "the stalled leader has not noticed\n{}", ha.logs());
    assert_eq!(
        ha.f.devkit.calls_from(&ha.replicas[old].name),
        calls_before,
        "the deposed leader made no outside call\n{}",
        ha.logs()
    );
    std::fs::remove_file(ha.replicas[old].failpoints.join("lease-stall")).unwrap();
    eventually(30, "the old leader steps down", || async { (!ha.replicas[old].leads().await).then_some(()) }).await;
    assert!(ha.replicas[new].leads().await, "the new leader still leads\n{}", ha.logs());
    ha.f.status_where("alpha", 120, "alpha at revision 2 from the new leader", |s| {
        running_with(s, 2) && s["observedRevision"].as_u64() == Some(2)
    })
    .await;

    stop.store(true, Ordering::SeqCst);
    let seen = watcher.await.unwrap();
    assert_eq!(seen.len(), 3, "every node's generation was followed: {seen:?}");
    let placed = ha.f.admin_get("/api/v1/placements").await;
    let replicas: u64 = placed["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["status"] == "placed")
        .map(|i| i["replicas"].as_u64().unwrap())
        .sum();
    assert_eq!(replicas, 5, "every replica placed: {placed}");
    one_live_pat_per_pair(&ha.f).await;
}
