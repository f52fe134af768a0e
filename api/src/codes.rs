//! Error codes and the user-facing strings SPEC quotes, in one place so tests can assert them.

pub const NOT_CONFIGURED: &str = "not_configured";
pub const INVALID_TOKEN: &str = "invalid_token";
pub const INSUFFICIENT_SCOPE: &str = "insufficient_scope";
pub const NODE_TOKEN_INVALID: &str = "node_token_invalid";
pub const INVALID_REQUEST: &str = "invalid_request";
pub const PAYLOAD_TOO_LARGE: &str = "payload_too_large";
pub const TOO_MANY_REQUESTS: &str = "too_many_requests";
pub const NOT_FOUND: &str = "not_found";
pub const JOIN_KEY_INVALID: &str = "join_key_invalid";
pub const NODE_NAME_TAKEN: &str = "node_name_taken";
pub const INTERNAL: &str = "internal";
pub const NOT_READY: &str = "not_ready";

/// Reasons an agent waits for a node (§5.1), in the order the filters apply.
pub const NO_NODE: &str = "no_node";
pub const NO_EXECUTOR_KIND: &str = "no_executor_kind";
pub const IMAGE_NOT_ALLOWED: &str = "image_not_allowed";
pub const NO_LABEL: &str = "no_label";
pub const NO_SECRET: &str = "no_secret";
pub const NO_CAPACITY: &str = "no_capacity";
pub const NODE_UNAVAILABLE: &str = "node_unavailable";
pub const IDENTITY_PENDING: &str = "identity_pending";
