-- High availability (SPEC §3.9). The lease: one row, its expiry in the database's clock.
-- Taking it over increments `epoch`; every write of the leader checks holder and epoch in
-- its own transaction (fencing).
CREATE TABLE leader_lease (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    epoch       BIGINT NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL
);

-- What the other replicas follow (SPEC §3.9). Every change of a node row or a desired state
-- notifies its id in the transaction that makes it (delivered at commit, after the row is
-- visible); a node row carries a revision bumped on every change, so a replica that lost its
-- listening connection catches up by comparing (id, rev) and (id, generation) with a query.
ALTER TABLE nodes ADD COLUMN rev BIGINT NOT NULL DEFAULT 0;

CREATE FUNCTION fleet_node_changed() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('fleet_nodes', OLD.id);
        RETURN OLD;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        NEW.rev := OLD.rev + 1;
    END IF;
    PERFORM pg_notify('fleet_nodes', NEW.id);
    RETURN NEW;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER nodes_changed BEFORE INSERT OR UPDATE OR DELETE ON nodes
    FOR EACH ROW EXECUTE FUNCTION fleet_node_changed();

CREATE FUNCTION fleet_desired_changed() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('fleet_desired', OLD.node_id);
        RETURN OLD;
    END IF;
    PERFORM pg_notify('fleet_desired', NEW.node_id);
    RETURN NEW;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER desired_changed AFTER INSERT OR UPDATE OR DELETE ON desired
    FOR EACH ROW EXECUTE FUNCTION fleet_desired_changed();
