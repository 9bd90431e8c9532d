-- The dashboard's queue and the queue positions of a page of requests (issue 15, defect 2).
-- The dashboard reads only each pool's queue head (respool._queue_top: O(shapes * limit)); the
-- positions of a page compute each pool's queue order once per call, never once per entry: with
-- 10,000 queued the per-entry way took seconds.

CREATE OR REPLACE FUNCTION respool.dashboard_queue(p_limit integer DEFAULT 200)
RETURNS TABLE (pool text, "position" bigint, request_id uuid, subject text, resources jsonb,
               preemptible boolean, priority integer, in_share boolean, waiting_seconds double precision,
               attempt integer, labels jsonb, waiting_for text)
LANGUAGE sql STABLE AS $$
    -- The first p_limit entries of every pool (its queue head, computed once per pool and
    -- MATERIALIZED: never re-run per row), cut to p_limit rows; only those rows get their
    -- blocker sentence.
    WITH page AS MATERIALIZED (
        SELECT pl.id AS pool_id, pl.name AS pool, o.request_id, o.policy_id, o.subject,
               o.priority, o.in_share, o.position
          FROM respool.pools pl
         CROSS JOIN LATERAL respool._queue_top(pl.id, p_limit) o
         ORDER BY pl.name, o.position
         LIMIT p_limit
    )
    SELECT q.pool, q.position, q.request_id, q.subject, r.resources, r.preemptible, q.priority,
           q.in_share, extract(epoch FROM now() - r.queued_at)::double precision, r.attempt, r.labels,
           coalesce(respool._blocker(r.resources, r.preemptible, q.pool_id, q.policy_id),
                    'fits, waiting for its turn')
      FROM page q
      JOIN respool.requests r ON r.id = q.request_id
     ORDER BY q.pool, q.position
$$;
COMMENT ON FUNCTION respool.dashboard_queue(integer) IS
    'The first p_limit queue entries over all pools (by pool name, then grant order), each with what blocks it now (or ''fits, waiting for its turn''). Reads each pool''s queue head once (respool._queue_top, O(shapes * p_limit) per pool, not O(queue)), and runs the blocker check only for the rows returned. Read-only.';

DROP FUNCTION IF EXISTS respool._queue_positions(uuid[]);
CREATE OR REPLACE FUNCTION respool._queue_positions(p_request_ids uuid[])
RETURNS TABLE (request_id uuid, positions jsonb) LANGUAGE sql STABLE AS $$
    -- Only the pools these requests queue in, each ordered once.
    SELECT o.request_id, jsonb_object_agg(p.pool_id::text, o.position)
      FROM (SELECT DISTINCT e.pool_id FROM respool.queue_entries e
             WHERE e.request_id = ANY (p_request_ids)) p
     CROSS JOIN LATERAL respool._queue_order(p.pool_id) o
      JOIN unnest(p_request_ids) AS wanted(id) ON wanted.id = o.request_id
     GROUP BY o.request_id
$$;
COMMENT ON FUNCTION respool._queue_positions(uuid[]) IS
    'Queue positions of the given queued requests: one row per request with {"<pool_id>": position} over every pool it waits in (the same numbers as _queue_position), computing each involved pool''s queue order once, not once per request: for reading many queued requests at a time. Read-only.';
