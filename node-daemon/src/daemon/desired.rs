//! The desired state as it passes from the link to the converge loop: its decoder, the watch
//! channel that carries it, and the copy saved in `desired.json` that the node applies at
//! start before the controller answers.

use super::fatal::Fatal;
use crate::state::StateDir;
use fleet_api::DesiredState;
use std::sync::Arc;
use tokio::sync::watch;

/// The newest desired state, `None` until one is known.
pub(super) type DesiredTx = watch::Sender<Option<Arc<DesiredState>>>;
pub(super) type DesiredRx = watch::Receiver<Option<Arc<DesiredState>>>;

/// The desired-state decoder: public for the fuzz target.
pub fn parse_desired(bytes: &[u8]) -> Result<DesiredState, String> {
    serde_json::from_slice(bytes).map_err(|e| e.to_string())
}

/// The saved desired state, or `None` when there is none or it cannot be read (the node then
/// waits for the controller).
pub(super) fn saved(state: &StateDir) -> Result<Option<Arc<DesiredState>>, Fatal> {
    let Some(text) = state.desired()? else { return Ok(None) };
    match parse_desired(text.as_bytes()) {
        Ok(d) => {
            tracing::info!(generation = d.generation, agents = d.agents.len(), "applying the saved desired state");
            Ok(Some(Arc::new(d)))
        }
        Err(e) => {
            tracing::error!(error = %e, "the saved desired.json is unreadable; waiting for the controller");
            Ok(None)
        }
    }
}
