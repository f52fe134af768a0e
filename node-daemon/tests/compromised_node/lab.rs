//! The compromised node's world: a host laid out as the shipped compose file lays it out (the
//! node's state directory its own, the secrets directory root's, the guard's directory root's),
//! the real `fleet-node docker-guard` binary running as root with the compose file's two
//! capabilities (`CHOWN`, `DAC_READ_SEARCH`) on a Unix socket, and an attacker
//! that is the node — uid 10001, its own files, the guard's socket — and nothing more: every
//! file operation and every call runs as that uid (`setpriv`), as the node would make them.

use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub const NODE_UID: &str = "10001";
pub const PAT: &str = "pat-of-coder";

pub struct Lab {
    pub dir: tempfile::TempDir,
    pub prefix: String,
    pub node: String,
    guard: Child,
}

impl Lab {
    /// The host, the guard, and the node's PAT file as fleet-node writes it.
    pub fn new(prefix: &str) -> Lab {
        fleet_e2e::cleanup(prefix);
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let node = format!("{prefix}-node");
        let lab = Lab { guard: spawn_guard(dir.path(), prefix, &node), dir, prefix: prefix.to_string(), node };
        lab.as_node(&format!("mkdir -p {0}/agents/coder && printf {PAT} > {0}/agents/coder/agent-pat", lab.state()));
        lab.wait_for_socket();
        lab
    }

    /// The guard started on a fresh host with `prefix` where the engine already holds what
    /// the caller made: how it exited (`None` if it was still serving after 20 s) and its log.
    pub fn refused(prefix: &str) -> (Option<std::process::ExitStatus>, String) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut guard = spawn_guard(dir.path(), prefix, &format!("{prefix}-node"));
        let exited = (0..400).find_map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(50));
            guard.try_wait().unwrap()
        });
        if exited.is_none() {
            let _ = guard.kill();
            let _ = guard.wait();
        }
        (exited, std::fs::read_to_string(dir.path().join("guard.log")).unwrap_or_default())
    }

    pub fn state(&self) -> String {
        self.dir.path().join("state").display().to_string()
    }

    pub fn secrets(&self) -> PathBuf {
        self.dir.path().join("secrets")
    }

    pub fn guard_dir(&self) -> PathBuf {
        self.dir.path().join("guard")
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("guard.sock")
    }

    fn wait_for_socket(&self) {
        for _ in 0..100 {
            if self.socket().exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("the guard did not listen:\n{}", self.guard_log());
    }

    pub fn guard_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("guard.log")).unwrap_or_default()
    }

    /// A shell command run as the node's uid, with no other group; whether it succeeded.
    pub fn as_node(&self, script: &str) -> bool {
        let out = node_cmd(&["sh", "-c", script]).output().unwrap();
        out.status.success()
    }

    /// A call to the guard as the node makes it; (status, body).
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let url = format!("http://docker{path}");
        let sock = self.socket().display().to_string();
        let mut args = vec!["curl", "-s", "-o", "-", "-w", "\n%{http_code}", "--unix-socket", &sock, "-X", method];
        let text = body.map(Value::to_string);
        if let Some(t) = &text {
            args.extend(["-H", "content-type: application/json", "--data-binary", t]);
        }
        args.push(&url);
        let out = node_cmd(&args).output().unwrap();
        let out = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, status) = out.rsplit_once('\n').unwrap_or(("", "0"));
        (status.parse().unwrap_or(0), serde_json::from_str(body).unwrap_or(json!(body)))
    }

    /// The node's own create body for replica 0 of `coder` (kind `k`, secret `gh`), as
    /// fleet-node's plan and Docker adapter make it.
    pub fn own_body(&self, agent: &str) -> Value {
        let cfg =
            fleet_node::config::NodeConfig::parse(&node_yaml(self.dir.path(), &self.prefix, &self.node), "x", &|_| {
                None
            })
            .unwrap();
        let a: fleet_api::DesiredAgent = serde_json::from_value(json!({
            "agentKey": agent, "revision": 1, "replicaIndexes": [0], "executor": {"kind": "k"},
            "secrets": ["gh"], "resources": {"cpus": 0.5, "memoryMb": 64}, "drainSeconds": 1,
            "identity": {"principalId": "p", "tenantId": "t",
                "credential": {"credentialId": "c1", "ciphertext": "x", "expiresAt": "2030-01-01T00:00:00Z"}}
        }))
        .unwrap();
        let spec = fleet_node::plan::spec(&a, 0, &fleet_e2e::image("sleep"), &cfg);
        let mut v = serde_json::to_value(fleet_node::runtime::docker::container_body(&spec)).unwrap();
        // The node's own uid, which fleet-node (running as 10001) would set.
        v["User"] = json!("10001:10001");
        v
    }

    /// Makes the replica's data volume through the guard, as fleet-node does first.
    pub fn own_volume(&self, agent: &str) {
        let body = serde_json::to_value(fleet_node::runtime::docker::volume_body(
            &format!("{}-{agent}-0-data", self.prefix),
            &self.node,
        ))
        .unwrap();
        let (s, v) = self.call("POST", "/v1.41/volumes/create", Some(&body));
        assert_eq!(s, 201, "{v}");
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.guard.kill();
        let _ = self.guard.wait();
        fleet_e2e::cleanup(&self.prefix);
    }
}

fn node_cmd(args: &[&str]) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid", NODE_UID, "--regid", NODE_UID, "--clear-groups", "--"]).args(args);
    c
}

fn node_yaml(root: &Path, prefix: &str, node: &str) -> String {
    format!(
        "controllerUrl: http://127.0.0.1:1\nname: {node}\ncapacity: {{slots: 4}}\n\
         executors:\n  k: {{image: \"{img}\", dataPath: /data, secrets: [gh], maxResources: {{cpus: 1, memoryMb: 256}}}}\n\
         \x20 other: {{image: \"{img}\", secrets: [other-secret]}}\n\
         stateDir: {r}/state\nsecretsDir: {r}/secrets\nguardDir: {r}/guard\ncontainerPrefix: {prefix}\n",
        img = fleet_e2e::image("sleep"),
        r = root.display()
    )
}

/// The directories as the compose file's step 2 makes them, and the guard started on them.
fn spawn_guard(root: &Path, prefix: &str, node: &str) -> Child {
    let install = |args: &[&str], path: &Path| {
        let ok = Command::new("install").args(args).arg(path).status().unwrap().success();
        assert!(ok, "install {args:?} {}", path.display());
    };
    install(&["-d", "-o", NODE_UID, "-g", NODE_UID, "-m", "0700"], &root.join("state"));
    install(&["-d", "-o", "0", "-g", NODE_UID, "-m", "0750"], &root.join("secrets"));
    for (name, value) in [("gh", "gh-token"), ("other-secret", "the-other-kinds-secret")] {
        std::fs::write(root.join("secrets").join(name), value).unwrap();
        std::fs::set_permissions(root.join("secrets").join(name), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    std::fs::write(root.join("node.yaml"), node_yaml(root, prefix, node)).unwrap();
    let log = std::fs::File::create(root.join("guard.log")).unwrap();
    // Root with the two capabilities the compose file gives the guard, and no other.
    Command::new("setpriv")
        .args(["--bounding-set", "-all,+chown,+dac_read_search", "--inh-caps", "-all", "--"])
        .arg(env!("CARGO_BIN_EXE_fleet-node"))
        .args(["--config", &root.join("node.yaml").display().to_string(), "docker-guard"])
        .args(["--listen", &format!("unix://{}", root.join("guard.sock").display())])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// `docker inspect` of a container or volume, `None` when there is none.
pub fn inspect(name: &str) -> Option<Value> {
    fleet_e2e::inspect(name).and_then(|t| serde_json::from_str::<Value>(&t).ok()).map(|v| v[0].clone())
}

/// What a command prints inside a running container (its own busybox), and whether it succeeded.
pub fn inside(container: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new("docker").args(["exec", container, "/bin/busybox"]).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string())
}

/// A container of another node on the same engine, running, with a secret in its environment.
pub fn foreign_container(name: &str) -> Value {
    let out = Command::new("docker")
        .args(["run", "-d", "--name", name, "--label", "fleet.managed=1", "--label", "fleet.node=someone-else"])
        .args(["-e", "THEIR_SECRET=do-not-read"])
        .arg(fleet_e2e::image("sleep"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    inspect(name).unwrap()
}
