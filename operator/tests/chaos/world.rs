//! What the faults hit: PostgreSQL, three replicas each reaching it through a proxy the suite
//! can cut, the Service in front of them, the simulated nodes and the agents the CP wants —
//! and the faults themselves.

use crate::support::ha::{the_leader, LogsOnFailure, Proxy, Replica, Service};
use crate::support::sim::SimNode;
use crate::support::{agent, devkit, free_port, Admin, TestNode};
use fleet_devkit::postgres::Postgres;
use fleet_devkit::Devkit;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// FLEET_TOKEN_REVOKE_GRACE_SECONDS of the replicas: a moved replica's old PAT lives this long.
pub const GRACE_SECONDS: u64 = 5;
const AGENTS: usize = 60;
const NAMES: [&str; 3] = ["r0", "r1", "r2"];

pub struct Run {
    pub seed: u64,
    pub seconds: u64,
    pub nodes: usize,
}

impl Run {
    pub fn from_env() -> Run {
        let var = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
        Run {
            seed: var("FLEET_CHAOS_SEED", 41),
            seconds: var("FLEET_CHAOS_SECONDS", 120),
            nodes: var("FLEET_CHAOS_NODES", 200) as usize,
        }
    }
}

/// What the CP wants of an agent now.
#[derive(Clone, Debug)]
pub struct Want {
    pub replicas: u32,
    pub image: String,
    pub revision: u64,
}

pub type Wanted = Arc<Mutex<BTreeMap<String, Want>>>;

/// One replica's place: its port and proxy stay; the process comes and goes.
pub struct Slot {
    pub name: &'static str,
    pub port: u16,
    pub proxy: Proxy,
    pub replica: Option<Replica>,
}

/// A fault as it was dealt: what, when, who led just before, and whether it hit the leader
/// (or its database): then another term follows.
pub struct Fault {
    pub kind: &'static str,
    pub at: SystemTime,
    pub leader: Option<String>,
    pub deposes: bool,
}

pub const KINDS: [&str; 5] =
    ["kill -9 leader", "kill -9 follower", "SIGSTOP leader", "PostgreSQL restart", "cut from PostgreSQL"];

pub struct World {
    pub dk: Devkit,
    pub service: Service,
    pub token: String,
    pub slots: Vec<Slot>,
    pub sims: Vec<(String, SimNode)>,
    pub wanted: Wanted,
    pub dir: std::path::PathBuf,
    pg: Arc<std::sync::Mutex<Postgres>>,
    db: String,
    _logs: LogsOnFailure,
    _tmp: tempfile::TempDir,
}

impl World {
    pub async fn start(run: &Run) -> World {
        let pg = Postgres::start().unwrap_or_else(|e| panic!("cannot start PostgreSQL for the fault suite: {e:#}"));
        let db = pg.database().unwrap();
        let dk = devkit().await;
        let wanted = agents(&dk, run.seed);
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let mut slots = Vec::new();
        for name in NAMES {
            let proxy = Proxy::start(pg.port()).await;
            slots.push(Slot { name, port: free_port(), proxy, replica: None });
        }
        let mut world = World {
            service: Service::start(&slots.iter().map(|s| s.port).collect::<Vec<_>>()).await,
            token: dk.mint("fleet", &["fleet:admin"], 24 * 3600),
            dk,
            slots,
            sims: Vec::new(),
            wanted,
            dir: dir.clone(),
            pg: Arc::new(std::sync::Mutex::new(pg)),
            db,
            _logs: LogsOnFailure(dir),
            _tmp: tmp,
        };
        for i in 0..world.slots.len() {
            world.launch(i).await;
        }
        the_leader(&world.live(), 30).await;
        world.join_nodes(run.nodes).await;
        world
    }

    async fn join_nodes(&mut self, n: usize) {
        let admin = Admin::new(&self.service.url(), self.token.clone());
        let announce = json!({"labels": [], "executorKinds": ["k"], "executorImages": {"k": ["agent:*"]},
                              "capacity": {"slots": 4}});
        for i in 0..n {
            let name = format!("n{i:03}");
            let mut node = TestNode::new(&self.service.url(), &name, announce.clone());
            node.join(&admin.join_key().await).await;
            self.sims.push((name, SimNode::start_paced(node, Default::default(), Duration::from_secs(1))));
        }
    }

    /// The nodes the admin writes cordon, uncordon and drain: few, so room stays.
    pub fn ops_nodes(&self) -> Vec<String> {
        self.sims.iter().take(8).map(|(n, _)| n.clone()).collect()
    }

    /// Starts slot `i`'s replica on its port, through its proxy.
    async fn launch(&mut self, i: usize) {
        let db = {
            let pg = self.pg.lock().unwrap();
            pg.via_port(&self.db, self.slots[i].proxy.port)
        };
        let extra =
            [("FLEET_LOG_FORMAT", "json".to_string()), ("FLEET_TOKEN_REVOKE_GRACE_SECONDS", GRACE_SECONDS.to_string())];
        let s = &self.slots[i];
        let r = Replica::spawn_with(&self.dk, &self.dir, &db, s.name, Some(3), s.port, &extra).await;
        self.slots[i].replica = Some(r);
        self.service.set_ready(self.slots[i].port, true);
    }

    /// Keeps the replicas' logs past the test, for a run that broke an invariant.
    pub fn keep_logs(&mut self) -> std::path::PathBuf {
        let kept = std::env::temp_dir().join(format!("fleet-chaos-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&kept);
        for s in &self.slots {
            let _ = std::fs::copy(self.dir.join(format!("{}.log", s.name)), kept.join(format!("{}.log", s.name)));
        }
        kept
    }

    pub fn live(&self) -> Vec<&Replica> {
        self.slots.iter().filter_map(|s| s.replica.as_ref()).collect()
    }

    /// The slot whose replica leads now, if one does.
    async fn leader(&self) -> Option<usize> {
        for (i, s) in self.slots.iter().enumerate() {
            if let Some(r) = &s.replica {
                if r.leads().await == Some(true) {
                    return Some(i);
                }
            }
        }
        None
    }

    /// Deals one fault from `rng`, and undoes it after the while it draws.
    pub async fn inject(&mut self, rng: &mut StdRng) -> Fault {
        let leader = self.leader().await;
        let mut kind = KINDS[rng.gen_range(0..KINDS.len())];
        if leader.is_none() && kind.ends_with("leader") {
            kind = "kill -9 follower";
        }
        let name = leader.map(|i| self.slots[i].name.to_string());
        let mut fault = Fault { kind, at: SystemTime::now(), leader: name, deposes: kind != "kill -9 follower" };
        let follower = {
            let others: Vec<usize> =
                (0..self.slots.len()).filter(|i| Some(*i) != leader && self.slots[*i].replica.is_some()).collect();
            others[rng.gen_range(0..others.len())]
        };
        match kind {
            "kill -9 leader" => self.kill(leader.unwrap(), rng).await,
            "kill -9 follower" => self.kill(follower, rng).await,
            "SIGSTOP leader" => self.pause(leader.unwrap(), rng).await,
            "PostgreSQL restart" => {
                let pg = self.pg.clone();
                tokio::task::spawn_blocking(move || pg.lock().unwrap().restart().unwrap()).await.unwrap();
            }
            _ => {
                let i = if rng.gen_bool(0.5) { leader.unwrap_or(follower) } else { follower };
                fault.deposes = Some(i) == leader;
                self.slots[i].proxy.cut();
                tokio::time::sleep(Duration::from_millis(rng.gen_range(3_000..15_000))).await;
                self.slots[i].proxy.restore();
            }
        }
        fault
    }

    async fn kill(&mut self, i: usize, rng: &mut StdRng) {
        self.service.set_ready(self.slots[i].port, false);
        if let Some(mut r) = self.slots[i].replica.take() {
            r.proc.kill9();
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(1_000..10_000))).await;
        self.launch(i).await;
    }

    async fn pause(&mut self, i: usize, rng: &mut StdRng) {
        let pid = self.slots[i].replica.as_ref().unwrap().proc.child.id().to_string();
        let signal = |sig: &str| std::process::Command::new("kill").args([sig, &pid]).status().unwrap();
        signal("-STOP");
        // A readiness probe would take it out of the Service after a second or so.
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.service.set_ready(self.slots[i].port, false);
        tokio::time::sleep(Duration::from_millis(rng.gen_range(4_000..29_000))).await;
        signal("-CONT");
        self.service.set_ready(self.slots[i].port, true);
    }

    /// Waits until every agent runs as the CP wants it — its replicas on the nodes with its
    /// image, none extra, and its CP status `running` at its revision — and says how long that
    /// took, or what still differed at `limit`.
    pub async fn converge(&self, limit: Duration) -> Result<Duration, String> {
        let start = Instant::now();
        loop {
            let differs = self.difference();
            match differs {
                None => return Ok(start.elapsed()),
                Some(d) if start.elapsed() > limit => return Err(d),
                Some(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }

    /// The first agent not yet as wanted, described.
    fn difference(&self) -> Option<String> {
        let wanted = self.wanted.lock().clone();
        // agent → (replicas on nodes, of them running the wanted image)
        let mut seen: HashMap<String, (u32, u32)> = HashMap::new();
        for (_, sim) in &self.sims {
            for ((a, _), (_, image, state, _)) in sim.running.lock().iter() {
                let e = seen.entry(a.clone()).or_default();
                e.0 += 1;
                let ok = wanted.get(a).is_some_and(|w| &w.image == image) && state == "running";
                e.1 += u32::from(ok);
            }
        }
        for (key, w) in &wanted {
            let (on_nodes, ok) = seen.get(key).copied().unwrap_or_default();
            let status = self.dk.status(key).unwrap_or_default();
            let cp_ok = status["phase"] == "running"
                && status["readyReplicas"] == w.replicas
                && status["observedRevision"] == w.revision;
            if on_nodes != w.replicas || ok != w.replicas || !cp_ok {
                return Some(format!(
                    "{key}: wants {w:?}; {on_nodes} on nodes, {ok} running the image; CP status {status}"
                ));
            }
        }
        None
    }
}

/// The CP's agents: replicas drawn from the seed, every one image `agent:1` at revision 1.
fn agents(dk: &Devkit, seed: u64) -> Wanted {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xa6e5);
    let mut wanted = BTreeMap::new();
    for i in 0..AGENTS {
        let key = format!("a{i:02}");
        let w = Want { replicas: rng.gen_range(1..=3), image: "agent:1".into(), revision: 1 };
        let mut a = agent(&key, "k", w.replicas);
        a["executor"]["image"] = json!(w.image);
        dk.put_agent(a);
        wanted.insert(key, w);
    }
    Arc::new(Mutex::new(wanted))
}
