-- The CP's agent list as last read, one row an agent (SPEC §3.5): a change of the list writes
-- the agents that changed, not the whole list as one `kv` value (20,000 agents were ~8 MB of
-- JSON, held three times while it was written). The old value is moved here.
CREATE TABLE agents (
    key   TEXT PRIMARY KEY,
    body  TEXT NOT NULL
);

INSERT INTO agents (key, body)
    SELECT e->>'key', e::text
    FROM (SELECT value FROM kv WHERE key = 'agents') AS old,
        json_array_elements(CASE WHEN json_typeof(old.value::json) = 'array' THEN old.value::json ELSE '[]'::json END) AS e
    WHERE json_typeof(e) = 'object' AND json_typeof(e->'key') = 'string'
    ON CONFLICT (key) DO NOTHING;

DELETE FROM kv WHERE key = 'agents';
