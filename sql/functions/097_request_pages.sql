-- A page of queued requests read at once: their queue positions, the
-- sentence saying what blocks them and their ETA (docs/scheduling.md, ETA), computed set-based: each involved
-- pool's queue positions, hold and ETA simulation once per pool, the blocker
-- check once per (pool, policy, resources, preemptible) shape, never once per request. The
-- answers are the ones respool._request_json gives for one request at a time
-- (tests/engine/test_request_pages.py).

CREATE OR REPLACE FUNCTION respool._queued_details(p_ids uuid[], p_now timestamptz)
RETURNS TABLE (request_id uuid, queue_position bigint, message text, eta jsonb)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH mine AS MATERIALIZED (
        -- (one primary-key probe per id, whatever a plan kept from a small table thinks of its
        -- size: docs/benchmarks.md, "Plans kept from a small table")
        SELECT x.r FROM (SELECT DISTINCT unnest(p_ids) AS id) u
         CROSS JOIN LATERAL (SELECT r FROM respool.requests r WHERE r.id = u.id AND r.status = 'queued' LIMIT 1) x
    ), req AS MATERIALIZED (
        -- qid: the request that stands in the queues for it, its gang's stand-in for a gang
        -- member (docs/scheduling.md, gangs, respool._queued_as), with the gang's resources. Computed for the
        -- requests asked for only (the CTE above), not for every queued request of the table.
        SELECT (m.r).id, (x.q).id AS qid, (x.q).resources, (x.q).preemptible, (x.q).max_seconds,
               (x.q).earmark_pool_id, (m.r).gang_id,
               -- (a gang is placed member by member: no one-node blocker for its sum)
               CASE WHEN (m.r).gang_id IS NULL THEN (x.q).node_selector END AS node_selector
          FROM mine m
         CROSS JOIN LATERAL (SELECT CASE WHEN (m.r).gang_id IS NULL THEN m.r ELSE respool._queued_as((m.r).id) END AS q
                              OFFSET 0) x
    ), entries AS MATERIALIZED (
        SELECT req.id AS request_id, e.pool_id, e.policy_id, pl.name AS pool_name, p.priority,
               count(*) OVER (PARTITION BY req.id) AS n_pools
          FROM respool.queue_entries e
          JOIN req ON req.qid = e.request_id
          JOIN respool.pools pl ON pl.id = e.pool_id
          JOIN respool.policies p ON p.id = e.policy_id
    ), pools AS MATERIALIZED (
        SELECT DISTINCT en.pool_id FROM entries en
    ), per_pool AS MATERIALIZED (
        -- Once per pool: its hold (docs/scheduling.md, starvation guard), free units and hold sentence when it holds, and
        -- whether some queued request holds an earmark on it.
        SELECT x.pool_id, x.hold,
               CASE WHEN (x.hold).head_id IS NOT NULL THEN respool._free_units(x.pool_id) END AS free,
               CASE WHEN (x.hold).head_id IS NOT NULL THEN format(
                   'held: pool reserves %s for an earlier request (waiting %s s)',
                   (SELECT string_agg(k, ', ' ORDER BY k) FROM jsonb_object_keys((x.hold).need) k),
                   (x.hold).waited_seconds) END AS held_sentence,
               -- (a scalar probe of requests_earmark_idx: as EXISTS, the planner hashed every
               -- queued request instead)
               (SELECT true FROM respool.requests b
                 WHERE b.earmark_pool_id = x.pool_id AND b.status = 'queued' LIMIT 1) IS NOT NULL
                   AS earmarks
          FROM (SELECT p.pool_id, respool._pool_hold(p.pool_id, p_now) AS hold FROM pools p OFFSET 0) x
    ), shapes AS MATERIALIZED (
        -- Once per shape: admission rules 1-3 (_blocker), earmarks, backfill rule (a).
        SELECT s.pool_id, s.policy_id, s.resources, s.preemptible, s.node_selector,
               coalesce(respool._blocker(s.resources, s.preemptible, s.pool_id, s.policy_id),
                        respool._node_blocker(s.resources, s.pool_id, s.node_selector)) AS blocker,
               -- (only in pools with earmarks; the request read is never an earmark holder of
               -- that pool, that case has its own sentence, so no request to leave out)
               pp.earmarks AND NOT respool._leaves_earmarks(s.resources, s.pool_id, NULL, NULL) AS earmark_blocks,
               CASE WHEN (pp.hold).head_id IS NOT NULL
                    THEN respool._leaves_head_room(pp.hold, s.resources, pp.free, s.node_selector) END AS head_room
          FROM (SELECT DISTINCT en.pool_id, en.policy_id, r.resources, r.preemptible, r.node_selector
                  FROM entries en JOIN req r ON r.id = en.request_id) s
          JOIN per_pool pp ON pp.pool_id = s.pool_id
    ), positions AS MATERIALIZED (
        -- Each pool once: the page's positions in it (respool._queue_positions, the numbers
        -- _queue_position counts one at a time), without sorting its whole queue.
        SELECT p.pool_id, o.request_id, o.position
          FROM pools p
         CROSS JOIN LATERAL respool._queue_positions(p.pool_id, ARRAY(SELECT DISTINCT r.qid FROM req r)) o
    ), etas AS MATERIALIZED (
        -- Each pool's ETA simulation once, for its first _eta_depth() requests (docs/scheduling.md, ETA);
        -- not at all in a pool where no request of the page is that far ahead.
        SELECT p.pool_id, x.request_id, x.p50_seconds, x.p90_seconds
          FROM pools p CROSS JOIN LATERAL respool._eta_pool(p.pool_id, p_now) x
         WHERE EXISTS (SELECT FROM positions o
                        WHERE o.pool_id = p.pool_id AND o.position <= respool._eta_depth())
    ), lines AS (
        SELECT en.request_id, en.pool_name, en.priority, o.position,
               CASE WHEN en.n_pools > 1 THEN en.pool_name || ': ' ELSE '' END
               || CASE WHEN r.earmark_pool_id = en.pool_id
                       THEN 'preempted units are being released for it'
                       ELSE coalesce(s.blocker,
                                     CASE WHEN s.earmark_blocks
                                          THEN 'waiting: freed units are earmarked for a request that preempted others'
                                          ELSE coalesce(CASE WHEN (pp.hold).head_id IS NULL
                                                               OR (pp.hold).head_id = r.qid
                                                               OR s.head_room
                                                               OR respool._ends_before_shadow(pp.hold, r.max_seconds, p_now)
                                                             THEN NULL ELSE pp.held_sentence END,
                                                        'fits, waiting for its turn') END) END
               || CASE WHEN o.position > 1 THEN format('; %s ahead', o.position - 1) ELSE '' END AS line
          FROM entries en
          JOIN req r ON r.id = en.request_id
          JOIN per_pool pp ON pp.pool_id = en.pool_id
          JOIN shapes s ON s.pool_id = en.pool_id AND s.policy_id = en.policy_id
                       AND s.resources = r.resources AND s.preemptible = r.preemptible
                       AND s.node_selector IS NOT DISTINCT FROM r.node_selector
          LEFT JOIN positions o ON o.pool_id = en.pool_id AND o.request_id = r.qid
    ), best_eta AS MATERIALIZED (
        -- Queued in several pools: the soonest estimate (as respool._request_eta).
        SELECT DISTINCT ON (en.request_id) en.request_id,
               jsonb_build_object('p50_seconds', x.p50_seconds, 'p90_seconds', x.p90_seconds) AS eta
          FROM entries en JOIN req r ON r.id = en.request_id
          JOIN etas x ON x.pool_id = en.pool_id AND x.request_id = r.qid
         ORDER BY en.request_id, x.p50_seconds, x.p90_seconds
    )
    SELECT a.request_id, a.position,
           CASE WHEN r.gang_id IS NOT NULL THEN format('gang %s: ', r.gang_id) ELSE '' END || a.message, b.eta
      FROM (SELECT l.request_id, min(l.position) AS position,
                   string_agg(l.line, ' | ' ORDER BY l.priority DESC, l.pool_name) AS message
              FROM lines l GROUP BY l.request_id) a
      JOIN req r ON r.id = a.request_id
      LEFT JOIN best_eta b ON b.request_id = a.request_id;
END $$;
COMMENT ON FUNCTION respool._queued_details(uuid[], timestamptz) IS 'For the queued requests among p_ids (others are left out, as are queued ones without queue entries): best queue position, the message and the ETA exactly as respool._request_json computes them one at a time, but computing each involved pool''s queue positions, hold, earmark usage and ETA simulation once, and each shape''s blocker once. Read-only; O(involved queues + shapes + page), not O(page * queue).';
