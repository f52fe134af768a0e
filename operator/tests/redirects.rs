//! Redirects to elsewhere (docs/behaviour.md#hardening): a `307` from an allowed URL to another
//! host would make the controller trust that host's JWKS, and re-post its client secret there.
//! Every outbound client follows a redirect only to the same scheme, host and port: here the
//! JWKS and IAM URLs answer `307` to a trap on another address, and the trap hears nothing.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A listener on 127.0.0.2 that counts the connections it gets.
async fn trap() -> (String, Arc<AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let heard = Arc::new(AtomicUsize::new(0));
    let count = heard.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
        }
    });
    (url, heard)
}

/// A server on 127.0.0.1 answering every request `307` to `to` plus the request's path.
async fn redirector(to: String) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let to = to.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                let answer =
                    format!("HTTP/1.1 307 Temporary Redirect\r\nlocation: {to}{path}\r\ncontent-length: 0\r\n\r\n");
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_redirected_elsewhere_gives_no_key() {
    let dk = devkit().await;
    let (elsewhere, heard) = trap().await;
    let jwks_url = format!("{}/jwks", redirector(elsewhere).await);
    let http = fleet_controller::platform::client::http_client();
    let jwks = fleet_controller::http::auth::Jwks::new(http, &jwks_url, &dk.issuer(), "fleet", Duration::from_secs(60));
    let token = dk.mint("fleet", &["fleet:admin"], 600);
    let e = jwks.verify(&token).await.unwrap_err();
    assert_eq!(e.message, "the token is signed by an unknown key");
    assert_eq!(heard.load(Ordering::SeqCst), 0, "the other host was never asked");
}

/// The controller's service account: a `307` from IAM's token endpoint would re-post
/// `client_secret` to wherever it points.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_secret_is_never_posted_to_a_redirect_elsewhere() {
    let dk = devkit().await;
    let (elsewhere, heard) = trap().await;
    let dir = tempfile::tempdir().unwrap();
    let mut env = env_for(&dk, dir.path(), free_port(), free_port());
    env.insert("FLEET_IAM_URL".into(), redirector(elsewhere).await);
    env.insert("FLEET_RECONCILE_SECONDS".into(), "1".into());
    let ctl = ControllerProcess::spawn(env, dir.path().join("controller.log")).await;
    let log = eventually(20, "the redirect refused", || async {
        let log = ctl.log_text();
        log.contains("only the same scheme, host and port are followed").then_some(log)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(heard.load(Ordering::SeqCst), 0, "the secret went elsewhere:\n{log}");
}
