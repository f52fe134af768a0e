//! An observed report (docs/behaviour.md#desired-state-and-observed-report) once its body is read: strict JSON (`400` naming the
//! field), then the registry; a refused one is counted and logged.

use crate::clock;
use crate::http::app::App;
use crate::http::body::parse_json;
use crate::http::error::ApiError;
use crate::store::{Id, ReportOutcome};
use fleet_api::{validate, ObservedReport};

/// Counts and logs a refused report, and passes the error on.
pub fn rejected(app: &App, node: &Id, e: ApiError) -> ApiError {
    app.metrics.report("rejected");
    tracing::warn!(node = %node, code = e.code, message = %e.message, "observed report rejected (is the node newer than the controller?)");
    e
}

/// Takes a report body for `node`: strict JSON (`400` naming the field), then the registry.
pub fn accept(app: &App, node: &Id, body: &[u8]) -> Result<(), ApiError> {
    let parsed = parse_json::<ObservedReport>(body, false)
        .and_then(|r| validate::observed(&r).map(|()| r).map_err(|e| ApiError::invalid_request(e.to_string())));
    let report = parsed.map_err(|e| rejected(app, node, e))?;
    match app.store.report(node, report, clock::now_ms(), app.offline_after) {
        ReportOutcome::Accepted { changed, was_online } => {
            app.metrics.report("accepted");
            if !was_online {
                tracing::info!(node = %node, "node is online again");
            }
            if changed || !was_online {
                app.kick();
            }
        }
        ReportOutcome::Stale => {
            app.metrics.report("stale");
        }
    }
    Ok(())
}
