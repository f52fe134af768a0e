//! The restore drill (docs/operations.md#a-restore-drill), on real SQLite and on real
//! PostgreSQL: a fleet of simulated nodes (they apply their desired states as fleet-node does)
//! with agents running, PATs rotating and a rollout in progress; a backup at T0 while it
//! serves; then, until T1, a node joins, one is deleted, an agent is added and one removed,
//! PATs rotate and the rollout goes on; at T1 the controller is lost and the store restored to
//! T0 — `fleet-controller restore` on SQLite, the operator's own `pg_dump`/`pg_restore` on
//! PostgreSQL (the controller heals both alike, docs/behaviour.md#a-store-older-than-the-fleet).
//! Then, within a minute: every node of T0 is served again without a join key (the deleted
//! one too, once its process runs again); no node is ever served a generation older than one
//! it had; no (agent, node) pair holds two live PATs in the IAM double's log, and every live
//! PAT of a node the store knows is one that node is served; the rollout finishes with no
//! replica handed the new template twice; the node that joined after T0 is told the cause
//! and the fix, and runs on.

mod support;

use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use support::sim::SimNode;
use support::*;

/// Where the store lives, and how it is backed up and restored.
enum Backend {
    Sqlite,
    Postgres(&'static fleet_devkit::postgres::Postgres, String),
}

struct Drill {
    dk: fleet_devkit::Devkit,
    dir: tempfile::TempDir,
    env: HashMap<String, String>,
    backend: Backend,
    nodes: BTreeMap<String, (TestNode, SimNode)>,
}

/// PATs live this long (IAM's cap, a devkit fault) while the drill wants them rotating.
const SHORT_PATS: u64 = 9;

fn web() -> Value {
    with(agent("web", "k", 6), |a| {
        a["drainSeconds"] = json!(1);
        a["placement"]["rollout"] = json!({"maxUnavailable": 1, "minReadySeconds": 2});
    })
}

impl Drill {
    async fn start(backend: Backend) -> Drill {
        let dk = devkit().await;
        dk.put_agents(vec![web(), agent("steady", "k", 2), agent("gone", "k", 1)]);
        dk.set_faults(fleet_devkit::Faults { pat_lifetime_seconds: Some(SHORT_PATS), ..Default::default() });
        let dir = tempfile::tempdir().unwrap();
        let mut env = env_for(&dk, dir.path(), free_port(), free_port());
        env.insert("FLEET_TOKEN_REVOKE_GRACE_SECONDS".into(), "2".into());
        env.insert("FLEET_NODE_OFFLINE_SECONDS".into(), "15".into());
        if let Backend::Postgres(_, db) = &backend {
            env.insert("FLEET_DATABASE_URL".into(), db.clone());
            env.insert("FLEET_REPLICA_NAME".into(), "r1".into());
            env.insert("FLEET_REPLICA_SECRET".into(), support::ha::REPLICA_SECRET.into());
            env.insert("FLEET_LEADER_LEASE_SECONDS".into(), "3".into());
        }
        Drill { dk, dir, env, backend, nodes: BTreeMap::new() }
    }

    fn url(&self) -> String {
        format!("http://{}", self.env["FLEET_LISTEN"])
    }

    async fn controller(&self, log: &str) -> ControllerProcess {
        ControllerProcess::spawn(self.env.clone(), self.dir.path().join(log)).await
    }

    fn admin(&self) -> Admin {
        Admin::new(&self.url(), self.dk.mint("fleet", &["fleet:admin"], 3600))
    }

    async fn join(&mut self, name: &str) {
        let mut node = TestNode::new(&self.url(), name, json!({"executorKinds": ["k"], "capacity": {"slots": 4}}));
        node.join(&self.admin().join_key().await).await;
        let sim = SimNode::start(node.clone(), Arc::new(Mutex::new(HashSet::new())));
        self.nodes.insert(name.into(), (node, sim));
    }

    fn sim(&self, name: &str) -> &SimNode {
        &self.nodes[name].1
    }

    /// `agent`'s phase in the CP is `running` with its replicas on the nodes.
    async fn running(&self, agent: &str, secs: u64) {
        eventually(secs, &format!("{agent} running"), || async {
            let s = self.dk.status(agent)?;
            (s["phase"] == "running").then_some(())
        })
        .await;
    }

    async fn rollout(&self) -> Value {
        let (s, v) = self.admin().get("/api/v1/agents/web/rollout").await;
        assert_eq!(s, 200, "{v}");
        v
    }

    /// T0: a backup while the controller serves.
    fn backup(&self) {
        let out = self.dir.path().join("t0");
        match &self.backend {
            Backend::Sqlite => run(&["backup", "--out", out.to_str().unwrap()], &self.env),
            Backend::Postgres(pg, db) => pg_tool(pg, "pg_dump", &["-Fc", "-f", out.to_str().unwrap(), "-d", db]),
        }
    }

    /// T1: the store put back as it was at T0.
    fn restore(&self) {
        let file = self.dir.path().join("t0");
        match &self.backend {
            Backend::Sqlite => run(&["restore", file.to_str().unwrap()], &self.env),
            Backend::Postgres(pg, db) => {
                pg_tool(pg, "pg_restore", &["--clean", "--if-exists", "-d", db, file.to_str().unwrap()])
            }
        }
    }
}

fn run(args: &[&str], env: &HashMap<String, String>) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleet-controller"))
        .args(args)
        .env_clear()
        .envs(env)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "fleet-controller {args:?}: {text}");
    eprintln!("fleet-controller {}:\n{text}", args[0]);
}

fn pg_tool(pg: &fleet_devkit::postgres::Postgres, tool: &str, args: &[&str]) {
    let out = std::process::Command::new(pg.program(tool)).args(args).output().unwrap();
    assert!(out.status.success(), "{tool}: {}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restore_to_t0_on_sqlite_heals_the_fleet_without_a_join_by_hand() {
    drill(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restore_to_t0_on_postgres_by_its_own_tools_heals_the_fleet_alike() {
    let Some(pg) = fleet_devkit::postgres::shared_or_skip("the restore drill on PostgreSQL") else { return };
    drill(Backend::Postgres(pg, pg.database().unwrap())).await;
}

async fn drill(backend: Backend) {
    let mut d = Drill::start(backend).await;
    let mut c = d.controller("c1.log").await;
    let _logs = support::ha::LogsOnFailure(d.dir.path().to_path_buf());
    for n in ["n1", "n2", "n3"] {
        d.join(n).await;
    }
    for a in ["web", "steady", "gone"] {
        d.running(a, 60).await;
    }
    let old_spec = d.rollout().await["target"]["specId"].as_str().unwrap().to_string();

    // A rollout starts; T0 once it stepped a node and has more to go.
    d.dk.edit_agent("web", |a| {
        a["revision"] = json!(2);
        a["placement"]["resources"] = json!({"memoryMb": 256});
    });
    let r = eventually(60, "the rollout stepped a node", || async {
        let r = d.rollout().await;
        (r["state"] == "progressing" && r["updatedReplicas"].as_u64() >= Some(1)).then_some(r)
    })
    .await;
    let target = r["target"]["specId"].as_str().unwrap().to_string();
    assert_ne!(target, old_spec);
    d.backup();
    let pats_at_t0 = d.dk.pats().len();

    // T0 → T1: a node joins, one is deleted, an agent comes and one goes, PATs rotate.
    d.join("n4").await;
    let n3 = d.nodes["n3"].0.id.clone();
    assert_eq!(d.admin().delete(&format!("/api/v1/nodes/{n3}")).await.0, 204);
    d.sim("n3").off.store(true, Ordering::Relaxed); // its process ends on the 401, as fleet-node's does
    d.dk.put_agent(agent("extra", "k", 2));
    assert!(d.dk.remove_agent("gone"));
    d.running("extra", 60).await;
    eventually(60, "PATs rotated since T0", || async { (d.dk.pats().len() > pats_at_t0 + 4).then_some(()) }).await;
    // IAM's short lifetimes end; what was issued with one rotates once more, then nothing.
    d.dk.set_faults(fleet_devkit::Faults::default());
    tokio::time::sleep(Duration::from_secs(SHORT_PATS + 4)).await;

    // T1: the controller is lost; the store is put back to T0.
    let at_t1: BTreeMap<String, u64> =
        d.nodes.iter().map(|(n, (_, s))| (n.clone(), s.generation.load(Ordering::Relaxed))).collect();
    let n4_running = d.sim("n4").running.lock().clone();
    c.kill9();
    d.restore();
    let c = d.controller("c2.log").await;
    d.sim("n3").off.store(false, Ordering::Relaxed); // its orchestrator started it again

    served_again(&d, &at_t1).await;
    the_rollout_finishes_once(&d, &target, &old_spec).await;
    one_live_pat_a_pair_each_known(&d).await;
    the_late_joiner_is_told_and_runs_on(&d, &n4_running).await;
    for (n, (_, s)) in &d.nodes {
        assert_eq!(s.backwards.load(Ordering::Relaxed), 0, "{n} was served an older generation than it had");
    }
    if std::env::var_os("FLEET_DRILL_LOG").is_some() {
        eprintln!("{}", c.log_text());
    }
    drop(c);
}

/// Every node of T0 is served again (n3 too, deleted after T0), past the generation it had.
async fn served_again(d: &Drill, at_t1: &BTreeMap<String, u64>) {
    let admin = d.admin();
    for n in ["n1", "n2", "n3"] {
        let (node, sim) = &d.nodes[n];
        // Online, and it has the generation the controller serves it, as new as the one it had.
        eventually(60, &format!("{n} served again"), || async {
            let (s, v) = admin.get(&format!("/api/v1/nodes/{}", node.id)).await;
            let has = sim.generation.load(Ordering::Relaxed);
            let ok = s == 200 && v["status"] == "online" && v["generation"].as_u64() == Some(has) && has >= at_t1[n];
            ok.then_some(())
        })
        .await;
        let refused = sim.refusals.lock().iter().filter(|(s, _)| *s == 401).count();
        assert!(n == "n3" || refused == 0, "{n} refused: {:?}", sim.refusals.lock());
    }
}

/// The rollout completes, and no replica's container was handed the new template twice nor
/// the old one back.
async fn the_rollout_finishes_once(d: &Drill, target: &str, old: &str) {
    eventually(60, "the rollout completes", || async { (d.rollout().await["state"] == "complete").then_some(()) })
        .await;
    for (n, (_, sim)) in &d.nodes {
        let mut specs: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for (_, replica, spec) in sim.history.lock().iter().filter(|h| h.0 == "web") {
            let s = spec.split('#').next().unwrap().to_string();
            let seq = specs.entry(*replica).or_default();
            if seq.last() != Some(&s) {
                seq.push(s);
            }
        }
        for (replica, seq) in specs {
            let ok = [vec![old.to_string(), target.to_string()], vec![target.to_string()], vec![old.to_string()]];
            assert!(ok.contains(&seq), "{n}: web replica {replica} ran templates {seq:?} (target {target})");
        }
    }
}

/// No pair holds two live PATs, and every live PAT of a node the store knows is the one that
/// node is served.
async fn one_live_pat_a_pair_each_known(d: &Drill) {
    let known: Vec<&str> = ["n1", "n2", "n3"].into_iter().collect();
    eventually(60, "one live PAT a pair, each known", || async {
        let mut served = HashSet::new();
        for n in &known {
            let (s, v) = d.nodes[*n].0.desired(None, 0).await;
            if s != 200 {
                return None;
            }
            for a in v["agents"].as_array()? {
                served.insert(a["identity"]["credential"]["credentialId"].as_str()?.to_string());
            }
        }
        let mut live: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for p in d.dk.pats().into_iter().filter(|p| !p.revoked) {
            let pair = p.idempotency_key.rsplit_once('-').map(|(pair, _)| pair.to_string()).unwrap_or_default();
            live.entry(pair).or_default().push(p.id);
        }
        let two = live.iter().find(|(_, ids)| ids.len() > 1);
        let ids = |n: &str| d.nodes[n].0.id.clone();
        let unknown = live
            .iter()
            .filter(|(pair, _)| known.iter().any(|n| pair.ends_with(&ids(n))))
            .find(|(_, v)| !served.contains(&v[0]));
        if let Some(p) = two.or(unknown) {
            eprintln!("waiting: {p:?}");
            return None;
        }
        Some(())
    })
    .await;
}

/// The node that joined after T0 is told why and what to do, and its containers run on.
async fn the_late_joiner_is_told_and_runs_on(
    d: &Drill,
    at_t1: &BTreeMap<(String, u32), (String, String, String, u64)>,
) {
    let sim = d.sim("n4");
    let told = eventually(30, "n4 told the cause", || async {
        sim.refusals.lock().iter().find(|(s, v)| *s == 401 && v["error"] == "node_unknown").map(|(_, v)| v.clone())
    })
    .await;
    let m = told["message"].as_str().unwrap();
    assert!(m.contains("restored from a backup") && m.contains("new join key"), "{m}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let now: Vec<_> = sim.running.lock().keys().cloned().collect();
    assert_eq!(now, at_t1.keys().cloned().collect::<Vec<_>>(), "n4's containers run on");
    assert!(!at_t1.is_empty(), "n4 ran replicas at T1");
}

/// A deleted node's token is refused as revoked (`node_token_invalid`: the node exits) also
/// after the controller restarts — the store keeps deleted nodes' token hashes — while a token
/// the store never knew is `node_unknown` (docs/behaviour.md#a-store-older-than-the-fleet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_nodes_token_stays_revoked_across_a_restart_and_a_stranger_is_unknown() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let env = env_for(&dk, dir.path(), free_port(), free_port());
    let mut c = ControllerProcess::spawn(env.clone(), dir.path().join("c1.log")).await;
    let admin = Admin::new(&c.url, dk.mint("fleet", &["fleet:admin"], 600));
    let mut node = TestNode::new(&c.url, "gone", json!({"executorKinds": ["k"], "capacity": {"slots": 1}}));
    node.join(&admin.join_key().await).await;
    assert_eq!(admin.delete(&format!("/api/v1/nodes/{}", node.id)).await.0, 204);
    c.kill9();
    let _c = ControllerProcess::spawn(env, dir.path().join("c2.log")).await;
    let (s, v) = node.desired(None, 0).await;
    assert_eq!((s.as_u16(), v["error"].as_str()), (401, Some("node_token_invalid")), "{v}");
    let stranger = TestNode { token: "fnt_never_seen".into(), ..node };
    let (s, v) = stranger.desired(None, 0).await;
    assert_eq!((s.as_u16(), v["error"].as_str()), (401, Some("node_unknown")), "{v}");
}
