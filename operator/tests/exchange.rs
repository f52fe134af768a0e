//! The exchange (docs/behaviour.md#desired-state-and-observed-report): one request that carries the observed report and is held like
//! the long-poll, so a node keeps one connection; and the node routes' own HTTP/1.1 path
//! (`http::node::raw`) on raw sockets: keep-alive, HTTP/1.0, pipelining, the limits of docs/behaviour.md#hardening,
//! a closed connection giving its hold back, and the hand-over of other requests to hyper.

mod support;

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One answer read off a raw socket: status, head, body.
struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// Reads exactly one answer (framed by `content-length`) from `sock`, leaving what follows.
async fn read_answer(sock: &mut TcpStream, pending: &mut Vec<u8>) -> Option<Answer> {
    let mut tmp = [0u8; 4096];
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).to_string();
            let len = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
                .unwrap_or(0usize);
            while pending.len() < end + 4 + len {
                let n = tokio::time::timeout(Duration::from_secs(30), sock.read(&mut tmp)).await.ok()?.ok()?;
                if n == 0 {
                    return None;
                }
                pending.extend_from_slice(&tmp[..n]);
            }
            let body = pending[end + 4..end + 4 + len].to_vec();
            pending.drain(..end + 4 + len);
            let status = head.split_whitespace().nth(1)?.parse().ok()?;
            return Some(Answer { status, head, body });
        }
        let n = tokio::time::timeout(Duration::from_secs(30), sock.read(&mut tmp)).await.ok()?.ok()?;
        if n == 0 {
            return None;
        }
        pending.extend_from_slice(&tmp[..n]);
    }
}

fn exchange_request(token: &str, query: &str, body: &[u8]) -> Vec<u8> {
    let head = format!(
        "POST /api/v1/nodes/me/exchange?{query} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    [head.into_bytes(), body.to_vec()].concat()
}

/// Whether the peer closed `sock` (EOF) within `secs`.
async fn closed_within(sock: &mut TcpStream, secs: u64) -> bool {
    let mut tmp = [0u8; 256];
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match tokio::time::timeout_at(deadline.into(), sock.read(&mut tmp)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

struct Setup {
    _dk: fleet_devkit::Devkit,
    _dir: tempfile::TempDir,
    running: fleet_controller::server::Running,
    admin: Admin,
    node: TestNode,
}

async fn setup(name: &str) -> Setup {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:admin"], 3600));
    let mut node = TestNode::new(&url, name, json!({"executorKinds": ["claude-code"], "capacity": {"slots": 4}}));
    node.join(&admin.join_key().await).await;
    Setup { _dk: dk, _dir: dir, running, admin, node }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exchange_reports_and_waits_for_the_desired_state_in_one_request() {
    let s = setup("x1").await;
    let (dk, n, admin) = (&s._dk, &s.node, &s.admin);

    // No `since`: the desired state at once, the report taken, the exchange offered.
    let mut report = n.report_body(&[]);
    report["labels"] = json!(["via-exchange"]);
    let (st, desired, offered) = n.exchange(None, 30, &report).await;
    assert_eq!(st, 200, "{desired}");
    assert!(offered, "every node-route answer offers the exchange");
    let g = desired["generation"].as_u64().unwrap();
    let (_, view) = admin.get(&format!("/api/v1/nodes/{}", n.id)).await;
    assert_eq!(view["labels"], json!(["via-exchange"]), "the report in the exchange was taken");

    // The generation it has: held until `wait` runs out, then 304 — and the report counts.
    let t = Instant::now();
    let (st, _, offered) = n.exchange(Some(g), 1, &n.report_body(&[])).await;
    assert_eq!(st, 304);
    assert!(offered);
    assert!(t.elapsed() >= Duration::from_millis(900), "held until wait ran out");

    // A held exchange answers as soon as the node's desired state changes.
    let held = {
        let (n, body) = (n.clone(), n.report_body(&[]));
        tokio::spawn(async move { n.exchange(Some(g), 30, &body).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    dk.put_agent(agent("ex-a", "claude-code", 2));
    let (st, desired, _) = held.await.unwrap();
    assert_eq!(st, 200);
    assert!(t.elapsed() < Duration::from_secs(25), "woken by the change, not by the wait");
    assert_eq!(desired["agents"][0]["agentKey"], "ex-a", "{desired}");
    assert_eq!(desired["agents"][0]["replicaIndexes"], json!([0, 1]));
    let g2 = desired["generation"].as_u64().unwrap();
    assert!(g2 > g);

    // The replicas reported running through the exchange reach the CP.
    let (st, _, _) =
        n.exchange(Some(g2), 0, &n.report_body(&[("ex-a", 0, "running", 1), ("ex-a", 1, "running", 1)])).await;
    assert_eq!(st, 304, "wait 0 answers at once");
    eventually(20, "ex-a running in the CP", || async {
        dk.status("ex-a").filter(|v| v["phase"] == "running" && v["readyReplicas"] == 2)
    })
    .await;

    // Refused reports: 400 naming the field, nothing held; 401 for a stranger; 400 for wait.
    let mut bad = n.report_body(&[]);
    bad["cpuTemperature"] = json!(70);
    let t = Instant::now();
    let (st, e, _) = n.exchange(Some(g2), 30, &bad).await;
    assert_eq!((st.as_u16(), e["error"].as_str()), (400, Some("invalid_request")));
    assert!(e["message"].as_str().unwrap().contains("cpuTemperature"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "a refused report holds nothing");
    let (st, e, _) = n.exchange(Some(g2), 61, &n.report_body(&[])).await;
    assert_eq!((st.as_u16(), e["error"].as_str()), (400, Some("invalid_request")));
    assert!(e["message"].as_str().unwrap().starts_with("wait:"), "{e}");
    let mut stranger = n.clone();
    stranger.token = "fnt_unknown".into();
    let (st, e, _) = stranger.exchange(None, 0, &n.report_body(&[])).await;
    assert_eq!((st.as_u16(), e["error"].as_str()), (401, Some("node_unknown")));
    // The old routes keep working beside it, and offer the exchange too.
    let r = n.http.get(format!("{}/api/v1/nodes/me/desired", n.url)).bearer_auth(&n.token).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["fleet-node-exchange"], "/api/v1/nodes/me/exchange");
    assert_eq!(n.report(&[]).await, 204);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_connections_keep_alive_and_hold_the_limits_of_the_api() {
    let s = setup("x2").await;
    let (n, addr) = (&s.node, s.running.addr);
    let report = serde_json::to_vec(&n.report_body(&[])).unwrap();

    // Keep-alive: exchanges one after another on one connection, then a request of another
    // route on the same connection (served by hyper from there on).
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let mut pending = Vec::new();
    sock.write_all(&exchange_request(&n.token, "wait=0", &report)).await.unwrap();
    let a = read_answer(&mut sock, &mut pending).await.expect("first answer");
    assert_eq!(a.status, 200, "{}", a.head);
    assert!(a.head.contains("fleet-node-exchange: /api/v1/nodes/me/exchange"), "{}", a.head);
    let g = a.json()["generation"].as_u64().unwrap();
    let report2 = serde_json::to_vec(&n.report_body(&[])).unwrap();
    sock.write_all(&exchange_request(&n.token, &format!("since={g}&wait=1"), &report2)).await.unwrap();
    let a = read_answer(&mut sock, &mut pending).await.expect("second answer on the same connection");
    assert_eq!(a.status, 304, "{}", a.head);
    // Two requests written at once (pipelined) are answered in order.
    let (r3, r4) = (n.report_body(&[]), n.report_body(&[]));
    let both = [
        exchange_request(&n.token, &format!("since={g}&wait=0"), &serde_json::to_vec(&r3).unwrap()),
        format!("GET /api/v1/nodes/me/desired?since={g} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n", n.token)
            .into_bytes(),
        format!(
            "PUT /api/v1/nodes/me/observed HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\n\r\n",
            n.token,
            serde_json::to_vec(&r4).unwrap().len()
        )
        .into_bytes(),
        serde_json::to_vec(&r4).unwrap(),
    ]
    .concat();
    sock.write_all(&both).await.unwrap();
    for want in [304, 304, 204] {
        let a = read_answer(&mut sock, &mut pending).await.expect("pipelined answer");
        assert_eq!(a.status, want, "{}", a.head);
    }
    sock.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let a = read_answer(&mut sock, &mut pending).await.expect("healthz on the same connection");
    assert_eq!((a.status, a.json()), (200, json!({"status": "ok"})));

    // HTTP/1.0, or `Connection: close`: answered, then closed.
    for req in [
        format!("GET /api/v1/nodes/me/desired HTTP/1.0\r\nAuthorization: Bearer {}\r\n\r\n", n.token),
        format!(
            "GET /api/v1/nodes/me/desired HTTP/1.1\r\nConnection: close\r\nAuthorization: Bearer {}\r\n\r\n",
            n.token
        ),
    ] {
        let mut sock = TcpStream::connect(addr).await.unwrap();
        sock.write_all(req.as_bytes()).await.unwrap();
        let a = read_answer(&mut sock, &mut Vec::new()).await.expect("answer");
        assert_eq!(a.status, 200);
        assert!(a.head.contains("connection: close"), "{}", a.head);
        assert!(closed_within(&mut sock, 5).await, "closed after the answer");
    }

    // The limits of docs/behaviour.md#hardening on this path: 401 before 413, a head over 64 KiB, a body over
    // 1 MiB, a trickled body (408 after 10 s).
    let mut sock = TcpStream::connect(addr).await.unwrap();
    sock.write_all(&exchange_request("fnt_unknown", "wait=0", &report)).await.unwrap();
    let a = read_answer(&mut sock, &mut Vec::new()).await.unwrap();
    assert_eq!((a.status, a.json()["error"].clone()), (401, json!("node_unknown")));
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let long = format!("GET /api/v1/nodes/me/desired HTTP/1.1\r\nX-Pad: {}\r\n", "p".repeat(70 * 1024));
    let _ = sock.write_all(long.as_bytes()).await;
    let a = read_answer(&mut sock, &mut Vec::new()).await.unwrap();
    assert_eq!(a.status, 431);
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /api/v1/nodes/me/exchange HTTP/1.1\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\n\r\n",
        n.token,
        2 << 20
    );
    sock.write_all(head.as_bytes()).await.unwrap();
    let a = read_answer(&mut sock, &mut Vec::new()).await.unwrap();
    assert_eq!((a.status, a.json()["error"].clone()), (413, json!("payload_too_large")));
    assert!(closed_within(&mut sock, 5).await, "the unread body ends the connection");
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "PUT /api/v1/nodes/me/observed HTTP/1.1\r\nAuthorization: Bearer {}\r\nContent-Length: 500\r\n\r\n{{",
        n.token
    );
    sock.write_all(head.as_bytes()).await.unwrap();
    let t = Instant::now();
    let a = read_answer(&mut sock, &mut Vec::new()).await.unwrap();
    assert_eq!((a.status, a.json()["error"].clone()), (408, json!("request_timeout")));
    assert!(t.elapsed() >= Duration::from_secs(9), "the body had 10 s");

    // Chunked bodies are hyper's to read: the same route answers the same.
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let body = serde_json::to_vec(&n.report_body(&[])).unwrap();
    let req = [
        format!(
            "PUT /api/v1/nodes/me/observed HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
            n.token,
            body.len()
        )
        .into_bytes(),
        body,
        b"\r\n0\r\n\r\n".to_vec(),
    ]
    .concat();
    sock.write_all(&req).await.unwrap();
    let a = read_answer(&mut sock, &mut Vec::new()).await.unwrap();
    assert_eq!(a.status, 204, "{}", a.head);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_connection_gives_its_held_exchange_back() {
    let s = setup("x3").await;
    let (n, addr) = (&s.node, s.running.addr);
    let g = n.generation().await;
    // Four held exchanges (the most one node may hold) on raw connections, then closed.
    let mut socks = Vec::new();
    for _ in 0..4 {
        let mut sock = TcpStream::connect(addr).await.unwrap();
        let body = serde_json::to_vec(&n.report_body(&[])).unwrap();
        sock.write_all(&exchange_request(&n.token, &format!("since={g}&wait=60"), &body)).await.unwrap();
        socks.push(sock);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (st, e, _) = n.exchange(Some(g), 1, &n.report_body(&[])).await;
    assert_eq!((st.as_u16(), e["error"].as_str()), (429, Some("too_many_requests")), "four are held");
    drop(socks);
    // The controller sees the peers go and ends their holds; a new one is held again.
    eventually(10, "a hold accepted again", || async {
        let (st, _, _) = n.exchange(Some(g), 1, &n.report_body(&[])).await;
        (st == 304).then_some(())
    })
    .await;
}
