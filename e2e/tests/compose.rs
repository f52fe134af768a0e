//! The compose files as an operator runs them (docs/behaviour.md#packaging-and-the-docker-guard): `deploy/node/compose.yaml` and
//! `deploy/controller/compose.yaml` brought up with `docker compose up` exactly as their
//! headers say, the only overrides being the names of the images built here (the fleet
//! images, and the executor images in a copy of the example node.yaml). The node joins,
//! starts an agent through its docker-guard, and the agent reads its PAT; the controller turns
//! healthy and issues a join key with the documented `exec` line.

mod support;

use fleet_e2e::{docker_available, ensure_fleet_images, ensure_test_images, image};
use std::path::Path;
use std::process::{Command, Output};
use support::*;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// `docker compose` where the plugin is installed, else `docker-compose` (Debian's package).
fn compose(dir: &Path, project: &str) -> Command {
    let plugin = Command::new("docker").args(["compose", "version"]).output().is_ok_and(|o| o.status.success());
    let mut c = if plugin {
        let mut c = Command::new("docker");
        c.arg("compose");
        c
    } else {
        Command::new("docker-compose")
    };
    c.current_dir(dir).args(["-p", project]);
    c
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Brings a project down (containers, volumes, networks) when the test ends, however it ends.
/// `down` reads the compose file too, so with a required variable unset it fails: what is left
/// is removed by the project's label. (A run that left the controller's project up kept port
/// 8040 taken, and `fleet-controller dev` after the test suite could not start.)
struct Down<'a>(&'a Path, &'a str);

impl Down<'_> {
    fn now(&self) {
        let _ = compose(self.0, self.1).args(["down", "-v", "--timeout", "2"]).output();
        let label = format!("label=com.docker.compose.project={}", self.1);
        for (list, rm) in [
            (vec!["ps", "-aq", "--filter", &label], vec!["rm", "-f"]),
            (vec!["volume", "ls", "-q", "--filter", &label], vec!["volume", "rm", "-f"]),
            (vec!["network", "ls", "-q", "--filter", &label], vec!["network", "rm"]),
        ] {
            let ids = project_objects(&list);
            if !ids.is_empty() {
                let _ = Command::new("docker").args(&rm).args(&ids).output();
            }
        }
    }
}

fn project_objects(list: &[&str]) -> Vec<String> {
    let out = Command::new("docker").args(list).output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    out.unwrap_or_default().split_whitespace().map(str::to_string).collect()
}

/// Nothing of the project is left: no container, volume or network.
fn assert_gone(project: &str) {
    let label = format!("label=com.docker.compose.project={project}");
    for list in [vec!["ps", "-aq", "--filter", &label], vec!["volume", "ls", "-q", "--filter", &label]] {
        assert_eq!(project_objects(&list), Vec::<String>::new(), "{project} left {list:?} behind");
    }
}

impl Drop for Down<'_> {
    fn drop(&mut self) {
        self.now();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_compose_comes_up_as_shipped() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    ensure_fleet_images();
    let f = Fleet::start("e2ecmp").await;
    let dir = f.dir.path().join("node-compose");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(repo().join("deploy/node/compose.yaml"), dir.join("compose.yaml")).unwrap();
    // The example node.yaml, its executor images renamed to ones this machine has.
    let yaml = std::fs::read_to_string(repo().join("deploy/node/node.yaml")).unwrap();
    let yaml = yaml.replace("agent-runner:1.4.0", &image("sleep")).replace("observer-base:1.0.0", &image("sleep2"));
    std::fs::write(dir.join("node.yaml"), yaml).unwrap();

    // Step 1: the agents' network. Step 2: the directories: the node's state, the secrets
    // (root's, listable by the node's group), the guard's own.
    let _ = Command::new("docker").args(["network", "create", "fleet-agents"]).output();
    let (state, secrets, guard) = (dir.join("state"), dir.join("secrets"), dir.join("guard"));
    for (d, owner, mode) in [(&state, "10001", "0700"), (&secrets, "0", "0750"), (&guard, "0", "0700")] {
        let args = ["-d", "-o", owner, "-g", if owner == "0" && mode == "0750" { "10001" } else { owner }, "-m", mode];
        ok(Command::new("install").args(args).arg(d).output().unwrap(), "install -d");
    }
    ok(
        Command::new("install")
            .args(["-o", "0", "-g", "0", "-m", "0600", "/dev/null"])
            .arg(secrets.join("github-token"))
            .output()
            .unwrap(),
        "install a secret",
    );
    std::fs::write(secrets.join("github-token"), "gh-composed").unwrap();
    // Step 3: the key.
    std::fs::write(dir.join("join-key"), f.join_key().await).unwrap();
    ok(Command::new("chown").args(["10001:10001"]).arg(dir.join("join-key")).output().unwrap(), "chown");
    ok(Command::new("chmod").args(["0600"]).arg(dir.join("join-key")).output().unwrap(), "chmod");
    // Every path up to the directories must be traversable by uid 10001.
    for p in dir.ancestors().take_while(|p| p.starts_with(f.dir.path())) {
        ok(Command::new("chmod").args(["o+x"]).arg(p).output().unwrap(), "chmod o+x");
    }

    // A missing variable stops `up` with its name, before anything starts.
    let project = "fleete2ecmp";
    let out = compose(&dir, project).args(["up", "-d"]).env("FLEET_NODE_IMAGE", "fleet-node:e2e").output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("FLEET_CONTROLLER_URL"), "the missing variable is named: {err}");

    // Step 4, as shipped.
    let _down = Down(&dir, project);
    let env = [
        ("FLEET_NODE_IMAGE", "fleet-node:e2e".to_string()),
        ("FLEET_CONTROLLER_URL", f.url.clone()),
        ("FLEET_NODE_NAME", "e2ecmp-node".to_string()),
        ("FLEET_STATE_DIR", state.display().to_string()),
        ("FLEET_SECRETS_DIR", secrets.display().to_string()),
        ("FLEET_GUARD_DIR", guard.display().to_string()),
    ];
    let up = compose(&dir, project).args(["up", "-d"]).envs(env.iter().map(|(k, v)| (*k, v.as_str()))).output();
    ok(up.unwrap(), "docker compose up");
    let service_logs = |service: &str| {
        let out = compose(&dir, project)
            .args(["logs", "--no-color", service])
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
    };
    let logs = || service_logs("fleet-node");
    // On a failure below, both services' logs say why.
    let _explain = OnPanic(|| format!("fleet-node:\n{}\ndocker-guard:\n{}", logs(), service_logs("docker-guard")));
    eventually(60, "joined the fleet", || async { logs().contains("joined the fleet as ").then_some(()) }).await;

    f.devkit.put_agent(serde_json::json!({"key": "composed", "revision": 1, "state": "running",
        "identity": {"kind": "agent"}, "executor": {"kind": "claude-code", "image": null},
        "placement": {"replicas": 1, "secrets": ["github-token"]}, "drainSeconds": 2}));
    let container = "fleet-composed-0";
    let _agent = scopeguard(container);
    eventually(90, "started fleet-composed-0", || async {
        logs().contains(&format!("started {container}")).then_some(())
    })
    .await;
    let pat = eventually(60, "the agent reads its PAT", || async { pat_seen_by(container) }).await;
    assert_eq!(live_pat(&f, "composed"), vec![pat], "the PAT IAM issued, inside the container");
    // The secret reaches the agent (the guard's copy, given to uid 10001), while the node's
    // own uid cannot read the file it came from (docs/behaviour.md#the-guards-own-files).
    assert!(support::logs(container).contains("secret github-token=gh-composed"), "{}", support::logs(container));
    let as_node = Command::new("setpriv")
        .args(["--reuid", "10001", "--regid", "10001", "--clear-groups", "cat"])
        .arg(secrets.join("github-token"))
        .output()
        .unwrap();
    assert!(!as_node.status.success(), "the node's uid reads the secret: {}", String::from_utf8_lossy(&as_node.stdout));
    let mounts = Command::new("docker").args(["inspect", "-f", "{{json .Mounts}}", container]).output().unwrap();
    let mounts = String::from_utf8_lossy(&mounts.stdout).to_string();
    assert!(
        mounts.contains(&guard.display().to_string()) && !mounts.contains(&state.display().to_string()),
        "{mounts}"
    );
    let net = Command::new("docker")
        .args(["inspect", "-f", "{{json .NetworkSettings.Networks}}", container])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&net.stdout).contains("fleet-agents"), "on the agents' network");
    assert!(!logs().contains("no such container"), "{}", logs());
    _down.now();
    assert_gone(project);
}

/// Prints what `explain` says when the test panics while this lives.
struct OnPanic<F: Fn() -> String>(F);

impl<F: Fn() -> String> Drop for OnPanic<F> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", (self.0)());
        }
    }
}

/// Removes the agent container the node started (it outlives the node by design).
fn scopeguard(name: &str) -> impl Drop + '_ {
    struct Rm<'a>(&'a str);
    impl Drop for Rm<'_> {
        fn drop(&mut self) {
            let _ = Command::new("docker").args(["rm", "-f", self.0]).output();
        }
    }
    Rm(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_compose_comes_up_as_shipped() {
    if !docker_available() {
        return;
    }
    ensure_fleet_images();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(repo().join("deploy/controller/compose.yaml"), dir.path().join("compose.yaml")).unwrap();
    let project = "fleete2ectl";
    let _down = Down(dir.path(), project);
    // The header's variables; nothing answers at these URLs, and a controller still turns
    // healthy and issues join keys (it reads the CP in the background).
    let env = [
        ("FLEET_CONTROLLER_IMAGE", "fleet-controller:e2e"),
        ("FLEET_CONTROL_PLANE_URL", "https://cp.example.invalid"),
        ("FLEET_IAM_URL", "https://iam.example.invalid"),
        ("FLEET_IAM_ISSUER", "https://iam.example.invalid"),
        ("FLEET_IAM_TENANT", "acme"),
        ("FLEET_JWKS_URL", "https://iam.example.invalid/jwks.json"),
        ("FLEET_CLIENT_ID", "fleet"),
        ("FLEET_CLIENT_SECRET", "secret"),
    ];
    // Without a required variable `up` stops and names it.
    let out = compose(dir.path(), project).args(["up", "-d"]).envs(env[..2].iter().copied()).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("set the IAM URL"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    ok(compose(dir.path(), project).args(["up", "-d"]).envs(env.iter().copied()).output().unwrap(), "up");
    let id = ok(
        compose(dir.path(), project).args(["ps", "-q", "fleet-controller"]).envs(env.iter().copied()).output().unwrap(),
        "ps",
    );
    let id = id.trim().to_string();
    let health = eventually(60, "the controller container healthy", || async {
        let o = Command::new("docker").args(["inspect", "-f", "{{.State.Health.Status}}", &id]).output().ok()?;
        let s = String::from_utf8_lossy(&o.stdout).trim().to_string();
        (s == "healthy").then_some(s)
    })
    .await;
    assert_eq!(health, "healthy");
    // The header's join-key line, verbatim.
    let key = compose(dir.path(), project)
        .args([
            "exec",
            "-T",
            "fleet-controller",
            "/fleet-controller",
            "join-key",
            "--ttl",
            "3600",
            "--note",
            "worker-1",
        ])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let out = ok(key, "join-key");
    assert!(out.trim().starts_with("fjk_"), "{out}");
    let header = std::fs::read_to_string(repo().join("deploy/controller/compose.yaml")).unwrap();
    assert!(
        header.contains("docker compose exec fleet-controller /fleet-controller join-key --ttl 3600 --note worker-1")
    );
    _down.now();
    assert_gone(project);
}
