//! The controller's own OAuth2 client-credentials tokens, one per audience, cached until
//! 30 s before expiry (docs/behaviour.md#iam-calls).

use super::error::{short_body, PlatformError};
use super::gate::{CallGate, Gated};
use crate::config::ClientCredentials;
use parking_lot::Mutex;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct TokenSource {
    http: reqwest::Client,
    gate: Arc<CallGate>,
    url: String,
    creds: Option<ClientCredentials>,
    cache: Mutex<HashMap<String, (String, Instant)>>,
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

const EARLY: Duration = Duration::from_secs(30);

impl TokenSource {
    pub fn new(http: reqwest::Client, iam_url: &str, creds: Option<ClientCredentials>, gate: Arc<CallGate>) -> Self {
        TokenSource { http, gate, url: format!("{iam_url}/oauth2/token"), creds, cache: Mutex::new(HashMap::new()) }
    }

    pub async fn token(&self, audience: &str) -> Result<String, PlatformError> {
        if let Some((t, until)) = self.cache.lock().get(audience) {
            if Instant::now() < *until {
                return Ok(t.clone());
            }
        }
        let creds = self.creds.as_ref().ok_or(PlatformError::NotConfigured)?;
        let resp = self
            .http
            .post(&self.url)
            .form(&[
                ("grant_type", "client_credentials"),
                ("client_id", &creds.client_id),
                ("client_secret", &creds.client_secret),
                ("audience", audience),
            ])
            .gated(&self.gate, "IAM")?
            .send()
            .await
            .map_err(|e| super::error::unreachable("IAM", &e))?;
        let status = resp.status().as_u16();
        if status != 200 {
            return Err(PlatformError::Status { service: "IAM", status, body: short_body(resp).await });
        }
        let a: TokenAnswer =
            resp.json().await.map_err(|e| PlatformError::Invalid { service: "IAM", detail: e.to_string() })?;
        let life = Duration::from_secs(a.expires_in.unwrap_or(300));
        let until = Instant::now() + life.saturating_sub(EARLY);
        self.cache.lock().insert(audience.to_string(), (a.access_token.clone(), until));
        Ok(a.access_token)
    }

    /// Drops a cached token the peer refused.
    pub fn forget(&self, audience: &str) {
        self.cache.lock().remove(audience);
    }
}
