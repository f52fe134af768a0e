//! The controller under measurement: its replicas as child processes on the devkit's
//! environment (one on SQLite, or several on one PostgreSQL), which of them leads, and their
//! CPU time and memory as read from `/proc`.

use crate::args::Args;
use crate::measure;
use anyhow::{bail, Context};
use fleet_devkit::postgres::Postgres;
use fleet_devkit::Devkit;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One controller process.
pub struct Controller {
    pub child: std::process::Child,
    pub url: String,
    pub metrics_url: String,
    pub log: PathBuf,
    /// Its replica number and ports: a replica started again takes the same ones, so the
    /// nodes that talked to it find it there.
    index: u32,
    ports: (u16, u16),
    /// Killed and reaped: nothing left to stop.
    gone: bool,
}

impl Drop for Controller {
    /// SIGTERM first (the controller flushes and exits; a profiler wrapping it writes its
    /// output), SIGKILL after 10 s.
    fn drop(&mut self) {
        if self.gone {
            return;
        }
        let _ = std::process::Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The PostgreSQL the replicas share: the one `--database` names, one started here for
/// several replicas, or none (one replica on SQLite in its data directory).
pub struct Database {
    url: Option<String>,
    /// Kept for the run: dropping it stops the server.
    _own: Option<Postgres>,
}

impl Database {
    pub fn for_run(args: &Args) -> anyhow::Result<Database> {
        let own = match (&args.database, args.controllers) {
            (None, n) if n > 1 => Some(Postgres::start()?),
            _ => None,
        };
        let url = match (&args.database, &own) {
            (Some(url), _) => Some(url.clone()),
            (None, Some(pg)) => Some(pg.database()?),
            (None, None) => None,
        };
        Ok(Database { url, _own: own })
    }

    pub fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }
}

/// Starts replica `i` of the controller, on `ports` (API, metrics) when given, else on free
/// ones; `database`: the shared PostgreSQL, if any.
fn start_controller(
    args: &Args,
    dk: &Devkit,
    dir: &Path,
    i: u32,
    database: Option<&str>,
    ports: Option<(u16, u16)>,
) -> anyhow::Result<Controller> {
    let bin = match &args.controller {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("fleet-controller"),
    };
    let (port, mport) = match ports {
        Some(p) => p,
        None => (free_port()?, free_port()?),
    };
    let (dir, log) = match args.controllers {
        1 => (dir.to_path_buf(), dir.join("controller.log")),
        _ => (dir.join(format!("replica-{i}")), dir.join(format!("controller-{i}.log"))),
    };
    std::fs::create_dir_all(&dir)?;
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg("serve").env_clear();
    if let Some(url) = database {
        cmd.env("FLEET_DATABASE_URL", url)
            .env("FLEET_REPLICA_NAME", format!("sim-{i}"))
            .env("FLEET_REPLICA_SECRET", "fleet-sim-replica-secret-of-32-characters");
    }
    let child = cmd
        .env("FLEET_LISTEN", format!("127.0.0.1:{port}"))
        .env("FLEET_METRICS_LISTEN", format!("127.0.0.1:{mport}"))
        .env("FLEET_DATA_DIR", &dir)
        .envs(dk.controller_env())
        .env("FLEET_TOKEN_AUDIENCES", "notification-service")
        .env("FLEET_TOKEN_SCOPES", "control-plane:read notification-service=notifications:send")
        .env("FLEET_NODE_OFFLINE_SECONDS", args.offline_seconds.to_string())
        .env("RUST_LOG", "warn")
        .envs(args.controller_env.iter().cloned())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::OpenOptions::new().create(true).append(true).open(&log)?)
        .spawn()
        .with_context(|| {
            format!("cannot start {} (build it: cargo build --release -p fleet-controller)", bin.display())
        })?;
    Ok(Controller {
        child,
        url: format!("http://127.0.0.1:{port}"),
        metrics_url: format!("http://127.0.0.1:{mport}/metrics"),
        log,
        index: i,
        ports: (port, mport),
        gone: false,
    })
}

/// The index of the replica that leads, once one does (the only one on SQLite).
async fn leader_of(http: &reqwest::Client, ctls: &[Controller]) -> anyhow::Result<usize> {
    if ctls.len() == 1 {
        return Ok(0);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for (i, c) in ctls.iter().enumerate() {
            let Ok(r) = http.get(&c.metrics_url).send().await else { continue };
            if r.text().await.unwrap_or_default().lines().any(|l| l == "fleet_leader 1") {
                eprintln!("fleet-sim: replica {i} leads ({})", c.url);
                return Ok(i);
            }
        }
        if Instant::now() > deadline {
            bail!("no controller replica took the lease within 60 s (see the controller logs)");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every replica of the controller, and which one leads.
pub struct Replicas {
    pub all: Vec<Controller>,
    leader: usize,
}

impl Replicas {
    /// Starts `--controllers` replicas in `dir`, waits until each accepts connections and
    /// one leads.
    pub async fn start(
        args: &Args,
        dk: &Devkit,
        dir: &Path,
        database: &Database,
        http: &reqwest::Client,
    ) -> anyhow::Result<Replicas> {
        let mut all = Vec::new();
        for i in 0..args.controllers {
            all.push(start_controller(args, dk, dir, i, database.url(), None)?);
        }
        for c in &all {
            measure::wait_until(Duration::from_secs(30), "the controller's /healthz", || {
                std::net::TcpStream::connect(c.url.trim_start_matches("http://")).is_ok()
            })
            .await?;
        }
        let leader = leader_of(http, &all).await?;
        Ok(Replicas { all, leader })
    }

    /// The replica that leads: the one whose passes, placements and metrics are read.
    pub fn leader(&self) -> &Controller {
        &self.all[self.leader]
    }

    pub fn leader_index(&self) -> usize {
        self.leader
    }

    /// Now replica `i` leads.
    pub fn set_leader(&mut self, i: usize) {
        self.leader = i;
    }

    /// `SIGKILL` of replica `i`, reaped at once.
    pub fn kill(&mut self, i: usize) -> anyhow::Result<()> {
        let c = &mut self.all[i];
        c.child.kill()?;
        c.child.wait()?;
        c.gone = true;
        Ok(())
    }

    /// Starts replica `i` again (after [`Replicas::kill`]) on its ports and data directory.
    pub fn restart(
        &mut self,
        i: usize,
        args: &Args,
        dk: &Devkit,
        dir: &Path,
        database: &Database,
    ) -> anyhow::Result<()> {
        let (index, ports) = (self.all[i].index, self.all[i].ports);
        self.all[i] = start_controller(args, dk, dir, index, database.url(), Some(ports))?;
        Ok(())
    }

    pub fn urls(&self) -> Vec<String> {
        self.all.iter().map(|c| c.url.clone()).collect()
    }

    fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.all.iter().map(|c| c.child.id())
    }

    /// User + system CPU seconds of all replicas together.
    pub fn cpu_seconds(&self) -> f64 {
        self.pids().map(|p| measure::cpu_seconds(p).unwrap_or(0.0)).sum()
    }

    /// The largest replica's current resident set, MiB.
    pub fn rss_mib(&self) -> f64 {
        self.pids().map(|p| measure::rss_mib(p).unwrap_or(0.0)).fold(0.0, f64::max)
    }

    /// Each replica's peak resident set so far, MiB.
    pub fn peak_rss_mib(&self) -> Vec<f64> {
        self.pids().map(|p| measure::peak_rss_mib(p).unwrap_or(0.0)).collect()
    }
}
