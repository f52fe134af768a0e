//! Joining the fleet (docs/behaviour.md#joining-and-the-state-directory): the identity saved in the state dir when the node has
//! joined, else a join with the one-time key of `joinKeyFile`, retried until the controller
//! answers and given up when it refuses.

use super::announce::join_request;
use super::fatal::{Fatal, NOT_JOINED};
use crate::client::{retry_delay, Client, ClientError};
use crate::config::NodeConfig;
use crate::state::{Identity, StateDir};

/// The node's identity: the saved one, else the one a join gets.
pub(super) async fn identity(cfg: &NodeConfig, state: &StateDir, client: &Client) -> Result<Identity, Fatal> {
    match state.identity()? {
        Some(i) => Ok(i),
        None => join(cfg, state, client).await,
    }
}

async fn join(cfg: &NodeConfig, state: &StateDir, client: &Client) -> Result<Identity, Fatal> {
    let Some(key_file) = &cfg.join_key_file else {
        return Err(Fatal(NOT_JOINED.into()));
    };
    let key = std::fs::read_to_string(key_file)
        .map_err(|e| Fatal(format!("joinKeyFile {}: {e}", key_file.display())))?
        .trim()
        .to_string();
    let secret_key = saved_or_new_secret_key(state)?;
    let public_key = fleet_api::seal::public_of(&secret_key);
    let req = join_request(cfg, &key, &public_key);
    let mut attempt = 0;
    loop {
        match client.join(&req).await {
            Ok(resp) => {
                state.save_identity(&resp.node_id, &resp.node_token)?;
                tracing::info!("joined the fleet as {}", resp.node_id);
                return Ok(Identity { node_id: resp.node_id, token: resp.node_token, secret_key, public_key });
            }
            Err(ClientError::Unauthorized(m) | ClientError::BadRequest(m) | ClientError::Conflict(m)) => {
                return Err(Fatal(format!("the controller refused the join: {m}")));
            }
            Err(e) => {
                let d = retry_delay(attempt);
                tracing::warn!(error = %e, retry_in = ?d, "cannot join yet");
                tokio::time::sleep(d).await;
                attempt += 1;
            }
        }
    }
}

/// The secret key the join announces: the saved one, else a fresh pair saved before joining,
/// so that a crash after the join keeps the key the controller seals to.
fn saved_or_new_secret_key(state: &StateDir) -> Result<[u8; 32], Fatal> {
    if let Some(k) = state.saved_secret_key()? {
        return Ok(k);
    }
    let (sk, _) = fleet_api::seal::generate_keypair();
    state.save_keys(&sk)?;
    Ok(sk)
}
