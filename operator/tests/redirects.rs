//! Redirects to elsewhere (docs/behaviour.md#hardening): a `307` from an allowed URL to another
//! host would make the controller trust that host's JWKS, and re-post its client secret there.
//! Every outbound client follows a redirect only to the same scheme, host and port: here the
//! JWKS and IAM URLs answer `307` to a trap on another address, and the trap hears nothing.

mod support;

use fleet_devkit::redirects::{redirector, trap};
use std::sync::atomic::Ordering;
use std::time::Duration;
use support::*;

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
