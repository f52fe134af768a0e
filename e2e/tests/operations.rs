//! Day-two operations end to end (docs/behaviour.md#node-lifecycle), real binaries on the real Docker engine: a
//! drained node's agents come up elsewhere with new PATs while the old containers stop and
//! their PATs are revoked; uncordon makes the node eligible again; a deleted node exits, its
//! PATs are revoked at once, its agents run elsewhere and its name joins again; a join whose
//! `201` is lost still ends with one node.

mod support;

use fleet_e2e::{docker_available, ensure_test_images};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use support::*;

/// PATs IAM issued for a node (by the node's name in their description): (agent, token, revoked).
fn pats_on(f: &Fleet, node: &str) -> Vec<(String, String, bool)> {
    let on = format!("on node {node}");
    f.devkit
        .pats()
        .into_iter()
        .filter(|p| p.description.ends_with(&on))
        .map(|p| (p.agent_key.unwrap_or_default(), p.token, p.revoked))
        .collect()
}

async fn admin(f: &Fleet, method: &str, path: &str, body: Value) -> (u16, Value) {
    let r = f
        .http
        .request(method.parse().unwrap(), format!("{}{path}", f.url))
        .bearer_auth(&f.admin_token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

fn running(name: &str) -> bool {
    container(name).is_some_and(|c| c["State"]["Running"] == true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_s_agents_come_up_elsewhere_and_uncordon_makes_it_eligible() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let f = Fleet::start("e2eo").await;
    let mut n1 = f.node("n1", "").await;
    let mut n2 = f.node("n2", "").await;
    f.devkit.put_agents(vec![agent("alpha", 1), agent("beta", 1)]);
    n1.start();
    for a in ["alpha", "beta"] {
        let c = n1.container(a, 0);
        eventually(60, "running on n1", || async { running(&c).then_some(()) }).await;
    }
    n2.start();
    eventually(30, "n2 online", || async { f.node_view(&n2.name).await.filter(|n| n["status"] == "online") }).await;
    let old: Vec<(String, String, bool)> = pats_on(&f, &n1.name);
    assert_eq!(old.len(), 2, "{old:?}");

    let (s, v) = admin(&f, "POST", &format!("/api/v1/nodes/{}:drain", n1.name), json!({})).await;
    assert_eq!(s, 202, "{v}");
    // Both come up on n2 with PATs of their own, which the containers read.
    for a in ["alpha", "beta"] {
        let c = n2.container(a, 0);
        let pat = eventually(60, "up on n2 with its PAT", || async { pat_seen_by(&c) }).await;
        assert!(old.iter().all(|(_, t, _)| *t != pat), "{a} on n2 runs with a new PAT");
        assert!(pats_on(&f, &n2.name).iter().any(|(x, t, r)| x == a && *t == pat && !r));
    }
    // The old containers stop (the node's stop window) and the old PATs are revoked.
    for a in ["alpha", "beta"] {
        let c = n1.container(a, 0);
        eventually(60, "the old container stopped", || async { (!running(&c)).then_some(()) }).await;
    }
    eventually(60, "n1's PATs revoked", || async {
        pats_on(&f, &n1.name).iter().all(|(_, _, revoked)| *revoked).then_some(())
    })
    .await;
    let view = eventually(30, "the drain done", || async {
        f.node_view(&n1.name).await.filter(|n| n["drain"]["remaining"] == 0)
    })
    .await;
    assert_eq!(view["schedulable"], false, "a drained node stays cordoned");

    // Uncordon: eligible again; the next agent goes to it (the node with the most free slots).
    let (s, v) = admin(&f, "POST", &format!("/api/v1/nodes/{}:uncordon", n1.name), json!({})).await;
    assert_eq!((s, &v["schedulable"]), (200, &json!(true)), "{v}");
    f.devkit.put_agent(agent("gamma", 1));
    let c = n1.container("gamma", 0);
    eventually(60, "gamma on n1", || async { running(&c).then_some(()) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_node_exits_its_pats_are_revoked_and_its_name_joins_again() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let f = Fleet::start("e2ed").await;
    let mut n1 = f.node("n1", "").await;
    let mut n2 = f.node("n2", "").await;
    f.devkit.put_agent(agent("alpha", 1));
    n1.start();
    let c1 = n1.container("alpha", 0);
    eventually(60, "alpha on n1", || async { running(&c1).then_some(()) }).await;
    n2.start();
    eventually(30, "n2 online", || async { f.node_view(&n2.name).await.filter(|n| n["status"] == "online") }).await;

    let (s, v) = admin(&f, "DELETE", &format!("/api/v1/nodes/{}", n1.name), Value::Null).await;
    assert_eq!(s, 204, "{v}");
    // Every PAT sealed to n1 is revoked now, with no drain window.
    eventually(5, "n1's PATs revoked at once", || async {
        pats_on(&f, &n1.name).iter().all(|(_, _, revoked)| *revoked).then_some(())
    })
    .await;
    // The node's next call is refused: it exits, saying so.
    let status = n1.proc.as_mut().unwrap().exited(60).await;
    assert!(!status.success(), "the deleted node exits non-zero");
    assert!(n1.log().contains("the controller no longer accepts this node's credential"), "{}", n1.log());
    // Its agent runs elsewhere.
    let c2 = n2.container("alpha", 0);
    eventually(60, "alpha on n2", || async { pat_seen_by(&c2).filter(|_| running(&c2)) }).await;
    // Its name is free: a machine joins under it (fresh state, a new key).
    let mut again = f.node("n1-again", "").await;
    let yaml = std::fs::read_to_string(again.config()).unwrap();
    std::fs::write(again.config(), yaml.replace(&format!("name: {}\n", again.name), &format!("name: {}\n", n1.name)))
        .unwrap();
    again.start();
    let view = eventually(30, "the name joined again", || async {
        f.node_view(&n1.name).await.filter(|n| n["status"] == "online")
    })
    .await;
    assert!(again.log().contains(&format!("joined the fleet as {}", view["id"].as_str().unwrap())), "{}", again.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_whose_answer_is_lost_ends_with_one_node() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let mut f = Fleet::start("e2ej").await;
    let proxy = LosesFirstJoin::start(f.url.trim_start_matches("http://").to_string()).await;
    f.public_url = proxy.url.clone();
    let mut n1 = f.node("n1", "").await;
    f.devkit.put_agent(agent("alpha", 1));
    n1.start();
    let c = n1.container("alpha", 0);
    eventually(90, "alpha running on n1", || async { running(&c).then_some(()) }).await;
    assert!(proxy.joins.load(Ordering::SeqCst) >= 2, "the first answer was lost and the node joined again");
    let nodes = f.admin_get("/api/v1/nodes").await;
    let named: Vec<&Value> = nodes["items"].as_array().unwrap().iter().filter(|n| n["name"] == n1.name).collect();
    assert_eq!(named.len(), 1, "one node, no ghost: {nodes}");
    let id = named[0]["id"].as_str().unwrap();
    assert!(n1.log().contains("cannot join yet"), "the node retried: {}", n1.log());
    assert!(n1.log().contains(&format!("joined the fleet as {id}")), "{}", n1.log());
    assert_eq!(f.admin_get("/api/v1/nodes").await["items"].as_array().unwrap().len(), 1);
}

/// docs/behaviour.md#spread-and-priority, Show 3 of the spread: three nodes labelled
/// `zone=a|b|c` (zone c with the most room), an agent of three replicas with `spread: zone`
/// → one replica in each zone (without the spread, two would go to zone c); the zone-a node
/// stops → its replica moves to a zone with the fewest (b and c hold one each; c has the more
/// room).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_replicas_take_one_zone_each_and_a_lost_zone_s_replica_goes_to_the_fewest() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let f = Fleet::start("e2esp").await;
    let mut a = f.node_sized("za", 2, "labels: [zone=a]\n").await;
    let mut b = f.node_sized("zb", 2, "labels: [zone=b]\n").await;
    let mut c = f.node_sized("zc", 4, "labels: [zone=c]\n").await;
    for n in [&mut a, &mut b, &mut c] {
        n.start();
    }
    for n in [&a, &b, &c] {
        eventually(30, "the node online", || async { f.node_view(&n.name).await.filter(|v| v["status"] == "online") })
            .await;
    }
    let mut spr = agent("spr", 3);
    spr["placement"]["spread"] = json!("zone");
    f.devkit.put_agents(vec![spr]);
    let on = |n: &NodeDir| -> usize { (0..3).filter(|r| running(&n.container("spr", *r))).count() };
    eventually(90, "one replica running in each zone", || async {
        (on(&a) == 1 && on(&b) == 1 && on(&c) == 1).then_some(())
    })
    .await;
    let (s, e) = admin(&f, "GET", "/api/v1/agents/spr/placement", Value::Null).await;
    assert_eq!(s, 200, "{e}");
    assert_eq!(e["spread"], json!({"label": "zone", "counts": {"a": 1, "b": 1, "c": 1}}), "{e}");

    a.kill9();
    eventually(90, "zone a's replica running in zone c", || async { (on(&b) == 1 && on(&c) == 2).then_some(()) }).await;
    let (_, e) = admin(&f, "GET", "/api/v1/agents/spr/placement", Value::Null).await;
    assert_eq!(e["spread"]["counts"], json!({"b": 1, "c": 2}), "{e}");
}
