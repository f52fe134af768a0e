//! The JWKS of admin tokens (docs/behaviour.md#hardening): refreshed in the background, so a key IAM retired is
//! refused after the next refresh and its successor is accepted; a failed or empty fetch keeps
//! the last keys; and a token whose key is known is verified without waiting for a fetch
//! that is under way. devkit rotates its signing key the way IAM would.

mod support;

use fleet_controller::http::auth::Jwks;
use fleet_devkit::Faults;
use std::sync::Arc;
use std::time::Duration;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_keys_are_followed_and_failed_fetches_keep_the_last_keys() {
    let dk = devkit().await;
    let jwks =
        Arc::new(Jwks::new(reqwest::Client::new(), &dk.jwks_url(), &dk.issuer(), "fleet", Duration::from_millis(200)));
    let refresher = tokio::spawn(jwks.clone().run());
    let old = dk.mint("fleet", &["fleet:admin"], 600);
    assert_eq!(jwks.verify(&old).await.unwrap().sub, "devkit-admin");

    // IAM rotates: the old key leaves the JWKS, the new one arrives.
    dk.rotate_signing_key();
    let new = dk.mint("fleet", &["fleet:admin"], 600);
    let refused =
        eventually(10, "the retired key refused after a refresh", || async { jwks.verify(&old).await.err() }).await;
    assert_eq!((refused.code, refused.message.as_str()), ("invalid_token", "the token is signed by an unknown key"));
    assert!(jwks.verify(&new).await.is_ok());

    // An empty JWKS, then a failing one: the last keys stay, for several refreshes.
    for faults in [Faults { jwks_empty: true, ..Default::default() }, Faults { jwks_down: true, ..Default::default() }]
    {
        dk.set_faults(faults);
        let seen = dk.calls("jwks");
        eventually(10, "two more refreshes", || async { (dk.calls("jwks") >= seen + 2).then_some(()) }).await;
        assert!(jwks.verify(&new).await.is_ok(), "the last keys are kept");
    }

    // A known key never waits for a fetch: with every fetch taking 5 s (one is always under
    // way), verifying still answers at once.
    dk.set_faults(Faults { jwks_down: true, latency_ms: 5_000, ..Default::default() });
    let seen = dk.calls("jwks");
    tokio::time::sleep(Duration::from_millis(400)).await; // the next refresh is now waiting
    let verified = tokio::time::timeout(Duration::from_secs(2), jwks.verify(&new)).await;
    assert!(matches!(verified, Ok(Ok(_))), "verified without waiting for the 5 s fetch");
    assert!(dk.calls("jwks") <= seen + 1, "no fetch was made for a known key");
    refresher.abort();
}

/// Serves `body` as a JWKS on 127.0.0.1; returns its URL.
async fn serve_jwks(body: serde_json::Value) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks", l.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let body = body.to_string();
            tokio::spawn(async move {
                let _ = s.read(&mut [0u8; 4096]).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(format!("{head}{body}").as_bytes()).await;
            });
        }
    });
    url
}

/// A key marked for encryption (`use: enc`, or `key_ops` without `verify`) verifies nothing,
/// even a token it could check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_marked_for_encryption_verifies_nothing() {
    let dk = devkit().await;
    let token = dk.mint("fleet", &["fleet:admin"], 600);
    let key = dk.signer().jwks()["keys"][0].clone();
    for (field, value) in [("use", serde_json::json!("enc")), ("key_ops", serde_json::json!(["encrypt"]))] {
        let mut marked = key.clone();
        marked.as_object_mut().unwrap().remove("use");
        marked[field] = value;
        let url = serve_jwks(serde_json::json!({"keys": [marked]})).await;
        let jwks = Jwks::new(reqwest::Client::new(), &url, &dk.issuer(), "fleet", Duration::from_secs(60));
        let e = jwks.verify(&token).await.unwrap_err();
        assert_eq!(e.message, "the token is signed by an unknown key", "{field}");
    }
    let url = serve_jwks(serde_json::json!({"keys": [key]})).await;
    let jwks = Jwks::new(reqwest::Client::new(), &url, &dk.issuer(), "fleet", Duration::from_secs(60));
    assert!(jwks.verify(&token).await.is_ok(), "the same key marked for signatures");
}

/// A header naming `crit` extensions is refused (Fleet understands none), and scopes are split
/// on spaces only: a token whose one scope holds another kind of whitespace grants nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crit_headers_are_refused_and_scopes_split_on_spaces_only() {
    let dk = devkit().await;
    let jwks = Jwks::new(reqwest::Client::new(), &dk.jwks_url(), &dk.issuer(), "fleet", Duration::from_secs(60));
    let signer = dk.signer();
    let now = fleet_controller::clock::now_ms() / 1000;
    let claims = serde_json::json!({"iss": dk.issuer(), "aud": "fleet", "sub": "x", "scope": "fleet:admin",
                                    "iat": now, "nbf": now - 5, "exp": now + 600});
    let header = serde_json::json!({"alg": "EdDSA", "typ": "JWT", "kid": signer.kid(), "crit": ["b64"], "b64": true});
    let e = jwks.verify(&signer.sign_with_header(&header, &claims)).await.unwrap_err();
    assert!(e.message.contains("crit"), "{}", e.message);
    let plain = serde_json::json!({"alg": "EdDSA", "typ": "JWT", "kid": signer.kid()});
    assert!(jwks.verify(&signer.sign_with_header(&plain, &claims)).await.is_ok(), "the same token without crit");

    let em_space = dk.mint("fleet", &["fleet:read\u{2003}fleet:admin"], 600);
    let admin = jwks.verify(&em_space).await.unwrap();
    assert_eq!(admin.scopes, vec!["fleet:read\u{2003}fleet:admin".to_string()], "one scope, not two");
    assert!(fleet_controller::http::auth::holds(admin, "fleet:admin").is_err());
}

/// A JWKS that answers with no usable key keeps the last keys for a while (IAM publishing an
/// empty set by mistake locks nobody out at once), not for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_keys_are_kept_for_a_bounded_time_only() {
    let dk = devkit().await;
    let jwks = Arc::new(
        Jwks::new(reqwest::Client::new(), &dk.jwks_url(), &dk.issuer(), "fleet", Duration::from_millis(100))
            .keeping_keys_for(Duration::from_millis(1500)),
    );
    let refresher = tokio::spawn(jwks.clone().run());
    let token = dk.mint("fleet", &["fleet:admin"], 600);
    assert!(jwks.verify(&token).await.is_ok());
    dk.set_faults(Faults { jwks_empty: true, ..Default::default() });
    let seen = dk.calls("jwks");
    eventually(10, "two empty answers", || async { (dk.calls("jwks") >= seen + 2).then_some(()) }).await;
    assert!(jwks.verify(&token).await.is_ok(), "kept a while");
    let refused = eventually(10, "the last keys dropped", || async { jwks.verify(&token).await.err() }).await;
    assert_eq!(refused.message, "the token is signed by an unknown key");
    dk.set_faults(Faults::default());
    eventually(10, "keys again once the JWKS has one", || async { jwks.verify(&token).await.ok() }).await;
    refresher.abort();
}
