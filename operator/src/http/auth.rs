//! Who is calling. Admin routes take an IAM-issued JWT (SPEC §3.7): signature against the
//! JWKS (RS256, ES256 or EdDSA), issuer, audience, `exp`/`nbf` with 60 s leeway, scopes from
//! the space-separated `scope` claim; `fleet:admin` implies `fleet:read`. Node routes take
//! the node token, looked up by its hash.

use super::error::ApiError;
use crate::store::{Id, Store};
use axum::http::HeaderMap;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::Mutex;
use serde::Deserialize;
use std::collections::HashMap;
use std::time::{Duration, Instant};

pub const SCOPE_READ: &str = "fleet:read";
pub const SCOPE_ADMIN: &str = "fleet:admin";
const REFETCH_EVERY: Duration = Duration::from_secs(60);

pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(axum::http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim()).filter(|t| !t.is_empty())
}

pub fn node(store: &Store, headers: &HeaderMap) -> Result<Id, ApiError> {
    let token = bearer(headers).ok_or_else(ApiError::node_token_invalid)?;
    store.state.read().node_id_by_token(token).ok_or_else(ApiError::node_token_invalid)
}

struct Keys {
    by_kid: HashMap<String, (DecodingKey, Algorithm)>,
    anonymous: Vec<(DecodingKey, Algorithm)>,
    fetched: Option<Instant>,
}

pub struct Jwks {
    http: reqwest::Client,
    url: String,
    issuer: String,
    audience: String,
    keys: Mutex<Keys>,
    /// Serialises fetches so a burst of unknown kids makes one request.
    fetching: tokio::sync::Mutex<()>,
}

#[derive(Deserialize)]
struct Claims {
    #[serde(default)]
    scope: Option<String>,
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
    pub fn new(http: reqwest::Client, url: &str, issuer: &str, audience: &str) -> Self {
        Jwks {
            http,
            url: url.to_string(),
            issuer: issuer.to_string(),
            audience: audience.to_string(),
            keys: Mutex::new(Keys { by_kid: HashMap::new(), anonymous: vec![], fetched: None }),
            fetching: tokio::sync::Mutex::new(()),
        }
    }

    async fn refresh(&self, force: bool) {
        let _one = self.fetching.lock().await;
        {
            let k = self.keys.lock();
            if let Some(t) = k.fetched {
                if !force || t.elapsed() < REFETCH_EVERY {
                    return;
                }
            }
        }
        let got = async {
            let resp = self.http.get(&self.url).send().await.map_err(|e| e.to_string())?;
            if !resp.status().is_success() {
                return Err(format!("JWKS answered {}", resp.status()));
            }
            resp.json::<JwkSet>().await.map_err(|e| e.to_string())
        }
        .await;
        let mut k = self.keys.lock();
        k.fetched = Some(Instant::now());
        match got {
            Ok(set) => {
                k.by_kid.clear();
                k.anonymous.clear();
                for jwk in &set.keys {
                    let (Some(alg), Ok(key)) = (alg_of(jwk), DecodingKey::from_jwk(jwk)) else { continue };
                    match &jwk.common.key_id {
                        Some(kid) => {
                            k.by_kid.insert(kid.clone(), (key, alg));
                        }
                        None => k.anonymous.push((key, alg)),
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, url = %self.url, "cannot fetch the JWKS for admin tokens"),
        }
    }

    fn candidates(&self, kid: Option<&str>) -> Vec<(DecodingKey, Algorithm)> {
        let k = self.keys.lock();
        match kid {
            Some(kid) => k.by_kid.get(kid).cloned().into_iter().collect(),
            None => k.by_kid.values().cloned().chain(k.anonymous.iter().cloned()).collect(),
        }
    }

    /// Verifies `token` and returns its scopes.
    pub async fn verify(&self, token: &str) -> Result<Vec<String>, ApiError> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|_| ApiError::invalid_token("the token is not a JWT"))?;
        if !matches!(header.alg, Algorithm::RS256 | Algorithm::ES256 | Algorithm::EdDSA) {
            return Err(ApiError::invalid_token("the token's algorithm is not RS256, ES256 or EdDSA"));
        }
        self.refresh(false).await;
        let mut keys = self.candidates(header.kid.as_deref());
        if keys.is_empty() {
            self.refresh(true).await;
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
                    return Ok(data.claims.scope.unwrap_or_default().split_whitespace().map(str::to_string).collect())
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
    pub async fn admin(&self, headers: &HeaderMap, need: &str) -> Result<(), ApiError> {
        let token = bearer(headers).ok_or_else(|| ApiError::invalid_token("an admin bearer token is required"))?;
        let scopes = self.verify(token).await?;
        let ok = scopes.iter().any(|s| s == need || s == SCOPE_ADMIN);
        if ok {
            Ok(())
        } else {
            Err(ApiError::insufficient_scope(need))
        }
    }
}
