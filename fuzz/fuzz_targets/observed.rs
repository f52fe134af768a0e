//! The controller's observed-report decoder and validation (`PUT /api/v1/nodes/me/observed`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = serde_json::from_slice::<fleet_api::ObservedReport>(data) {
        if fleet_api::validate::observed(&r).is_ok() {
            // What validation accepts round-trips through the wire format unchanged.
            let again = serde_json::to_vec(&r).unwrap();
            let back: fleet_api::ObservedReport = serde_json::from_slice(&again).unwrap();
            assert_eq!(back, r);
        }
    }
    if let Ok(j) = serde_json::from_slice::<fleet_api::JoinRequest>(data) {
        let _ = fleet_api::validate::join(&j);
    }
});
