//! Control Plane client: the active agent list (paginated, `ETag`/`304`), identity binding
//! and status writes.

use super::error::{short_body, short_text, PlatformError};
use super::gate::{CallGate, Gated};
use super::token::TokenSource;
use crate::model::{parse_agents, Agent, AgentList, FieldWarning, Interner, SkippedAgent};
use crate::store::kept::StatusBody;
use reqwest::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::sync::Arc;

const SERVICE: &str = "CP";
pub const AUDIENCE: &str = "control-plane";
/// A list longer than this many pages is treated as a CP fault, not followed forever.
const MAX_PAGES: usize = 10_000;
/// The most agents a list's vector is sized for up front; a longer list grows it as read.
const MAX_EXPECTED: usize = 1_000_000;

pub struct CpClient {
    http: reqwest::Client,
    gate: Arc<CallGate>,
    base: String,
    tokens: Arc<TokenSource>,
}

pub enum AgentsFetch {
    NotModified,
    List { agents: Vec<Agent>, skipped: Vec<SkippedAgent>, warnings: Vec<FieldWarning>, etag: Option<String> },
}

/// One page as read off the wire: the items stay raw JSON until they are parsed into agents,
/// which happens while the next page is being fetched.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Page {
    items: Vec<Box<RawValue>>,
    #[serde(default)]
    next_cursor: Option<String>,
}

/// A fetched page: the answer's status, its `ETag` and its body.
struct Fetched {
    status: StatusCode,
    etag: Option<String>,
    body: axum::body::Bytes,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct IdentityBody<'a> {
    issuer: &'a str,
    iam_tenant_id: &'a str,
    iam_principal_id: &'a str,
}

fn unreachable(e: reqwest::Error) -> PlatformError {
    super::error::unreachable(SERVICE, &e)
}

impl CpClient {
    pub fn new(http: reqwest::Client, base: &str, tokens: Arc<TokenSource>, gate: Arc<CallGate>) -> Self {
        CpClient { http, gate, base: base.to_string(), tokens }
    }

    async fn bearer(&self) -> Result<String, PlatformError> {
        self.tokens.token(AUDIENCE).await
    }

    /// Reads every page of active agents; `If-None-Match` goes with the first page only.
    ///
    /// Pages are pipelined: as soon as a page's `nextCursor` is known the next request is on
    /// its way, and the page's items are parsed while the CP answers it.
    /// `previous`: the list in force, whose agents' last good versions stand in for what is
    /// wrong in their items now (`model::parse_agents`) and whose lists of names the new
    /// agents share where equal (`model::names`); its length is how many agents the
    /// new list is likely to hold, so the vector is sized for it once instead of doubling
    /// page by page (20,000 agents of 256 bytes would double to 32,768 places, 8.4 MB, beside
    /// the list it replaces).
    pub async fn list_agents(&self, etag: Option<&str>, previous: &AgentList) -> Result<AgentsFetch, PlatformError> {
        let token = self.bearer().await?;
        let mut agents = Vec::with_capacity(previous.len().min(MAX_EXPECTED));
        let (mut skipped, mut warnings) = (Vec::new(), Vec::new());
        let mut first_etag = None;
        let mut interner = None;
        let started = std::time::Instant::now();
        let mut next = tokio::spawn(self.fetch_page(&token, None, etag));
        for page_no in 0..MAX_PAGES {
            let fetched = (&mut next)
                .await
                .map_err(|e| PlatformError::Unreachable { service: SERVICE, detail: e.to_string() })??;
            if page_no == 0 && fetched.status == StatusCode::NOT_MODIFIED {
                return Ok(AgentsFetch::NotModified);
            }
            if fetched.status == StatusCode::UNAUTHORIZED {
                self.tokens.forget(AUDIENCE);
            }
            let body = fetched.body;
            if !fetched.status.is_success() {
                let body = short_text(&String::from_utf8_lossy(&body));
                return Err(PlatformError::Status { service: SERVICE, status: fetched.status.as_u16(), body });
            }
            if page_no == 0 {
                first_etag = fetched.etag;
            }
            let page: Page = serde_json::from_slice(&body)
                .map_err(|e| PlatformError::Invalid { service: SERVICE, detail: e.to_string() })?;
            let last = match page.next_cursor {
                Some(c) if !c.is_empty() => {
                    next = tokio::spawn(self.fetch_page(&token, Some(c), None));
                    false
                }
                _ => true,
            };
            let interner = interner.get_or_insert_with(Interner::default);
            let read = parse_agents(&page.items, previous, interner);
            agents.extend(read.agents);
            skipped.extend(read.skipped);
            warnings.extend(read.warnings);
            if last {
                // Duplicate keys across pages would make two agents of one name: keep the first.
                let mut seen = std::collections::HashSet::with_capacity(agents.len());
                agents.retain(|a: &Agent| seen.insert(a.key.clone()));
                tracing::debug!(
                    pages = page_no + 1,
                    agents = agents.len(),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "agent list read"
                );
                return Ok(AgentsFetch::List { agents, skipped, warnings, etag: first_etag });
            }
        }
        next.abort();
        Err(PlatformError::Invalid { service: SERVICE, detail: format!("more than {MAX_PAGES} pages of agents") })
    }

    /// The request for one page, as a task of its own so that it runs while the caller parses
    /// the page before it.
    fn fetch_page(
        &self,
        token: &str,
        cursor: Option<String>,
        etag: Option<&str>,
    ) -> impl std::future::Future<Output = Result<Fetched, PlatformError>> + Send + 'static {
        let mut query = vec![("status", "active".to_string())];
        if let Some(c) = cursor {
            query.push(("cursor", c));
        }
        let mut req = self.http.get(format!("{}/api/v1/agents", self.base)).bearer_auth(token).query(&query);
        if let Some(e) = etag {
            req = req.header(reqwest::header::IF_NONE_MATCH, e);
        }
        let req = req.gated(&self.gate, SERVICE);
        async move {
            let resp = req?.send().await.map_err(unreachable)?;
            let status = resp.status();
            let etag = resp.headers().get(reqwest::header::ETAG).and_then(|v| v.to_str().ok()).map(str::to_string);
            let body = resp.bytes().await.map_err(unreachable)?;
            Ok(Fetched { status, etag, body })
        }
    }

    async fn put(&self, path: String, body: &impl Serialize) -> Result<(), PlatformError> {
        let token = self.bearer().await?;
        let resp = self
            .http
            .put(format!("{}{path}", self.base))
            .bearer_auth(token)
            .json(body)
            .gated(&self.gate, SERVICE)?
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
