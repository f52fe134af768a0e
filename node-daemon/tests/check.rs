//! `fleet-node check` as an operator runs it (docs/reference.md#fleet-node-commands): a node.yaml
//! with five problems prints all five, each with its line, and exits 2; the example node.yaml
//! of deploy/node passes.

use std::path::Path;
use std::process::{Command, Output};

fn check(config: &Path, env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleet-node"));
    cmd.arg("check").arg("--config").arg(config).env_remove("FLEET_NODE_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run fleet-node check")
}

#[test]
fn check_lists_all_five_problems_each_with_its_line() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/five-problems.yaml");
    let out = check(&file, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let listed: Vec<&str> = stderr.lines().filter_map(|l| l.strip_prefix("  - ")).collect();
    let wanted = [
        "line 5: unknown field `labelz`; expected one of: ",
        "line 7: capacity.slots: expected a whole number, got \"four\"",
        "line 8: capacity.cpus: must be a positive number, got 0",
        "line 9: capacity.memoryMb: must be at least 64, got 32",
        "line 13: unknown field `dataPth` in executors.claude-code; expected one of: ",
    ];
    assert_eq!(listed.len(), wanted.len(), "{stderr}");
    for (got, want) in listed.iter().zip(wanted) {
        assert!(got.starts_with(want), "want {want:?}, got {got:?} in:\n{stderr}");
    }
    assert!(stderr.starts_with(&format!("fleet-node: {}: invalid configuration:\n", file.display())), "{stderr}");
}

#[test]
fn check_passes_the_deploy_example() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/node/node.yaml");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (state, secrets) = (dir.path().join("state"), dir.path().join("secrets"));
    let url = Path::new("https://platform.example.com/fleet");
    let name = Path::new("worker-1");
    let env = [
        ("FLEET_CONTROLLER_URL", url),
        ("FLEET_NODE_NAME", name),
        ("FLEET_STATE_DIR", state.as_path()),
        ("FLEET_SECRETS_DIR", secrets.as_path()),
        ("FLEET_GUARD_DIR", Path::new("/var/lib/fleet-guard")),
    ];
    let out = check(&file, &env);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with(&format!("{}: ok\n", file.display())), "{stdout}");
    assert!(stdout.contains("node worker-1 → https://platform.example.com/fleet"), "{stdout}");
}
