//! What a client without credentials can do to the controller's memory and sockets, bounded
//! (docs/behaviour.md#hardening): at most `FLEET_MAX_CONNECTIONS` connections (the rest closed at accept and
//! counted), a request head of at most 64 KiB (`431`), a body that must arrive within 10 s of
//! its head (`408 request_timeout`), and a join body of at most 64 KiB (`413`).

mod support;

use std::time::{Duration, Instant};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn answer(s: &mut TcpStream, limit: Duration) -> String {
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(limit, s.read_to_end(&mut buf)).await;
    String::from_utf8_lossy(&buf).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_are_closed_at_accept_and_counted() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = in_process_config(&dk, dir.path());
    cfg.max_connections = 16;
    let running = fleet_controller::server::start(cfg).await.unwrap();
    let addr = running.addr;
    let mut idle = Vec::new();
    for _ in 0..16 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut extra = TcpStream::connect(addr).await.unwrap();
    let _ = extra.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let got = answer(&mut extra, Duration::from_secs(5)).await;
    assert!(got.is_empty(), "closed without an answer: {got}");
    let m = reqwest::get(format!("http://{}/metrics", running.metrics_addr)).await.unwrap().text().await.unwrap();
    let refused = m.lines().find(|l| l.starts_with("fleet_connections_refused_total ")).unwrap_or_default();
    assert!(refused.rsplit(' ').next().unwrap_or("0").parse::<u64>().unwrap_or(0) >= 1, "{refused}");
    drop(idle);
    // Room again once they are gone.
    let url = format!("http://{addr}/healthz");
    eventually(5, "served again", || async { reqwest::get(&url).await.ok().filter(|r| r.status() == 200) }).await;
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_over_64_kib_trickled_bodies_and_large_joins_are_refused() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let addr = running.addr;

    // A head over 64 KiB.
    let mut big = TcpStream::connect(addr).await.unwrap();
    let head = format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n", "a".repeat(70 * 1024));
    let _ = big.write_all(head.as_bytes()).await;
    let got = answer(&mut big, Duration::from_secs(5)).await;
    assert!(got.starts_with("HTTP/1.1 431"), "{}", got.lines().next().unwrap_or(""));

    // A join body over 64 KiB (reports may be larger: a join announces, nothing more).
    let mut body = serde_json::json!({"joinKey": "fjk_x", "name": "n", "publicKey": "", "labels": [],
        "executorKinds": [], "capacity": {"slots": 1}, "secrets": [], "version": "1"});
    body["pad"] = serde_json::json!("x".repeat(65 * 1024));
    let r = reqwest::Client::new().post(format!("http://{addr}/api/v1/nodes:join")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 413);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        (v["error"].as_str(), v["message"].as_str()),
        (Some("payload_too_large"), Some("the body is larger than 64 KiB"))
    );

    // A body trickled a byte a second: 408 once 10 s have passed since the head.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"POST /api/v1/nodes:join HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{")
        .await
        .unwrap();
    let started = Instant::now();
    let (mut rd, mut wr) = slow.into_split();
    let trickle = tokio::spawn(async move {
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if wr.write_all(b" ").await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(20), rd.read(&mut buf)).await.unwrap().unwrap();
    let got = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("request_timeout"), "{got}");
    assert!(started.elapsed() >= Duration::from_secs(9), "not before the deadline: {:?}", started.elapsed());
    trickle.abort();
    running.shutdown().await;
}

/// With several replicas (PostgreSQL) an unknown node token is looked up in the database; a
/// token refused there is answered for 10 s without asking again (docs/behaviour.md#hardening).
/// Counted by PostgreSQL itself: the scans of the nodes table (nothing else reads it while no
/// node is joined and no admin asks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_node_token_costs_one_database_query() {
    let Some(pg) = fleet_devkit::postgres::shared_or_skip("the refused-token test") else { return };
    let url = pg.database().unwrap();
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = in_process_config(&dk, dir.path());
    cfg.store.database_url = url.clone();
    let running = fleet_controller::server::start(cfg).await.unwrap();
    let base = format!("http://{}", running.addr);
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    // A backend publishes its counters at most once a second, and an idle one after 10 s.
    let scans = || async {
        tokio::time::sleep(Duration::from_secs(11)).await;
        let (n,): (i64,) = sqlx::query_as(
            "SELECT (COALESCE(seq_scan, 0) + COALESCE(idx_scan, 0))::BIGINT FROM pg_stat_user_tables WHERE relname = 'nodes'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        n
    };
    let http = reqwest::Client::new();
    let ask = |token: String| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let r = http.get(format!("{base}/api/v1/nodes/me/desired?wait=0")).bearer_auth(token).send().await.unwrap();
            r.status().as_u16()
        }
    };
    let before = scans().await;
    for _ in 0..50 {
        assert_eq!(ask("not-a-node-token".into()).await, 401);
    }
    let after = scans().await;
    assert_eq!(after - before, 1, "fifty refusals of one token, one query");
    let before = after;
    let distinct: Vec<String> = (0..8).map(|i| format!("stranger-{i}")).collect();
    for _ in 0..3 {
        for t in &distinct {
            assert_eq!(ask(t.clone()).await, 401);
        }
    }
    assert_eq!(scans().await - before, 8, "each distinct token asked once");
    running.shutdown().await;
}
