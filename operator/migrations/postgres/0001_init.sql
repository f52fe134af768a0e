-- Fleet controller store, PostgreSQL (SPEC §3.9): the tables of the SQLite store with
-- PostgreSQL's types. Secrets appear only as hashes (join keys, node tokens) or as
-- ciphertext sealed to a node (PATs).
CREATE TABLE join_keys (
    hash        BYTEA PRIMARY KEY,
    expires_ms  BIGINT NOT NULL,
    used_ms     BIGINT,
    note        TEXT NOT NULL DEFAULT '',
    created_ms  BIGINT NOT NULL
);

CREATE TABLE nodes (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    token_hash  BYTEA NOT NULL UNIQUE,
    public_key  BYTEA NOT NULL,
    joined_ms   BIGINT NOT NULL,
    last_seen_ms BIGINT NOT NULL,
    info        TEXT NOT NULL
);

CREATE TABLE placements (
    agent_key   TEXT NOT NULL,
    replica     BIGINT NOT NULL,
    node_id     TEXT NOT NULL,
    PRIMARY KEY (agent_key, replica)
);

CREATE TABLE identities (
    agent_key    TEXT PRIMARY KEY,
    principal_id TEXT NOT NULL,
    bound        BOOLEAN NOT NULL DEFAULT false
);

-- Per (agent, node) PAT counter: `pending_n` is written before the IAM call, so a retry
-- after a crash replays the same Idempotency-Key instead of minting a second PAT.
CREATE TABLE pat_pairs (
    agent_key   TEXT NOT NULL,
    node_id     TEXT NOT NULL,
    next_n      BIGINT NOT NULL,
    pending_n   BIGINT,
    PRIMARY KEY (agent_key, node_id)
);

CREATE TABLE credentials (
    id          TEXT PRIMARY KEY,
    agent_key   TEXT NOT NULL,
    node_id     TEXT NOT NULL,
    n           BIGINT NOT NULL,
    principal_id TEXT NOT NULL,
    ciphertext  TEXT NOT NULL,
    expires_ms  BIGINT NOT NULL,
    issued_ms   BIGINT NOT NULL,
    revoke_ms   BIGINT
);

CREATE TABLE desired (
    node_id     TEXT PRIMARY KEY,
    generation  BIGINT NOT NULL,
    agents      TEXT NOT NULL
);

CREATE TABLE statuses (
    agent_key   TEXT PRIMARY KEY,
    body        TEXT NOT NULL
);

CREATE TABLE kv (
    key         TEXT PRIMARY KEY,
    value       TEXT NOT NULL
);
