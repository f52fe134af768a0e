//! Every status code of docs/reference.md#http-api and docs/behaviour.md#node-protocol, produced over real HTTP against an in-process
//! controller and devkit, with the precedence `503`, then `401`/`403`, then `413`/`400`.

mod support;

use serde_json::{json, Value};
use std::time::Duration;
use support::*;

async fn code_of(r: reqwest::Response) -> (u16, String, String) {
    let s = r.status().as_u16();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    (s, v["error"].as_str().unwrap_or("").to_string(), v["message"].as_str().unwrap_or("").to_string())
}

/// A POST over a raw socket that reads the answer even when the server answers before the
/// whole body is sent (as it does for bodies over the limit).
async fn raw(addr: std::net::SocketAddr, path: &str, token: Option<&str>, body: &[u8], chunked: bool) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let framing =
        if chunked { "Transfer-Encoding: chunked".to_string() } else { format!("Content-Length: {}", body.len()) };
    let head = format!("POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n{framing}\r\n\r\n");
    sock.write_all(head.as_bytes()).await.unwrap();
    let (mut rd, mut wr) = sock.into_split();
    let body = body.to_vec();
    let writer = tokio::spawn(async move {
        for chunk in body.chunks(64 * 1024) {
            let framed = if chunked {
                [format!("{:x}\r\n", chunk.len()).into_bytes(), chunk.to_vec(), b"\r\n".to_vec()].concat()
            } else {
                chunk.to_vec()
            };
            if wr.write_all(&framed).await.is_err() {
                return;
            }
        }
        let _ = wr.write_all(if chunked { b"0\r\n\r\n" } else { b"" }).await;
    });
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    while !String::from_utf8_lossy(&buf).contains("}") {
        match tokio::time::timeout(Duration::from_secs(10), rd.read(&mut tmp)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&tmp[..n]),
            _ => break,
        }
    }
    writer.abort();
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let json = text.split("\r\n\r\n").nth(1).unwrap_or("");
    let json = json.find('{').map(|i| &json[i..]).unwrap_or("");
    let json = json.rfind('}').map(|i| &json[..=i]).unwrap_or("");
    let v: Value = serde_json::from_str(json).unwrap_or(Value::Null);
    (status, v["error"].as_str().unwrap_or("").to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_status_code_of_the_api() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let http = reqwest::Client::new();
    let admin_token = dk.mint("fleet", &["fleet:admin"], 3600);
    let read_token = dk.mint("fleet", &["fleet:read"], 3600);
    let admin = Admin::new(&url, admin_token.clone());

    // 200 /healthz
    let r = http.get(format!("{url}/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"status": "ok"}));

    // join-keys: 401, 403, 400 naming the field, 413, 201
    let post_key = |token: Option<&str>, body: String| {
        let mut req =
            http.post(format!("{url}/api/v1/join-keys")).header("content-type", "application/json").body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send()
    };
    let (s, e, _) = code_of(post_key(None, "{}".into()).await.unwrap()).await;
    assert_eq!((s, e.as_str()), (401, "invalid_token"));
    let (s, e, _) = code_of(post_key(Some("not.a.jwt"), "{}".into()).await.unwrap()).await;
    assert_eq!((s, e.as_str()), (401, "invalid_token"));
    let (s, e, _) = code_of(post_key(Some(&read_token), "{}".into()).await.unwrap()).await;
    assert_eq!((s, e.as_str()), (403, "insufficient_scope"));
    let (s, e, m) = code_of(post_key(Some(&admin_token), r#"{"ttlSeconds": 10}"#.into()).await.unwrap()).await;
    assert_eq!((s, e.as_str()), (400, "invalid_request"));
    assert!(m.contains("ttlSeconds"), "{m}");
    let (s, _, m) = code_of(post_key(Some(&admin_token), r#"{"ttl": 100}"#.into()).await.unwrap()).await;
    assert_eq!(s, 400);
    assert!(m.contains("ttl"), "unknown field named: {m}");
    // Found by schemathesis: serde builds a struct from an array of its fields; bodies are objects.
    let (s, e, m) = code_of(post_key(Some(&admin_token), "[null, null]".into()).await.unwrap()).await;
    assert_eq!((s, e.as_str()), (400, "invalid_request"));
    assert!(m.contains("expected a JSON object"), "{m}");
    let big = format!(r#"{{"note": "{}"}}"#, "x".repeat(1024 * 1024 + 10));
    let path = "/api/v1/join-keys";
    assert_eq!(
        raw(running.addr, path, Some(&admin_token), big.as_bytes(), false).await,
        (413, "payload_too_large".into())
    );
    assert_eq!(
        raw(running.addr, path, Some(&admin_token), big.as_bytes(), true).await,
        (413, "payload_too_large".into()),
        "chunked, no length"
    );
    assert_eq!(
        raw(running.addr, path, None, big.as_bytes(), false).await,
        (401, "invalid_token".into()),
        "401 comes before 413"
    );
    let r = post_key(Some(&admin_token), r#"{"ttlSeconds": 120, "note": "w1"}"#.into()).await.unwrap();
    assert_eq!(r.status(), 201);
    let v: Value = r.json().await.unwrap();
    assert!(v["joinKey"].as_str().unwrap().starts_with("fjk_") && v["expiresAt"].is_string());
    // an empty body takes the defaults
    assert_eq!(post_key(Some(&admin_token), String::new()).await.unwrap().status(), 201);

    // join: 401 join_key_invalid, 400 naming the field, 409 node_name_taken, 201;
    // refusals with 400 and 409 leave the key usable.
    let mut n1 = TestNode::new(&url, "w1", json!({"executorKinds": ["k"], "capacity": {"slots": 2}}));
    let (s, v) = n1.try_join("fjk_nope").await;
    assert_eq!((s.as_u16(), v["error"].as_str()), (401, Some("join_key_invalid")));
    let key = admin.join_key().await;
    let mut bad = n1.join_body(&key);
    bad["gpus"] = json!(1);
    let (s, e, m) = code_of(http.post(format!("{url}/api/v1/nodes:join")).json(&bad).send().await.unwrap()).await;
    assert_eq!((s, e.as_str()), (400, "invalid_request"));
    assert!(m.contains("gpus"), "{m}");
    let mut badcap = n1.join_body(&key);
    badcap["capacity"]["slots"] = json!(101);
    let (s, _, m) = code_of(http.post(format!("{url}/api/v1/nodes:join")).json(&badcap).send().await.unwrap()).await;
    assert_eq!(s, 400);
    assert!(m.contains("capacity.slots"), "{m}");
    n1.join(&key).await;
    // A key works once: another node (its own key pair) cannot use it, under the same name or
    // another.
    for name in ["w1", "w1b"] {
        let (s, v) = TestNode::new(&url, name, json!({"capacity": {"slots": 1}})).try_join(&key).await;
        assert_eq!((s.as_u16(), v["error"].as_str()), (401, Some("join_key_invalid")), "a key works once");
    }
    // docs/behaviour.md#node-lifecycle: the same node (name and public key) joining again while the key lasts — its
    // first `201` was lost — gets the same id and a new token; the old token stops working.
    let first = n1.clone();
    n1.join(&key).await;
    assert_eq!(n1.id, first.id, "no ghost: the same node");
    assert_ne!(n1.token, first.token);
    assert_eq!(first.desired(None, 0).await.0, 401, "the previous token no longer works");
    assert_eq!(n1.desired(None, 0).await.0, 200);
    let key2 = admin.join_key().await;
    let (s, v) = TestNode::new(&url, "w1", json!({"capacity": {"slots": 1}})).try_join(&key2).await;
    assert_eq!((s.as_u16(), v["error"].as_str()), (409, Some("node_name_taken")));
    let mut n2 = TestNode::new(&url, "w2", json!({"capacity": {"slots": 1}}));
    n2.join(&key2).await; // the key survived the 409

    // admin reads: 200, 404 not_found, 403 for a node token, 401 for an expired token
    let (s, v) = admin.get("/api/v1/nodes").await;
    assert_eq!(s, 200);
    assert_eq!(v["items"].as_array().unwrap().len(), 2);
    let (s, v) = admin.get(&format!("/api/v1/nodes/{}", n1.id)).await;
    assert_eq!((s.as_u16(), v["name"].as_str()), (200, Some("w1")));
    assert!(v["replicas"].is_array() && v["generation"].is_u64());
    let (s, v) = admin.get("/api/v1/nodes/no-such-id").await;
    assert_eq!((s.as_u16(), v["error"].as_str()), (404, Some("not_found")));
    let (s, _) = Admin::new(&url, read_token.clone()).get("/api/v1/placements").await;
    assert_eq!(s, 200, "fleet:read reads placements");
    let (s, v) = Admin::new(&url, n1.token.clone()).get("/api/v1/nodes").await;
    assert_eq!((s.as_u16(), v["error"].as_str()), (401, Some("invalid_token")), "a node token is no admin token");
    let (s, v) = Admin::new(&url, dk.mint("fleet", &["fleet:admin"], -120)).get("/api/v1/nodes").await;
    assert_eq!((s.as_u16(), v["error"].as_str()), (401, Some("invalid_token")));
    let (s, v) = Admin::new(&url, dk.mint("other", &["fleet:admin"], 600)).get("/api/v1/nodes").await;
    assert_eq!((s.as_u16(), v["error"].as_str()), (401, Some("invalid_token")), "wrong audience");
    let (s, _) = Admin::new(&url, dk.mint("fleet", &["other:scope"], 600)).get("/api/v1/nodes").await;
    assert_eq!(s.as_u16(), 403);

    // desired: 401 node_unknown for a token this store never knew (its node keeps running;
    // docs/behaviour.md#a-store-older-than-the-fleet), 400 for wait > 60, 200, 304 at once and after waiting
    let mut stranger = n1.clone();
    stranger.token = "fnt_unknown".into();
    let (s, v) = stranger.desired(None, 0).await;
    assert_eq!((s.as_u16(), v["error"].as_str()), (401, Some("node_unknown")));
    assert!(v["message"].as_str().unwrap().contains("join it again with a new join key"), "{v}");
    let (s, v) = n1.desired(None, 61).await;
    assert_eq!((s.as_u16(), v["error"].as_str()), (400, Some("invalid_request")));
    // Also found by schemathesis: a generation beyond the contract's int64 range is refused.
    let (s, v) = n1.desired(Some(1 << 63), 0).await;
    assert_eq!((s.as_u16(), v["error"].as_str()), (400, Some("invalid_request")));
    let g = n1.generation().await;
    let (s, _) = n1.desired(Some(g), 0).await;
    assert_eq!(s, 304);
    let t = std::time::Instant::now();
    let (s, _) = n1.desired(Some(g), 1).await;
    assert_eq!(s, 304);
    assert!(t.elapsed() >= Duration::from_millis(900), "held until wait ran out");
    let (s, _) = n1.desired(Some(g - 1), 0).await;
    assert_eq!(s, 200, "an older since answers at once");
    // A node ahead of the store (docs/behaviour.md#a-store-older-than-the-fleet) is never
    // served the older generation: it is answered as if nothing changed.
    let (s, _) = n1.desired(Some(g + 7), 0).await;
    assert_eq!(s, 304, "a newer since than the store's is never answered with an older body");

    // 429: a fifth held long-poll of one node
    let held: Vec<_> = (0..4)
        .map(|_| {
            let n = n1.clone();
            tokio::spawn(async move { n.desired(Some(g), 20).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (s, v) = n1.desired(Some(g), 20).await;
    assert_eq!((s.as_u16(), v["error"].as_str()), (429, Some("too_many_requests")));
    let (s, _) = n2.desired(Some(n2.generation().await), 0).await;
    assert_eq!(s, 304, "another node is not limited by n1's polls");
    for h in held {
        h.abort();
    }

    // observed: 204, 400 naming an unknown field, 401, stale (bootId, seq) ignored
    assert_eq!(n1.report(&[]).await, 204);
    let mut body = n1.announce.clone();
    body["appliedGeneration"] = json!(1);
    body["health"] = json!("ok");
    body["cpuTemperature"] = json!(70);
    let r =
        http.put(format!("{url}/api/v1/nodes/me/observed")).bearer_auth(&n1.token).json(&body).send().await.unwrap();
    let (s, e, m) = code_of(r).await;
    assert_eq!((s, e.as_str()), (400, "invalid_request"));
    assert!(m.contains("cpuTemperature"), "{m}");
    assert_eq!(stranger.report(&[]).await, 401);
    let mut fresh = n1.announce.clone();
    fresh["labels"] = json!(["fresh"]);
    fresh.as_object_mut().unwrap().extend(
        json!({"appliedGeneration": 1, "health": "ok", "bootId": "boot-1", "seq": 10}).as_object().unwrap().clone(),
    );
    assert_eq!(n1.put_observed(&fresh).await, 204);
    let mut stale = fresh.clone();
    stale["labels"] = json!(["stale"]);
    stale["seq"] = json!(9);
    assert_eq!(n1.put_observed(&stale).await, 204);
    let (_, v) = admin.get(&format!("/api/v1/nodes/{}", n1.id)).await;
    assert_eq!(v["labels"], json!(["fresh"]), "a report with an older seq of the same boot is ignored");

    // 429: more than 20 failed joins a second, all sources together
    let mut statuses = vec![];
    for _ in 0..45 {
        statuses.push(TestNode::new(&url, "x", json!({"capacity": {"slots": 1}})).try_join("fjk_bad").await.0.as_u16());
    }
    assert!(statuses.contains(&429), "{statuses:?}");
    assert!(statuses.iter().all(|s| *s == 401 || *s == 429));

    // Two joins racing with one key (docs/behaviour.md#hardening): exactly one node is created. (After the
    // second in which failed joins were throttled above.)
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let key3 = admin.join_key().await;
    let (ra, rb) = (
        TestNode::new(&url, "race-a", json!({"capacity": {"slots": 1}})),
        TestNode::new(&url, "race-b", json!({"capacity": {"slots": 1}})),
    );
    let ((sa, _), (sb, vb)) = tokio::join!(ra.try_join(&key3), rb.try_join(&key3));
    let mut got = [sa.as_u16(), sb.as_u16()];
    got.sort();
    assert_eq!(got, [201, 401], "one wins, the other is refused: {vb}");
    let names: Vec<String> = admin.nodes().await.iter().map(|n| n["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names.iter().filter(|n| n.starts_with("race-")).count(), 1, "{names:?}");

    // unknown route
    let (s, v) = admin.get("/api/v1/nothing").await;
    assert_eq!((s.as_u16(), v["error"].as_str()), (404, Some("not_found")));

    // 405: a known path with another method, with the same JSON error body
    let http = reqwest::Client::new();
    for (method, path) in
        [("DELETE", "/api/v1/placements"), ("POST", "/api/v1/nodes/me/desired"), ("GET", "/api/v1/nodes:join")]
    {
        let r = http.request(method.parse().unwrap(), format!("{url}{path}")).bearer_auth(&admin.token).send().await;
        let (s, e, m) = code_of(r.unwrap()).await;
        assert_eq!((s, e.as_str()), (405, "method_not_allowed"), "{method} {path}");
        assert_eq!(m, format!("{method} is not allowed on {path}"));
    }
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_client_credentials_everything_but_healthz_is_503() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = in_process_config(&dk, dir.path());
    cfg.credentials = None;
    let running = fleet_controller::server::start(cfg).await.unwrap();
    let url = format!("http://{}", running.addr);
    let http = reqwest::Client::new();
    assert_eq!(http.get(format!("{url}/healthz")).send().await.unwrap().status(), 200);
    let token = dk.mint("fleet", &["fleet:admin"], 600);
    for (method, path) in [
        ("GET", "/api/v1/nodes"),
        ("GET", "/api/v1/placements"),
        ("POST", "/api/v1/join-keys"),
        ("POST", "/api/v1/nodes:join"),
        ("GET", "/api/v1/nodes/me/desired"),
        ("PUT", "/api/v1/nodes/me/observed"),
    ] {
        let r = http.request(method.parse().unwrap(), format!("{url}{path}")).bearer_auth(&token).send().await.unwrap();
        let (s, e, m) = code_of(r).await;
        assert_eq!((s, e.as_str()), (503, "not_configured"), "{method} {path}");
        assert!(m.contains("FLEET_CLIENT_ID"), "{m}");
    }
    running.shutdown().await;
}
