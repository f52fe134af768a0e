//! Every route × every kind of bad credential → the exact code of docs/reference.md#http-api and docs/behaviour.md#admin-tokens. Admin
//! routes answer `401 invalid_token` or `403 insufficient_scope`; node routes
//! `401 node_token_invalid` without a token, `401 node_unknown` with one the store never knew;
//! the open routes answer anyway.

mod support;

use serde_json::json;
use support::*;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Admin,
    Read,
    Node,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_by_every_bad_credential() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let running = fleet_controller::server::start(in_process_config(&dk, dir.path())).await.unwrap();
    let url = format!("http://{}", running.addr);
    let admin = Admin::new(&url, dk.mint("fleet", &["fleet:admin"], 3600));
    let mut node = TestNode::new(&url, "m1", json!({"executorKinds": ["k"], "capacity": {"slots": 1}}));
    node.join(&admin.join_key().await).await;

    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let claims = |iss: &str, aud: &str, scope: &str, exp: i64| json!({"iss": iss, "aud": aud, "scope": scope, "exp": exp, "nbf": now - 5});
    let valid = dk.mint("fleet", &["fleet:admin"], 600);
    let mut bad_sig = valid.clone();
    let last = bad_sig.pop().unwrap();
    bad_sig.push(if last == 'A' { 'B' } else { 'A' });
    let other_key = fleet_devkit::keys::Signer::generate(&dk.issuer());
    // Forgeries (docs/behaviour.md#hardening): no signature at all, and HS256 "signed" with the public key as
    // the HMAC secret (the classic key-confusion attack); and claims the rules refuse.
    let b64 = |v: serde_json::Value| {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let good_claims = claims(&dk.issuer(), "fleet", "fleet:admin", now + 600);
    let alg_none = format!("{}.{}.", b64(json!({"alg": "none", "typ": "JWT"})), b64(good_claims.clone()));
    let signer = dk.signer();
    let mut hs = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    hs.kid = Some(signer.kid().to_string());
    let hs256 =
        jsonwebtoken::encode(&hs, &good_claims, &jsonwebtoken::EncodingKey::from_secret(signer.public_key())).unwrap();
    let no_exp = signer.sign(&json!({"iss": dk.issuer(), "aud": "fleet", "scope": "fleet:admin"}));
    let mut later = good_claims.clone();
    later["nbf"] = json!(now + 300);
    let not_yet = signer.sign(&later);
    let tokens: Vec<(&str, String)> = vec![
        ("no token", String::new()),
        ("malformed", "not-a-jwt".into()),
        ("bad signature", bad_sig),
        ("signed by an unknown key", other_key.mint("fleet", "fleet:admin", 600)),
        ("expired", dk.signer().sign(&claims(&dk.issuer(), "fleet", "fleet:admin", now - 300))),
        ("wrong audience", dk.signer().sign(&claims(&dk.issuer(), "other", "fleet:admin", now + 600))),
        ("wrong issuer", dk.signer().sign(&claims("http://evil", "fleet", "fleet:admin", now + 600))),
        ("alg none", alg_none),
        ("HS256 with the public key", hs256),
        ("no exp", no_exp),
        ("nbf in the future", not_yet),
        ("read scope", dk.mint("fleet", &["fleet:read"], 600)),
        ("no fleet scope", dk.mint("fleet", &["other:admin"], 600)),
        ("node token", node.token.clone()),
        ("admin token", valid.clone()),
    ];
    let routes: Vec<(&str, String, Kind)> = vec![
        ("POST", "/api/v1/join-keys".into(), Kind::Admin),
        ("GET", "/api/v1/nodes".into(), Kind::Read),
        ("GET", format!("/api/v1/nodes/{}", node.id), Kind::Read),
        ("GET", "/api/v1/placements".into(), Kind::Read),
        ("GET", "/api/v1/nodes/me/desired".into(), Kind::Node),
        ("PUT", "/api/v1/nodes/me/observed".into(), Kind::Node),
        // docs/behaviour.md#day-two-operations: the day-two routes.
        ("POST", format!("/api/v1/nodes/{}:cordon", node.id), Kind::Admin),
        ("POST", format!("/api/v1/nodes/{}:drain", node.id), Kind::Admin),
        ("POST", format!("/api/v1/nodes/{}:uncordon", node.id), Kind::Admin),
        // docs/behaviour.md#what-a-node-may-claim: an admin changes what a node may claim.
        ("PUT", format!("/api/v1/nodes/{}/allowed", node.id), Kind::Admin),
        ("GET", "/api/v1/agents/coder/placement".into(), Kind::Read),
        ("GET", "/api/v1/events".into(), Kind::Read),
        ("GET", "/api/v1/summary".into(), Kind::Read),
        // Last: the admin token deletes the node.
        ("DELETE", format!("/api/v1/nodes/{}", node.id), Kind::Admin),
    ];
    let http = reqwest::Client::new();
    let mut checked = 0;
    for (method, path, kind) in &routes {
        for (what, token) in &tokens {
            let mut req = http.request(method.parse().unwrap(), format!("{url}{path}")).json(&json!({}));
            if !token.is_empty() {
                req = req.bearer_auth(token);
            }
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            let body: serde_json::Value = r.json().await.unwrap_or_default();
            let code = body["error"].as_str().unwrap_or("");
            let expected: (u16, &str) = match (kind, *what) {
                (Kind::Node, "node token") => (0, ""),
                (Kind::Node, "no token") => (401, "node_token_invalid"),
                // A bearer token the store never knew (docs/behaviour.md#a-store-older-than-the-fleet).
                (Kind::Node, _) => (401, "node_unknown"),
                (_, "admin token") => (0, ""),
                (Kind::Read, "read scope") => (0, ""),
                (_, "read scope") | (_, "no fleet scope") => (403, "insufficient_scope"),
                _ => (401, "invalid_token"),
            };
            if expected.0 == 0 {
                // Past authentication: the route's own answer (a 404 for an agent not listed).
                assert!(!matches!(status, 401 | 403 | 500..), "{method} {path} with {what}: {status} {body}");
            } else {
                assert_eq!((status, code), expected, "{method} {path} with {what}: {body}");
                assert!(!body["message"].as_str().unwrap_or("").is_empty(), "a message explains it");
            }
            checked += 1;
        }
    }
    assert_eq!(checked, routes.len() * tokens.len());
    // The open routes answer whatever the credential; the web view's files hold no data and
    // keep the page to this origin (docs/behaviour.md#web-view).
    for token in ["", "not-a-jwt"] {
        for path in ["/healthz", "/ui", "/ui/app.js", "/ui/app.css"] {
            let mut req = http.get(format!("{url}{path}"));
            if !token.is_empty() {
                req = req.bearer_auth(token);
            }
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 200, "{path}");
            if path.starts_with("/ui") {
                let csp = r.headers()["content-security-policy"].to_str().unwrap().to_string();
                assert!(csp.contains("connect-src 'self'") && csp.contains("frame-ancestors 'none'"), "{csp}");
                assert_eq!(r.headers()["x-content-type-options"], "nosniff");
            }
        }
    }
    let r = http.get(format!("{url}/ui/")).send().await.unwrap();
    assert_eq!(r.url().path(), "/ui", "/ui/ redirects to the page");
    running.shutdown().await;
}
