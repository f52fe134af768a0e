//! Nodes of two protocol versions on one controller (docs/behaviour.md#desired-state-and-observed-report): the controller is upgraded
//! first, so a node that speaks only the two routes (`GET desired`, `PUT observed`; here the
//! real binary with `--protocol two-routes`, as nodes before the exchange) runs beside one that
//! takes the exchange the controller offers. Both run their share of one agent, both follow
//! its new revision, and the new one holds a single connection to the controller.

mod support;

use fleet_e2e::{docker_available, ensure_test_images};
use serde_json::Value;
use std::collections::HashSet;
use support::*;

/// Established TCP connections of process `pid` to `port` (its sockets in `/proc/<pid>/fd`
/// matched against `/proc/net/tcp{,6}`).
fn connections_to(pid: u32, port: u16) -> usize {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let mut n = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(state), Some(inode)) = (f.get(2), f.get(3), f.get(9)) else { continue };
            let remote_port = remote.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
            if *state == "01" && remote_port == Some(port) && inodes.contains(*inode) {
                n += 1;
            }
        }
    }
    n
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// `fleet_node_requests_total` of the controller by route.
async fn node_requests(f: &Fleet, route: &str) -> u64 {
    let url = format!("http://{}/metrics", f.env["FLEET_METRICS_LISTEN"]);
    let text = f.http.get(url).send().await.unwrap().text().await.unwrap();
    let prefix = format!("fleet_node_requests_total{{route=\"{route}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_protocol_node_and_a_new_one_run_side_by_side() {
    if !docker_available() {
        return;
    }
    ensure_test_images();
    let f = Fleet::start("e2emx").await;
    let mut old = f.node("old", "").await;
    let mut new = f.node("new", "").await;
    old.start_with(&[("FLEET_NODE_PROTOCOL", "two-routes")]);
    new.start();
    for n in [&old, &new] {
        eventually(30, "online", || async { f.node_view(&n.name).await.filter(|v| v["status"] == "online") }).await;
    }

    // Eight replicas on two nodes of four slots: each node runs four.
    f.devkit.put_agent(agent("mx", 8));
    f.status_where("mx", 90, "mx running with 8 ready", |s| s["phase"] == "running" && s["readyReplicas"] == 8).await;
    let placed: Vec<Value> = f.admin_get("/api/v1/placements").await["items"].as_array().unwrap().clone();
    let ids: HashSet<&str> =
        placed.iter().filter(|p| p["agentKey"] == "mx").filter_map(|p| p["nodeId"].as_str()).collect();
    assert_eq!(ids.len(), 2, "on both nodes: {placed:?}");

    // A new revision reaches both: every replica runs it.
    let mut next = agent("mx", 8);
    next["revision"] = 2.into();
    f.devkit.put_agent(next);
    f.status_where("mx", 90, "mx at revision 2 with 8 ready", |s| {
        s["phase"] == "running" && s["readyReplicas"] == 8 && s["observedRevision"] == 2
    })
    .await;

    // Each spoke its own protocol.
    let switched = "the controller offers the exchange";
    assert!(new.log().contains(switched), "the new node took the exchange:\n{}", new.log());
    assert!(!old.log().contains(switched), "the old node kept to the two routes:\n{}", old.log());
    assert!(node_requests(&f, "exchange").await > 0);
    assert!(node_requests(&f, "observed").await > 0 && node_requests(&f, "desired").await > 0);

    // The new node holds one connection to the controller; the old one two (its long-poll
    // and its report's keep-alive).
    let port = port_of(&f.public_url);
    let pid = |n: &NodeDir| n.proc.as_ref().unwrap().child.id();
    eventually(30, "one connection from the new node", || async {
        (connections_to(pid(&new), port) == 1).then_some(())
    })
    .await;
    eventually(30, "two connections from the old node", || async {
        (connections_to(pid(&old), port) == 2).then_some(())
    })
    .await;
}
