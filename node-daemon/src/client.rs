//! The node's side of the node protocol (docs/behaviour.md#node-protocol): join, desired-state long-poll, observed
//! report. Errors are classified the way the loops act on them (docs/behaviour.md#the-nodes-loops).

use fleet_api::{protocol, ErrorBody, JoinRequest, JoinResponse, ObservedReport};
use reqwest::StatusCode;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ClientError {
    /// `401`: the key or the node's credential is not accepted.
    #[error("{0}")]
    Unauthorized(String),
    /// `401 node_unknown`: the controller's store does not know this node (it is older than
    /// the node's join); the node keeps running and asks again.
    #[error("{0}")]
    Unknown(String),
    /// `400`: the controller names what is wrong.
    #[error("{0}")]
    BadRequest(String),
    /// `409`: a node of this name exists.
    #[error("{0}")]
    Conflict(String),
    /// Network errors, `5xx` and `429`: try again later.
    #[error("{0}")]
    Retry(String),
    #[error("unexpected answer {0}: {1}")]
    Other(u16, String),
}

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    /// Whether the controller offers the exchange (docs/behaviour.md#desired-state-and-observed-report), as its last answer said.
    offer: Arc<watch::Sender<Offer>>,
}

/// What this node knows of the controller's exchange route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Not seen (an older controller, or no answer yet): the two routes.
    Unknown,
    Offered,
    /// Tried and refused (`404`/`405`, or a report it cannot take): the two routes for the
    /// rest of this process.
    Declined,
}

/// Backoff of the pull loop and of join retries: 2, 5, 10, 30, 60, 60… s.
pub fn retry_delay(attempt: u32) -> Duration {
    const STEPS: [u64; 5] = [2, 5, 10, 30, 60];
    Duration::from_secs(STEPS[(attempt as usize).min(STEPS.len() - 1)])
}

async fn classify(resp: reqwest::Response) -> ClientError {
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    let body = serde_json::from_str::<ErrorBody>(&text).ok();
    let code = body.as_ref().map(|e| e.error.clone()).unwrap_or_default();
    let msg = body.map(|e| format!("{}: {}", e.error, e.message)).unwrap_or_else(|| text.chars().take(300).collect());
    match status {
        StatusCode::UNAUTHORIZED if code == fleet_api::codes::NODE_UNKNOWN => ClientError::Unknown(msg),
        StatusCode::UNAUTHORIZED => ClientError::Unauthorized(msg),
        StatusCode::BAD_REQUEST => ClientError::BadRequest(msg),
        StatusCode::CONFLICT => ClientError::Conflict(msg),
        s if s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS => ClientError::Retry(format!("{s}: {msg}")),
        s => ClientError::Other(s.as_u16(), msg),
    }
}

fn poll_query(since: Option<u64>, wait: u64) -> Vec<(&'static str, String)> {
    let mut q = vec![("wait", wait.to_string())];
    if let Some(s) = since {
        q.push(("since", s.to_string()));
    }
    q
}

/// The most of a desired-state answer the node reads (docs/behaviour.md#hardening): the
/// largest real one, 1,000 replicas of agents with long keys and sealed PATs, is a few MiB.
pub const MAX_DESIRED_BYTES: usize = 16 << 20;

/// A desired-state answer: the body on `200`, `None` on `304`.
async fn desired_answer(resp: reqwest::Response) -> Result<Option<Vec<u8>>, ClientError> {
    match resp.status() {
        StatusCode::OK => read_capped(resp, MAX_DESIRED_BYTES).await.map(Some),
        StatusCode::NOT_MODIFIED => Ok(None),
        _ => Err(classify(resp).await),
    }
}

/// The body of `resp`, refused (and retried later, the last desired state kept) past `cap`.
async fn read_capped(mut resp: reqwest::Response, cap: usize) -> Result<Vec<u8>, ClientError> {
    let too_big = || {
        ClientError::Retry(format!(
            "the controller's desired state is larger than {} MiB; the node keeps the last one it has",
            cap >> 20
        ))
    };
    if resp.content_length().is_some_and(|n| n > cap as u64) {
        return Err(too_big());
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(net)? {
        if out.len() + chunk.len() > cap {
            return Err(too_big());
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Redirects followed only to the controller's own scheme, host and port: a `307` elsewhere
/// would re-post the join key there (docs/behaviour.md#hardening).
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|a| match a.previous().last() {
        Some(from) if !fleet_api::urls::same_origin(from, a.url()) => {
            let to = a.url().to_string();
            a.error(format!("a redirect to {to} is refused: only the controller's own scheme, host and port"))
        }
        _ if a.previous().len() > 5 => a.stop(),
        _ => a.follow(),
    })
}

fn net(e: reqwest::Error) -> ClientError {
    let mut detail = e.to_string();
    let mut source = std::error::Error::source(&e);
    // reqwest's own text hides the cause ("error following redirect"): it is what to fix.
    while let Some(cause) = source {
        detail.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    ClientError::Retry(format!("cannot reach the controller: {detail}"))
}

impl Client {
    pub fn new(base: &str, ca_file: Option<&Path>) -> anyhow::Result<Client> {
        let mut b = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .redirect(same_origin_redirects())
            .user_agent(concat!("fleet-node/", env!("CARGO_PKG_VERSION")));
        if let Some(ca) = ca_file {
            let pem = std::fs::read(ca).map_err(|e| anyhow::anyhow!("caFile {}: {e}", ca.display()))?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| anyhow::anyhow!("caFile {}: {e}", ca.display()))?
            {
                b = b.add_root_certificate(cert);
            }
        }
        let (offer, _) = watch::channel(Offer::Unknown);
        Ok(Client { http: b.build()?, base: base.trim_end_matches('/').to_string(), offer: Arc::new(offer) })
    }

    /// Notes the controller's offer of the exchange from an answer's headers.
    fn saw(&self, resp: &reqwest::Response) {
        if resp.headers().contains_key(protocol::EXCHANGE_HEADER) {
            self.offer.send_if_modified(|o| {
                let first = *o == Offer::Unknown;
                if first {
                    *o = Offer::Offered;
                }
                first
            });
        }
    }

    pub fn offer(&self) -> Offer {
        *self.offer.borrow()
    }

    /// Resolves once the controller has offered the exchange.
    pub async fn offered(&self) {
        let mut rx = self.offer.subscribe();
        let _ = rx.wait_for(|o| *o == Offer::Offered).await;
    }

    /// The exchange is not used again by this process.
    pub fn decline(&self) {
        self.offer.send_replace(Offer::Declined);
    }

    /// Reports and long-polls in one request (docs/behaviour.md#desired-state-and-observed-report): the desired state when its
    /// generation differs from `since` (raw JSON), `None` on `304`.
    pub async fn exchange(
        &self,
        token: &str,
        since: Option<u64>,
        wait: u64,
        report: &ObservedReport,
    ) -> Result<Option<Vec<u8>>, ClientError> {
        let resp = self
            .http
            .post(format!("{}{}", self.base, protocol::EXCHANGE_PATH))
            .query(&poll_query(since, wait))
            .bearer_auth(token)
            .timeout(Duration::from_secs(wait + 30))
            .json(report)
            .send()
            .await
            .map_err(net)?;
        self.saw(&resp);
        desired_answer(resp).await
    }

    pub async fn join(&self, req: &JoinRequest) -> Result<JoinResponse, ClientError> {
        let resp = self
            .http
            .post(format!("{}/api/v1/nodes:join", self.base))
            .timeout(Duration::from_secs(30))
            .json(req)
            .send()
            .await
            .map_err(net)?;
        self.saw(&resp);
        if resp.status() == StatusCode::CREATED {
            return resp.json().await.map_err(|e| ClientError::Retry(format!("unreadable join answer: {e}")));
        }
        Err(classify(resp).await)
    }

    /// The desired state when its generation differs from `since` (raw JSON), `None` on `304`.
    pub async fn desired(&self, token: &str, since: Option<u64>, wait: u64) -> Result<Option<Vec<u8>>, ClientError> {
        let resp = self
            .http
            .get(format!("{}{}", self.base, protocol::DESIRED_PATH))
            .query(&poll_query(since, wait))
            .bearer_auth(token)
            .timeout(Duration::from_secs(wait + 30))
            .send()
            .await
            .map_err(net)?;
        self.saw(&resp);
        desired_answer(resp).await
    }

    pub async fn observed(&self, token: &str, report: &ObservedReport) -> Result<(), ClientError> {
        let resp = self
            .http
            .put(format!("{}{}", self.base, protocol::OBSERVED_PATH))
            .bearer_auth(token)
            .timeout(Duration::from_secs(30))
            .json(report)
            .send()
            .await
            .map_err(net)?;
        self.saw(&resp);
        if resp.status() == StatusCode::NO_CONTENT || resp.status().is_success() {
            return Ok(());
        }
        Err(classify(resp).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Serves one answer per connection: `head`, then `body_len` bytes of `{`-less filler, sent
    /// in 64 KiB pieces for as long as the client reads.
    async fn server(head: &'static str, body_len: usize) -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf).await;
                    let _ = s.write_all(head.as_bytes()).await;
                    let piece = vec![b' '; 64 << 10];
                    let mut sent = 0;
                    while sent < body_len {
                        let n = piece.len().min(body_len - sent);
                        if s.write_all(&piece[..n]).await.is_err() {
                            return;
                        }
                        sent += n;
                    }
                });
            }
        });
        url
    }

    /// A desired state past 16 MiB is refused whether it says its length or streams it.
    #[tokio::test]
    async fn a_desired_state_past_the_cap_is_refused() {
        let big = MAX_DESIRED_BYTES + 1;
        let declared = server("HTTP/1.1 200 OK\r\ncontent-length: 16777217\r\n\r\n", 0).await;
        let streamed = server("HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n", big).await;
        let fits = server("HTTP/1.1 200 OK\r\ncontent-length: 1048576\r\n\r\n", 1 << 20).await;
        for (url, ok) in [(declared, false), (streamed, false), (fits, true)] {
            let c = Client::new(&url, None).unwrap();
            match c.desired("t", None, 0).await {
                Ok(Some(b)) => assert!(ok && b.len() == 1 << 20, "{url}: {} bytes", b.len()),
                Err(ClientError::Retry(m)) => assert!(!ok && m.contains("larger than 16 MiB"), "{url}: {m}"),
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    #[test]
    fn backoff_sequence() {
        let s: Vec<u64> = (0..7).map(|i| super::retry_delay(i).as_secs()).collect();
        assert_eq!(s, vec![2, 5, 10, 30, 60, 60, 60]);
    }
}
