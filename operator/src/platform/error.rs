//! What a call to the CP or IAM can come to, and how a peer's error body is told: cut to a
//! length safe to log, since error bodies from peers are not trusted.

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
    /// The lease does not surely run for a call (docs/behaviour.md#high-availability): not sent.
    #[error("{service} not called: this replica is not sure it leads")]
    NotLeading { service: &'static str },
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
            PlatformError::NotLeading { .. } => "not_leading",
        }
    }
}

/// What a failed request came to, with its causes: reqwest's own text hides them ("error
/// following redirect"), and the cause is what an operator needs (which redirect was refused).
pub fn unreachable(service: &'static str, e: &reqwest::Error) -> PlatformError {
    let mut detail = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        detail.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    PlatformError::Unreachable { service, detail }
}

/// Reads a body cut to a length safe to log: error bodies from peers are not trusted.
pub async fn short_body(resp: reqwest::Response) -> String {
    short_text(&resp.text().await.unwrap_or_default())
}

/// The start of an error body, for a message.
pub fn short_text(text: &str) -> String {
    let mut s: String = text.chars().take(300).collect();
    if s.len() < text.len() {
        s.push('…');
    }
    s
}
