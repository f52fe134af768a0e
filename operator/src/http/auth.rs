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
        for jwk in set.keys.iter().filter(|j| for_signatures(j)) {
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
    /// Since when the JWKS has answered with no usable key while the last keys were kept.
    unusable_since: Mutex<Option<Instant>>,
    keep_keys_for: Duration,
}

/// How long the last keys are kept while the JWKS answers with no usable key: IAM publishing
/// an empty set by mistake does not lock every admin out at once, and a key it removed is not
/// trusted for ever.
pub const KEEP_KEYS_FOR: Duration = Duration::from_secs(3600);

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

/// Whether a JWK may verify signatures: one marked for encryption only (`use: enc`, or
/// `key_ops` without `verify`) is not a signing key, whatever its type.
fn for_signatures(jwk: &jsonwebtoken::jwk::Jwk) -> bool {
    use jsonwebtoken::jwk::{KeyOperations, PublicKeyUse};
    let use_ok = jwk.common.public_key_use.as_ref().is_none_or(|u| *u == PublicKeyUse::Signature);
    let ops_ok = jwk.common.key_operations.as_ref().is_none_or(|ops| ops.contains(&KeyOperations::Verify));
    use_ok && ops_ok
}

/// Whether a JWT's header names `crit` extensions: Fleet understands none, so RFC 7515 says
/// such a token must be refused.
fn names_crit(token: &str) -> bool {
    use base64::Engine;
    let head = token.split('.').next().unwrap_or("");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(head).unwrap_or_default();
    serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes).is_ok_and(|h| h.contains_key("crit"))
}

/// A `scope` claim's scopes: separated by spaces (RFC 6749, section 3.3), not by any other whitespace.
pub fn scopes_of(claim: &str) -> Vec<String> {
    claim.split(' ').filter(|s| !s.is_empty()).map(str::to_string).collect()
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
            unusable_since: Mutex::new(None),
            keep_keys_for: KEEP_KEYS_FOR,
        }
    }

    /// How long the last keys are kept while the JWKS holds no usable key ([`KEEP_KEYS_FOR`]).
    pub fn keeping_keys_for(mut self, d: Duration) -> Self {
        self.keep_keys_for = d;
        self
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
            Ok(set) if !set.is_empty() => {
                *self.unusable_since.lock() = None;
                *self.keys.write() = Arc::new(set);
            }
            Ok(_) => self.no_usable_key(),
            Err(e) => tracing::warn!(error = %e, url = %self.url, "cannot fetch the JWKS; keeping the last keys"),
        }
    }

    /// The JWKS answered with no usable key: the last keys are kept for [`KEEP_KEYS_FOR`], then
    /// dropped (no admin token verifies until the JWKS has a key again).
    fn no_usable_key(&self) {
        let since = *self.unusable_since.lock().get_or_insert_with(Instant::now);
        if since.elapsed() < self.keep_keys_for {
            tracing::warn!(url = %self.url, "the JWKS holds no usable key; keeping the last keys for at most an hour");
        } else if !self.keys.read().is_empty() {
            tracing::error!(url = %self.url, "the JWKS has held no usable key for an hour; the last keys are dropped");
            *self.keys.write() = Arc::default();
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
        if names_crit(token) {
            return Err(ApiError::invalid_token(
                "the token's header names crit extensions, which Fleet does not understand",
            ));
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
                    let scopes = scopes_of(&data.claims.scope.unwrap_or_default());
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
