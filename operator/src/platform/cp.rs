//! Control Plane client: the active agent list (paginated, `ETag`/`304`), identity binding
//! and status writes.

use super::token::TokenSource;
use super::{short_body, PlatformError};
use crate::model::{parse_agents, Agent, SkippedAgent};
use crate::reconcile::status::StatusBody;
use reqwest::StatusCode;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

const SERVICE: &str = "CP";
pub const AUDIENCE: &str = "control-plane";
/// A list longer than this many pages is treated as a CP fault, not followed forever.
const MAX_PAGES: usize = 10_000;

pub struct CpClient {
    http: reqwest::Client,
    base: String,
    tokens: Arc<TokenSource>,
}

pub enum AgentsFetch {
    NotModified,
    List { agents: Vec<Agent>, skipped: Vec<SkippedAgent>, etag: Option<String> },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Page {
    items: Vec<serde_json::Value>,
    #[serde(default)]
    next_cursor: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct IdentityBody<'a> {
    issuer: &'a str,
    iam_tenant_id: &'a str,
    iam_principal_id: &'a str,
}

fn unreachable(e: reqwest::Error) -> PlatformError {
    PlatformError::Unreachable { service: SERVICE, detail: e.to_string() }
}

impl CpClient {
    pub fn new(http: reqwest::Client, base: &str, tokens: Arc<TokenSource>) -> Self {
        CpClient { http, base: base.to_string(), tokens }
    }

    async fn bearer(&self) -> Result<String, PlatformError> {
        self.tokens.token(AUDIENCE).await
    }

    /// Reads every page of active agents; `If-None-Match` goes with the first page only.
    pub async fn list_agents(&self, etag: Option<&str>) -> Result<AgentsFetch, PlatformError> {
        let token = self.bearer().await?;
        let mut agents = Vec::new();
        let mut skipped = Vec::new();
        let mut cursor: Option<String> = None;
        let mut first_etag = None;
        let started = std::time::Instant::now();
        for page_no in 0..MAX_PAGES {
            let mut req = self.http.get(format!("{}/api/v1/agents", self.base)).bearer_auth(&token);
            let mut query = vec![("status", "active".to_string())];
            if let Some(c) = &cursor {
                query.push(("cursor", c.clone()));
            }
            req = req.query(&query);
            if page_no == 0 {
                if let Some(e) = etag {
                    req = req.header(reqwest::header::IF_NONE_MATCH, e);
                }
            }
            let resp = req.send().await.map_err(unreachable)?;
            if page_no == 0 && resp.status() == StatusCode::NOT_MODIFIED {
                return Ok(AgentsFetch::NotModified);
            }
            if resp.status() == StatusCode::UNAUTHORIZED {
                self.tokens.forget(AUDIENCE);
            }
            if !resp.status().is_success() {
                let status = resp.status().as_u16();
                return Err(PlatformError::Status { service: SERVICE, status, body: short_body(resp).await });
            }
            if page_no == 0 {
                first_etag =
                    resp.headers().get(reqwest::header::ETAG).and_then(|v| v.to_str().ok()).map(str::to_string);
            }
            let page: Page =
                resp.json().await.map_err(|e| PlatformError::Invalid { service: SERVICE, detail: e.to_string() })?;
            let (good, bad) = parse_agents(page.items);
            agents.extend(good);
            skipped.extend(bad);
            match page.next_cursor {
                Some(c) if !c.is_empty() => cursor = Some(c),
                _ => {
                    // Duplicate keys across pages would make two agents of one name: keep the first.
                    let mut seen = std::collections::HashSet::new();
                    agents.retain(|a: &Agent| seen.insert(a.key.clone()));
                    tracing::debug!(
                        pages = page_no + 1,
                        agents = agents.len(),
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "agent list read"
                    );
                    return Ok(AgentsFetch::List { agents, skipped, etag: first_etag });
                }
            }
        }
        Err(PlatformError::Invalid { service: SERVICE, detail: format!("more than {MAX_PAGES} pages of agents") })
    }

    async fn put(&self, path: String, body: &impl Serialize) -> Result<(), PlatformError> {
        let token = self.bearer().await?;
        let resp = self
            .http
            .put(format!("{}{path}", self.base))
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .map_err(unreachable)?;
        let status = resp.status();
        if status == StatusCode::UNAUTHORIZED {
            self.tokens.forget(AUDIENCE);
        }
        if status.is_success() {
            Ok(())
        } else {
            Err(PlatformError::Status { service: SERVICE, status: status.as_u16(), body: short_body(resp).await })
        }
    }

    pub async fn put_identity(
        &self,
        key: &str,
        issuer: &str,
        tenant: &str,
        principal: &str,
    ) -> Result<(), PlatformError> {
        self.put(
            format!("/api/v1/agents/{key}/identity"),
            &IdentityBody { issuer, iam_tenant_id: tenant, iam_principal_id: principal },
        )
        .await
    }

    pub async fn put_status(&self, key: &str, body: &StatusBody) -> Result<(), PlatformError> {
        self.put(format!("/api/v1/agents/{key}/status"), body).await
    }
}
