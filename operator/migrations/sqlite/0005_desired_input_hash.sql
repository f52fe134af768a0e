-- The hash of what each desired body was built from (docs/behaviour.md#high-availability):
-- a restarted controller builds again only the bodies whose inputs changed. A row without one
-- is built again.
ALTER TABLE desired ADD COLUMN input_hash INTEGER;
