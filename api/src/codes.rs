//! Error codes and the user-facing strings the docs quote (docs/reference.md#error-codes), in one place so tests can assert them.

pub const NOT_CONFIGURED: &str = "not_configured";
pub const INVALID_TOKEN: &str = "invalid_token";
pub const INSUFFICIENT_SCOPE: &str = "insufficient_scope";
pub const NODE_TOKEN_INVALID: &str = "node_token_invalid";
/// [ext] A node token the store neither knows nor deleted: its store is older than the node
/// (docs/behaviour.md#a-store-older-than-the-fleet). The node keeps running on its last
/// desired state.
pub const NODE_UNKNOWN: &str = "node_unknown";
/// What a node whose token the store does not know is told: the cause and the fix.
pub const NODE_UNKNOWN_MESSAGE: &str =
    "this controller's store does not know this node: it was restored from a backup \
taken before the node joined (or the node belongs to another fleet); the node keeps running its last desired state — \
join it again with a new join key (docs/operations.md#a-node-that-joined-after-the-backup)";
pub const INVALID_REQUEST: &str = "invalid_request";
pub const PAYLOAD_TOO_LARGE: &str = "payload_too_large";
pub const TOO_MANY_REQUESTS: &str = "too_many_requests";
pub const NOT_FOUND: &str = "not_found";
pub const JOIN_KEY_INVALID: &str = "join_key_invalid";
pub const NODE_NAME_TAKEN: &str = "node_name_taken";
pub const INTERNAL: &str = "internal";
pub const NOT_READY: &str = "not_ready";
pub const METHOD_NOT_ALLOWED: &str = "method_not_allowed";
pub const REQUEST_TIMEOUT: &str = "request_timeout";
/// `rollout:undo` of an agent that never completed a rollout (docs/behaviour.md#rolling-out-a-change).
pub const NO_PREVIOUS_TEMPLATE: &str = "no_previous_template";

/// Reasons an agent waits for a node (docs/behaviour.md#placement), in the order the filters apply.
pub const NO_NODE: &str = "no_node";
/// [ext] Every online node is cordoned or draining (docs/behaviour.md#node-lifecycle).
pub const NO_SCHEDULABLE_NODE: &str = "no_schedulable_node";
pub const NO_EXECUTOR_KIND: &str = "no_executor_kind";
pub const IMAGE_NOT_ALLOWED: &str = "image_not_allowed";
pub const NO_LABEL: &str = "no_label";
pub const NO_SECRET: &str = "no_secret";
pub const NO_CAPACITY: &str = "no_capacity";
/// [ext] A replica of higher priority took the replica's room (docs/behaviour.md#spread-and-priority).
pub const PREEMPTED: &str = "preempted";
pub const NODE_UNAVAILABLE: &str = "node_unavailable";
pub const IDENTITY_PENDING: &str = "identity_pending";

/// Why a node did not run a replica (docs/behaviour.md#container-rules): the node's messages, and the code the
/// controller shows for each in the agent's phase (docs/behaviour.md#agent-status rule 7). Both programs use these, so
/// the texts cannot drift apart.
pub mod refusal {
    pub const SECRET_MISSING: &str = "secret_missing";
    /// A secret outside its kind's `executors.<k>.secrets` (docs/behaviour.md#secrets).
    pub const SECRET_NOT_ALLOWED: &str = "secret_not_allowed";
    pub const CREDENTIAL_UNREADABLE: &str = "credential_unreadable";
    pub const EXECUTOR_KIND_MISSING: &str = "executor_kind_missing";
    pub const START_FAILED: &str = "start_failed";

    pub const CREDENTIAL_UNOPENABLE: &str = "credential cannot be opened with this node's key";
    pub const START_FAILED_PREFIX: &str = "start failed: ";
    /// [ext] With `checkBeforeStop`, the node kept the old container running because the new
    /// template cannot start (docs/behaviour.md#rolling-out-a-change).
    pub const UPDATE_BLOCKED: &str = "update_blocked";

    pub fn update_blocked(cause: &str) -> String {
        format!("{UPDATE_BLOCKED}: {cause}")
    }

    pub fn image_not_allowed(image: &str, kind: &str) -> String {
        format!("{}: image {image} is not allowed for executor kind {kind}", super::IMAGE_NOT_ALLOWED)
    }

    pub fn secret_missing(secret: &str) -> String {
        format!("secret {secret} is missing on this node")
    }

    pub fn secret_not_allowed(secret: &str, kind: &str) -> String {
        format!("{SECRET_NOT_ALLOWED}: secret {secret} is not offered to executor kind {kind} on this node")
    }

    pub fn executor_kind_missing(kind: &str) -> String {
        format!("executor kind {kind} is not configured on this node")
    }

    pub fn start_failed(docker_message: &str) -> String {
        format!("{START_FAILED_PREFIX}{docker_message}")
    }

    /// The code of a node's refusal message, if it is one.
    pub fn code_of(message: &str) -> Option<&'static str> {
        if message.starts_with(&format!("{}: ", super::IMAGE_NOT_ALLOWED)) {
            Some(super::IMAGE_NOT_ALLOWED)
        } else if message.starts_with(&format!("{SECRET_NOT_ALLOWED}: ")) {
            Some(SECRET_NOT_ALLOWED)
        } else if message.starts_with("secret ") && message.ends_with(" is missing on this node") {
            Some(SECRET_MISSING)
        } else if message == CREDENTIAL_UNOPENABLE || message.starts_with("cannot write the PAT") {
            Some(CREDENTIAL_UNREADABLE)
        } else if message.starts_with("executor kind ") && message.ends_with(" is not configured on this node") {
            Some(EXECUTOR_KIND_MISSING)
        } else if message.starts_with(START_FAILED_PREFIX) {
            Some(START_FAILED)
        } else if message.starts_with(&format!("{UPDATE_BLOCKED}: ")) {
            Some(UPDATE_BLOCKED)
        } else {
            None
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn every_refusal_message_maps_back_to_its_code() {
            assert_eq!(code_of(&image_not_allowed("x:1", "k")), Some("image_not_allowed"));
            assert_eq!(code_of(&secret_missing("gh")), Some(SECRET_MISSING));
            assert_eq!(code_of(&secret_not_allowed("gh", "k")), Some(SECRET_NOT_ALLOWED));
            assert_eq!(code_of(CREDENTIAL_UNOPENABLE), Some(CREDENTIAL_UNREADABLE));
            assert_eq!(code_of(&executor_kind_missing("k")), Some(EXECUTOR_KIND_MISSING));
            assert_eq!(code_of(&start_failed("No such image: a:1")), Some(START_FAILED));
            assert_eq!(code_of(&update_blocked("No such image: a:2")), Some(UPDATE_BLOCKED));
            assert_eq!(code_of("exited with code 1"), None);
        }
    }
}
