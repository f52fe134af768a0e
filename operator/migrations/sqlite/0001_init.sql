-- Fleet controller store. Secrets appear only as hashes (join keys, node tokens) or as
-- ciphertext sealed to a node (PATs).
CREATE TABLE join_keys (
    hash        BLOB PRIMARY KEY,
    expires_ms  INTEGER NOT NULL,
    used_ms     INTEGER,
    note        TEXT NOT NULL DEFAULT '',
    created_ms  INTEGER NOT NULL
);

CREATE TABLE nodes (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    token_hash  BLOB NOT NULL UNIQUE,
    public_key  BLOB NOT NULL,
    joined_ms   INTEGER NOT NULL,
    last_seen_ms INTEGER NOT NULL,
    info        TEXT NOT NULL
);

CREATE TABLE placements (
    agent_key   TEXT NOT NULL,
    replica     INTEGER NOT NULL,
    node_id     TEXT NOT NULL,
    PRIMARY KEY (agent_key, replica)
);

CREATE TABLE identities (
    agent_key    TEXT PRIMARY KEY,
    principal_id TEXT NOT NULL,
    bound        INTEGER NOT NULL DEFAULT 0
);

-- Per (agent, node) PAT counter: `pending_n` is written before the IAM call, so a retry
-- after a crash replays the same Idempotency-Key instead of minting a second PAT.
CREATE TABLE pat_pairs (
    agent_key   TEXT NOT NULL,
    node_id     TEXT NOT NULL,
    next_n      INTEGER NOT NULL,
    pending_n   INTEGER,
    PRIMARY KEY (agent_key, node_id)
);

CREATE TABLE credentials (
    id          TEXT PRIMARY KEY,
    agent_key   TEXT NOT NULL,
    node_id     TEXT NOT NULL,
    n           INTEGER NOT NULL,
    principal_id TEXT NOT NULL,
    ciphertext  TEXT NOT NULL,
    expires_ms  INTEGER NOT NULL,
    issued_ms   INTEGER NOT NULL,
    revoke_ms   INTEGER
);

CREATE TABLE desired (
    node_id     TEXT PRIMARY KEY,
    generation  INTEGER NOT NULL,
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
