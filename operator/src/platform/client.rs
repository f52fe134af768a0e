//! The HTTP client the controller calls the platform with: bounded connect and request
//! times, the extra CAs of `FLEET_CA_FILE`, and redirects followed only to the same scheme,
//! host and port (a `307` re-posts the client secret to wherever it points).

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
        .redirect(same_origin_redirects())
        .user_agent(concat!("fleet-controller/", env!("CARGO_PKG_VERSION")));
    for c in extra {
        b = b.add_root_certificate(c.clone());
    }
    b.build().expect("the HTTP client builds with static settings")
}

/// Up to five redirects, each to the scheme, host and port asked; any other is an error.
pub fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|a| match a.previous().last() {
        Some(from) if !fleet_api::urls::same_origin(from, a.url()) => {
            let to = a.url().to_string();
            a.error(format!("a redirect to {to} is refused: only the same scheme, host and port are followed"))
        }
        _ if a.previous().len() > 5 => a.stop(),
        _ => a.follow(),
    })
}
