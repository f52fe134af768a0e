//! Maintenance windows (docs/behaviour.md#maintenance-windows): when a voluntary disruption may
//! start. A window is a five-field cron schedule of its starts (`*/5 * * * *`), a duration, and
//! the IANA time zone the schedule reads in; an agent (`placement.rollout.windows`) and a node
//! (node.yaml `maintenanceWindows`) may each name several, and a disruption starts only inside
//! one of each that names any. Daylight-saving changes are the libraries' (croner for the
//! schedule, chrono-tz for the zone, with its own copy of the zone database): a start that
//! falls in a skipped hour fires at the first minute after it, one in a repeated hour fires
//! once, at its first occurrence.

use serde::{Deserialize, Serialize};
use std::str::FromStr;
use utoipa::ToSchema;

/// At most this many windows an agent or a node names.
pub const MAX_WINDOWS: usize = 16;
/// A window lasts at least a minute and at most a week.
pub const MAX_DURATION_MINUTES: u32 = 7 * 24 * 60;
/// A schedule must start a window within this many days of any moment (a schedule that fires on
/// the 30th of February would hold every disruption for ever).
pub const MAX_GAP_DAYS: i64 = 400;

/// A window as written: `{"schedule": "0 2 * * 6", "durationMinutes": 120, "timeZone": "Europe/Paris"}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MaintenanceWindow {
    pub schedule: String,
    pub duration_minutes: u32,
    pub time_zone: String,
}

/// A window read: its schedule and zone parsed once.
#[derive(Debug, Clone)]
pub struct Window {
    schedule: croner::Cron,
    zone: chrono_tz::Tz,
    duration_ms: i64,
}

/// Whether the windows let a disruption start now, and when that changes (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Openness {
    /// Inside a window that closes then.
    Open { closes_ms: i64 },
    /// Outside every window; the next opens then.
    Closed { opens_ms: i64 },
}

impl Window {
    /// Reads a window, or says what is wrong with it, naming the field.
    pub fn parse(w: &MaintenanceWindow) -> Result<Window, String> {
        let fields: Vec<&str> = w.schedule.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(format!("schedule {:?} is not five cron fields (minute hour day month weekday)", w.schedule));
        }
        let schedule = croner::Cron::from_str(&fields.join(" "))
            .map_err(|e| format!("schedule {:?} is not a cron schedule: {e}", w.schedule))?;
        let zone = chrono_tz::Tz::from_str(&w.time_zone)
            .map_err(|_| format!("timeZone {:?} is not an IANA time zone (Europe/Paris, UTC, …)", w.time_zone))?;
        if !(1..=MAX_DURATION_MINUTES).contains(&w.duration_minutes) {
            return Err(format!("durationMinutes {} must be 1…{MAX_DURATION_MINUTES}", w.duration_minutes));
        }
        let window = Window { schedule, zone, duration_ms: i64::from(w.duration_minutes) * 60_000 };
        window.first_start_after(0).ok_or_else(|| format!("schedule {:?} never starts a window", w.schedule))?;
        Ok(window)
    }

    /// The first start strictly after `ms`, if within [`MAX_GAP_DAYS`].
    fn first_start_after(&self, ms: i64) -> Option<i64> {
        use chrono::TimeZone;
        let at = self.zone.timestamp_millis_opt(ms).single()?;
        let next = self.schedule.find_next_occurrence(&at, false).ok()?.timestamp_millis();
        (next - ms <= MAX_GAP_DAYS * 86_400_000).then_some(next)
    }

    /// This window's state at `now_ms`.
    pub fn at(&self, now_ms: i64) -> Openness {
        // A start within the last `duration` (or exactly now) means inside it.
        if let Some(start) = self.first_start_after(now_ms - self.duration_ms).filter(|s| *s <= now_ms) {
            return Openness::Open { closes_ms: start + self.duration_ms };
        }
        Openness::Closed { opens_ms: self.first_start_after(now_ms).unwrap_or(i64::MAX) }
    }
}

/// Reads every window of a list, naming the first bad one by its index (`windows[1].timeZone …`).
pub fn parse_all(list: &[MaintenanceWindow], field: &str) -> Result<Vec<Window>, String> {
    if list.len() > MAX_WINDOWS {
        return Err(format!("{field}: at most {MAX_WINDOWS} windows"));
    }
    list.iter().enumerate().map(|(i, w)| Window::parse(w).map_err(|e| format!("{field}[{i}]: {e}"))).collect()
}

/// Whether a disruption may start at `now_ms` under `windows` (none named: always), and when
/// that changes: open while any window is, closed until the next opens.
pub fn openness(windows: &[Window], now_ms: i64) -> Openness {
    if windows.is_empty() {
        return Openness::Open { closes_ms: i64::MAX };
    }
    let states: Vec<Openness> = windows.iter().map(|w| w.at(now_ms)).collect();
    let latest_close = states.iter().filter_map(|s| match s {
        Openness::Open { closes_ms } => Some(*closes_ms),
        Openness::Closed { .. } => None,
    });
    if let Some(closes_ms) = latest_close.max() {
        return Openness::Open { closes_ms };
    }
    let soonest = states.iter().filter_map(|s| match s {
        Openness::Closed { opens_ms } => Some(*opens_ms),
        Openness::Open { .. } => None,
    });
    Openness::Closed { opens_ms: soonest.min().unwrap_or(i64::MAX) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(schedule: &str, minutes: u32, zone: &str) -> Window {
        Window::parse(&MaintenanceWindow {
            schedule: schedule.into(),
            duration_minutes: minutes,
            time_zone: zone.into(),
        })
        .unwrap()
    }

    fn ms(rfc3339: &str) -> i64 {
        chrono::DateTime::parse_from_rfc3339(rfc3339).unwrap().timestamp_millis()
    }

    #[test]
    fn a_window_is_open_from_each_start_for_its_duration() {
        let w = window("*/5 * * * *", 2, "Europe/Paris");
        assert_eq!(w.at(ms("2026-12-07T12:00:00Z")), Openness::Open { closes_ms: ms("2026-12-07T12:02:00Z") });
        assert_eq!(w.at(ms("2026-12-07T12:01:59Z")), Openness::Open { closes_ms: ms("2026-12-07T12:02:00Z") });
        assert_eq!(w.at(ms("2026-12-07T12:02:00Z")), Openness::Closed { opens_ms: ms("2026-12-07T12:05:00Z") });
        assert_eq!(w.at(ms("2026-12-07T12:04:30Z")), Openness::Closed { opens_ms: ms("2026-12-07T12:05:00Z") });
    }

    /// Paris springs forward on 2026-03-29 at 02:00 (to 03:00) and falls back on 2026-10-25 at
    /// 03:00 (to 02:00): a window at 02:30 local opens at 03:00 the day that hour is skipped,
    /// and once the day it is repeated — wherever the look starts from.
    #[test]
    fn a_window_across_a_daylight_saving_change() {
        let w = window("30 2 * * *", 60, "Europe/Paris");
        // The day before: 02:30 CET is 01:30 UTC.
        assert_eq!(w.at(ms("2026-03-28T01:00:00Z")), Openness::Closed { opens_ms: ms("2026-03-28T01:30:00Z") });
        // The skipped hour: 02:30 does not exist; the window opens at 03:00 CEST, 01:00 UTC,
        // whether looked at from the day before or the same night.
        for from in ["2026-03-28T12:00:00Z", "2026-03-28T23:00:00Z", "2026-03-29T00:30:00Z"] {
            assert_eq!(w.at(ms(from)), Openness::Closed { opens_ms: ms("2026-03-29T01:00:00Z") }, "{from}");
        }
        assert_eq!(w.at(ms("2026-03-29T01:59:00Z")), Openness::Open { closes_ms: ms("2026-03-29T02:00:00Z") });
        // The day after, in summer time: 02:30 CEST is 00:30 UTC.
        assert_eq!(w.at(ms("2026-03-29T23:00:00Z")), Openness::Closed { opens_ms: ms("2026-03-30T00:30:00Z") });
        // The repeated hour: 02:30 comes twice (CEST 00:30 UTC, CET 01:30 UTC); the window
        // opens once, at the first.
        assert_eq!(w.at(ms("2026-10-24T23:00:00Z")), Openness::Closed { opens_ms: ms("2026-10-25T00:30:00Z") });
        assert_eq!(w.at(ms("2026-10-25T01:00:00Z")), Openness::Open { closes_ms: ms("2026-10-25T01:30:00Z") });
        assert_eq!(w.at(ms("2026-10-25T01:45:00Z")), Openness::Closed { opens_ms: ms("2026-10-26T01:30:00Z") });
    }

    #[test]
    fn several_windows_open_together_and_none_means_always() {
        let a = window("0 2 * * *", 60, "UTC");
        let b = window("30 2 * * *", 60, "UTC");
        assert_eq!(openness(&[], 0), Openness::Open { closes_ms: i64::MAX });
        assert_eq!(
            openness(&[a.clone(), b.clone()], ms("2026-12-07T02:45:00Z")),
            Openness::Open { closes_ms: ms("2026-12-07T03:30:00Z") }
        );
        assert_eq!(
            openness(&[a, b], ms("2026-12-07T04:00:00Z")),
            Openness::Closed { opens_ms: ms("2026-12-08T02:00:00Z") }
        );
    }

    #[test]
    fn a_bad_window_is_named_with_its_field() {
        let bad = |schedule: &str, minutes: u32, zone: &str| {
            let w = MaintenanceWindow { schedule: schedule.into(), duration_minutes: minutes, time_zone: zone.into() };
            parse_all(&[w], "placement.rollout.windows").unwrap_err()
        };
        assert!(bad("* * * *", 5, "UTC").contains("is not five cron fields"), "{}", bad("* * * *", 5, "UTC"));
        assert!(bad("61 * * * *", 5, "UTC").contains("is not a cron schedule"));
        assert!(bad("0 2 * * *", 5, "Mars/Olympus").starts_with("placement.rollout.windows[0]: timeZone"));
        assert!(bad("0 2 * * *", 0, "UTC").contains("durationMinutes 0 must be"));
        assert!(bad("0 0 30 2 *", 60, "UTC").contains("never starts a window"), "{}", bad("0 0 30 2 *", 60, "UTC"));
    }
}
