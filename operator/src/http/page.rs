//! Paging of the list routes: `?limit=N&cursor=C`, `nextCursor` in the answer while more
//! follow. The cursor is opaque to clients (base64url of where the page ended); without
//! `limit` a route answers its whole list, as before paging existed.

use super::error::ApiError;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use std::collections::HashMap;

/// Items one page holds at most.
pub const MAX_LIMIT: usize = 5_000;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Page {
    pub limit: Option<usize>,
    /// Where the last page ended, decoded.
    pub after: Option<String>,
}

impl Page {
    pub fn parse(q: &HashMap<String, String>) -> Result<Page, ApiError> {
        let limit = match q.get("limit").filter(|s| !s.is_empty()) {
            None => None,
            Some(s) => match s.parse::<usize>() {
                Ok(n) if (1..=MAX_LIMIT).contains(&n) => Some(n),
                _ => return Err(ApiError::invalid_request(format!("limit: must be 1–{MAX_LIMIT}"))),
            },
        };
        let after = match q.get("cursor").filter(|s| !s.is_empty()) {
            None => None,
            Some(c) => Some(decode(c).ok_or_else(|| {
                ApiError::invalid_request(
                    "cursor: not a cursor this controller gave out (pass nextCursor back as it is)",
                )
            })?),
        };
        Ok(Page { limit, after })
    }
}

pub fn encode(position: &str) -> String {
    URL_SAFE_NO_PAD.encode(position.as_bytes())
}

fn decode(cursor: &str) -> Option<String> {
    String::from_utf8(URL_SAFE_NO_PAD.decode(cursor).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn limits_and_cursors_are_checked_and_round_trip() {
        assert_eq!(Page::parse(&q(&[])).unwrap(), Page::default());
        let p = Page::parse(&q(&[("limit", "10"), ("cursor", &encode("n-0042"))])).unwrap();
        assert_eq!(p, Page { limit: Some(10), after: Some("n-0042".into()) });
        for bad in ["0", "5001", "x", "-1"] {
            let e = Page::parse(&q(&[("limit", bad)])).unwrap_err();
            assert_eq!(e.message, "limit: must be 1–5000");
        }
        let e = Page::parse(&q(&[("cursor", "%%%")])).unwrap_err();
        assert!(e.message.starts_with("cursor: "), "{}", e.message);
    }
}
