//! Names of the node protocol's routes and headers (docs/behaviour.md#desired-state-and-observed-report), shared by controller, node
//! and simulator so the three cannot drift.

/// Join with a one-time key.
pub const JOIN_PATH: &str = "/api/v1/nodes:join";
/// The long-poll of the two-route protocol.
pub const DESIRED_PATH: &str = "/api/v1/nodes/me/desired";
/// The report of the two-route protocol.
pub const OBSERVED_PATH: &str = "/api/v1/nodes/me/observed";
/// One request that carries the observed report and is held like the long-poll: a node on it
/// keeps a single connection to the controller.
pub const EXCHANGE_PATH: &str = "/api/v1/nodes/me/exchange";
/// Sent by a controller that serves [`EXCHANGE_PATH`] on every node-route answer (join,
/// desired, observed, exchange); the value is the path. A node switches to the exchange when
/// it sees it, and older nodes ignore it.
pub const EXCHANGE_HEADER: &str = "fleet-node-exchange";
