-- What a node may claim (docs/behaviour.md#what-a-node-may-claim): a join key's allowance,
-- `{"allowedLabels": […], "allowedKinds": […]}` as JSON (NULL: anything, as before), passed
-- to the node it makes, whose own copy an admin may change.
ALTER TABLE join_keys ADD COLUMN allowed TEXT;
ALTER TABLE nodes ADD COLUMN allowed TEXT;
