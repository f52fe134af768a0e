//! High availability on PostgreSQL (docs/behaviour.md#high-availability), with three real controller processes on one
//! PostgreSQL the test starts itself: one leader, every replica serving joins, reports,
//! long-polls and admin reads; a takeover after the leader's `SIGKILL`; and a deposed leader
//! whose write is refused by the fence.

mod support;

use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::ha::*;
use support::*;

fn announce() -> Value {
    json!({"labels": [], "executorKinds": ["k"], "capacity": {"slots": 4}, "secrets": []})
}

/// Agents of `desired` by key.
fn agent_keys(d: &Value) -> Vec<String> {
    d["agents"]
        .as_array()
        .map(|a| a.iter().map(|x| x["agentKey"].as_str().unwrap_or("").to_string()).collect())
        .unwrap_or_default()
}

/// Polls every node's generation through every replica in the background, as a node polls
/// (`since` the generation it has); fails on an answer older than what the node has.
fn watch_generations(
    nodes: Vec<TestNode>,
    urls: Vec<String>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<HashMap<String, u64>> {
    tokio::spawn(async move {
        let mut last: HashMap<String, u64> = HashMap::new();
        while !stop.load(Ordering::SeqCst) {
            for n in &nodes {
                for u in &urls {
                    // A replica killed by the test does not answer: skipped.
                    let Some(g) = generation_via(n, u, last.get(&n.name).copied()).await else { continue };
                    let seen = last.entry(n.name.clone()).or_default();
                    assert!(g >= *seen, "{} has generation {seen}, and {u} answered with {g}", n.name);
                    *seen = g;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        last
    })
}

/// `n`'s generation as the replica at `url` serves it to a node that has `since`, as a node
/// asks; `None` when it does not answer or answers `304` (the same).
async fn generation_via(n: &TestNode, url: &str, since: Option<u64>) -> Option<u64> {
    let since = since.map(|g| format!("&since={g}")).unwrap_or_default();
    let r = n
        .http
        .get(format!("{url}/api/v1/nodes/me/desired?wait=0{since}"))
        .bearer_auth(&n.token)
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    let d: Value = r.error_for_status().ok()?.json().await.ok()?;
    d["generation"].as_u64()
}

/// Replicas placed in a placements list, of `agent` or of all.
fn placed(items: &[Value], agent: Option<&str>) -> u64 {
    items
        .iter()
        .filter(|i| i["status"] == "placed" && agent.is_none_or(|a| i["agentKey"] == a))
        .map(|i| i["replicas"].as_u64().unwrap())
        .sum()
}

/// The URL of the first of `replicas`.
fn f_any(replicas: &[&Replica]) -> String {
    replicas[0].proc.url.clone()
}

/// At most one live PAT per (agent, node) pair once rotations are over (no rotation happens
/// in these tests: every PAT beyond one per pair would be a duplicate).
fn assert_one_live_pat_per_pair(dk: &fleet_devkit::Devkit) {
    let mut per_pair: HashMap<String, u32> = HashMap::new();
    for p in dk.pats().iter().filter(|p| !p.revoked) {
        *per_pair.entry(p.description.clone()).or_default() += 1;
    }
    assert!(per_pair.values().all(|n| *n == 1), "two live PATs for a pair: {per_pair:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_every_replica_serves_and_a_killed_leader_is_replaced() {
    let Some(pg) = fleet_devkit::postgres::shared_or_skip("the HA tests") else { return };
    let db = pg.database().unwrap();
    let dk = devkit().await;
    dk.put_agent(agent("alpha", "k", 2));
    let dir = tempfile::tempdir().unwrap();
    let _logs = LogsOnFailure(dir.path().to_path_buf());
    let mut replicas = Vec::new();
    for name in ["r0", "r1", "r2"] {
        replicas.push(Replica::spawn(&dk, dir.path(), &db, name).await);
    }
    let first = the_leader(&replicas.iter().collect::<Vec<_>>(), 20).await;
    let followers: Vec<&Replica> = replicas.iter().filter(|r| r.name != first).collect();
    let (f1, f2) = (followers[0].proc.url.clone(), followers[1].proc.url.clone());
    let token = dk.mint("fleet", &["fleet:admin"], 3600);

    // Joins and reports on one follower, long-polls on the other, admin reads on both.
    let admin = Admin::new(&f1, token.clone());
    let mut nodes = Vec::new();
    for name in ["n1", "n2"] {
        let mut n = TestNode::new(&f1, name, announce());
        n.join(&admin.join_key().await).await;
        nodes.push(n);
    }
    let reporting = keep_reporting(nodes.clone());
    let polled: Vec<TestNode> = nodes.iter().map(|n| TestNode { url: f2.clone(), ..n.clone() }).collect();
    eventually(30, "alpha's two replicas placed, seen through a follower", || async {
        // A follower that has not caught up answers 503 for now: asked again, not a failure.
        let (status, v) = Admin::new(&f2, token.clone()).get("/api/v1/placements").await;
        let items = v["items"].as_array().cloned().unwrap_or_default();
        (status == 200 && placed(&items, Some("alpha")) == 2).then_some(())
    })
    .await;
    eventually(30, "alpha's PATs in the desired states of its nodes, served by the other follower", || async {
        let (_, v) = Admin::new(&f2, token.clone()).get("/api/v1/placements").await;
        let items = v["items"].as_array().cloned().unwrap_or_default();
        let hosts: HashSet<&str> = items
            .iter()
            .filter(|i| i["agentKey"] == "alpha" && i["status"] == "placed")
            .filter_map(|i| i["nodeId"].as_str())
            .collect();
        let mut with_alpha = HashSet::new();
        for n in &polled {
            let (_, d) = n.desired(None, 0).await;
            if agent_keys(&d).contains(&"alpha".to_string()) {
                n.open_pat(&d, "alpha")?;
                with_alpha.insert(n.id.as_str());
            }
        }
        (!hosts.is_empty() && with_alpha == hosts).then_some(())
    })
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let urls: Vec<String> = replicas.iter().map(|r| r.proc.url.clone()).collect();
    let watcher = watch_generations(nodes.clone(), urls, stop.clone());

    // The leader dies without a word; a follower takes over once the lease expires.
    let leader = replicas.iter_mut().find(|r| r.name == first).unwrap();
    leader.proc.kill9();
    let rest: Vec<&Replica> = replicas.iter().filter(|r| r.name != first).collect();
    let second = the_leader(&rest, 30).await;
    let new = rest.iter().find(|r| r.name == second).unwrap();
    assert!(new.proc.log_text().contains("became the leader (epoch 2)"), "{}", new.proc.log_text());
    // The lease still ran: the old leader's last calls are waited out before the new term.
    assert!(
        new.proc
            .log_text()
            .contains("took the lock of a leader whose lease still runs; loading the store while waiting 850 ms"),
        "{}",
        new.proc.log_text()
    );

    // Its first pass builds no desired body: each was stored with the hash of its inputs, and
    // none changed in the takeover.
    eventually(30, "the new leader's first pass", || async {
        (new.metric("fleet_passes_total").await? >= 1).then_some(())
    })
    .await;
    assert_eq!(new.metric("fleet_desired_built_total").await, Some(0), "bodies built again after the takeover");

    // The new leader reconciles: a new agent is placed and reaches a node through a follower.
    dk.put_agent(agent("beta", "k", 1));
    let other = rest.iter().find(|r| r.name != second).unwrap().proc.url.clone();
    eventually(30, "beta placed by the new leader, served by the remaining follower", || async {
        for n in &nodes {
            let via = TestNode { url: other.clone(), ..n.clone() };
            let (_, d) = via.desired(None, 0).await;
            if agent_keys(&d).contains(&"beta".to_string()) && via.open_pat(&d, "beta").is_some() {
                return Some(());
            }
        }
        None
    })
    .await;
    assert!(new.metric("fleet_desired_built_total").await >= Some(1), "beta's node's body was built");
    let items = Admin::new(&other, token.clone()).placements().await;
    assert_eq!(placed(&items, Some("alpha")), 2, "no placement was lost in the takeover: {items:?}");
    for n in Admin::new(&other, token.clone()).nodes().await {
        assert_eq!(n["status"], "online", "the takeover alone marks no node offline: {n}");
    }
    // Day-two operations from a follower (docs/behaviour.md#day-two-operations): a drain asked there empties n1 by the
    // leader's passes, and its events are read back through the other replica.
    let drainer = Admin::new(&other, token.clone());
    let busy = items.iter().find(|i| i["status"] == "placed").unwrap()["nodeId"].as_str().unwrap().to_string();
    let name = nodes.iter().find(|n| n.id == busy).unwrap().name.clone();
    let (s, v) = drainer.post(&format!("/api/v1/nodes/{name}:drain"), json!({})).await;
    assert_eq!(s, 202, "{v}");
    let n1 = busy.clone();
    eventually(30, "the busy node drained by the leader", || async {
        let items = Admin::new(&f_any(&rest), token.clone()).placements().await;
        let on_n1 = items.iter().any(|i| i["nodeId"] == n1.as_str() && i["status"] == "placed");
        (!on_n1 && placed(&items, None) == 3).then_some(())
    })
    .await;
    let (s, events) = Admin::new(&f_any(&rest), token.clone()).get(&format!("/api/v1/events?node={name}")).await;
    assert_eq!(s, 200);
    assert!(events["items"].as_array().unwrap().iter().any(|e| e["kind"] == "node_draining"), "{events}");

    stop.store(true, Ordering::SeqCst);
    let seen = watcher.await.unwrap();
    assert_eq!(seen.len(), 2, "both nodes' generations were followed: {seen:?}");
    reporting.abort();
    assert_one_live_pat_per_pair(&dk);
}

/// A takeover with nothing changed sends the CP no status: what the CP accepted is stored,
/// and only an agent marked unsettled would go again. Counted on the devkit CP; a change after
/// the takeover is still sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_with_nothing_changed_sends_no_status() {
    let Some(pg) = fleet_devkit::postgres::shared_or_skip("the HA tests") else { return };
    let db = pg.database().unwrap();
    let dk = devkit().await;
    let keys = ["alpha", "gamma", "delta"];
    for key in keys {
        dk.put_agent(agent(key, "k", 2));
    }
    let dir = tempfile::tempdir().unwrap();
    let _logs = LogsOnFailure(dir.path().to_path_buf());
    let mut replicas = Vec::new();
    for name in ["r0", "r1"] {
        replicas.push(Replica::spawn(&dk, dir.path(), &db, name).await);
    }
    let first = the_leader(&replicas.iter().collect::<Vec<_>>(), 20).await;
    let follower = replicas.iter().find(|r| r.name != first).unwrap().proc.url.clone();
    let admin = Admin::new(&follower, dk.mint("fleet", &["fleet:admin"], 3600));
    let mut nodes = Vec::new();
    for name in ["n1", "n2"] {
        let mut n = TestNode::new(&follower, name, announce());
        n.join(&admin.join_key().await).await;
        nodes.push(n);
    }
    let reporting = keep_reporting(nodes.clone());
    eventually(30, "every agent's status in the CP", || async {
        keys.iter().all(|k| dk.status(k).is_some()).then_some(())
    })
    .await;
    let settled = eventually(30, "no status sent for 3 s", || async {
        let before = dk.calls("put_status");
        tokio::time::sleep(Duration::from_secs(3)).await;
        (dk.calls("put_status") == before).then_some(before)
    })
    .await;

    replicas.iter_mut().find(|r| r.name == first).unwrap().proc.kill9();
    let rest: Vec<&Replica> = replicas.iter().filter(|r| r.name != first).collect();
    the_leader(&rest, 30).await;
    eventually(30, "the new leader's first pass", || async {
        (rest[0].metric("fleet_passes_total").await? >= 1).then_some(())
    })
    .await;
    // Longer than a status's debounce and a few passes of the reports coming in.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(dk.calls("put_status"), settled, "statuses sent again by the new leader with nothing changed");

    dk.put_agent(agent("beta", "k", 1));
    eventually(30, "beta's status sent by the new leader", || async { dk.status("beta").is_some().then_some(()) })
        .await;
    reporting.abort();
}

/// The leader's connection to PostgreSQL is cut while it is stalled (it has not noticed it
/// lost the lease); another replica takes over; when the connection is back, the write the
/// old leader attempts is refused by the fence — and the new leader's state stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_cannot_write() {
    let Some(pg) = fleet_devkit::postgres::shared_or_skip("the HA tests") else { return };
    let db = pg.database().unwrap();
    let proxy = Proxy::start(pg.port()).await;
    let via_proxy = pg.via_port(&db, proxy.port);
    let dk = devkit().await;
    dk.put_agent(agent("alpha", "k", 1));
    let dir = tempfile::tempdir().unwrap();
    let _logs = LogsOnFailure(dir.path().to_path_buf());
    let old = Replica::spawn(&dk, dir.path(), &via_proxy, "old").await;
    assert_eq!(the_leader(&[&old], 20).await, "old");
    let (a, b) = (Replica::spawn(&dk, dir.path(), &db, "a").await, Replica::spawn(&dk, dir.path(), &db, "b").await);
    let token = dk.mint("fleet", &["fleet:admin"], 3600);
    let admin = Admin::new(&a.proc.url, token.clone());
    let mut n = TestNode::new(&a.proc.url, "n1", announce());
    n.join(&admin.join_key().await).await;
    let reporting = keep_reporting(vec![n.clone()]);
    let revision = |d: &Value| {
        d["agents"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["agentKey"] == "alpha"))
            .and_then(|x| x["revision"].as_u64())
    };
    eventually(30, "alpha on n1 with its PAT", || async {
        let (_, d) = n.desired(None, 0).await;
        (revision(&d) == Some(1) && n.open_pat(&d, "alpha").is_some()).then_some(())
    })
    .await;

    // Stalled and cut off: the lease passes while the old leader still holds its fence.
    std::fs::write(old.failpoints.join("lease-stall"), "").unwrap();
    // A lock check already under way when the failpoint appears would still notice the cut.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.cut();
    let new = the_leader(&[&a, &b], 30).await;
    let new = if new == "a" { &a } else { &b };
    assert!(new.proc.log_text().contains("became the leader (epoch 2)"), "{}", new.proc.log_text());
    assert_eq!(old.leads().await, Some(true), "the stalled leader has not noticed");

    // Back in touch, it acts as a leader would: the CP change it cannot learn (its lease ran
    // out by its own clock, so it calls nothing out), but a drain taken by another replica it
    // follows from the database, and the desired states its pass writes to move alpha are
    // refused by the fence.
    proxy.restore();
    dk.edit_agent("alpha", |v| v["revision"] = json!(2));
    let mut n2 = TestNode::new(&a.proc.url, "n2", announce());
    n2.join(&admin.join_key().await).await;
    let reporting2 = keep_reporting(vec![n2.clone()]);
    let (s, v) = admin.post("/api/v1/nodes/n1:drain", json!({})).await;
    assert_eq!(s, 202, "{v}");
    eventually(30, "the old leader's write refused by the fence", || async {
        old.proc
            .log_text()
            .contains("refused by the lease: this replica no longer leads (its epoch 1 has ended)")
            .then_some(())
    })
    .await;
    // Once it runs again it learns it lost the lease — its lock's session is gone (cut, or
    // ended by the new leader), or its renewal is refused — and stops leading.
    std::fs::remove_file(old.failpoints.join("lease-stall")).unwrap();
    eventually(20, "the old leader steps down", || async { (old.leads().await == Some(false)).then_some(()) }).await;
    let log = old.proc.log_text();
    assert!(
        log.contains("lost the lease (epoch 1): the session holding the leader's lock")
            || log.contains("lost the lease (epoch 1): another replica holds the lease now"),
        "{log}"
    );
    // The new leader's work stands: alpha moved to n2, at revision 2, with one live PAT.
    eventually(30, "revision 2 on n2 from the new leader", || async {
        let (_, d) = n2.desired(None, 0).await;
        (revision(&d) == Some(2) && n2.open_pat(&d, "alpha").is_some()).then_some(())
    })
    .await;
    assert_eq!(new.leads().await, Some(true), "the new leader still leads");
    reporting.abort();
    reporting2.abort();
    assert_one_live_pat_per_pair(&dk);
}

/// A leader paused with `SIGSTOP` is replaced when its lease expires (TTL + 2 s at most), and
/// after `SIGCONT` it makes no outside call — devkit counts every request by the replica that
/// names itself in it — and steps down; the new leader's work stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_is_replaced_and_wakes_silent() {
    let Some(pg) = fleet_devkit::postgres::shared_or_skip("the HA tests") else { return };
    let db = pg.database().unwrap();
    let dk = devkit().await;
    dk.put_agent(agent("alpha", "k", 1));
    let dir = tempfile::tempdir().unwrap();
    let _logs = LogsOnFailure(dir.path().to_path_buf());
    let mut replicas = Vec::new();
    for name in ["p0", "p1", "p2"] {
        replicas.push(Replica::spawn(&dk, dir.path(), &db, name).await);
    }
    let leader = the_leader(&replicas.iter().collect::<Vec<_>>(), 30).await;
    let i = replicas.iter().position(|r| r.name == leader).unwrap();
    let via = replicas[(i + 1) % 3].proc.url.clone();
    let token = dk.mint("fleet", &["fleet:admin"], 3600);
    let mut n = TestNode::new(&via, "n1", announce());
    n.join(&Admin::new(&via, token).join_key().await).await;
    let reporting = keep_reporting(vec![n.clone()]);
    eventually(30, "alpha on n1 with its PAT", || async {
        let (_, d) = n.desired(None, 0).await;
        n.open_pat(&d, "alpha").map(|_| ())
    })
    .await;
    assert!(dk.calls_from(&leader) > 0, "the leader's calls name it");

    let pid = replicas[i].proc.child.id().to_string();
    let signal = |sig: &str| assert!(std::process::Command::new("kill").args([sig, &pid]).status().unwrap().success());
    // It wakes not knowing it lost the lease (its lock and renewals unchecked): only the call
    // gate stands between it and the CP.
    std::fs::write(replicas[i].failpoints.join("lease-stall"), "").unwrap();
    // A lock check already under way when the failpoint appears would still end the term.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    signal("-STOP");
    let paused_at = std::time::Instant::now();
    let calls_while_paused = dk.calls_from(&leader);
    let rest: Vec<&Replica> = replicas.iter().filter(|r| r.name != leader).collect();
    let new = the_leader(&rest, 10).await;
    let took = paused_at.elapsed();
    assert!(took < Duration::from_secs(3 + 2), "replaced within TTL + 2 s: {took:?}");
    // Work for a leader while the old one sleeps: a new revision, then wake it.
    dk.edit_agent("alpha", |v| v["revision"] = json!(2));
    signal("-CONT");
    let old = &replicas[i];
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(old.leads().await, Some(true), "it believes it still leads");
    assert_eq!(dk.calls_from(&leader), calls_while_paused, "no outside call after it woke: {}", old.proc.log_text());
    std::fs::remove_file(replicas[i].failpoints.join("lease-stall")).unwrap();
    eventually(20, "the woken leader steps down", || async { (old.leads().await == Some(false)).then_some(()) }).await;
    assert_eq!(dk.calls_from(&leader), calls_while_paused, "none while it stepped down either");
    assert!(dk.calls_from(&new) > 0, "the new leader calls out");
    eventually(30, "revision 2 on n1 from the new leader", || async {
        let (_, d) = n.desired(None, 0).await;
        let rev = d["agents"].as_array()?.iter().find(|a| a["agentKey"] == "alpha")?["revision"].as_u64()?;
        (rev == 2).then_some(())
    })
    .await;
    eprintln!("paused leader replaced after {took:?}");
    reporting.abort();
    assert_one_live_pat_per_pair(&dk);
}

/// What crosses the network between replicas: a proxy in front of the leader records every
/// request head a follower forwards.
async fn capture_proxy(target: u16) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match client.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                seen.lock().unwrap().push(String::from_utf8_lossy(&buf).to_string());
                let Ok(mut upstream) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else { return };
                if upstream.write_all(&buf).await.is_ok() {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
            });
        }
    });
    (port, heads)
}

/// A follower forwards an admin read with the caller it verified, signed — never the admin's
/// token (the proxy in front of the leader sees every head); a forged or stale signature is
/// refused `401`; a replica on PostgreSQL without `FLEET_REPLICA_SECRET` does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_reads_carry_a_signature_not_the_token() {
    let Some(pg) = fleet_devkit::postgres::shared_or_skip("the HA tests") else { return };
    let db = pg.database().unwrap();
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let _logs = LogsOnFailure(dir.path().to_path_buf());
    let leader_port = free_port();
    let (proxy_port, heads) = capture_proxy(leader_port).await;
    let advertise = [("FLEET_ADVERTISE_URL", format!("http://127.0.0.1:{proxy_port}"))];
    let leader = Replica::spawn_with(&dk, dir.path(), &db, "s0", Some(3), leader_port, &advertise).await;
    assert_eq!(the_leader(&[&leader], 20).await, "s0");
    let follower = Replica::spawn(&dk, dir.path(), &db, "s1").await;
    let token = dk.mint("fleet", &["fleet:read"], 600);
    let http = reqwest::Client::new();
    let read = |base: &str| http.get(format!("{base}/api/v1/nodes?limit=5")).bearer_auth(&token).send();
    // A follower just started learns where the leader is at its first try for the lock.
    eventually(20, "the follower forwards the read", || async {
        let r = read(&follower.proc.url).await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    let forwarded: Vec<String> = heads.lock().unwrap().clone();
    assert!(!forwarded.is_empty(), "the read went through the proxy to the leader");
    for head in &forwarded {
        let lower = head.to_ascii_lowercase();
        assert!(!lower.contains("authorization:") && !head.contains(&token), "no token crosses: {head}");
        assert!(lower.contains("x-fleet-forwarded-signature:"), "{head}");
    }
    let r = http.get(format!("{}/api/v1/nodes", follower.proc.url)).send().await.unwrap();
    assert_eq!(r.status(), 401, "the follower checks the token itself");

    // Forged and stale requests straight to the leader.
    let signer = fleet_controller::http::signed::Signer::new(REPLICA_SECRET.as_bytes());
    let admin = fleet_controller::http::auth::Admin { sub: "mallory".into(), scopes: vec!["fleet:admin".into()] };
    let send_signed = |signer: fleet_controller::http::signed::Signer, at: i64| {
        let mut req = http.get(format!("{}/api/v1/nodes?limit=5", leader.proc.url)).header("x-fleet-forwarded", "s1");
        for (k, v) in signer.headers("GET", "/api/v1/nodes?limit=5", &admin, "s1", at) {
            req = req.header(k, v);
        }
        req.send()
    };
    let now = fleet_controller::clock::now_ms();
    let r = send_signed(fleet_controller::http::signed::Signer::new(b"not the replicas' secret, forged!"), now)
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.text().await.unwrap().contains("signature is not the replicas'"));
    let r = send_signed(fleet_controller::http::signed::Signer::new(REPLICA_SECRET.as_bytes()), now - 31_000)
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.text().await.unwrap().contains("not signed within 30 s of now"));
    // A forged time at the edge of i64 (a debug build once panicked on it).
    let mut forged = http.get(format!("{}/api/v1/nodes?limit=5", leader.proc.url)).header("x-fleet-forwarded", "s1");
    for (k, v) in signer.headers("GET", "/api/v1/nodes?limit=5", &admin, "s1", now) {
        forged = forged.header(k, if k == "x-fleet-forwarded-at" { i64::MIN.to_string() } else { v });
    }
    let r = forged.send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.text().await.unwrap().contains("not signed within 30 s of now"));
    // A signed read is answered once; the same headers again are a replay.
    let headers = signer.headers("GET", "/api/v1/nodes?limit=5", &admin, "s1", now);
    let again = || {
        let mut req = http.get(format!("{}/api/v1/nodes?limit=5", leader.proc.url)).header("x-fleet-forwarded", "s1");
        for (k, v) in &headers {
            req = req.header(*k, v);
        }
        req
    };
    assert_eq!(again().send().await.unwrap().status(), 200);
    let r = again().send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.text().await.unwrap().contains("already answered once (a replay)"));
    // A signed read cannot carry a body its signature does not cover.
    let mut with_body = http.get(format!("{}/api/v1/nodes?limit=5", leader.proc.url)).header("x-fleet-forwarded", "s1");
    for (k, v) in signer.headers("GET", "/api/v1/nodes?limit=5", &admin, "s1", now) {
        with_body = with_body.header(k, v);
    }
    let r = with_body.body("{}").send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.text().await.unwrap().contains("carries a body"));

    // No secret on PostgreSQL: the controller does not start, and says which variable.
    let mut env = env_for(&dk, &dir.path().join("nosecret"), free_port(), free_port());
    env.insert("FLEET_DATABASE_URL".into(), db.clone());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleet-controller"))
        .arg("serve")
        .env_clear()
        .envs(&env)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("FLEET_REPLICA_SECRET is required with a PostgreSQL FLEET_DATABASE_URL"), "{err}");
}

/// The takeover time with the shipped lease (15 s), over 20 kills of the leader
/// (`FLEET_TAKEOVER_KILLS`): from the
/// `SIGKILL` to another replica leading, to its first completed pass, and to an agent put in
/// the CP at the kill (waiting: nobody leads) placed with its PAT in a node's desired state.
/// Run: `cargo test -p fleet-controller --test ha -- --ignored --nocapture` (docs/performance.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement of a minute or two (docs/performance.md, \"Takeover\")"]
async fn takeover_time_over_ten_kills() {
    let Some(pg) = fleet_devkit::postgres::shared_or_skip("the HA tests") else { return };
    let db = pg.database().unwrap();
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let _logs = LogsOnFailure(dir.path().to_path_buf());
    let mut replicas = Vec::new();
    for name in ["t0", "t1", "t2"] {
        replicas.push(Replica::spawn_with_lease(&dk, dir.path(), &db, name, None).await);
    }
    let token = dk.mint("fleet", &["fleet:admin"], 3600);
    let first = the_leader(&replicas.iter().collect::<Vec<_>>(), 30).await;
    let via = replicas.iter().find(|r| r.name != first).unwrap().proc.url.clone();
    let mut n = TestNode::new(
        &via,
        "n1",
        json!({"labels": [], "executorKinds": ["k"], "capacity": {"slots": 20}, "secrets": []}),
    );
    n.join(&Admin::new(&via, token.clone()).join_key().await).await;
    let reporting = keep_reporting(vec![n.clone()]);
    let (mut lead, mut pass, mut placed) = (Vec::new(), Vec::new(), Vec::new());
    let kills: usize = std::env::var("FLEET_TAKEOVER_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    for kill in 0..kills {
        let leader = the_leader(&replicas.iter().collect::<Vec<_>>(), 60).await;
        let mut passes_before = HashMap::new();
        for r in &replicas {
            passes_before.insert(r.name.clone(), r.metric("fleet_passes_total").await.unwrap_or(0));
        }
        let i = replicas.iter().position(|r| r.name == leader).unwrap();
        replicas[i].proc.kill9();
        let t0 = std::time::Instant::now();
        let key = format!("waiting-{kill}");
        dk.put_agent(agent(&key, "k", 1));
        let rest: Vec<&Replica> = replicas.iter().filter(|r| r.name != leader).collect();
        let new = the_leader(&rest, 60).await;
        lead.push(t0.elapsed());
        let new = rest.iter().find(|r| r.name == new).unwrap();
        eventually(60, "the new leader's first pass", || async {
            (new.metric("fleet_passes_total").await? > passes_before[&new.name]).then_some(())
        })
        .await;
        pass.push(t0.elapsed());
        let polled = TestNode { url: new.proc.url.clone(), ..n.clone() };
        eventually(60, "the waiting agent placed with its PAT", || async {
            let (_, d) = polled.desired(None, 0).await;
            polled.open_pat(&d, &key).map(|_| ())
        })
        .await;
        placed.push(t0.elapsed());
        eprintln!(
            "kill {kill}: leading {:?}, first pass {:?}, agent placed {:?}",
            lead[kill], pass[kill], placed[kill]
        );
        let (env, log) = (replicas[i].proc.env.clone(), replicas[i].proc.log.clone());
        replicas[i].proc = ControllerProcess::spawn(env, log).await;
    }
    reporting.abort();
    let stat = |v: &mut Vec<Duration>| {
        v.sort();
        let p99 = v[((v.len() * 99).div_ceil(100)).saturating_sub(1)];
        (v[v.len() / 2], p99, v[v.len() - 1])
    };
    let (l, p, a) = (stat(&mut lead), stat(&mut pass), stat(&mut placed));
    eprintln!(
        "takeover over {kills} kills (p50 / p99 / max): leading {:?} / {:?} / {:?}; first pass {:?} / {:?} / {:?}; \
         agent placed {:?} / {:?} / {:?}",
        l.0, l.1, l.2, p.0, p.1, p.2, a.0, a.1, a.2
    );
    assert!(a.2 < Duration::from_secs(60), "every takeover placed the waiting agent within a minute");
}

/// docs/behaviour.md#rolling-out-a-change on PostgreSQL: a rollout in progress survives a
/// change of leader — orders taken by followers are applied by the leader; after the leader's
/// `SIGKILL` the new one resumes where the rollout stood, holds the budget, and no node is
/// stepped twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_survives_a_change_of_leader() {
    use support::sim::SimNode;
    let Some(pg) = fleet_devkit::postgres::shared_or_skip("the HA tests") else { return };
    let db = pg.database().unwrap();
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let _logs = LogsOnFailure(dir.path().to_path_buf());
    let mut replicas = Vec::new();
    for name in ["r0", "r1", "r2"] {
        replicas.push(Replica::spawn(&dk, dir.path(), &db, name).await);
    }
    let first = the_leader(&replicas.iter().collect::<Vec<_>>(), 20).await;
    let followers: Vec<String> = replicas.iter().filter(|r| r.name != first).map(|r| r.proc.url.clone()).collect();
    let token = dk.mint("fleet", &["fleet:admin"], 3600);
    let (a1, a2) = (Admin::new(&followers[0], token.clone()), Admin::new(&followers[1], token.clone()));
    let bad: Arc<parking_lot::Mutex<std::collections::HashSet<String>>> = Default::default();
    let announce = json!({"executorKinds": ["k"], "executorImages": {"k": ["agent:*"]}, "capacity": {"slots": 1}});
    let mut sims = Vec::new();
    for i in 0..4 {
        // Each node talks to one follower: the one that survives the leader's kill either way.
        let url = &followers[i % 2];
        let mut n = TestNode::new(url, &format!("n-{i}"), announce.clone());
        n.join(&Admin::new(url, token.clone()).join_key().await).await;
        sims.push(SimNode::start(n, bad.clone()));
    }
    let mut a = agent("coder", "k", 4);
    a["executor"]["image"] = json!("agent:1");
    a["placement"]["rollout"] = json!({"maxUnavailable": 1, "minReadySeconds": 2});
    dk.put_agent(a);
    let images = |sims: &[SimNode]| {
        let mut v: Vec<String> = sims.iter().flat_map(SimNode::images).collect();
        v.sort();
        v
    };
    let view = |admin: &Admin| {
        let admin = admin.clone();
        async move {
            let (s, v) = admin.get("/api/v1/agents/coder/rollout").await;
            (s == 200).then_some(v)
        }
    };
    eventually(60, "four replicas running agent:1, known to the leader", || async {
        let v = view(&a1).await?;
        (images(&sims) == vec!["agent:1"; 4] && v["readyReplicas"] == 4).then_some(())
    })
    .await;

    dk.edit_agent("coder", |a| a["executor"]["image"] = json!("agent:2"));
    eventually(60, "two replicas updated", || async {
        let v = view(&a1).await?;
        (v["target"]["image"] == "agent:2" && v["updatedReplicas"].as_u64() >= Some(2)).then_some(())
    })
    .await;
    // An order taken by a follower, applied by the leader.
    let (s, v) = a1.post("/api/v1/agents/coder/rollout:pause", json!({})).await;
    assert_eq!((s.as_u16(), v["state"].as_str()), (200, Some("paused")), "{v}");
    // The live view (a follower forwards reads to the leader), once no step is under way.
    let updated = eventually(30, "the paused rollout's steps ready", || async {
        let v = view(&a1).await?;
        (v["state"] == "paused" && v["readyReplicas"] == 4).then(|| v["updatedReplicas"].as_u64()).flatten()
    })
    .await;
    let leader = replicas.iter_mut().find(|r| r.name == first).unwrap();
    leader.proc.kill9();
    let rest: Vec<&Replica> = replicas.iter().filter(|r| r.name != first).collect();
    let second = the_leader(&rest, 30).await;
    assert_ne!(second, first);
    let v = eventually(30, "the new leader's view of the rollout", || async {
        view(&a2).await.filter(|v| v["state"] == "paused")
    })
    .await;
    assert_eq!(v["updatedReplicas"].as_u64(), Some(updated), "the steps taken stand: {v}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(images(&sims).iter().filter(|i| *i == "agent:2").count() as u64, updated, "paused: no step");

    let (s, v) = a2.post("/api/v1/agents/coder/rollout:resume", json!({})).await;
    assert_eq!((s.as_u16(), v["state"].as_str()), (200, Some("progressing")), "{v}");
    let until = std::time::Instant::now() + Duration::from_secs(90);
    let mut worst = 0;
    loop {
        worst = worst.max(sims.iter().map(SimNode::down).sum::<usize>());
        if view(&a2).await.is_some_and(|v| v["state"] == "complete" && v["target"]["image"] == "agent:2") {
            break;
        }
        assert!(std::time::Instant::now() < until, "the rollout did not complete under the new leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(worst <= 1, "{worst} replicas down at once across the change of leader");
    assert_eq!(images(&sims), vec!["agent:2"; 4]);
    let stepped = eventually(15, "every step in the history", || async {
        let (_, v) = a2.get("/api/v1/events?agent=coder").await;
        let mut nodes: Vec<String> = v["items"]
            .as_array()?
            .iter()
            .filter(|e| e["kind"] == "rollout_step")
            .filter_map(|e| e["node"].as_str().map(str::to_string))
            .collect();
        nodes.sort();
        (nodes.len() >= 4).then_some(nodes)
    })
    .await;
    assert_eq!(stepped, ["n-0", "n-1", "n-2", "n-3"], "each node stepped once, across the change of leader");
}
