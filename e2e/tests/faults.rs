//! End-to-end under real faults (issue scenarios 9–15 and the node's exits): `SIGKILL` of a
//! node and of the controller, a partition through a proxy the test controls, a node restart
//! while the controller is down, a rejected credential, an unreachable Docker, PAT rotation.

mod support;

use fleet_devkit::Faults;
use fleet_e2e::{docker_available, ensure_test_images};
use std::time::Duration;
use support::*;

fn running(name: &str) -> Option<serde_json::Value> {
    container(name).filter(|c| c["State"]["Running"] == true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_node_loses_its_agent_and_stops_the_stale_copy_on_return() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let f = Fleet::start("e2ec").await;
    let mut a = f.node("a", "").await;
    let mut b = f.node("b", "").await;
    a.start();
    eventually(30, "a online", || async { f.node_view(&a.name).await.filter(|n| n["status"] == "online") }).await;
    f.devkit.put_agent(agent("mover", 1));
    let on_a = a.container("mover", 0);
    let old_pat = eventually(60, "mover runs on a", || async { running(&on_a).and_then(|_| pat_seen_by(&on_a)) }).await;
    b.start();
    eventually(30, "b online", || async { f.node_view(&b.name).await.filter(|n| n["status"] == "online") }).await;

    // 9. Node a is killed: offline, the agent moves to b with a new PAT, the old one revoked.
    a.kill9();
    eventually(60, "a offline", || async { f.node_view(&a.name).await.filter(|n| n["status"] == "offline") }).await;
    let on_b = b.container("mover", 0);
    let new_pat = eventually(60, "mover runs on b", || async { running(&on_b).and_then(|_| pat_seen_by(&on_b)) }).await;
    assert_ne!(new_pat, old_pat);
    eventually(30, "the old PAT revoked", || async {
        f.devkit.pats().iter().any(|p| p.token == old_pat && p.revoked).then_some(())
    })
    .await;
    assert_eq!(live_pats(&f, "mover").len(), 1);
    assert!(running(&on_a).is_some(), "a's copy still runs: nobody told a yet");
    // a comes back: it learns the agent moved and stops its stale copy.
    a.start();
    eventually(60, "a stopped its stale copy", || async { container(&on_a).is_none().then_some(()) }).await;
    assert!(running(&on_b).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_moves_the_replica_and_healing_stops_the_old_copy() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let mut f = Fleet::start("e2ed").await;
    // The cut sits between the node and whatever it talks to (the controller, or the TLS proxy).
    let public = f.public_url.clone();
    let host_port = public.split("://").nth(1).unwrap().split('/').next().unwrap().to_string();
    let cut = Partition::start(host_port.clone()).await;
    let mut a = f.node("a", "").await;
    let yaml = std::fs::read_to_string(a.config()).unwrap().replace(&host_port, &format!("127.0.0.1:{}", cut.port));
    std::fs::write(a.config(), yaml).unwrap();
    a.start();
    eventually(30, "a online", || async { f.node_view(&a.name).await.filter(|n| n["status"] == "online") }).await;
    f.devkit.put_agent(agent("island", 1));
    let on_a = a.container("island", 0);
    let id = eventually(60, "island runs on a", || async { running(&on_a).map(|c| c["Id"].clone()) }).await;
    let mut b = f.node("b", "").await;
    b.start();

    // 14. Partition: a keeps running its agent, goes offline, the replica moves to b.
    cut.set(false);
    eventually(60, "a offline", || async { f.node_view(&a.name).await.filter(|n| n["status"] == "offline") }).await;
    let on_b = b.container("island", 0);
    eventually(60, "island runs on b", || async { running(&on_b) }).await;
    assert_eq!(running(&on_a).map(|c| c["Id"].clone()), Some(id), "a's agent kept running through the partition");
    // Heal: a hears the agent moved and stops its copy.
    cut.set(true);
    eventually(120, "a stopped its copy after the heal", || async { container(&on_a).is_none().then_some(()) }).await;
    eventually(30, "a online again", || async { f.node_view(&a.name).await.filter(|n| n["status"] == "online") }).await;
    f.kill_controller();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_and_node_restarts_lose_nothing() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let mut f = Fleet::start("e2ee").await;
    let mut a = f.node("a", "").await;
    a.start();
    f.devkit.put_agents(vec![agent("one", 1), agent("two", 1)]);
    let names = [a.container("one", 0), a.container("two", 0)];
    for n in &names {
        eventually(60, "agents running", || async { running(n) }).await;
    }
    let before: Vec<_> = names.iter().map(|n| container(n).unwrap()["State"]["StartedAt"].clone()).collect();

    // 10. Controller killed: containers untouched, the node keeps working.
    f.kill_controller();
    tokio::time::sleep(Duration::from_secs(6)).await;
    // 11. The node restarted while the controller is down applies desired.json; nothing restarts.
    a.kill9();
    a.start();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after: Vec<_> =
        names.iter().map(|n| running(n).expect("still running")["State"]["StartedAt"].clone()).collect();
    assert_eq!(before, after, "no container was restarted");
    assert!(a.log().contains("applying the saved desired state"), "{}", a.log());
    // The controller returns with the same state and no duplicate live PAT.
    f.start_controller().await;
    eventually(30, "a online", || async { f.node_view(&a.name).await.filter(|n| n["status"] == "online") }).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let placements = f.admin_get("/api/v1/placements").await;
    assert_eq!(placements["items"].as_array().unwrap().iter().filter(|p| p["status"] == "placed").count(), 2);
    for agent in ["one", "two"] {
        assert_eq!(live_pats(&f, agent).len(), 1, "{agent}: exactly one live PAT");
    }
    let again: Vec<_> = names.iter().map(|n| running(n).unwrap()["State"]["StartedAt"].clone()).collect();
    assert_eq!(before, again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_recreates_the_container_with_the_new_pat() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let f = Fleet::start("e2ef").await;
    let mut a = f.node("a", "").await;
    a.start();
    // 15. IAM grants 15 s: rotation after 10 s; the node recreates with the new PAT; the old one
    // is revoked after the (2 s) grace.
    f.devkit.set_faults(Faults { pat_lifetime_seconds: Some(15), ..Default::default() });
    f.devkit.put_agent(agent("rot", 1));
    let name = a.container("rot", 0);
    let first = eventually(60, "rot runs", || async { running(&name).and_then(|_| pat_seen_by(&name)) }).await;
    let second = eventually(60, "rot recreated with a new PAT", || async {
        running(&name).and_then(|_| pat_seen_by(&name)).filter(|p| *p != first)
    })
    .await;
    f.devkit.set_faults(Faults::default());
    eventually(30, "the first PAT revoked", || async {
        f.devkit.pats().iter().any(|p| p.token == first && p.revoked).then_some(())
    })
    .await;
    assert!(f.devkit.pats().iter().any(|p| p.token == second));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_exits_clearly_and_reports_docker_trouble() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let mut f = Fleet::start("e2eg").await;

    // Not joined and no join key file.
    let mut lost = f.node("lost", "").await;
    let yaml = std::fs::read_to_string(lost.config()).unwrap();
    let yaml: String = yaml.lines().filter(|l| !l.starts_with("joinKeyFile")).map(|l| format!("{l}\n")).collect();
    std::fs::write(lost.config(), yaml).unwrap();
    lost.start();
    let st = lost.proc.as_mut().unwrap().exited(20).await;
    assert!(!st.success());
    assert!(lost.log().contains("node is not joined and no join key file is configured"), "{}", lost.log());

    // 13. Docker unreachable: the node joins and reports health degraded.
    let mut sick = f.node("sick", "dockerUrl: tcp://127.0.0.1:1\n").await;
    sick.start();
    eventually(40, "sick is degraded", || async {
        f.node_view(&sick.name).await.filter(|n| n["health"] == "degraded")
    })
    .await;

    // A second node with a taken name: 409, the process ends with the controller's message.
    let mut twin = f.node("twin", "").await;
    let yaml = std::fs::read_to_string(twin.config())
        .unwrap()
        .replace(&format!("name: {}", twin.name), &format!("name: {}", sick.name));
    std::fs::write(twin.config(), yaml).unwrap();
    twin.start();
    let st = twin.proc.as_mut().unwrap().exited(30).await;
    assert!(!st.success());
    assert!(twin.log().contains("node_name_taken"), "{}", twin.log());

    // A token the store never knew (its store older than the node,
    // docs/behaviour.md#a-store-older-than-the-fleet): the node runs on, saying why and what to do.
    sick.kill9();
    let token = sick.root.join("state/token");
    let good = std::fs::read_to_string(&token).unwrap();
    std::fs::write(&token, "fnt_unknown_to_the_store").unwrap();
    sick.start();
    eventually(30, "the node says the controller does not know it", || async {
        sick.log().contains("the controller does not know this node").then_some(())
    })
    .await;
    assert!(sick.proc.as_mut().unwrap().child.try_wait().unwrap().is_none(), "it runs on:\n{}", sick.log());
    sick.kill9();
    std::fs::write(&token, good).unwrap();

    // 12. The controller stops accepting a node's credential (the node was deleted): the node
    // exits non-zero, saying so.
    sick.start();
    eventually(60, "sick back", || async { f.node_view(&sick.name).await.filter(|n| n["status"] == "online") }).await;
    let gone = f.http.delete(format!("{}/api/v1/nodes/{}", f.url, sick.name)).bearer_auth(&f.admin_token).send();
    assert_eq!(gone.await.unwrap().status(), 204);
    let st = sick.proc.as_mut().unwrap().exited(30).await;
    assert!(!st.success());
    assert!(sick.log().contains("the controller no longer accepts this node's credential"), "{}", sick.log());

    // A node started before the controller keeps retrying and joins when it comes up.
    let mut early = f.node("early", "").await;
    f.kill_controller();
    early.start();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(early.proc.as_mut().unwrap().child.try_wait().unwrap().is_none(), "still trying");
    f.start_controller().await;
    eventually(60, "early joined", || async { f.node_view(&early.name).await }).await;
    assert!(early.log().contains("cannot join yet"), "{}", early.log());
}
