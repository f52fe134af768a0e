-- Day-two operations (SPEC §10): a node's cordon and drain, the node a join key made (so a
-- join whose `201` was lost can be answered again), and the event history.
ALTER TABLE nodes ADD COLUMN cordoned INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN drain_started_ms INTEGER;
ALTER TABLE nodes ADD COLUMN drain_force INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN drain_done_ms INTEGER;
ALTER TABLE join_keys ADD COLUMN node_id TEXT;

CREATE TABLE events (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms       INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    agent_key   TEXT,
    node_id     TEXT,
    node        TEXT,
    replica     INTEGER,
    message     TEXT NOT NULL
);
CREATE INDEX events_agent ON events (agent_key, seq);
CREATE INDEX events_node ON events (node_id, seq);
