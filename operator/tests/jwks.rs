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
