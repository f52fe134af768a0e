//! Who is calling. Admin routes take an IAM-issued JWT (docs/behaviour.md#admin-tokens): signature against the
//! JWKS (RS256, ES256 or EdDSA), issuer, audience, `exp`/`nbf` with 60 s leeway, scopes from
//! the space-separated `scope` claim; `fleet:admin` implies `fleet:read`. Node routes take
//! the node token, looked up by its hash.

use super::error::ApiError;
use crate::store::{Id, Store};
use axum::http::HeaderMap;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::{Mutex, RwLock};
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const SCOPE_READ: &str = "fleet:read";
pub const SCOPE_ADMIN: &str = "fleet:admin";
const REFETCH_EVERY: Duration = Duration::from_secs(60);

pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    bearer_of(headers.get(axum::http::header::AUTHORIZATION)?.to_str().ok()?)
}

/// The token of an `Authorization: Bearer <token>` value.
pub fn bearer_of(v: &str) -> Option<&str> {
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim()).filter(|t| !t.is_empty())
}

pub async fn node(store: &Store, headers: &HeaderMap, offline_after: std::time::Duration) -> Result<Id, ApiError> {
    node_by_token(store, bearer(headers), offline_after).await
}

/// The node a bearer token belongs to: `401 node_token_invalid` for none or a deleted node's,
/// `401 node_unknown` for a token this store never knew — its store is older than the node
/// (docs/behaviour.md#a-store-older-than-the-fleet).
pub async fn node_by_token(store: &Store, token: Option<&str>, offline_after: Duration) -> Result<Id, ApiError> {
    let token = token.ok_or_else(ApiError::node_token_invalid)?;
    if let Some(id) = store.read().node_id_by_token(token) {
        return Ok(id);
    }
    // Several replicas (docs/behaviour.md#high-availability): the node may have joined on another one a moment ago,
    // before this replica heard of it. The database says; one indexed read per unknown token.
    if store.db().is_shared() {
        match store.learn_node_by_token(token, offline_after).await {
            Ok(Some(id)) => return Ok(id),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "cannot look a node token up in the database"),
        }
    }
    if store.read().was_deleted(token) {
        return Err(ApiError::node_token_invalid());
    }
    Err(ApiError::node_unknown())
}

/// The keys of one JWKS fetch, swapped in whole.
#[derive(Default)]
struct KeySet {
    by_kid: HashMap<String, (DecodingKey, Algorithm)>,
    anonymous: Vec<(DecodingKey, Algorithm)>,
}

impl KeySet {
    fn from_jwks(set: &JwkSet) -> KeySet {
        let mut k = KeySet::default();
        for jwk in &set.keys {
            let (Some(alg), Ok(key)) = (alg_of(jwk), DecodingKey::from_jwk(jwk)) else { continue };
            match &jwk.common.key_id {
                Some(kid) => {
                    k.by_kid.insert(kid.clone(), (key, alg));
                }
                None => k.anonymous.push((key, alg)),
            }
        }
        k
    }

    fn is_empty(&self) -> bool {
        self.by_kid.is_empty() && self.anonymous.is_empty()
    }
}

/// The keys that sign admin tokens (docs/behaviour.md#admin-tokens, docs/behaviour.md#hardening): refreshed in the background every
/// `FLEET_JWKS_REFRESH_SECONDS` (10 minutes) and on an unknown `kid` at most once a minute.
/// A key that left the JWKS is refused after the next refresh; a failed or empty fetch keeps
/// the last keys; verifying a token whose key is known never waits for a fetch.
pub struct Jwks {
    http: reqwest::Client,
    url: String,
    issuer: String,
    audience: String,
    keys: RwLock<Arc<KeySet>>,
    /// When a fetch was last tried, for the once-a-minute limit on unknown kids.
    tried: Mutex<Option<Instant>>,
    /// Serialises fetches so a burst of unknown kids makes one request.
    fetching: tokio::sync::Mutex<()>,
    refresh_every: Duration,
}

#[derive(Deserialize)]
struct Claims {
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    sub: Option<String>,
}

/// Who a verified admin token speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admin {
    /// The token's `sub` (cut and escaped for logs), or `?`.
    pub sub: String,
    pub scopes: Vec<String>,
}

fn alg_of(jwk: &jsonwebtoken::jwk::Jwk) -> Option<Algorithm> {
    use jsonwebtoken::jwk::AlgorithmParameters as P;
    match &jwk.algorithm {
        P::RSA(_) => Some(Algorithm::RS256),
        P::EllipticCurve(ec) if ec.curve == jsonwebtoken::jwk::EllipticCurve::P256 => Some(Algorithm::ES256),
        P::OctetKeyPair(okp) if okp.curve == jsonwebtoken::jwk::EllipticCurve::Ed25519 => Some(Algorithm::EdDSA),
        _ => None,
    }
}

impl Jwks {
    pub fn new(http: reqwest::Client, url: &str, issuer: &str, audience: &str, refresh_every: Duration) -> Self {
        Jwks {
            http,
            url: url.to_string(),
            issuer: issuer.to_string(),
            audience: audience.to_string(),
            keys: RwLock::new(Arc::default()),
            tried: Mutex::new(None),
            fetching: tokio::sync::Mutex::new(()),
            refresh_every,
        }
    }

    /// The background refresh, for the life of the controller.
    pub async fn run(self: Arc<Self>) {
        loop {
            self.refresh().await;
            tokio::time::sleep(self.refresh_every).await;
        }
    }

    async fn fetch(&self) -> Result<JwkSet, String> {
        let resp = self.http.get(&self.url).send().await.map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("JWKS answered {}", resp.status()));
        }
        resp.json::<JwkSet>().await.map_err(|e| e.to_string())
    }

    /// Fetches the JWKS and swaps in its keys; keeps the last ones when the fetch fails or
    /// holds no usable key.
    async fn refresh(&self) {
        let _one = self.fetching.lock().await;
        self.fetch_and_swap().await;
    }

    /// The fetch itself; the caller holds `fetching`.
    async fn fetch_and_swap(&self) {
        *self.tried.lock() = Some(Instant::now());
        match self.fetch().await.map(|set| KeySet::from_jwks(&set)) {
            Ok(set) if !set.is_empty() => *self.keys.write() = Arc::new(set),
            Ok(_) => tracing::warn!(url = %self.url, "the JWKS holds no usable key; keeping the last keys"),
            Err(e) => tracing::warn!(error = %e, url = %self.url, "cannot fetch the JWKS; keeping the last keys"),
        }
    }

    /// For a key not known yet: waits for a fetch under way (it may bring the key), else
    /// fetches, at most once a minute.
    async fn refresh_for_unknown_key(&self, kid: Option<&str>) {
        let _one = self.fetching.lock().await;
        if !self.candidates(kid).is_empty() {
            return;
        }
        let recent = self.tried.lock().is_some_and(|t| t.elapsed() < REFETCH_EVERY);
        if !recent {
            self.fetch_and_swap().await;
        }
    }

    fn candidates(&self, kid: Option<&str>) -> Vec<(DecodingKey, Algorithm)> {
        let k = self.keys.read().clone();
        match kid {
            Some(kid) => k.by_kid.get(kid).cloned().into_iter().collect(),
            None => k.by_kid.values().cloned().chain(k.anonymous.iter().cloned()).collect(),
        }
    }

    /// Verifies `token` and returns who it speaks for.
    pub async fn verify(&self, token: &str) -> Result<Admin, ApiError> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|_| ApiError::invalid_token("the token is not a JWT"))?;
        if !matches!(header.alg, Algorithm::RS256 | Algorithm::ES256 | Algorithm::EdDSA) {
            return Err(ApiError::invalid_token("the token's algorithm is not RS256, ES256 or EdDSA"));
        }
        let mut keys = self.candidates(header.kid.as_deref());
        if keys.is_empty() {
            self.refresh_for_unknown_key(header.kid.as_deref()).await;
            keys = self.candidates(header.kid.as_deref());
        }
        if keys.is_empty() {
            return Err(ApiError::invalid_token("the token is signed by an unknown key"));
        }
        let mut v = Validation::new(header.alg);
        v.set_issuer(&[&self.issuer]);
        v.set_audience(&[&self.audience]);
        v.leeway = 60;
        v.validate_nbf = true;
        v.set_required_spec_claims(&["exp", "iss", "aud"]);
        let mut last = ApiError::invalid_token("the token's signature does not verify");
        for (key, alg) in keys {
            if alg != header.alg {
                continue;
            }
            match jsonwebtoken::decode::<Claims>(token, &key, &v) {
                Ok(data) => {
                    let scopes = data.claims.scope.unwrap_or_default().split_whitespace().map(str::to_string).collect();
                    let sub = data.claims.sub.as_deref().map(super::error::cut).unwrap_or_else(|| "?".into());
                    return Ok(Admin { sub, scopes });
                }
                Err(e) => {
                    use jsonwebtoken::errors::ErrorKind as K;
                    let why = match e.kind() {
                        K::ExpiredSignature => "the token has expired",
                        K::ImmatureSignature => "the token is not valid yet",
                        K::InvalidIssuer => "the token's issuer is not FLEET_IAM_ISSUER",
                        K::InvalidAudience => "the token's audience does not include FLEET_AUDIENCE",
                        K::MissingRequiredClaim(_) => "the token lacks exp, iss or aud",
                        _ => "the token's signature does not verify",
                    };
                    last = ApiError::invalid_token(why);
                }
            }
        }
        Err(last)
    }

    /// Checks an admin request for `need` (`fleet:admin` implies `fleet:read`).
    pub async fn admin(&self, headers: &HeaderMap, need: &str) -> Result<Admin, ApiError> {
        let token = bearer(headers).ok_or_else(|| ApiError::invalid_token("an admin bearer token is required"))?;
        holds(self.verify(token).await?, need)
    }
}

/// `admin`, when its scopes hold `need` (`fleet:admin` implies `fleet:read`).
pub fn holds(admin: Admin, need: &str) -> Result<Admin, ApiError> {
    if admin.scopes.iter().any(|s| s == need || s == SCOPE_ADMIN) {
        Ok(admin)
    } else {
        Err(ApiError::insufficient_scope(need))
    }
}
