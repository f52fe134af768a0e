//! A PostgreSQL server for tests and the simulator, started from Debian's packages: `initdb`
//! into a temporary directory, `postgres` on a free port of 127.0.0.1, stopped when the value
//! is dropped — and, should the process that started it die first (a test aborted, a
//! `SIGKILL`), by a watchdog that outlives it by at most a second. No test needs a server
//! already running (docs/behaviour.md#high-availability, CONTRIBUTING.md#high-availability-on-postgresql).
//!
//! As root (CI containers), the server runs as the `postgres` user the package creates,
//! because `initdb` refuses to run as root. Durability is off (`fsync=off`): a test server
//! only.

use anyhow::{bail, Context};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The superuser the tests connect as (trust authentication, 127.0.0.1 only).
pub const USER: &str = "fleet";

pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    owner: Option<(u32, u32)>,
    server: Option<Child>,
    databases: std::sync::atomic::AtomicU32,
}

impl Postgres {
    /// Initialises a cluster and starts its server; errors say what is missing.
    pub fn start() -> anyhow::Result<Postgres> {
        let bin = bin_dir()?;
        let dir = tempfile::Builder::new().prefix("fleet-pg-").tempdir()?;
        let owner = if is_root() { Some(postgres_user()?) } else { None };
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))?;
        }
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))?;
        let data = dir.path().join("data");
        let out = as_owner(Command::new(bin.join("initdb")), owner)
            .args(["-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync", "-D"])
            .arg(&data)
            .output()
            .context("running initdb")?;
        if !out.status.success() {
            bail!("initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let mut pg = Postgres { dir, bin, port: 0, owner, server: None, databases: Default::default() };
        pg.port = free_port()?;
        pg.start_server()?;
        Ok(pg)
    }

    /// The URL of database `name` (see [`Postgres::database`]).
    pub fn url(&self, name: &str) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/{name}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// One of the server's programs (`pg_dump`, `pg_restore`…), from the same installation.
    pub fn program(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }

    /// The URL of the database `url` names, reached on `port` of 127.0.0.1 instead (a proxy
    /// the test puts between a controller and this server).
    pub fn via_port(&self, url: &str, port: u16) -> String {
        let name = url.rsplit('/').next().unwrap_or_default();
        format!("postgres://{USER}@127.0.0.1:{port}/{name}")
    }

    /// Creates a fresh database and returns its URL: one per test, so tests sharing the
    /// server never see each other's rows.
    pub fn database(&self) -> anyhow::Result<String> {
        let n = self.databases.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("t{}_{n}", std::process::id());
        let out = Command::new(self.bin.join("createdb"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER, &name])
            .output()
            .context("running createdb")?;
        if !out.status.success() {
            bail!("createdb {name} failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(self.url(&name))
    }

    /// Stops the server (a fast shutdown: clients are disconnected) and waits for it.
    ///
    /// TERM, not INT, to the shell whose trap stops the server: a shell started from a
    /// background job inherits SIGINT ignored and cannot trap it, so an INT would be lost and
    /// this wait would never end.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.server.take() {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and data (after [`Postgres::stop`]).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        self.start_server()
    }

    fn start_server(&mut self) -> anyhow::Result<()> {
        let data = self.dir.path().join("data");
        // The watchdog: the shell is the server's parent and stops it when this process is
        // gone (checked through /proc, which works across users).
        let script = format!(
            "{postgres} -D {data} -p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off \
             -c synchronous_commit=off -c full_page_writes=off -c max_connections=300 & pg=$!; \
             trap 'kill -INT $pg; wait $pg; exit 0' TERM INT; \
             while [ -d /proc/{me} ] && kill -0 $pg 2>/dev/null; do sleep 1; done; \
             if [ ! -d /proc/{me} ]; then kill -INT $pg; wait $pg; rm -rf {dir}; fi",
            postgres = self.bin.join("postgres").display(),
            data = data.display(),
            port = self.port,
            sock = self.dir.path().display(),
            me = std::process::id(),
            dir = self.dir.path().display(),
        );
        let log = std::fs::File::create(self.dir.path().join("server.log"))?;
        let child = as_owner(Command::new("sh"), self.owner)
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting postgres")?;
        self.server = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = Command::new(self.bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.server.as_mut().map(|c| c.try_wait()) {
                bail!("postgres exited ({status}): {}", self.log_tail());
            }
            if Instant::now() > deadline {
                bail!("postgres did not accept connections within 30 s: {}", self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
        log.lines().rev().take(10).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(child) = &self.server {
            // The shell's trap stops the server and waits for it.
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        }
        if let Some(mut child) = self.server.take() {
            let _ = child.wait();
        }
    }
}

/// `FLEET_PG_BIN`, else the newest `/usr/lib/postgresql/<version>/bin`, else `PATH`.
fn bin_dir() -> anyhow::Result<PathBuf> {
    if let Ok(dir) = std::env::var("FLEET_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, p): &(u32, PathBuf)| p.join("initdb").exists())
        .collect();
    versions.sort();
    if let Some((_, dir)) = versions.pop() {
        return Ok(dir);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .find(|d| d.join("initdb").exists() && d.join("postgres").exists());
    on_path.context(
        "PostgreSQL is not installed: no initdb under /usr/lib/postgresql/*/bin or on PATH \
         (apt-get install postgresql, or set FLEET_PG_BIN)",
    )
}

fn as_owner(mut c: Command, owner: Option<(u32, u32)>) -> Command {
    if let Some((uid, gid)) = owner {
        c.uid(uid).gid(gid);
    }
    c
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0).unwrap_or(false)
}

/// The `postgres` user's uid and gid, from /etc/passwd.
fn postgres_user() -> anyhow::Result<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.first() == Some(&"postgres") && f.len() > 3)
        .and_then(|f| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
        .context("running as root, and there is no postgres user to run PostgreSQL as (initdb refuses root)")
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Whether PostgreSQL's programs are installed here.
pub fn installed() -> bool {
    bin_dir().is_ok_and(|d| d.join("initdb").exists())
}

/// The shared server, or `None` (said on stderr) when PostgreSQL is not installed and
/// `FLEET_E2E=1` does not make it mandatory — as the Docker tests do, so `cargo test` works on
/// a machine without it, and CI, which installs it, cannot skip it.
pub fn shared_or_skip(what: &str) -> Option<&'static Postgres> {
    usable(what).then(shared)
}

/// Whether tests that need PostgreSQL run: it is installed, or `FLEET_E2E=1` demands it (and
/// starting it then fails loudly). Says on stderr what is skipped otherwise.
pub fn usable(what: &str) -> bool {
    if installed() || std::env::var("FLEET_E2E").as_deref() == Ok("1") {
        return true;
    }
    eprintln!("PostgreSQL is not installed (apt-get install postgresql): skipping {what}");
    false
}

/// One server per test process, started on first use.
pub fn shared() -> &'static Postgres {
    static PG: std::sync::OnceLock<Postgres> = std::sync::OnceLock::new();
    PG.get_or_init(|| Postgres::start().unwrap_or_else(|e| panic!("cannot start PostgreSQL for the tests: {e:#}")))
}
