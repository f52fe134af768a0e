-- High availability (SPEC §3.9). The lease: one row, its expiry in the database's clock.
-- Taking it over increments `epoch`; every write of the leader checks holder and epoch in
-- its own transaction (fencing).
CREATE TABLE leader_lease (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    epoch       BIGINT NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL,
    -- Where the holder's API is: followers send it what only the leader answers.
    url         TEXT NOT NULL DEFAULT ''
);

-- What the other replicas follow (SPEC §3.9). Every change of a node row or a desired state
-- notifies `<id> <replica>` in the transaction that makes it (delivered at commit, after the
-- row is visible); `<replica>` is the writer's `fleet.replica` setting, so a replica skips
-- its own changes. A replica whose listening connection was lost catches up with a query.
CREATE FUNCTION fleet_notify_change() RETURNS trigger AS $$
DECLARE
    id TEXT;
BEGIN
    IF TG_TABLE_NAME = 'nodes' THEN
        id := CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END;
    ELSE
        id := CASE WHEN TG_OP = 'DELETE' THEN OLD.node_id ELSE NEW.node_id END;
    END IF;
    PERFORM pg_notify('fleet_' || TG_TABLE_NAME, id || ' ' || coalesce(current_setting('fleet.replica', true), ''));
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER nodes_changed AFTER INSERT OR UPDATE OR DELETE ON nodes
    FOR EACH ROW EXECUTE FUNCTION fleet_notify_change();
CREATE TRIGGER desired_changed AFTER INSERT OR UPDATE OR DELETE ON desired
    FOR EACH ROW EXECUTE FUNCTION fleet_notify_change();
