//! IAM client: agent principals and their platform access tokens (docs/behaviour.md#iam-calls). Every create
//! carries an `Idempotency-Key`, so a retry after a crash replays instead of duplicating.

use super::error::{short_body, PlatformError};
use super::gate::{CallGate, Gated};
use super::token::TokenSource;
use reqwest::StatusCode;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

const SERVICE: &str = "IAM";
pub const AUDIENCE: &str = "iam";

pub struct IamClient {
    http: reqwest::Client,
    gate: Arc<CallGate>,
    base: String,
    tenant: String,
    tokens: Arc<TokenSource>,
}

#[derive(Deserialize)]
struct Created {
    id: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PrincipalBody<'a> {
    name: &'a str,
    display_name: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PatRequest {
    pub audiences: Vec<String>,
    pub scope_ceiling: Vec<String>,
    pub expires_in_seconds: u64,
    pub description: String,
}

/// An issued PAT. `token` is the secret: seal it and drop it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IssuedPat {
    pub id: String,
    pub token: String,
    pub expires_at: String,
    /// IAM answered `200`: the key was used before and this is the PAT it made then, not a
    /// new one (`201`).
    #[serde(skip)]
    pub replayed: bool,
}

impl std::fmt::Debug for IssuedPat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedPat").field("id", &self.id).field("token", &"<redacted>").finish()
    }
}

fn unreachable(e: reqwest::Error) -> PlatformError {
    super::error::unreachable(SERVICE, &e)
}

impl IamClient {
    pub fn new(http: reqwest::Client, base: &str, tenant: &str, tokens: Arc<TokenSource>, gate: Arc<CallGate>) -> Self {
        IamClient { http, gate, base: base.to_string(), tenant: tenant.to_string(), tokens }
    }

    async fn check(&self, resp: reqwest::Response) -> Result<reqwest::Response, PlatformError> {
        let status = resp.status();
        if status == StatusCode::UNAUTHORIZED {
            self.tokens.forget(AUDIENCE);
        }
        if status.is_success() {
            Ok(resp)
        } else {
            Err(PlatformError::Status { service: SERVICE, status: status.as_u16(), body: short_body(resp).await })
        }
    }

    pub async fn create_principal(&self, agent_key: &str) -> Result<String, PlatformError> {
        segment("the tenant", &self.tenant)?;
        let token = self.tokens.token(AUDIENCE).await?;
        let resp = self
            .http
            .post(format!("{}/tenants/{}/agents", self.base, self.tenant))
            .bearer_auth(token)
            .header("Idempotency-Key", format!("fleet-principal-{agent_key}"))
            .json(&PrincipalBody { name: agent_key, display_name: agent_key })
            .gated(&self.gate, SERVICE)?
            .send()
            .await
            .map_err(unreachable)?;
        let c: Created = self
            .check(resp)
            .await?
            .json()
            .await
            .map_err(|e| PlatformError::Invalid { service: SERVICE, detail: e.to_string() })?;
        segment("the principal id IAM answered", &c.id)?;
        Ok(c.id)
    }

    pub async fn issue_pat(
        &self,
        principal: &str,
        idempotency_key: &str,
        req: &PatRequest,
    ) -> Result<IssuedPat, PlatformError> {
        segment("the tenant", &self.tenant)?;
        segment("the principal id", principal)?;
        let token = self.tokens.token(AUDIENCE).await?;
        let resp = self
            .http
            .post(format!("{}/tenants/{}/agents/{principal}/platform-access-tokens", self.base, self.tenant))
            .bearer_auth(token)
            .header("Idempotency-Key", idempotency_key)
            .json(req)
            .gated(&self.gate, SERVICE)?
            .send()
            .await
            .map_err(unreachable)?;
        let replayed = resp.status() == StatusCode::OK;
        let mut pat: IssuedPat = self
            .check(resp)
            .await?
            .json()
            .await
            .map_err(|e| PlatformError::Invalid { service: SERVICE, detail: e.to_string() })?;
        pat.replayed = replayed;
        if pat.token.is_empty() || pat.token.len() > 8192 {
            return Err(PlatformError::Invalid { service: SERVICE, detail: "PAT answer lacks a token".into() });
        }
        segment("the PAT id IAM answered", &pat.id)?;
        Ok(pat)
    }

    pub async fn revoke_pat(&self, principal: &str, credential_id: &str) -> Result<(), PlatformError> {
        segment("the tenant", &self.tenant)?;
        segment("the principal id", principal)?;
        segment("the PAT id", credential_id)?;
        let token = self.tokens.token(AUDIENCE).await?;
        let resp = self
            .http
            .delete(format!(
                "{}/tenants/{}/agents/{principal}/platform-access-tokens/{credential_id}",
                self.base, self.tenant
            ))
            .bearer_auth(token)
            .gated(&self.gate, SERVICE)?
            .send()
            .await
            .map_err(unreachable)?;
        if resp.status() == StatusCode::NOT_FOUND {
            return Ok(());
        }
        self.check(resp).await.map(|_| ())
    }
}

/// An id that goes into a URL path must be one plain segment (docs/behaviour.md#hardening): an id IAM answered
/// with `/`, `..` or `%` in it must not turn a revoke into a call on another path.
fn segment<'a>(what: &str, id: &'a str) -> Result<&'a str, PlatformError> {
    let ok = !id.is_empty()
        && id.len() <= 200
        && id != "."
        && id != ".."
        && id.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b'~'));
    if ok {
        Ok(id)
    } else {
        let shown: String = id.chars().take(60).collect();
        Err(PlatformError::Invalid {
            service: SERVICE,
            detail: format!("{what} {shown:?} is not a plain URL path segment"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::segment;

    #[test]
    fn ids_in_url_paths_are_single_plain_segments() {
        for ok in ["prn_123", "a.b-c~d", "0"] {
            assert!(segment("id", ok).is_ok(), "{ok}");
        }
        for bad in ["", "..", ".", "a/b", "../../admin", "a%2Fb", "a b", "a?x=1", "a#b", &"x".repeat(201)] {
            let e = segment("the PAT id", bad).unwrap_err().to_string();
            assert!(e.contains("is not a plain URL path segment"), "{bad}: {e}");
        }
    }
}
