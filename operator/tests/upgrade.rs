//! A rolling upgrade of an HA group (docs/operations.md#versions-and-upgrades): three replicas
//! of the previous release on one PostgreSQL, behind one Service, are replaced one at a time
//! by this build — stopped with SIGTERM as the chart's RollingUpdate does, started again on the
//! same address — with old and new replicas serving side by side between the steps, while
//! simulated nodes run agents and an admin writes all along (join keys, cordons). No
//! acknowledged write is lost, every epoch is led by one replica only, no node is served a
//! generation older than one it had, and the fleet ends converged with one live PAT per pair.
//!
//! The previous release's binaries come from `FLEET_PREV_BIN` (`scripts/build-release.sh`;
//! `.ci/run` builds them from the commit in the newest earlier corpus's `release.json`). Without
//! it the test says so and does nothing: CI runs it in a step of its own with the variable set.

mod support;

use parking_lot::Mutex;
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::ha::{LogsOnFailure, Service, REPLICA_SECRET};
use support::sim::SimNode;
use support::*;

struct Group {
    dk: fleet_devkit::Devkit,
    dir: tempfile::TempDir,
    db: String,
    ports: Vec<u16>,
    service: Service,
    replicas: Vec<Option<ControllerProcess>>,
}

impl Group {
    fn env(&self, i: usize) -> HashMap<String, String> {
        let name = format!("r{i}");
        let mut env = env_for(&self.dk, &self.dir.path().join(&name), self.ports[i], free_port());
        for (k, v) in [
            ("FLEET_DATABASE_URL", self.db.clone()),
            ("FLEET_REPLICA_NAME", name.clone()),
            ("FLEET_REPLICA_SECRET", REPLICA_SECRET.to_string()),
            ("FLEET_ADVERTISE_URL", format!("http://127.0.0.1:{}", self.ports[i])),
            ("FLEET_LEADER_LEASE_SECONDS", "5".into()),
            ("FLEET_NODE_OFFLINE_SECONDS", "15".into()),
            ("FLEET_RECONCILE_SECONDS", "2".into()),
        ] {
            env.insert(k.into(), v);
        }
        env
    }

    async fn start(&mut self, i: usize, bin: &Path, build: &str) {
        let log = self.dir.path().join(format!("r{i}-{build}.log"));
        self.replicas[i] = Some(ControllerProcess::spawn_bin(bin, self.env(i), log).await);
        self.service.set_ready(self.ports[i], true);
    }

    /// Replica `i` stopped as a rolling update stops a pod: out of the Service, then SIGTERM.
    fn stop(&mut self, i: usize) {
        self.service.set_ready(self.ports[i], false);
        if let Some(mut r) = self.replicas[i].take() {
            r.term();
        }
    }
}

/// An admin's writes, all along: join keys issued and nodes cordoned and uncordoned, through
/// the Service. Returns the keys acknowledged and each node's last acknowledged cordon state.
type Acknowledged = Arc<Mutex<(Vec<String>, BTreeMap<String, bool>)>>;

fn writes(admin: Admin, nodes: Vec<String>, stop: Arc<AtomicBool>) -> (Acknowledged, tokio::task::JoinHandle<()>) {
    let acked: Acknowledged = Default::default();
    let out = acked.clone();
    let task = tokio::spawn(async move {
        let mut i = 0usize;
        while !stop.load(Ordering::Relaxed) {
            // A request the stopping replica drops is not acknowledged: only answers count.
            let key = admin.try_post("/api/v1/join-keys", json!({"ttlSeconds": 3600, "note": "rolling"})).await;
            if let Some((_, v)) = key.filter(|(s, _)| *s == 201) {
                out.lock().0.push(v["joinKey"].as_str().unwrap().to_string());
            }
            let node = &nodes[i % nodes.len()];
            let cordon = (i / nodes.len()).is_multiple_of(2);
            let action = if cordon { "cordon" } else { "uncordon" };
            let done = admin.try_post(&format!("/api/v1/nodes/{node}:{action}"), json!({})).await;
            match done.map(|(s, _)| s.as_u16()) {
                Some(200) => drop(out.lock().1.insert(node.clone(), cordon)),
                // Unknown now whether it landed: this node's state is not checked.
                _ => drop(out.lock().1.remove(node)),
            }
            i += 1;
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    });
    (acked, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_upgrade_of_three_replicas_loses_no_write_and_never_leads_twice() {
    let Some(prev) = std::env::var_os("FLEET_PREV_BIN").map(PathBuf::from) else {
        eprintln!("FLEET_PREV_BIN is not set (scripts/build-release.sh builds a release's binaries): skipping the rolling upgrade from the previous release");
        return;
    };
    let Some(pg) = fleet_devkit::postgres::shared_or_skip("the rolling upgrade") else { return };
    let (old, new) = (prev.join("fleet-controller"), PathBuf::from(env!("CARGO_BIN_EXE_fleet-controller")));
    assert!(
        old.is_file(),
        "FLEET_PREV_BIN has no fleet-controller: {} (an absolute path; tests run in their crate's directory)",
        old.display()
    );
    let dk = devkit().await;
    dk.put_agents(vec![agent("web", "k", 6), agent("api", "k", 4)]);
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let service = Service::start(&ports).await;
    let mut g =
        Group { dk, dir: tempfile::tempdir().unwrap(), db: pg.database().unwrap(), ports, service, replicas: vec![] };
    let _logs = LogsOnFailure(g.dir.path().to_path_buf());
    g.replicas = (0..3).map(|_| None).collect();
    for i in 0..3 {
        g.start(i, &old, "old").await;
    }
    let admin = Admin::new(&g.service.url(), g.dk.mint("fleet", &["fleet:admin"], 3600));
    let mut sims = Vec::new();
    for n in 0..5 {
        let mut node = TestNode::new(
            &g.service.url(),
            &format!("n{n}"),
            json!({"executorKinds": ["k"], "capacity": {"slots": 4}}),
        );
        let key = eventually(30, "a join key", || async {
            let (s, v) = admin.post("/api/v1/join-keys", json!({})).await;
            (s == 201).then(|| v["joinKey"].as_str().unwrap().to_string())
        })
        .await;
        node.join(&key).await;
        sims.push((node.name.clone(), SimNode::start(node, Arc::new(Mutex::new(HashSet::new())))));
    }
    converged(&g).await;

    let stop = Arc::new(AtomicBool::new(false));
    let (acked, writer) = writes(admin.clone(), sims.iter().map(|s| s.0.clone()).collect(), stop.clone());
    let mut old_ones: Vec<usize> = (0..3).collect();
    for step in 0..3 {
        // A follower first (an old leader beside a new replica), then the leader (the lease
        // moves to another build's replica or an old one's), then the last.
        let leading = leader_index(&g).await;
        let i = match step {
            1 => old_ones.iter().copied().find(|&i| Some(i) == leading).unwrap_or(old_ones[0]),
            _ => old_ones.iter().copied().find(|&i| Some(i) != leading).unwrap_or(old_ones[0]),
        };
        old_ones.retain(|&o| o != i);
        g.stop(i);
        g.start(i, &new, "new").await;
        // Old and new replicas side by side: the fleet is served, one leads.
        tokio::time::sleep(Duration::from_secs(5)).await;
        eventually(30, "exactly one replica leads", || async { (leaders(&g).await == 1).then_some(()) }).await;
    }
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    converged(&g).await;
    no_write_lost(&g, &admin, &acked).await;
    every_epoch_led_once(g.dir.path());
    for (name, s) in &sims {
        assert_eq!(s.backwards.load(Ordering::Relaxed), 0, "{name} was served an older generation");
    }
}

/// The replicas that say they lead (`fleet_leader 1` on their metrics port).
async fn leading(g: &Group) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, r) in g.replicas.iter().enumerate() {
        let Some(r) = r else { continue };
        let url = format!("http://{}/metrics", r.env["FLEET_METRICS_LISTEN"]);
        let Ok(resp) = reqwest::get(&url).await else { continue };
        if resp.text().await.unwrap_or_default().lines().any(|l| l == "fleet_leader 1") {
            out.push(i);
        }
    }
    out
}

async fn leaders(g: &Group) -> usize {
    leading(g).await.len()
}

async fn leader_index(g: &Group) -> Option<usize> {
    leading(g).await.first().copied()
}

/// Every agent runs, each pair with one live PAT.
async fn converged(g: &Group) {
    for a in ["web", "api"] {
        eventually(90, &format!("{a} running"), || async { (g.dk.status(a)?["phase"] == "running").then_some(()) })
            .await;
    }
    eventually(60, "one live PAT a pair", || async {
        let mut live: BTreeMap<String, usize> = BTreeMap::new();
        for p in g.dk.pats().into_iter().filter(|p| !p.revoked) {
            *live.entry(p.idempotency_key.rsplit_once('-')?.0.to_string()).or_default() += 1;
        }
        live.values().all(|n| *n == 1).then_some(())
    })
    .await;
}

/// Every join key an admin was answered `201` for is in the store, and each node's cordon is
/// the last one acknowledged.
async fn no_write_lost(g: &Group, admin: &Admin, acked: &Acknowledged) {
    let (keys, cordons) = acked.lock().clone();
    assert!(keys.len() > 20, "writes went on through the upgrade: {} keys", keys.len());
    let pool = sqlx::PgPool::connect(&g.db).await.unwrap();
    for k in &keys {
        let hash = fleet_controller::store::hash(k).to_vec();
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM join_keys WHERE hash = $1")
            .bind(hash)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(n, 1, "an acknowledged join key is lost");
    }
    for n in admin.nodes().await {
        let name = n["name"].as_str().unwrap().to_string();
        if let Some(cordoned) = cordons.get(&name) {
            assert_eq!(n["schedulable"], json!(!cordoned), "{name}: the last acknowledged cordon");
        }
    }
}

/// Each `became the leader (epoch N)` of every replica's log, old and new: no epoch twice.
fn every_epoch_led_once(dir: &Path) {
    let mut led: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap().flatten().filter(|e| e.path().extension().is_some_and(|x| x == "log")) {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains("became the leader (epoch ")) {
            let epoch = line.split("became the leader (epoch ").nth(1).and_then(|r| r.split(')').next()).unwrap();
            led.entry(epoch.parse().unwrap()).or_default().push(e.file_name().to_string_lossy().to_string());
        }
    }
    for (epoch, by) in &led {
        assert_eq!(by.len(), 1, "epoch {epoch} led by {by:?}");
    }
    eprintln!("epochs and the replica that led each: {led:?}");
    let last = led.values().last().map(|by| by[0].clone()).unwrap_or_default();
    assert!(led.len() >= 2 && last.ends_with("-new.log"), "the lease passed to the new build: {led:?}");
}
