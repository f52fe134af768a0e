//! The node routes answer alike on both of their transports: the raw HTTP/1.1 path
//! (`http::node::raw`) and hyper with the axum router (`http::node::routes`). Every case of
//! the table sends the same request bytes over a real TCP socket to each and compares what
//! comes back: the status, the error code and message (the whole body), the content type and
//! the exchange offer.
//!
//! How each transport is reached, with no switch of its own for the test:
//! - **raw**: a fresh connection. Every connection starts on the raw path, which serves a
//!   node route whose body has a `content-length`.
//! - **axum**: a connection that asks for `GET /healthz` first. The raw path does not serve
//!   that route and hands the connection to hyper for the rest of its life (as it does for a
//!   node whose connection first asked for anything else), so the case's bytes that follow on
//!   it are read by hyper and answered by the router. The same bytes, the production path.
//!
//! That the right path answered is checked, not assumed: hyper stamps every answer with
//! `date`, the raw path never does. Framing is not compared: `date`, `content-length` on an
//! empty answer, and `connection: close` (the raw path says it when it will close; hyper may
//! close without saying). One answer is hyper's own and cannot be the router's: a request
//! head past 64 KiB, which hyper refuses before any route runs (`431` without a body, where
//! the raw path writes the JSON error); the table pins that difference.

mod support;

use fleet_devkit::Devkit;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Raw,
    Axum,
}

/// One answer read off a socket.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// Names in lower case.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// Reads exactly one answer (framed by `content-length`, none meaning empty) from `rd`,
/// leaving what follows in `pending`.
async fn read_answer(rd: &mut (impl AsyncRead + Unpin), pending: &mut Vec<u8>) -> Option<Answer> {
    let mut tmp = [0u8; 4096];
    let end = loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        let n = tokio::time::timeout(Duration::from_secs(45), rd.read(&mut tmp)).await.ok()?.ok()?;
        if n == 0 {
            return None;
        }
        pending.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&pending[..end]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let len = headers.iter().find(|(n, _)| n == "content-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    while pending.len() < end + 4 + len {
        let n = tokio::time::timeout(Duration::from_secs(45), rd.read(&mut tmp)).await.ok()?.ok()?;
        if n == 0 {
            return None;
        }
        pending.extend_from_slice(&tmp[..n]);
    }
    let body = pending[end + 4..end + 4 + len].to_vec();
    pending.drain(..end + 4 + len);
    Some(Answer { status, headers, body })
}

/// A request: head and, when given, a body with its `content-length`.
fn request(method: &str, target: &str, token: Option<&str>, body: Option<&[u8]>) -> Vec<u8> {
    let framing = body.map(|b| format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()));
    head_and(method, target, token, framing.as_deref().unwrap_or(""), body.unwrap_or_default())
}

/// A request whose head declares `len` bytes of body and is followed by `first` of them only.
fn declaring(method: &str, target: &str, token: Option<&str>, len: usize, first: &[u8]) -> Vec<u8> {
    let framing = format!("Content-Type: application/json\r\nContent-Length: {len}\r\n");
    head_and(method, target, token, &framing, first)
}

fn head_and(method: &str, target: &str, token: Option<&str>, framing: &str, body: &[u8]) -> Vec<u8> {
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    [format!("{method} {target} HTTP/1.1\r\nHost: fleet\r\n{auth}{framing}\r\n").into_bytes(), body.to_vec()].concat()
}

fn json_bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

/// How a case is sent on the two transports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    /// Both at once.
    Together,
    /// The raw one first, then the axum one (a join that creates what the second finds).
    RawFirst,
    /// Both at once, then a byte of body a second, never all of it.
    Trickle,
    /// Both at once; while both are held, an agent is placed on the node.
    Bump,
}

/// What the two bodies have in common.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Same {
    /// The same bytes.
    Body,
    /// A join's answer: the same node, each with its own new token.
    Node,
    /// Only the raw path's: hyper answers this one itself, without a body.
    RawOnly,
}

/// Which controller a case asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum To {
    Configured,
    /// One without a service account: everything is `503 not_configured`.
    Bare,
}

struct Case {
    name: &'static str,
    to: To,
    request: Vec<u8>,
    run: Run,
    status: u16,
    /// The error code; `""` for a success.
    code: &'static str,
    /// What the raw answer's body says, in part (an error's message, a reply's content).
    says: &'static str,
    same: Same,
}

fn case(name: &'static str, request: Vec<u8>, status: u16, code: &'static str) -> Case {
    Case { name, to: To::Configured, request, run: Run::Together, status, code, says: "", same: Same::Body }
}

impl Case {
    fn says(mut self, text: &'static str) -> Case {
        self.says = text;
        self
    }
    fn run(mut self, run: Run) -> Case {
        self.run = run;
        self
    }
    fn same(mut self, same: Same) -> Case {
        self.same = same;
        self
    }
    fn to(mut self, to: To) -> Case {
        self.to = to;
        self
    }
}

/// A connection on `transport`: fresh for the raw path, handed to hyper by a `/healthz`
/// first for axum.
async fn connect(addr: SocketAddr, transport: Transport) -> (TcpStream, Vec<u8>) {
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let mut pending = Vec::new();
    if transport == Transport::Axum {
        sock.write_all(b"GET /healthz HTTP/1.1\r\nHost: fleet\r\n\r\n").await.unwrap();
        let a = read_answer(&mut sock, &mut pending).await.expect("healthz");
        assert_eq!(a.status, 200, "healthz before the case");
        assert!(a.header("date").is_some(), "healthz is hyper's");
    }
    (sock, pending)
}

/// Sends `c` on `transport` and reads its answer.
async fn send(addr: SocketAddr, transport: Transport, c: &Case) -> Answer {
    let (sock, mut pending) = connect(addr, transport).await;
    let (mut rd, mut wr) = sock.into_split();
    // A refused head or body may be answered (and the connection closed) before it is sent
    // whole: what counts is the answer.
    let _ = wr.write_all(&c.request).await;
    // The write half stays open until the answer is read: hyper takes a client's half-close
    // for its leaving and drops the answer.
    let (trickle, _open) = match c.run {
        Run::Trickle => (Some(tokio::spawn(trickle(wr))), None),
        _ => (None, Some(wr)),
    };
    let a = read_answer(&mut rd, &mut pending).await;
    if let Some(t) = trickle {
        t.abort();
    }
    a.unwrap_or_else(|| panic!("{}: no answer on the {transport:?} path", c.name))
}

/// Writes a byte of body a second, never all of it.
async fn trickle(mut wr: tokio::net::tcp::OwnedWriteHalf) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if wr.write_all(b" ").await.is_err() {
            return;
        }
    }
}

/// The case on both transports: (raw, axum).
async fn both(addrs: (SocketAddr, SocketAddr), dk: &Devkit, c: &Case) -> (Answer, Answer) {
    let addr = if c.to == To::Configured { addrs.0 } else { addrs.1 };
    if c.run == Run::RawFirst {
        let raw = send(addr, Transport::Raw, c).await;
        return (raw, send(addr, Transport::Axum, c).await);
    }
    let bump = async {
        if c.run == Run::Bump {
            tokio::time::sleep(Duration::from_millis(500)).await;
            dk.put_agent(agent("eq-bump", "k-eq", 1));
        }
    };
    let (raw, axum, ()) = tokio::join!(send(addr, Transport::Raw, c), send(addr, Transport::Axum, c), bump);
    (raw, axum)
}

/// Both answers are the case's, and alike.
fn check(c: &Case, raw: &Answer, axum: &Answer) {
    let name = c.name;
    assert_eq!((raw.status, axum.status), (c.status, c.status), "{name}: status (raw, axum)");
    assert!(raw.header("date").is_none(), "{name}: the raw answer has a date, so hyper wrote it");
    assert!(axum.header("date").is_some(), "{name}: the axum answer has no date, so hyper did not write it");
    let code = raw.json()["error"].as_str().unwrap_or("").to_string();
    assert_eq!(code, c.code, "{name}: error code");
    let text = String::from_utf8_lossy(&raw.body);
    assert!(text.contains(c.says), "{name}: {text:?} does not say {:?}", c.says);
    match c.same {
        Same::Body => {
            assert_eq!(String::from_utf8_lossy(&raw.body), String::from_utf8_lossy(&axum.body), "{name}: body");
            for h in ["content-type", "fleet-node-exchange"] {
                assert_eq!(raw.header(h), axum.header(h), "{name}: {h}");
            }
        }
        Same::Node => {
            let (r, a) = (raw.json(), axum.json());
            assert!(r["nodeId"].is_string() && r["nodeId"] == a["nodeId"], "{name}: the same node: {r} {a}");
            assert!(r["nodeToken"].is_string() && r["nodeToken"] != a["nodeToken"], "{name}: a new token each");
            for h in ["content-type", "fleet-node-exchange"] {
                assert_eq!(raw.header(h), axum.header(h), "{name}: {h}");
            }
        }
        Same::RawOnly => {
            assert_eq!(raw.header("content-type"), Some("application/json"), "{name}");
            assert!(axum.body.is_empty() && axum.header("content-type").is_none(), "{name}: hyper's own answer");
        }
    }
}

/// What the cases need: nodes, keys and generations.
struct Fleet {
    /// The node a bump reaches (the only one of its executor kind), kept online.
    a: TestNode,
    ga: u64,
    /// Holds the most long-polls allowed while the table runs; its generation.
    b: TestNode,
    gb: u64,
    /// Reports; its generation.
    s: TestNode,
    gs: u64,
    /// Deleted.
    gone: TestNode,
    /// Joins with `key`, once per transport.
    joiner: TestNode,
    key: String,
    /// Left usable by the refused joins that carry it.
    spare: String,
    admin_token: String,
}

async fn fleet(dk: &Devkit, url: &str) -> Fleet {
    let admin = Admin::new(url, dk.mint("fleet", &["fleet:admin"], 3600));
    let kind = |k: &str| json!({"executorKinds": [k], "capacity": {"slots": 2}});
    let mut nodes = [("eq-a", "k-eq"), ("eq-b", "k-other"), ("eq-s", "k-other"), ("eq-gone", "k-other")]
        .map(|(name, k)| TestNode::new(url, name, kind(k)));
    for n in &mut nodes {
        n.join(&admin.join_key().await).await;
    }
    let [a, b, s, gone] = nodes;
    assert_eq!(admin.delete(&format!("/api/v1/nodes/{}", gone.id)).await.0, 204);
    let mut first = s.report_body(&[]);
    first["bootId"] = json!("eq-boot");
    first["seq"] = json!(10);
    assert_eq!(s.put_observed(&first).await, 204);
    let (ga, gb, gs) = (a.generation().await, b.generation().await, s.generation().await);
    let joiner = TestNode::new(url, "eq-join", kind("k-other"));
    Fleet {
        ga,
        gb,
        gs,
        a,
        b,
        s,
        gone,
        joiner,
        key: admin.join_key().await,
        spare: admin.join_key().await,
        admin_token: admin.token,
    }
}

/// The table, in the order it runs: the joins in the order they depend on each other, the
/// slow cases last (the held polls of node `b` last 60 s).
fn cases(f: &Fleet) -> Vec<Case> {
    let (desired, observed, exchange, join) =
        ("/api/v1/nodes/me/desired", "/api/v1/nodes/me/observed", "/api/v1/nodes/me/exchange", "/api/v1/nodes:join");
    let (a, s) = (Some(f.a.token.as_str()), Some(f.s.token.as_str()));
    let report = json_bytes(&f.s.report_body(&[]));
    let mut stale = f.s.report_body(&[]);
    (stale["bootId"], stale["seq"]) = (json!("eq-boot"), json!(9));
    let mut unknown_field = f.s.report_body(&[]);
    unknown_field["cpuTemperature"] = json!(70);
    let mut gpus = f.joiner.join_body(&f.spare);
    gpus["gpus"] = json!(1);
    let taken = TestNode::new("", "eq-a", json!({"capacity": {"slots": 1}})).join_body(&f.spare);
    let other = TestNode::new("", "eq-other", json!({"capacity": {"slots": 1}}));
    let q = |query: String| format!("{desired}?{query}");
    let unconfigured = |method, path, body: Option<&[u8]>| request(method, path, a, body);
    vec![
        case("not configured: desired", unconfigured("GET", desired, None), 503, "not_configured")
            .to(To::Bare)
            .says("FLEET_CLIENT_ID"),
        case("not configured: observed", unconfigured("PUT", observed, Some(&report)), 503, "not_configured")
            .to(To::Bare),
        case("not configured: exchange", unconfigured("POST", exchange, Some(&report)), 503, "not_configured")
            .to(To::Bare),
        case("not configured: join", request("POST", join, None, Some(b"{}")), 503, "not_configured").to(To::Bare),
        case("no token", request("GET", desired, None, None), 401, "node_token_invalid"),
        case("unknown token", request("PUT", observed, Some("fnt_unknown"), Some(&report)), 401, "node_unknown")
            .says("new join key"),
        case("an admin token", request("POST", exchange, Some(&f.admin_token), Some(&report)), 401, "node_unknown"),
        case("a deleted node's token", request("GET", desired, Some(&f.gone.token), None), 401, "node_token_invalid"),
        case("401 before 413", declaring("PUT", observed, None, 2 << 20, b""), 401, "node_token_invalid"),
        case("wait over 60", request("GET", &q("wait=61".into()), a, None), 400, "invalid_request").says("wait:"),
        case("since negative", request("GET", &q("since=-1".into()), a, None), 400, "invalid_request").says("since:"),
        case("since not a number", request("GET", &q("since=x".into()), a, None), 400, "invalid_request"),
        case(
            "bad wait before the body",
            declaring("POST", &format!("{exchange}?wait=99"), s, 2 << 20, b""),
            400,
            "invalid_request",
        ),
        case("bad JSON", request("PUT", observed, s, Some(b"{\"health\": ")), 400, "invalid_request")
            .says("invalid body"),
        case("not an object", request("PUT", observed, s, Some(b"[1]")), 400, "invalid_request").says("JSON object"),
        case("unknown field", request("PUT", observed, s, Some(&json_bytes(&unknown_field))), 400, "invalid_request")
            .says("cpuTemperature"),
        case(
            "a refused report holds nothing",
            request("POST", &format!("{exchange}?since={}&wait=30", f.gs), s, Some(&json_bytes(&unknown_field))),
            400,
            "invalid_request",
        ),
        case("report too large", declaring("PUT", observed, s, 2 << 20, b"{"), 413, "payload_too_large").says("1 MiB"),
        case("exchange too large", declaring("POST", exchange, s, (1 << 20) + 1, b""), 413, "payload_too_large"),
        case("join too large", declaring("POST", join, None, 65 * 1024, b"{"), 413, "payload_too_large").says("64 KiB"),
        case(
            "a fifth held poll",
            request("GET", &q(format!("since={}&wait=5", f.gb)), Some(&f.b.token), None),
            429,
            "too_many_requests",
        ),
        case("report taken", request("PUT", observed, s, Some(&report)), 204, ""),
        case("stale report", request("PUT", observed, s, Some(&json_bytes(&stale))), 204, ""),
        case(
            "exchange, since current",
            request("POST", &format!("{exchange}?since={}&wait=0", f.gs), s, Some(&report)),
            304,
            "",
        ),
        case("desired, no since", request("GET", desired, a, None), 200, ""),
        case("desired, since older", request("GET", &q(format!("since={}", f.ga - 1)), a, None), 200, ""),
        // A node ahead of the store is never served the older generation
        // (docs/behaviour.md#a-store-older-than-the-fleet).
        case("desired, since newer", request("GET", &q(format!("since={}", f.ga + 7)), a, None), 304, ""),
        case("desired, since current, wait 0", request("GET", &q(format!("since={}&wait=0", f.ga)), a, None), 304, ""),
        case(
            "join, bad key",
            request("POST", join, None, Some(&json_bytes(&f.joiner.join_body("fjk_nope")))),
            401,
            "join_key_invalid",
        ),
        case("join, name taken", request("POST", join, None, Some(&json_bytes(&taken))), 409, "node_name_taken"),
        case("join, unknown field", request("POST", join, None, Some(&json_bytes(&gpus))), 400, "invalid_request")
            .says("gpus"),
        case("join", request("POST", join, None, Some(&json_bytes(&f.joiner.join_body(&f.key)))), 201, "")
            .run(Run::RawFirst)
            .same(Same::Node)
            .says("nodeToken"),
        case(
            "join, used key",
            request("POST", join, None, Some(&json_bytes(&other.join_body(&f.key)))),
            401,
            "join_key_invalid",
        ),
        case("desired, since current, wait 1", request("GET", &q(format!("since={}&wait=1", f.ga)), a, None), 304, ""),
        case("report too slow", declaring("PUT", observed, s, 500, b"{"), 408, "request_timeout")
            .run(Run::Trickle)
            .says("10 s"),
        case("join too slow", declaring("POST", join, None, 500, b"{"), 408, "request_timeout").run(Run::Trickle),
        case("head too large", unfinished_head(desired), 431, "invalid_request").same(Same::RawOnly).says("64 KiB"),
        case(
            "held, answered by a new generation",
            request("GET", &q(format!("since={}&wait=30", f.ga)), a, None),
            200,
            "",
        )
        .run(Run::Bump)
        .says("\"agentKey\":\"eq-bump\""),
    ]
}

/// Exactly 64 KiB of a head that never ends: the raw path reads all of it (its buffer stops
/// there) before it answers, so no unread byte turns its close into a reset.
fn unfinished_head(path: &str) -> Vec<u8> {
    let start = format!("GET {path} HTTP/1.1\r\nHost: fleet\r\nX-Pad: ");
    [start.clone().into_bytes(), vec![b'p'; 64 * 1024 - start.len()]].concat()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_transports_answer_every_node_request_alike() {
    let dk = devkit().await;
    let (dir, bare_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let mut bare_cfg = in_process_config(&dk, bare_dir.path());
    bare_cfg.credentials = None;
    let bare = fleet_controller::server::start(bare_cfg).await.unwrap();
    let url = format!("http://{}", running.addr);
    let f = fleet(&dk, &url).await;
    let online = keep_reporting(vec![f.a.clone()]);
    // Node b holds the most long-polls allowed, on connections of its own.
    let mut holds = Vec::new();
    for _ in 0..4 {
        let mut sock = TcpStream::connect(running.addr).await.unwrap();
        let poll = request("GET", &format!("/api/v1/nodes/me/desired?since={}&wait=60", f.gb), Some(&f.b.token), None);
        sock.write_all(&poll).await.unwrap();
        holds.push(sock);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let table = cases(&f);
    for c in &table {
        let (raw, axum) = both((running.addr, bare.addr), &dk, c).await;
        check(c, &raw, &axum);
        eprintln!("{:<40} {} {:<20} alike", c.name, raw.status, c.code);
    }
    online.abort();
    drop(holds);
    running.shutdown().await;
    bare.shutdown().await;
}
