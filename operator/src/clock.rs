//! Wall-clock helpers: the store keeps Unix milliseconds; the wire shows RFC 3339.

use std::time::{SystemTime, UNIX_EPOCH};

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

pub fn rfc3339_ms(ms: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    t.replace_nanosecond(0).unwrap_or(t).format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

/// RFC 3339 in UTC with milliseconds, always three digits (`2026-12-07T18:00:00.120Z`): for
/// instants a client compares with each other, where a whole second is too coarse.
pub fn rfc3339_millis(ms: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    Some((t.unix_timestamp_nanos() / 1_000_000) as i64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip() {
        let s = super::rfc3339_ms(1_700_000_000_123);
        assert_eq!(s, "2023-11-14T22:13:20Z");
        assert_eq!(super::parse_rfc3339_ms(&s), Some(1_700_000_000_000));
        let precise = super::rfc3339_millis(1_700_000_000_120);
        assert_eq!(precise, "2023-11-14T22:13:20.120Z");
        assert_eq!(super::parse_rfc3339_ms(&precise), Some(1_700_000_000_120));
    }
}
