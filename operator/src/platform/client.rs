//! The HTTP client the controller calls the platform with: bounded connect and request
//! times, and the extra CAs of `FLEET_CA_FILE`.

use std::time::Duration;

pub fn http_client() -> reqwest::Client {
    http_client_trusting(&[])
}

/// The client for CP, IAM and the JWKS, trusting `extra` CAs (`FLEET_CA_FILE`) besides the
/// built-in roots.
pub fn http_client_trusting(extra: &[reqwest::Certificate]) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(20))
        .pool_idle_timeout(Duration::from_secs(60))
        .user_agent(concat!("fleet-controller/", env!("CARGO_PKG_VERSION")));
    for c in extra {
        b = b.add_root_certificate(c.clone());
    }
    b.build().expect("the HTTP client builds with static settings")
}
