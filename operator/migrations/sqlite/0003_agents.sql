-- The CP's agent list as last read, one row an agent (SPEC §3.5): a change of the list writes
-- the agents that changed, not the whole list as one `kv` value (20,000 agents were ~8 MB of
-- JSON, held three times while it was written). The old value is moved here.
CREATE TABLE agents (
    key   TEXT PRIMARY KEY,
    body  TEXT NOT NULL
);

INSERT OR REPLACE INTO agents (key, body)
    SELECT json_extract(e.value, '$.key'), e.value
    FROM kv, json_each(CASE WHEN json_valid(kv.value) AND json_type(kv.value) = 'array' THEN kv.value ELSE '[]' END) AS e
    WHERE kv.key = 'agents' AND e.type = 'object' AND json_type(e.value, '$.key') = 'text';

DELETE FROM kv WHERE key = 'agents';
