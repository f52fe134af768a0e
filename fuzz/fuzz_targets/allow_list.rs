//! The image allow-list (docs/behaviour.md#images-an-agent-may-name): patterns and references from arbitrary text. The first
//! line is the reference, the rest are allow-list entries.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let mut lines = text.lines();
        let reference = lines.next().unwrap_or("");
        let entries: Vec<&str> = lines.collect();
        let _ = fleet_api::images::is_reference(reference);
        let loose = fleet_api::images::admits(&entries, reference);
        if let Ok(list) = fleet_api::images::AllowList::parse(&entries) {
            // A parsed list and the one-shot matcher agree.
            assert_eq!(list.admits(reference), loose, "{entries:?} vs {reference:?}");
        }
    }
});
