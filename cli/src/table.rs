//! Tables as kubectl prints them: an upper-case header, columns padded to their widest cell
//! and separated by three spaces, no borders.

pub struct Table {
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&'static str]) -> Table {
        Table { header: header.to_vec(), rows: Vec::new() }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cells: Vec<&str>| {
            let last = cells.len().saturating_sub(1);
            let mut out = String::new();
            for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
                out.push_str(c);
                if i < last {
                    out.push_str(&" ".repeat(w - c.chars().count() + 3));
                }
            }
            out.trim_end().to_string() + "\n"
        };
        let mut out = line(self.header.clone());
        for r in &self.rows {
            out.push_str(&line(r.iter().map(String::as_str).collect()));
        }
        out
    }
}

/// `-` for nothing, like kubectl's `<none>` but shorter.
pub fn or_dash(s: Option<impl ToString>) -> String {
    s.map(|v| v.to_string()).filter(|v| !v.is_empty()).unwrap_or_else(|| "-".into())
}

/// How long ago an RFC 3339 instant was: `45s`, `12m`, `3h`, `2d`.
pub fn age(rfc3339: &str, now: time::OffsetDateTime) -> String {
    let Ok(t) = time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339) else {
        return "?".into();
    };
    let s = (now - t).whole_seconds().max(0);
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_padded_to_the_widest_cell() {
        let mut t = Table::new(&["NAME", "STATUS"]);
        t.row(vec!["n-1".into(), "online".into()]);
        t.row(vec!["node-long".into(), "offline".into()]);
        assert_eq!(t.render(), "NAME        STATUS\nn-1         online\nnode-long   offline\n");
    }

    #[test]
    fn ages_read_in_the_unit_that_fits() {
        let now = time::OffsetDateTime::parse("2026-12-01T12:00:00Z", &time::format_description::well_known::Rfc3339)
            .unwrap();
        assert_eq!(age("2026-12-01T11:59:15.000Z", now), "45s");
        assert_eq!(age("2026-12-01T11:48:00Z", now), "12m");
        assert_eq!(age("2026-12-01T09:00:00Z", now), "3h");
        assert_eq!(age("2026-11-28T12:00:00Z", now), "3d");
        assert_eq!(age("yesterday", now), "?");
        assert_eq!(or_dash(None::<String>), "-");
    }
}
