//! Paging of the list routes, as axum extractors: `?limit=N&cursor=C`, `nextCursor` in the
//! answer while more follow. The cursor is opaque to clients (base64url of where the page
//! ended); without `limit` a route answers its whole list, as before paging existed. The
//! events route pages by `seq` instead ([`EventRange`]). A handler takes its page after its
//! caller, so a bad page is `400` only for a caller who may read the list.

use super::error::ApiError;
use crate::store::events::PAGE;
use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
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

impl<S: Send + Sync> FromRequestParts<S> for Page {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Page, ApiError> {
        Page::parse(&query(parts)?)
    }
}

/// The events route's page (docs/behaviour.md#events): oldest first, the events after the `seq`
/// in `since` (or `cursor`); with `order=desc` newest first, the events before the `seq` in
/// `before` (or `cursor`) and after `since`; at most `limit` (1…500, default 500).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventRange {
    pub since: i64,
    /// Only events whose `seq` is below this one (paging back, newest first).
    pub before: Option<i64>,
    pub limit: u32,
    pub newest_first: bool,
}

impl EventRange {
    pub fn parse(q: &HashMap<String, String>) -> Result<EventRange, ApiError> {
        let number = |name: &str| -> Result<Option<i64>, ApiError> {
            match q.get(name).filter(|s| !s.is_empty()) {
                None => Ok(None),
                Some(s) => s
                    .parse::<i64>()
                    .ok()
                    .filter(|n| *n >= 0)
                    .map(Some)
                    .ok_or_else(|| ApiError::invalid_request(format!("{name}: must be a number ≥ 0"))),
            }
        };
        let newest_first = match q.get("order").map(String::as_str) {
            None | Some("") | Some("asc") => false,
            Some("desc") => true,
            Some(_) => return Err(ApiError::invalid_request("order: must be asc or desc")),
        };
        // A cursor continues in the order asked for: after it oldest first, before it newest first.
        let (cursor, since, before) = (number("cursor")?, number("since")?, number("before")?);
        let (since, before) = match newest_first {
            false => (cursor.or(since).unwrap_or(0), before),
            true => (since.unwrap_or(0), cursor.or(before)),
        };
        let limit = match number("limit")? {
            None => PAGE,
            Some(n) if (1..=i64::from(PAGE)).contains(&n) => n as u32,
            Some(_) => return Err(ApiError::invalid_request(format!("limit: must be 1–{PAGE}"))),
        };
        Ok(EventRange { since, before, limit, newest_first })
    }
}

impl<S: Send + Sync> FromRequestParts<S> for EventRange {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<EventRange, ApiError> {
        EventRange::parse(&query(parts)?)
    }
}

/// The query as a map, as axum's `Query` reads it (the last of a repeated name counts). A
/// map of strings takes any query, so the error is there for the type's sake.
fn query(parts: &Parts) -> Result<HashMap<String, String>, ApiError> {
    match Query::try_from_uri(&parts.uri) {
        Ok(Query(q)) => Ok(q),
        Err(e) => Err(ApiError::invalid_request(format!("query: {e}"))),
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

    #[test]
    fn event_ranges_take_the_cursor_before_since_and_check_every_number() {
        let oldest = EventRange { since: 0, before: None, limit: PAGE, newest_first: false };
        assert_eq!(EventRange::parse(&q(&[])).unwrap(), oldest);
        let r = EventRange::parse(&q(&[("cursor", "7"), ("since", "3"), ("limit", "10")])).unwrap();
        assert_eq!(r, EventRange { since: 7, limit: 10, ..oldest });
        assert_eq!(EventRange::parse(&q(&[("since", "3")])).unwrap().since, 3);
        for (name, bad) in [("cursor", "-1"), ("since", "x"), ("limit", "y"), ("before", "z")] {
            let e = EventRange::parse(&q(&[(name, bad)])).unwrap_err();
            assert_eq!(e.message, format!("{name}: must be a number ≥ 0"));
        }
        let e = EventRange::parse(&q(&[("cursor", "7"), ("since", "x")])).unwrap_err();
        assert_eq!(e.message, "since: must be a number ≥ 0", "a bad since counts even beside a cursor");
        let e = EventRange::parse(&q(&[("limit", "501")])).unwrap_err();
        assert_eq!(e.message, "limit: must be 1–500");
    }

    /// Newest first: a cursor pages back (it is a `before`), `since` still bounds from below.
    #[test]
    fn newest_first_ranges_page_back_with_the_cursor() {
        let newest = EventRange { since: 0, before: None, limit: PAGE, newest_first: true };
        assert_eq!(EventRange::parse(&q(&[("order", "desc")])).unwrap(), newest);
        let r = EventRange::parse(&q(&[("order", "desc"), ("cursor", "40"), ("since", "3")])).unwrap();
        assert_eq!(r, EventRange { since: 3, before: Some(40), ..newest });
        let r = EventRange::parse(&q(&[("order", "desc"), ("before", "9")])).unwrap();
        assert_eq!(r.before, Some(9));
        assert!(!EventRange::parse(&q(&[("order", "asc")])).unwrap().newest_first);
        let e = EventRange::parse(&q(&[("order", "newest")])).unwrap_err();
        assert_eq!(e.message, "order: must be asc or desc");
    }
}
