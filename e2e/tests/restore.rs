//! A restore with real nodes on Docker (docs/operations.md#a-restore-drill,
//! docs/behaviour.md#a-store-older-than-the-fleet): the controller's SQLite store backed up at
//! T0 while it serves; a node joins after T0 and runs an agent; the store is restored to T0.
//! The node of T0 is served again with its old token; the node that joined after T0 is told
//! `node_unknown`, logs the cause and the fix, and keeps running with its agent's container
//! as it was — the real `fleet-node`, not a simulation.

mod support;

use fleet_e2e::{docker_available, ensure_test_images};
use std::process::Command;
use std::time::Duration;
use support::*;

fn controller(args: &[&str], f: &Fleet) -> String {
    let out = Command::new(bin("fleet-controller")).args(args).env_clear().envs(&f.env).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "fleet-controller {args:?}: {text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_joined_after_the_backup_says_why_and_runs_on_while_the_others_are_served_again() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let mut f = Fleet::start("rs").await;
    f.devkit.put_agent(agent("early", 1));
    let mut n1 = f.node("n1", "").await;
    n1.start();
    f.status_where("early", 90, "early running", |s| s["phase"] == "running").await;
    let t0 = f.dir.path().join("t0.sqlite");
    controller(&["backup", "--out", t0.to_str().unwrap()], &f);

    // After T0: n2 joins and runs `late`.
    let mut n2 = f.node("n2", "").await;
    n2.start();
    eventually(60, "n2 online", || async { (f.node_view(&n2.name).await?["status"] == "online").then_some(()) }).await;
    f.devkit.put_agent(agent("late", 1));
    f.status_where("late", 90, "late running", |s| s["phase"] == "running").await;
    let late = eventually(30, "late's container on n2", || async {
        let c = container(&n2.container("late", 0))?;
        (c["State"]["Running"] == true).then(|| c["Id"].as_str().unwrap().to_string())
    })
    .await;

    // T1: the controller is lost; the store is restored to T0.
    f.kill_controller();
    let said = controller(&["restore", t0.to_str().unwrap()], &f);
    assert!(said.contains("nodes        1"), "{said}");
    f.start_controller().await;

    eventually(60, "n1 served again", || async {
        let n = f.node_view(&n1.name).await?;
        (n["status"] == "online").then_some(())
    })
    .await;
    let told = eventually(90, "n2 says why", || async {
        let log = n2.log();
        log.contains("the controller does not know this node").then_some(log)
    })
    .await;
    assert!(told.contains("node_unknown") && told.contains("join it again with a new join key"), "{told}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let proc = n2.proc.as_mut().unwrap();
    assert!(proc.child.try_wait().unwrap().is_none(), "n2 runs on:\n{}", n2.log());
    let c = container(&n2.container("late", 0)).expect("late's container is there");
    assert_eq!((c["Id"].as_str(), c["State"]["Running"].as_bool()), (Some(late.as_str()), Some(true)));
    assert!(f.node_view(&n2.name).await.is_none(), "the restored store does not know n2");
}
