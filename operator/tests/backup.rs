//! Backups, restores and copies of the store by the real binary (docs/operations.md#backup-and-restore):
//! a backup of a store a controller serves is consistent, private (mode 0600, no secret but
//! hashes and sealed boxes) and says what it holds; a restore is refused while a controller
//! serves the store, and puts the backup in its place (the old store kept aside); a copy from
//! SQLite into PostgreSQL and back checks every table alike, refuses a target that is not
//! empty, and the nodes are served from the copy with their old tokens.

mod support;

use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::*;

/// `fleet-controller ARGS` with `env`: (success, stdout, stderr).
fn run(args: &[&str], env: &HashMap<String, String>) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fleet-controller")).args(args).env_clear().envs(env).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// A fleet of one node running `coder` (two replicas) with its PAT, on the controller `c`.
async fn fleet(dk: &fleet_devkit::Devkit, c: &ControllerProcess) -> (Admin, TestNode, Value) {
    dk.put_agent(agent("coder", "k", 2));
    let admin = Admin::new(&c.url, dk.mint("fleet", &["fleet:admin"], 600));
    let node = admin.join_one_node_until_placed(&c.url, 1).await;
    let desired = eventually(20, "the node's desired state carries coder", || async {
        let (s, d) = node.desired(None, 0).await;
        (s == 200 && d["agents"].as_array().is_some_and(|a| a.len() == 1)).then_some(d)
    })
    .await;
    (admin, node, desired)
}

fn controller_env(dk: &fleet_devkit::Devkit, data: &Path) -> HashMap<String, String> {
    let mut env = env_for(dk, data, free_port(), free_port());
    env.insert("FLEET_NODE_OFFLINE_SECONDS".into(), "60".into());
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_of_a_served_store_is_consistent_private_and_says_what_it_holds() {
    let dk = devkit().await;
    let data = tempfile::tempdir().unwrap();
    let env = controller_env(&dk, data.path());
    let c = ControllerProcess::spawn(env.clone(), data.path().join("c.log")).await;
    let (_admin, node, desired) = fleet(&dk, &c).await;
    let out = data.path().join("backups/fleet-1.sqlite");

    let (ok, stdout, stderr) = run(&["backup", "--out", out.to_str().unwrap()], &env);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("(mode 0600, "), "{stdout}");
    for line in ["nodes        1", "agents       1", "replicas     2 placed", "pairs        1 with a live PAT"] {
        assert!(stdout.contains(line), "{line:?} in\n{stdout}");
    }
    assert!(stdout.contains("taken at     20"), "{stdout}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&out).unwrap().permissions().mode() & 0o777, 0o600);

    // Secrets only as hashes and sealed boxes: neither the node's token nor the PAT is in it.
    let bytes = std::fs::read(&out).unwrap();
    let pat = node.open_pat(&desired, "coder").unwrap();
    for secret in [node.token.as_str(), pat.as_str()] {
        assert!(!bytes.windows(secret.len()).any(|w| w == secret.as_bytes()), "a secret in the backup");
    }
    let token_hash = fleet_controller::store::hash(&node.token);
    assert!(bytes.windows(32).any(|w| w == token_hash), "the token's hash is");

    // The controller still serves, and a second backup replaces the first whole.
    assert_eq!(node.desired(None, 0).await.0, 200);
    let (ok, stdout, stderr) = run(&["backup", "--out", out.to_str().unwrap()], &env);
    assert!(ok && stdout.contains("nodes        1"), "{stdout}{stderr}");
    let leftovers: Vec<_> =
        std::fs::read_dir(out.parent().unwrap()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(leftovers, vec![std::ffi::OsString::from("fleet-1.sqlite")], "nothing left beside it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_is_refused_while_a_controller_serves_and_then_puts_the_backup_in_place() {
    let dk = devkit().await;
    let data = tempfile::tempdir().unwrap();
    let env = controller_env(&dk, data.path());
    let mut c = ControllerProcess::spawn(env.clone(), data.path().join("c.log")).await;
    let (admin, node, _) = fleet(&dk, &c).await;
    let out = data.path().join("t0.sqlite");
    assert!(run(&["backup", "--out", out.to_str().unwrap()], &env).0);

    // After T0 the node is deleted.
    assert_eq!(admin.delete(&format!("/api/v1/nodes/{}", node.id)).await.0, 204);
    let (ok, stdout, stderr) = run(&["restore", out.to_str().unwrap()], &env);
    assert!(!ok, "{stdout}");
    assert!(stderr.contains("a controller serves this store (pid "), "{stderr}");
    // A second controller on the same store does not start either.
    let (ok, _, stderr) = run(&["serve"], &controller_env(&dk, data.path()));
    assert!(!ok && stderr.contains("a controller serves this store"), "{stderr}");

    c.kill9();
    let (ok, stdout, stderr) = run(&["restore", out.to_str().unwrap()], &env);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("nodes        1") && stdout.contains("the store it replaced is kept at"), "{stdout}");
    let kept = std::fs::read_dir(data.path()).unwrap().flatten().any(|e| {
        let n = e.file_name().to_string_lossy().to_string();
        n.starts_with("fleet.sqlite.replaced-") && !n.ends_with("-wal") && !n.ends_with("-shm")
    });
    assert!(kept, "the replaced store is kept aside");

    // The node that existed at T0 is served again, with its old token, without a join.
    let c = ControllerProcess::spawn(env.clone(), data.path().join("c2.log")).await;
    let node = TestNode { url: c.url.clone(), ..node };
    let (s, d) = node.desired(None, 0).await;
    assert_eq!(s, 200, "{d}\n{}", c.log_text());
    assert_eq!(d["agents"][0]["agentKey"], "coder");
    // A restore of something that is not a store says so and changes nothing.
    std::fs::write(data.path().join("junk"), b"not a database").unwrap();
    let (ok, _, stderr) = run(&["restore", data.path().join("junk").to_str().unwrap()], &env);
    assert!(!ok && stderr.contains("junk"), "{stderr}");
}

/// The rows of a copy's report: (table, rows, checksum).
fn tables(stdout: &str) -> Vec<(String, u64, String)> {
    stdout
        .lines()
        .skip_while(|l| !l.starts_with("TABLE"))
        .skip(1)
        .map_while(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            Some((w.first()?.to_string(), w.get(1)?.parse().ok()?, w.get(2)?.to_string())).filter(|_| w.len() == 3)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_from_sqlite_into_postgres_and_back_checks_every_table_and_serves_the_nodes() {
    let Some(pg) = fleet_devkit::postgres::shared_or_skip("the store copy into PostgreSQL") else { return };
    let dk = devkit().await;
    let data = tempfile::tempdir().unwrap();
    let env = controller_env(&dk, data.path());
    let mut c = ControllerProcess::spawn(env.clone(), data.path().join("c.log")).await;
    let (_admin, node, desired) = fleet(&dk, &c).await;
    let sqlite = format!("sqlite://{}/fleet.sqlite", data.path().display());
    let target = pg.database().unwrap();

    let (ok, _, stderr) = run(&["store", "copy", "--from", &sqlite, "--to", &target], &env);
    assert!(!ok && stderr.contains("a controller serves this store"), "offline only: {stderr}");
    c.kill9();
    let (ok, stdout, stderr) = run(&["store", "copy", "--from", &sqlite, "--to", &target], &env);
    assert!(ok, "{stdout}{stderr}");
    let there = tables(&stdout);
    assert_eq!(there.len(), 11, "{stdout}");
    assert!(there.iter().any(|t| t.0 == "nodes" && t.1 == 1) && there.iter().any(|t| t.0 == "credentials" && t.1 == 1));
    let (ok, _, stderr) = run(&["store", "copy", "--from", &sqlite, "--to", &target], &env);
    assert!(!ok && stderr.contains("the target is not empty"), "{stderr}");

    // And back, into a new SQLite store: the same rows, table by table.
    let back = tempfile::tempdir().unwrap();
    let again = format!("sqlite://{}/fleet.sqlite", back.path().display());
    let (ok, stdout, stderr) = run(&["store", "copy", "--from", &target, "--to", &again], &env);
    assert!(ok, "{stdout}{stderr}");
    assert_eq!(tables(&stdout), there);

    // Three replicas on the copy: the node is served with its old token and the same PAT.
    let dir = tempfile::tempdir().unwrap();
    let r = support::ha::Replica::spawn(&dk, dir.path(), &target, "r1").await;
    let node = TestNode { url: r.proc.url.clone(), ..node };
    let (s, d) = node.desired(desired["generation"].as_u64(), 0).await;
    assert_eq!(s, 304, "the generation it has: {d}");
    let (s, d) = node.desired(None, 0).await;
    assert_eq!(s, 200);
    assert_eq!(
        d["agents"][0]["identity"]["credential"]["credentialId"],
        desired["agents"][0]["identity"]["credential"]["credentialId"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_store_is_backed_up_while_served_and_restored_into_another() {
    let Some(pg) = fleet_devkit::postgres::shared_or_skip("a backup of a PostgreSQL store") else { return };
    let dk = devkit().await;
    let (db, dir) = (pg.database().unwrap(), tempfile::tempdir().unwrap());
    let mut r = support::ha::Replica::spawn(&dk, dir.path(), &db, "r1").await;
    support::ha::the_leader(&[&r], 30).await;
    let (_admin, node, desired) = fleet(&dk, &r.proc).await;
    let mut env = r.proc.env.clone();
    let out = dir.path().join("pg.sqlite");
    let (ok, stdout, stderr) = run(&["backup", "--out", out.to_str().unwrap()], &env);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("nodes        1") && stdout.contains("pairs        1 with a live PAT"), "{stdout}");

    // Into another database: refused while a replica serves it, then every table written.
    let other = pg.database().unwrap();
    let mut r2 = support::ha::Replica::spawn(&dk, dir.path(), &other, "r2").await;
    support::ha::the_leader(&[&r2], 30).await;
    env.insert("FLEET_DATABASE_URL".into(), other.clone());
    let (ok, _, stderr) = run(&["restore", out.to_str().unwrap()], &env);
    assert!(!ok && stderr.contains("holds the lease"), "{stderr}");
    r2.proc.kill9();
    r.proc.kill9();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (ok, stdout, stderr) = run(&["restore", out.to_str().unwrap()], &env);
    assert!(ok, "{stdout}{stderr}");
    assert!(tables(&stdout).iter().any(|t| t.0 == "nodes" && t.1 == 1), "{stdout}");

    let r3 = support::ha::Replica::spawn(&dk, dir.path(), &other, "r3").await;
    let node = TestNode { url: r3.proc.url.clone(), ..node };
    let (s, d) = node.desired(None, 0).await;
    assert_eq!(s, 200, "{d}");
    assert!(d["generation"].as_u64() >= desired["generation"].as_u64());
}
