-- 0008_queue_lease: queue leases (SPEC §6). A heartbeat on a queued request sets a queue lease
-- (now + N); a queued request whose queue lease lapses is cancelled with reason `abandoned` by the
-- reconciler's step 1, so a waiting client that died keeps no queue place. A queued request that
-- was never heartbeated has no row here and keeps waiting.
--
-- A table of its own, not a column of respool.requests: a heartbeat writes only this row, so it
-- never locks the request row, which allocation passes pick with FOR UPDATE SKIP LOCKED (a locked
-- request is skipped, and a strict queue stops there). For the same reason it has no foreign key
-- (the check would take a KEY SHARE lock on the request row). A row is only honoured while its
-- request is queued on the same attempt; respool._abandon_queue_leases removes the rest.
CREATE TABLE respool.queue_leases (
    request_id uuid PRIMARY KEY,
    attempt    integer NOT NULL CHECK (attempt >= 1),
    expires_at timestamptz NOT NULL
);
CREATE INDEX queue_leases_expires_idx ON respool.queue_leases (expires_at);
COMMENT ON TABLE respool.queue_leases IS
    'Queue leases set by heartbeats on queued requests; a lapsed one cancels its request (reason abandoned).';
COMMENT ON COLUMN respool.queue_leases.request_id IS 'The queued request (no foreign key: see 0008_queue_lease.sql).';
COMMENT ON COLUMN respool.queue_leases.attempt IS 'The attempt the heartbeat was for; a requeued request (attempt + 1) is not bound by it.';
COMMENT ON COLUMN respool.queue_leases.expires_at IS 'When the waiting client is presumed gone unless it heartbeats again.';
