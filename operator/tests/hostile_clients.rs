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

/// A counter or gauge of the controller's metrics.
async fn metric(running: &fleet_controller::server::Running, name: &str) -> u64 {
    let m = reqwest::get(format!("http://{}/metrics", running.metrics_addr)).await.unwrap().text().await.unwrap();
    let line = m.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_default();
    line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) as u64
}

/// A connection from `local` (any address of 127.0.0.0/8: Linux answers them all on lo).
async fn connect_from(local: &str, addr: std::net::SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{local}:0").parse().unwrap()).unwrap();
    socket.connect(addr).await.unwrap()
}

/// Whether the controller closed `s` (EOF or a reset) within `limit`; bytes it sent first
/// are skipped.
async fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(limit, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// `n` connections, each sending `bytes` of a head that never ends.
async fn unfinished_heads(addr: std::net::SocketAddr, n: usize, bytes: usize) -> Vec<TcpStream> {
    let mut head = b"GET /api/v1/nodes HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
    head.resize(bytes, b'a');
    let mut all = Vec::new();
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&head).await.unwrap();
        all.push(s);
    }
    all
}

/// docs/behaviour.md#hardening: unfinished heads and join bodies come out of one budget; past
/// it the connection holding the most is closed and counted, while smaller heads and a node
/// keep being served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_unauthenticated_buffer_is_shed_while_smaller_heads_and_nodes_pass() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = in_process_config(&dk, dir.path());
    cfg.unauth_buffer_bytes = 1 << 20;
    let running = fleet_controller::server::start(cfg).await.unwrap();
    let (addr, url) = (running.addr, format!("http://{}", running.addr));
    // Eight heads of 63,000 bytes hold 64 KiB each: half the budget.
    let mut big = unfinished_heads(addr, 8, 63_000).await;
    eventually(10, "the big heads held", || async {
        (metric(&running, "fleet_unauth_buffer_bytes").await >= 8 * 64 * 1024).then_some(())
    })
    .await;
    // Twenty of 20,000 bytes hold 32 KiB each: together past the budget, so big ones go.
    let mut medium = unfinished_heads(addr, 20, 20_000).await;
    eventually(10, "two big heads shed", || async {
        (metric(&running, "fleet_unauth_connections_shed_total").await >= 2).then_some(())
    })
    .await;
    let mut big_closed = 0;
    for s in &mut big {
        big_closed += usize::from(closed_within(s, Duration::from_millis(500)).await);
    }
    assert!((2..=3).contains(&big_closed), "the largest were shed, only as many as needed: {big_closed}");
    for s in &mut medium {
        assert!(!closed_within(s, Duration::from_millis(100)).await, "a smaller head was shed");
    }
    assert!(metric(&running, "fleet_unauth_buffer_bytes").await <= 1 << 20);
    // A node's few hundred bytes of head pass meanwhile.
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:admin"], 3600));
    let mut node = TestNode::new(&url, "honest", serde_json::json!({"capacity": {"slots": 1}}));
    node.join(&admin.join_key().await).await;
    assert_eq!(node.desired(None, 0).await.0, 200);
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_join_bodies_come_out_of_the_same_budget() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = in_process_config(&dk, dir.path());
    cfg.unauth_buffer_bytes = 1 << 20;
    let running = fleet_controller::server::start(cfg).await.unwrap();
    let addr = running.addr;
    // Twenty join bodies of 64 KiB, all but the last byte sent: 1.25 MiB declared.
    let head = b"POST /api/v1/nodes:join HTTP/1.1\r\nHost: x\r\nContent-Length: 65536\r\n\r\n";
    let mut joins = Vec::new();
    for _ in 0..20 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(head).await.unwrap();
        s.write_all(&vec![b' '; 65535]).await.unwrap();
        joins.push(s);
    }
    eventually(10, "join bodies shed", || async {
        (metric(&running, "fleet_unauth_connections_shed_total").await >= 4).then_some(())
    })
    .await;
    assert!(metric(&running, "fleet_unauth_buffer_bytes").await <= 1 << 20);
    let mut closed = 0;
    for s in &mut joins {
        closed += usize::from(closed_within(s, Duration::from_millis(500)).await);
    }
    assert!(closed >= 4, "shed joins are closed: {closed}");
    running.shutdown().await;
}

/// The same budget holds a head on a connection hyper serves (the node path handed it over
/// with its first request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_on_connections_hyper_serves_come_out_of_the_same_budget() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = in_process_config(&dk, dir.path());
    cfg.unauth_buffer_bytes = 1 << 20;
    let running = fleet_controller::server::start(cfg).await.unwrap();
    let mut head = b"GET /api/v1/nodes HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
    head.resize(63_000, b'a');
    let mut conns = Vec::new();
    // 24 × 63,000 bytes: 16 fit in 1 MiB.
    for _ in 0..24 {
        let mut s = TcpStream::connect(running.addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut got = Vec::new();
        while !String::from_utf8_lossy(&got).contains("\"status\":\"ok\"") {
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before the health answer");
            got.extend_from_slice(&buf[..n]);
        }
        s.write_all(&head).await.unwrap();
        conns.push(s);
    }
    eventually(10, "heads shed on hyper's path", || async {
        (metric(&running, "fleet_unauth_connections_shed_total").await >= 4).then_some(())
    })
    .await;
    assert!(metric(&running, "fleet_unauth_buffer_bytes").await <= 1 << 20);
    let mut closed = 0;
    for s in &mut conns {
        closed += usize::from(closed_within(s, Duration::from_millis(500)).await);
    }
    assert!(closed >= 4, "shed connections are closed: {closed}");
    running.shutdown().await;
}

/// docs/behaviour.md#hardening: FLEET_MAX_CONNECTIONS_PER_IP, counted per client address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_per_address_cap_are_closed_at_accept_and_counted() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = in_process_config(&dk, dir.path());
    cfg.max_connections_per_ip = 4;
    let running = fleet_controller::server::start(cfg).await.unwrap();
    let addr = running.addr;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect_from("127.0.0.2", addr).await);
    }
    let mut extra = connect_from("127.0.0.2", addr).await;
    let _ = extra.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let got = answer(&mut extra, Duration::from_secs(5)).await;
    assert!(got.is_empty(), "closed without an answer: {got}");
    assert!(metric(&running, "fleet_connections_refused_per_ip_total").await >= 1);
    // Another address has its own share.
    let mut other = connect_from("127.0.0.3", addr).await;
    other.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    let got = answer(&mut other, Duration::from_secs(5)).await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    drop(held);
    running.shutdown().await;
}

/// Joins with a wrong key from `from` (a local address, and `X-Forwarded-For` when given), in
/// bursts of 25 at once so a loaded machine still sends more than the limit within a second,
/// until stopped and a `429` was seen (or a minute passed); the statuses seen.
fn failed_joins(
    url: String,
    from: &str,
    forwarded: Option<&'static str>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<Vec<u16>> {
    let http = reqwest::Client::builder().local_address(from.parse::<std::net::IpAddr>().ok()).build().unwrap();
    tokio::spawn(async move {
        let mut seen = Vec::new();
        let body =
            TestNode::new(&url, "stranger", serde_json::json!({"capacity": {"slots": 1}})).join_body("fjk_wrong");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let done = |seen: &Vec<u16>| stop.load(std::sync::atomic::Ordering::Relaxed) && seen.contains(&429);
        while !done(&seen) && std::time::Instant::now() < deadline {
            let burst = (0..25).map(|_| {
                let mut req = http.post(format!("{url}/api/v1/nodes:join")).json(&body);
                if let Some(f) = forwarded {
                    req = req.header("x-forwarded-for", f);
                }
                req.send()
            });
            for r in futures::future::join_all(burst).await.into_iter().flatten() {
                seen.push(r.status().as_u16());
            }
        }
        seen
    })
}

/// docs/behaviour.md#joining: the throttle on failed joins counts per client address — the
/// TCP peer, or behind a trusted proxy the address it forwards — so a stranger's flood does
/// not block a node joining from elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_s_failed_joins_do_not_block_a_real_join_from_another_address() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = in_process_config(&dk, dir.path());
    cfg.trusted_proxies = vec![fleet_controller::http::peers::Cidr::parse("127.0.0.1/32").unwrap()];
    let running = fleet_controller::server::start(cfg).await.unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:admin"], 3600));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Directly from 127.0.0.2 (its X-Forwarded-For is not believed: it is no trusted proxy),
    // and through the trusted proxy 127.0.0.1 from 10.9.9.9.
    let direct = failed_joins(url.clone(), "127.0.0.2", Some("10.1.1.1"), stop.clone());
    let proxied = failed_joins(url.clone(), "127.0.0.1", Some("10.9.9.9"), stop.clone());
    eventually(20, "the floods throttled", || async {
        (metric(&running, "fleet_joins_total{outcome=\"throttled\"}").await >= 2).then_some(())
    })
    .await;
    let key = admin.join_key().await;
    let from_another = reqwest::Client::builder().local_address("127.0.0.3".parse().ok()).build().unwrap();
    let mut node = TestNode::new(&url, "real", serde_json::json!({"capacity": {"slots": 1}}));
    node.http = from_another;
    let (s, v) = node.try_join(&key).await;
    assert_eq!(s, 201, "a real join from another address while both floods run: {v}");
    // Through the proxy, another forwarded client is another address.
    let key = admin.join_key().await;
    let behind = TestNode::new(&url, "behind-the-proxy", serde_json::json!({"capacity": {"slots": 1}}));
    let r = behind
        .http
        .post(format!("{url}/api/v1/nodes:join"))
        .header("x-forwarded-for", "10.2.2.2")
        .json(&behind.join_body(&key))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "a real join forwarded for another client: {:?}", r.text().await);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (direct, proxied) = (direct.await.unwrap(), proxied.await.unwrap());
    assert!(direct.contains(&429), "the direct flood is throttled by its own address: {direct:?}");
    assert!(proxied.contains(&429), "the proxied flood is throttled by its forwarded address: {proxied:?}");
    running.shutdown().await;
}

/// docs/behaviour.md#hardening: the third `401` on a connection closes it, on the node
/// routes' own path and on hyper's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_is_closed_after_its_third_failed_credential() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let addr = running.addr;
    let node = "GET /api/v1/nodes/me/desired HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n\r\n";
    let admin = "GET /api/v1/nodes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n\r\n";
    let healthz = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    // The first request of a connection decides its path: a node route stays on the node
    // path, anything else goes to hyper.
    for (path, first, wrong) in [("node path", node, node), ("hyper", healthz, admin)] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        // Pipelined: a fourth wrong credential and a health check would be answered too if
        // the connection stayed open.
        let all = format!("{first}{wrong}{wrong}{wrong}{healthz}");
        s.write_all(all.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let ended = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await.is_ok();
        let got = String::from_utf8_lossy(&got);
        assert!(ended, "{path}: the connection was closed");
        assert_eq!(got.matches("HTTP/1.1 401").count(), 3, "{path}: {got}");
        let healthy = usize::from(first == healthz);
        assert_eq!(got.matches("HTTP/1.1 200").count(), healthy, "{path}: nothing after the third: {got}");
    }
    running.shutdown().await;
}

/// docs/behaviour.md#hardening: `Content-Length` is digits only, on every route and both paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_length_of_anything_but_digits_is_refused() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let addr = running.addr;
    for value in ["+5", "5,5", "5 5", "0x5"] {
        // On hyper's path (after a first request it serves) hyper refuses them itself,
        // without a body.
        for (first, route) in [
            ("", "PUT /api/v1/nodes/me/observed"),
            ("", "POST /api/v1/join-keys"),
            ("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "POST /api/v1/join-keys"),
        ] {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let req = format!("{first}{route} HTTP/1.1\r\nHost: x\r\nContent-Length: {value}\r\n\r\n{{}}   ");
            s.write_all(req.as_bytes()).await.unwrap();
            let got = answer(&mut s, Duration::from_secs(5)).await;
            let last = got.rfind("HTTP/1.1 ").map(|i| &got[i..]).unwrap_or("");
            assert!(last.starts_with("HTTP/1.1 400"), "{value:?} on {route} after {first:?}: {got}");
            if first.is_empty() {
                assert!(last.contains("Content-Length must be digits only"), "{got}");
            }
        }
    }
    running.shutdown().await;
}
