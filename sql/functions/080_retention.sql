-- Retention (RESPOOL_RETENTION, docs/ops.md; `respool request prune --older-than`): delete terminal
-- requests and their history. Live requests (queued, allocated, preempting) are never touched.

CREATE OR REPLACE FUNCTION respool.prune_requests(p_before timestamptz, p_limit integer DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    deleted integer;
BEGIN
    IF p_before IS NULL THEN
        PERFORM respool._fail('RP400', 'before', 'before must be a timestamp');
    END IF;
    IF p_limit IS NOT NULL AND p_limit < 1 THEN
        PERFORM respool._fail('RP400', 'limit', 'limit must be at least 1 (or NULL for no limit)');
    END IF;
    -- Oldest first (requests_finished_idx); a row another transaction holds (a late release or
    -- cancel of a terminal request, a concurrent prune) is skipped, never waited for.
    WITH doomed AS (
        SELECT id FROM respool.requests
         WHERE finished_at < p_before
           AND status IN ('released', 'rejected', 'cancelled', 'expired', 'preempted')
         ORDER BY finished_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    )
    DELETE FROM respool.requests r
     USING doomed d
     WHERE r.id = d.id AND respool._is_terminal(r.status) AND r.finished_at < p_before;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    -- History goes only here (0007_history_survives): the events of every request deleted
    -- before p_before, by this prune or earlier by a client (respool.deleted_requests).
    WITH gone AS (DELETE FROM respool.deleted_requests WHERE finished_at < p_before RETURNING id)
    DELETE FROM respool.events e USING gone g WHERE e.request_id = g.id;
    RETURN deleted;
END $$;
COMMENT ON FUNCTION respool.prune_requests(timestamptz, integer) IS 'Deletes terminal requests (released, rejected, cancelled, expired, preempted) whose finished_at is before p_before, oldest first and at most p_limit of them (NULL: all), with their events, and the history of requests a client deleted that finished before p_before; returns how many requests went. Never touches queued, allocated or preempting requests (a requeued preempted request is queued, so it stays). Rows locked by another transaction are skipped, so concurrent reconcilers never block each other. Their idempotency keys become free again.';
