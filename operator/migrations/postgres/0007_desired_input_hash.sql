-- The hash of what each desired body was built from (docs/behaviour.md#high-availability):
-- a new leader builds again only the bodies whose inputs changed. A row without one is built
-- again. Setting only the hash changes nothing a node is served, so it notifies no replica.
ALTER TABLE desired ADD COLUMN input_hash BIGINT;
DROP TRIGGER desired_changed ON desired;
CREATE TRIGGER desired_changed AFTER INSERT OR DELETE OR UPDATE OF generation, agents ON desired
    FOR EACH ROW EXECUTE FUNCTION fleet_notify_change();
