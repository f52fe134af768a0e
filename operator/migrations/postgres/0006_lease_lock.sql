-- Fast takeover (docs/behaviour.md#high-availability). The leader also holds a session
-- advisory lock on a connection of its own, which PostgreSQL releases the moment that session
-- ends; `lock_pid` is that session's backend and `lock_epoch` the epoch it was taken for. A
-- replica that gets the lock may take over a lease whose current epoch recorded a lock (its
-- holder can only have lost it) without waiting for expiry; a holder that recorded none (an
-- older version) is waited out as before.
ALTER TABLE leader_lease ADD COLUMN lock_pid INTEGER;
ALTER TABLE leader_lease ADD COLUMN lock_epoch BIGINT;
