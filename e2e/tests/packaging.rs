//! What operators install: the example node.yaml validates, the compose files parse (they are
//! brought up as shipped in `compose.rs`), and the controller image runs as uid 10001 with its
//! binary's own healthcheck.

mod support;

use std::path::Path;
use std::process::Command;
use support::*;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

#[test]
fn example_node_yaml_validates_and_names_unset_variables() {
    let cfg = repo().join("deploy/node/node.yaml");
    let out = Command::new(bin("fleet-node")).args(["check", "--config"]).arg(&cfg).env_clear().output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(
            "unset environment variables: FLEET_CONTROLLER_URL, FLEET_NODE_NAME, FLEET_STATE_DIR, FLEET_SECRETS_DIR, \
             FLEET_GUARD_DIR"
        ),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(bin("fleet-node"))
        .args(["check", "--config"])
        .arg(&cfg)
        .env_clear()
        .env("FLEET_CONTROLLER_URL", "https://platform.example.com/fleet")
        .env("FLEET_NODE_NAME", "worker-1")
        .env("FLEET_STATE_DIR", "/var/lib/fleet-node")
        .env("FLEET_SECRETS_DIR", "/etc/fleet-node/secrets")
        .env("FLEET_GUARD_DIR", "/var/lib/fleet-guard")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("kinds: claude-code, observer"), "{text}");
    assert!(
        text.contains("  claude-code: image agent-runner:1.4.0, capAdd [], pidsLimit 1024, user (the node's own)"),
        "{text}"
    );
}

/// `--version` on every subcommand (docs/reference.md#fleet-controller-commands), before any configuration is read.
#[test]
fn fleet_node_answers_version_on_every_subcommand() {
    for args in [&["--version"][..], &["run", "--version"], &["check", "--version"], &["docker-guard", "--version"]] {
        let out = Command::new(bin("fleet-node")).args(args).env_clear().output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.starts_with("fleet-node") && text.ends_with(&format!(" {}\n", env!("CARGO_PKG_VERSION"))),
            "{text}"
        );
    }
}

#[test]
fn compose_files_parse() {
    if Command::new("docker-compose").arg("version").output().is_err() {
        assert!(std::env::var("FLEET_E2E").as_deref() != Ok("1"), "FLEET_E2E=1 but docker-compose is missing");
        return;
    }
    let mut node = Command::new("docker-compose");
    node.args(["-f"]).arg(repo().join("deploy/node/compose.yaml")).args(["config"]);
    for v in ["FLEET_CONTROLLER_URL", "FLEET_NODE_NAME", "FLEET_STATE_DIR", "FLEET_SECRETS_DIR"] {
        node.env(v, format!("/x/{v}"));
    }
    let out = node.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("docker-guard"), "the node reaches Docker through fleet-node docker-guard: {text}");
    assert!(!text.contains("docker-socket-proxy"), "not through a path-only proxy");
    let mut c = Command::new("docker-compose");
    c.args(["-f"]).arg(repo().join("deploy/controller/compose.yaml")).args(["config"]);
    for v in ["FLEET_CONTROL_PLANE_URL", "FLEET_IAM_URL", "FLEET_IAM_ISSUER", "FLEET_IAM_TENANT", "FLEET_JWKS_URL"] {
        c.env(v, "http://example");
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("128m") || text.contains("134217728"), "the 128 MiB default memory limit: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_image_runs_as_10001_read_only_and_reports_healthy() {
    if !fleet_e2e::docker_available() {
        return;
    }
    fleet_e2e::ensure_fleet_images();
    let devkit = fleet_devkit::Devkit::start(Default::default(), "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let port = free_port();
    let name = "e2e-controller-image";
    let _ = Command::new("docker").args(["rm", "-f", name]).output();
    let env: Vec<String> =
        [("FLEET_LISTEN", format!("127.0.0.1:{port}")), ("FLEET_METRICS_LISTEN", format!("127.0.0.1:{}", free_port()))]
            .into_iter()
            .chain(devkit.controller_env())
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
    let mut cmd = Command::new("docker");
    // As the Helm chart runs it: read-only root filesystem, the store on its own volume.
    cmd.args(["run", "-d", "--read-only", "--name", name, "--network", "host", "--tmpfs", "/data:uid=10001"]);
    for e in &env {
        cmd.args(["-e", e]);
    }
    let out = cmd.arg("fleet-controller:e2e").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let health = eventually(60, "docker reports the controller healthy", || async {
        let o = Command::new("docker").args(["inspect", "-f", "{{.State.Health.Status}}", name]).output().ok()?;
        let s = String::from_utf8_lossy(&o.stdout).trim().to_string();
        (s == "healthy").then_some(s)
    })
    .await;
    assert_eq!(health, "healthy");
    let user = Command::new("docker").args(["inspect", "-f", "{{.Config.User}}", name]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&user.stdout).trim(), "10001:10001");
    let r = reqwest::get(format!("http://127.0.0.1:{port}/healthz")).await.unwrap();
    assert_eq!(r.status(), 200);
    // The chart's install notes issue join keys this way (`kubectl exec … -- /fleet-controller join-key`).
    let key = Command::new("docker")
        .args(["exec", name, "/fleet-controller", "join-key", "--ttl", "120", "--note", "worker-1"])
        .output()
        .unwrap();
    assert!(key.status.success(), "{}", String::from_utf8_lossy(&key.stderr));
    assert!(String::from_utf8_lossy(&key.stdout).starts_with("fjk_"), "{}", String::from_utf8_lossy(&key.stdout));
    // Ready once its first pass has finished (the chart's readiness probe).
    let ready = eventually(30, "/readyz answers 200", || async {
        let r = reqwest::get(format!("http://127.0.0.1:{port}/readyz")).await.ok()?;
        (r.status() == 200).then_some(())
    });
    ready.await;
    let _ = Command::new("docker").args(["rm", "-f", name]).output();
}

/// The release images carry no devkit: its IAM mints admin tokens, so `dev` is left out of
/// them, and saying so beats an unknown-subcommand error.
#[test]
fn the_controller_image_has_no_dev_mode_and_says_so() {
    if !fleet_e2e::docker_available() {
        return;
    }
    fleet_e2e::ensure_fleet_images();
    let out = Command::new("docker").args(["run", "--rm", "fleet-controller:e2e", "dev"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("this build has no dev mode"), "{err}");
    let help = Command::new("docker").args(["run", "--rm", "fleet-controller:e2e", "--help"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&help.stdout).contains("Run a whole fleet"), "dev is not offered in --help");
}

/// docs/troubleshooting.md names, per row, the test that provokes the symptom: every one of
/// those tests exists, and the guide's nineteen rows are all there.
#[test]
fn troubleshooting_rows_name_tests_that_exist() {
    let doc = std::fs::read_to_string(repo().join("docs/troubleshooting.md")).unwrap();
    let rows: Vec<&str> = doc.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| ---")).collect();
    let guide = rows.iter().filter(|r| r.split('|').nth(1).is_some_and(|c| c.trim().parse::<u32>().is_ok())).count();
    assert_eq!(guide, 19, "the guide's table has 19 symptoms");
    let mut named = 0;
    for row in &rows {
        for cell in row.split('`').filter(|c| c.ends_with(".rs") || c.contains(".rs::")) {
            let (file, test) = cell.split_once("::").unwrap_or((cell, ""));
            let text = std::fs::read_to_string(repo().join(file)).unwrap_or_else(|e| panic!("{file} in {row}: {e}"));
            if !test.is_empty() {
                assert!(text.contains(&format!("fn {test}(")), "{file} has no test {test} (row: {row})");
                named += 1;
            }
        }
    }
    assert!(named >= rows.len() - 2, "nearly every row names a test: {named} of {}", rows.len());
}
