-- 0012_gangs: gangs (SPEC §11.6). The members of an all_or_nothing batch share a gang_id; while
-- queued, the gang waits as one queue entry (its first member's, with the members' summed
-- resources) and is granted whole in one transaction (sql/functions/046_gangs.sql).
ALTER TABLE respool.requests ADD COLUMN gang_id uuid;
CREATE INDEX requests_gang_idx ON respool.requests (gang_id, queued_at, id) WHERE gang_id IS NOT NULL;
COMMENT ON COLUMN respool.requests.gang_id IS
    'The gang (all_or_nothing batch, SPEC §11.6) the request belongs to; NULL for a request on its own.';
