//! The command line as an operator uses it: `join-key` writes into a running controller's
//! store, `serve` names every missing variable at once, `healthcheck`, `--help`, `--version`.

mod support;

use serde_json::json;
use std::process::Command;
use support::*;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fleet-controller"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_key_command_feeds_a_running_controller() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let env = env_for(&dk, dir.path(), free_port(), free_port());
    let ctl = ControllerProcess::spawn(env.clone(), dir.path().join("c.log")).await;

    let out = bin()
        .args(["join-key", "--ttl", "120", "--note", "worker-1"])
        .env("FLEET_DATA_DIR", dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(key.starts_with("fjk_"), "{key}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("expires at 20"), "prints the expiry");
    let mut node = TestNode::new(&ctl.url, "worker-1", json!({"capacity": {"slots": 1}}));
    node.join(&key).await;

    let sqlite = std::fs::read(dir.path().join("fleet.sqlite")).unwrap();
    let wal = std::fs::read(dir.path().join("fleet.sqlite-wal")).unwrap_or_default();
    for secret in [&key, &node.token] {
        let needle = secret.as_bytes();
        for file in [&sqlite, &wal] {
            assert!(!file.windows(needle.len()).any(|w| w == needle), "a secret is stored only as a hash");
        }
    }

    // docs/behaviour.md#what-a-node-may-claim: a key whose node may claim only zone labels.
    let out = bin()
        .args(["join-key", "--allow-label", "zone=*", "--note", "worker-2"])
        .env("FLEET_DATA_DIR", dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let mut limited =
        TestNode::new(&ctl.url, "worker-2", json!({"labels": ["gpu", "zone=eu"], "capacity": {"slots": 1}}));
    limited.join(&key).await;
    let admin = Admin::new(&ctl.url, dk.mint("fleet", &["fleet:read"], 600));
    let (_, view) = admin.get("/api/v1/nodes/worker-2").await;
    assert_eq!((&view["labels"], &view["refusedFacts"]["labels"]), (&json!(["zone=eu"]), &json!(["gpu"])), "{view}");
    let bad = bin().args(["join-key", "--allow-kind", "Bad Kind"]).env("FLEET_DATA_DIR", dir.path()).output().unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("allowedKinds[0]"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );

    let bad = bin().args(["join-key", "--ttl", "30"]).env("FLEET_DATA_DIR", dir.path()).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("60..=604800"), "{}", String::from_utf8_lossy(&bad.stderr));

    let port = env["FLEET_LISTEN"].rsplit(':').next().unwrap().to_string();
    let hc = bin().arg("healthcheck").env("FLEET_LISTEN", format!("0.0.0.0:{port}")).status().unwrap();
    assert!(hc.success());
    drop(ctl);
    let hc = bin().arg("healthcheck").env("FLEET_LISTEN", format!("0.0.0.0:{port}")).output().unwrap();
    assert!(!hc.status.success(), "healthcheck fails when nothing answers");
}

#[test]
fn serve_lists_every_missing_variable_and_bad_value() {
    let out = bin()
        .arg("serve")
        .env_clear()
        .env("FLEET_IAM_URL", "http://iam")
        .env("FLEET_TOKEN_TTL_SECONDS", "99")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "missing required variables: FLEET_CONTROL_PLANE_URL, FLEET_IAM_ISSUER, FLEET_IAM_TENANT, FLEET_JWKS_URL"
        ),
        "{err}"
    );
    assert!(err.contains("FLEET_TOKEN_TTL_SECONDS=\"99\""), "{err}");
}

#[test]
fn help_and_version() {
    let out = bin().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for cmd in ["serve", "join-key", "healthcheck", "dev"] {
        assert!(help.contains(cmd), "{help}");
    }
    let out = bin().args(["join-key", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("--ttl"));
    let out = bin().arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("fleet-controller "));
    // `--version` works on every subcommand, as docs/reference.md#fleet-controller-commands says.
    for cmd in ["serve", "join-key", "healthcheck", "openapi", "crds", "dev"] {
        let out = bin().args([cmd, "--version"]).output().unwrap();
        assert!(out.status.success(), "{cmd} --version: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text, format!("fleet-controller-{cmd} {}\n", env!("CARGO_PKG_VERSION")), "{cmd} --version");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_prints_token_key_and_node_line() {
    let dir = tempfile::tempdir().unwrap();
    let (p1, p2, p3) = (free_port(), free_port(), free_port());
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fleet-controller"))
        .args(["dev", "--print-and-exit", "--dir"])
        .arg(dir.path().join("dev"))
        .args(["--listen", &format!("127.0.0.1:{p1}"), "--metrics-listen", &format!("127.0.0.1:{p2}")])
        .args(["--devkit-listen", &format!("127.0.0.1:{p3}")])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("export FLEET_URL=http://127.0.0.1:{p1} FLEET_TOKEN=ey")), "{text}");
    assert!(
        text.contains(&format!("web view              http://127.0.0.1:{p1}/ui\n")),
        "the web view's address: {text}"
    );
    assert!(text.contains("cargo run -q -p fleetctl -- nodes"), "the ready fleetctl line: {text}");
    assert!(text.contains("Join key (one use, 1 h): fjk_"), "{text}");
    assert!(text.contains("fleet-node -- --config"), "{text}");
    let yaml = std::fs::read_to_string(dir.path().join("dev/node.yaml")).unwrap();
    assert!(yaml.contains(&format!("controllerUrl: http://127.0.0.1:{p1}")), "{yaml}");
}
