//! Clients of the platform's Control Plane and IAM (docs/behaviour.md#the-platform-control-plane-and-iam): the only code that knows their
//! URLs and bodies, so a deployment can adapt them without touching the reconciler.

pub mod cp;
pub mod iam;
pub mod token;

use std::time::Duration;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PlatformError {
    #[error("{service} unreachable: {detail}")]
    Unreachable { service: &'static str, detail: String },
    #[error("{service} answered {status}: {body}")]
    Status { service: &'static str, status: u16, body: String },
    #[error("{service} answered something unexpected: {detail}")]
    Invalid { service: &'static str, detail: String },
    #[error("the controller has no client credentials (FLEET_CLIENT_ID, FLEET_CLIENT_SECRET)")]
    NotConfigured,
}

impl PlatformError {
    /// The short outcome label used in metrics.
    pub fn outcome(&self) -> &'static str {
        match self {
            PlatformError::Unreachable { .. } => "unreachable",
            PlatformError::Status { status, .. } if *status >= 500 => "server_error",
            PlatformError::Status { .. } => "refused",
            PlatformError::Invalid { .. } => "invalid",
            PlatformError::NotConfigured => "not_configured",
        }
    }
}

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

/// Reads a body cut to a length safe to log: error bodies from peers are not trusted.
pub(crate) async fn short_body(resp: reqwest::Response) -> String {
    short_text(&resp.text().await.unwrap_or_default())
}

/// The start of an error body, for a message.
pub(crate) fn short_text(text: &str) -> String {
    let mut s: String = text.chars().take(300).collect();
    if s.len() < text.len() {
        s.push('…');
    }
    s
}
