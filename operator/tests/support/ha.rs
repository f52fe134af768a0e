//! Controller replicas on PostgreSQL as real processes, and the network between them and
//! their database, for the HA tests and the fault suite.

use super::*;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct Replica {
    pub name: String,
    pub proc: ControllerProcess,
    pub metrics: String,
    pub failpoints: std::path::PathBuf,
}

/// The replicas' shared FLEET_REPLICA_SECRET.
pub const REPLICA_SECRET: &str = "ha-test-replica-secret-0123456789abcdef";

impl Replica {
    pub async fn spawn(dk: &fleet_devkit::Devkit, dir: &Path, db: &str, name: &str) -> Replica {
        Self::spawn_with_lease(dk, dir, db, name, Some(3)).await
    }

    /// `lease`: FLEET_LEADER_LEASE_SECONDS, or the default.
    pub async fn spawn_with_lease(
        dk: &fleet_devkit::Devkit,
        dir: &Path,
        db: &str,
        name: &str,
        lease: Option<u64>,
    ) -> Replica {
        Self::spawn_with(dk, dir, db, name, lease, free_port(), &[]).await
    }

    /// On `port`, with `extra` variables.
    pub async fn spawn_with(
        dk: &fleet_devkit::Devkit,
        dir: &Path,
        db: &str,
        name: &str,
        lease: Option<u64>,
        port: u16,
        extra: &[(&str, String)],
    ) -> Replica {
        let mport = free_port();
        let mut env = env_for(dk, &dir.join(name), port, mport);
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
        let failpoints = dir.join(format!("fp-{name}"));
        std::fs::create_dir_all(&failpoints).unwrap();
        env.insert("FLEET_DATABASE_URL".into(), db.into());
        // A report taken by a follower reaches the leader with the next flush (1 s) and a
        // notification: 3 s (the other tests' threshold) leaves too little room under load.
        env.insert("FLEET_NODE_OFFLINE_SECONDS".into(), "10".into());
        if let Some(secs) = lease {
            env.insert("FLEET_LEADER_LEASE_SECONDS".into(), secs.to_string());
        }
        env.insert("FLEET_REPLICA_NAME".into(), name.into());
        env.insert("FLEET_REPLICA_SECRET".into(), REPLICA_SECRET.into());
        env.insert("FLEET_FAILPOINTS".into(), failpoints.display().to_string());
        let proc = ControllerProcess::spawn(env, dir.join(format!("{name}.log"))).await;
        Replica { name: name.into(), proc, metrics: format!("http://127.0.0.1:{mport}/metrics"), failpoints }
    }

    pub async fn leads(&self) -> Option<bool> {
        Some(self.metric("fleet_leader").await? == 1)
    }

    pub async fn metric(&self, name: &str) -> Option<u64> {
        let text = reqwest::get(&self.metrics).await.ok()?.text().await.ok()?;
        let line = text.lines().find(|l| l.split(' ').next() == Some(name))?;
        line.rsplit(' ').next()?.parse().ok()
    }
}

/// The one replica that leads, once exactly one does.
pub async fn the_leader(replicas: &[&Replica], secs: u64) -> String {
    eventually(secs, "exactly one replica leads", || async {
        let mut leaders = Vec::new();
        for r in replicas {
            if r.leads().await == Some(true) {
                leaders.push(r.name.clone());
            }
        }
        (leaders.len() == 1).then(|| leaders.remove(0))
    })
    .await
}

/// Prints every replica's log when the test fails.
pub struct LogsOnFailure(pub std::path::PathBuf);

impl Drop for LogsOnFailure {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for e in std::fs::read_dir(&self.0).into_iter().flatten().flatten() {
            if e.path().extension().is_some_and(|x| x == "log") {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(400).collect();
                eprintln!("==== {} (last 400 lines)", e.path().display());
                for l in tail.into_iter().rev() {
                    eprintln!("{l}");
                }
            }
        }
    }
}

/// A TCP proxy the test can cut: every open connection is dropped and new ones are closed at
/// once until it is restored.
pub struct Proxy {
    pub port: u16,
    cut: Arc<AtomicBool>,
    open: Arc<parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: u16) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let open: Arc<parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>> = Default::default();
        let (c, o) = (cut.clone(), open.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if c.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let conn = tokio::spawn(async move {
                    let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else { return };
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
                o.lock().push(conn);
            }
        });
        Proxy { port, cut, open, task }
    }

    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for c in self.open.lock().drain(..) {
            c.abort();
        }
    }

    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

/// A Service in front of the replicas, as Kubernetes gives the nodes and the admins one: each
/// connection goes to the next ready replica that accepts it. A replica the test marks not
/// ready (killed, or paused as a failing readiness probe would show) gets no new connection;
/// those it holds stay, as with kube-proxy, until their clients give up.
pub struct Service {
    pub port: u16,
    ready: Arc<parking_lot::Mutex<Vec<(u16, bool)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Service {
    pub async fn start(backends: &[u16]) -> Service {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let ready = Arc::new(parking_lot::Mutex::new(backends.iter().map(|p| (*p, true)).collect::<Vec<_>>()));
        let r = ready.clone();
        let task = tokio::spawn(async move {
            let mut next = 0usize;
            while let Ok((mut client, _)) = listener.accept().await {
                next = next.wrapping_add(1);
                let order: Vec<u16> = {
                    let all = r.lock();
                    (0..all.len()).map(|i| all[(next + i) % all.len()]).filter(|b| b.1).map(|b| b.0).collect()
                };
                tokio::spawn(async move {
                    for p in order {
                        let connect = tokio::net::TcpStream::connect(("127.0.0.1", p));
                        if let Ok(Ok(mut server)) = tokio::time::timeout(Duration::from_millis(500), connect).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                            return;
                        }
                    }
                });
            }
        });
        Service { port, ready, task }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn set_ready(&self, backend: u16, ready: bool) {
        for b in self.ready.lock().iter_mut().filter(|b| b.0 == backend) {
            b.1 = ready;
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.task.abort();
    }
}
