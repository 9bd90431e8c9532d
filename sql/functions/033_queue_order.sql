-- Queue order (docs/admission.md): priority lane first, priority desc, in-share first, queue time, id;
-- computed shape by shape.

CREATE OR REPLACE FUNCTION respool._rank(p_priority integer, p_lane boolean)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_priority::bigint + CASE WHEN p_lane THEN 4294967296 ELSE 0 END
$$;
COMMENT ON FUNCTION respool._rank(integer, boolean) IS 'A policy''s place in queue order and priority preemption (docs/preemption.md, priority lanes): its priority, above every priority (2^32 higher) in a priority lane. A lane request outranks every non-lane one; lane allocations never preempt each other, which the victim rule (respool._may_preempt) adds.';

DROP FUNCTION IF EXISTS respool._queue_groups(uuid, boolean);

CREATE OR REPLACE FUNCTION respool._queue_groups(p_pool_id uuid, p_skip_earmarked boolean DEFAULT false)
RETURNS TABLE (policy_id uuid, subject text, preemptible boolean, resources jsonb, priority integer,
               in_share boolean, queued_at timestamptz, request_id uuid, share double precision,
               node_selector jsonb, rank bigint)
LANGUAGE sql STABLE AS $$
    -- Entries of one shape (policy, preemptible, resources, node selector) are alike for every admission rule
    -- and for in-share, so they keep their queue-time order among themselves: one row per shape,
    -- with its first entry. A skip scan of queue_entries_shape_idx finds the shapes, so this
    -- costs O(shapes * log(queue)), not O(queue).
    WITH RECURSIVE shapes AS (
        (SELECT e.policy_id, e.preemptible, e.resources, e.node_selector FROM respool.queue_entries e
          WHERE e.pool_id = p_pool_id
          ORDER BY e.policy_id, e.preemptible, e.resources, e.node_selector LIMIT 1)
        UNION ALL
        SELECT n.* FROM shapes s CROSS JOIN LATERAL (
            SELECT e.policy_id, e.preemptible, e.resources, e.node_selector FROM respool.queue_entries e
             WHERE e.pool_id = p_pool_id
               AND (e.policy_id, e.preemptible, e.resources, e.node_selector)
                   > (s.policy_id, s.preemptible, s.resources, s.node_selector)
             ORDER BY e.policy_id, e.preemptible, e.resources, e.node_selector LIMIT 1) n
    ), tracked AS (
        SELECT (SELECT pl.ordering = 'fair' FROM respool.pools pl WHERE pl.id = p_pool_id) AS fair
    )
    SELECT s.policy_id, p.subject, s.preemptible, s.resources, p.priority, i.in_share, h.queued_at, h.request_id,
           ds.share, s.node_selector, respool._rank(p.priority, p.priority_lane)
      FROM shapes s
      JOIN respool.policies p ON p.id = s.policy_id
     CROSS JOIN tracked t
     -- fair share (docs/scheduling.md): fair ordering: the subject's dominant share in the pool (max over tracked
     -- keys of used / capacity), 0 for every shape in a fifo pool (no effect on the order).
     CROSS JOIN LATERAL (
            SELECT CASE WHEN t.fair THEN coalesce((
                       SELECT max(pol.used::double precision / pr.capacity)
                         FROM respool.policy_resources pol
                         JOIN respool.pool_resources pr
                           ON pr.pool_id = p_pool_id AND pr.key = pol.key AND pr.capacity IS NOT NULL
                        WHERE pol.policy_id = s.policy_id), 0) ELSE 0 END AS share) ds
     CROSS JOIN LATERAL (
            -- In share: for every key the pool bounds (the key rule, respool._effective_capacity),
            -- the request fits the subject's room under its reserved share (respool._room).
            SELECT NOT EXISTS (
                SELECT FROM jsonb_each_text(s.resources) x
                  LEFT JOIN respool.pool_resources pr ON pr.pool_id = p_pool_id AND pr.key = x.key
                  LEFT JOIN respool.policy_resources pol ON pol.policy_id = s.policy_id AND pol.key = x.key
                 WHERE respool._effective_capacity(x.key, pr.capacity) IS NOT NULL
                   AND NOT respool._fits_room(x.value::bigint,
                                              respool._room(coalesce(pol.reserved, 0), coalesce(pol.used, 0)))) AS in_share) i
     CROSS JOIN LATERAL (
            SELECT e.queued_at, e.request_id FROM respool.queue_entries e
             WHERE e.pool_id = p_pool_id AND e.policy_id = s.policy_id
               AND e.preemptible = s.preemptible AND e.resources = s.resources
               AND e.node_selector = s.node_selector
               AND (NOT p_skip_earmarked
                    OR NOT EXISTS (SELECT FROM respool.requests r
                                    WHERE r.id = e.request_id AND r.earmark_pool_id IS NOT NULL))
             ORDER BY e.queued_at, e.request_id LIMIT 1) h
$$;
COMMENT ON FUNCTION respool._queue_groups(uuid, boolean) IS 'A pool''s queue by shape (policy, preemptible, resources, node selector): each shape''s policy priority and rank (respool._rank: lane first), in-share flag, dominant share (fair pools; 0 in fifo pools) and first entry (with p_skip_earmarked, its first entry holding no earmark; a shape with none is left out). Entries of one shape are granted in queue-time order, so the queue order is the merge of the shapes by (rank desc, in-share first, share asc, queue time, id). Costs O(shapes), not O(queue). Read-only.';

CREATE OR REPLACE FUNCTION respool._next_of_shape(p_pool_id uuid, p_policy_id uuid, p_preemptible boolean,
                                                  p_resources jsonb, p_selector jsonb,
                                                  p_after_at timestamptz, p_after_id uuid,
                                                  OUT queued_at timestamptz, OUT request_id uuid)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT e.queued_at, e.request_id INTO queued_at, request_id FROM respool.queue_entries e
     WHERE e.pool_id = p_pool_id AND e.policy_id = p_policy_id
       AND e.preemptible = p_preemptible AND e.resources = p_resources AND e.node_selector = p_selector
       AND (e.queued_at, e.request_id) > (p_after_at, p_after_id)
     ORDER BY e.queued_at, e.request_id LIMIT 1;
END $$;
COMMENT ON FUNCTION respool._next_of_shape(uuid, uuid, boolean, jsonb, jsonb, timestamptz, uuid) IS 'The entry of one queue shape that follows (p_after_at, p_after_id) in queue-time order (NULLs when none): one index probe.';

CREATE OR REPLACE FUNCTION respool._next_other_group(p_pool_id uuid, p_policy_id uuid, p_preemptible boolean,
                                                    p_resources jsonb, p_selector jsonb, p_tried text[])
RETURNS uuid LANGUAGE sql STABLE AS $$
    SELECT e.request_id FROM respool.queue_entries e JOIN respool.requests r ON r.id = e.request_id
     WHERE e.pool_id = p_pool_id AND e.policy_id = p_policy_id
       AND e.preemptible = p_preemptible AND e.resources = p_resources AND e.node_selector = p_selector
       AND r.earmark_pool_id IS NULL
       AND (r.preemption_group IS NULL OR r.preemption_group <> ALL (p_tried))
     ORDER BY e.queued_at, e.request_id LIMIT 1
$$;
COMMENT ON FUNCTION respool._next_other_group(uuid, uuid, boolean, jsonb, jsonb, text[]) IS 'The first entry (queue-time order, holding no earmark) of one queue shape whose preemption group is none of p_tried (or that has no group): the next stand-in of the shape for preemption when its own group kept the one before from preempting (docs/preemption.md, preemption groups). NULL when none. Read-only.';

CREATE OR REPLACE FUNCTION respool._queue_top(p_pool_id uuid, p_limit integer)
RETURNS TABLE (request_id uuid, policy_id uuid, subject text, priority integer, in_share boolean,
               queued_at timestamptz, "position" bigint)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    -- (The SET clause also keeps it from being inlined: one call per pool, which
    -- tests/ops/test_queue_reads_scale.py counts.)
    -- Queue order is the merge of the shapes (respool._queue_groups: in-share and share decided
    -- once per shape), each already in queue-time order on queue_entries_shape_idx. So the first
    -- p_limit entries of the queue are among the first p_limit of each shape: one ordered index
    -- range per shape, then one sort of what was read (no join of every entry against the
    -- shapes). p_limit NULL: the whole queue.
    SELECT e.request_id, g.policy_id, g.subject, g.priority, g.in_share, e.queued_at,
           row_number() OVER (ORDER BY g.rank DESC, g.in_share DESC, g.share, e.queued_at, e.request_id)
      FROM respool._queue_groups(p_pool_id) g
     CROSS JOIN LATERAL (
            SELECT x.queued_at, x.request_id FROM respool.queue_entries x
             WHERE x.pool_id = p_pool_id AND x.policy_id = g.policy_id
               AND x.preemptible = g.preemptible AND x.resources = g.resources
               AND x.node_selector = g.node_selector
             ORDER BY x.queued_at, x.request_id
             LIMIT p_limit) e
     ORDER BY g.rank DESC, g.in_share DESC, g.share, e.queued_at, e.request_id
     LIMIT p_limit
$$;
COMMENT ON FUNCTION respool._queue_top(uuid, integer) IS 'The first p_limit entries (NULL: all) of a pool''s queue in grant order (docs/admission.md, docs/scheduling.md: priority lane first, policy priority desc, in-share first, dominant share asc in fair pools, queue time, id) with their 1-based positions. Read-only; O(shapes * p_limit) index reads plus one sort of them, whatever the queue length.';

CREATE OR REPLACE FUNCTION respool._queue_order(p_pool_id uuid)
RETURNS TABLE (request_id uuid, policy_id uuid, subject text, priority integer, in_share boolean,
               queued_at timestamptz, "position" bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM respool._queue_top(p_pool_id, NULL)
$$;
COMMENT ON FUNCTION respool._queue_order(uuid) IS 'A pool''s whole queue in grant order (docs/admission.md, docs/scheduling.md): priority lane first, policy priority desc, in-share first, dominant share asc (fair pools), queue time, id (respool._queue_top without a limit). Read-only; O(queue), for the respool.queue view and the positions of a page of requests (the engine itself works shape by shape).';

DROP FUNCTION IF EXISTS respool._queue_positions(uuid, uuid[]);

CREATE OR REPLACE FUNCTION respool._queue_positions(p_pool_id uuid, p_request_ids uuid[])
RETURNS TABLE (request_id uuid, "position" bigint)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_one bigint;
BEGIN
    IF cardinality(p_request_ids) = 1 THEN
        -- One request (the answer of a create or a read): count only the entries ahead of it
        -- (respool._queue_position, counted once), rather than reading every entry of its shapes.
        v_one := respool._queue_position(p_pool_id, p_request_ids[1]);
        IF v_one IS NOT NULL THEN
            RETURN QUERY SELECT p_request_ids[1], v_one;
        END IF;
        RETURN;
    END IF;
    -- Counting what is ahead, as _queue_position does, but for many requests at once and
    -- without sorting the queue: per shape, its entries' queue times as one ascending array;
    -- a request is behind every entry of a shape of a higher (rank, in-share, -share) class
    -- and, in a shape of its own class, behind the entries queued before it (binary search,
    -- width_bucket) and those queued at the same instant with a smaller id (an index probe,
    -- only when the shape has such an instant).
    RETURN QUERY
    WITH shapes AS MATERIALIZED (
        SELECT g.policy_id, g.preemptible, g.resources, g.node_selector, g.rank, g.in_share, g.share, t.times
          FROM respool._queue_groups(p_pool_id) g
         CROSS JOIN LATERAL (
                SELECT array_agg(e.queued_at ORDER BY e.queued_at) AS times
                  FROM respool.queue_entries e
                 WHERE e.pool_id = p_pool_id AND e.policy_id = g.policy_id
                   AND e.preemptible = g.preemptible AND e.resources = g.resources
                   AND e.node_selector = g.node_selector) t
    ), me AS MATERIALIZED (
        SELECT e.request_id, e.queued_at, s.rank, s.in_share, s.share
          FROM respool.queue_entries e
          JOIN shapes s ON s.policy_id = e.policy_id AND s.preemptible = e.preemptible
                       AND s.resources = e.resources AND s.node_selector = e.node_selector
         WHERE e.pool_id = p_pool_id AND e.request_id = ANY (p_request_ids)
    )
    SELECT m.request_id, 1 + (
               SELECT sum(CASE WHEN (s.rank, s.in_share, -s.share) > (m.rank, m.in_share, -m.share)
                               THEN cardinality(s.times)
                               ELSE b.before + CASE WHEN b.up_to > b.before THEN (
                                        SELECT count(*) FROM respool.queue_entries x
                                         WHERE x.pool_id = p_pool_id AND x.policy_id = s.policy_id
                                           AND x.preemptible = s.preemptible AND x.resources = s.resources
                                           AND x.node_selector = s.node_selector
                                           AND x.queued_at = m.queued_at AND x.request_id < m.request_id)
                                    ELSE 0 END END)::bigint
                 FROM shapes s
                CROSS JOIN LATERAL (
                       SELECT width_bucket(m.queued_at - interval '1 microsecond', s.times) AS before,
                              width_bucket(m.queued_at, s.times) AS up_to) b
                WHERE (s.rank, s.in_share, -s.share) >= (m.rank, m.in_share, -m.share))
      FROM me m;
END $$;
COMMENT ON FUNCTION respool._queue_positions(uuid, uuid[]) IS 'The 1-based positions in one pool''s queue of those of p_request_ids that wait in it (others are left out), the same numbers as _queue_order and _queue_position: for one request by counting the entries ahead of it (respool._queue_position); for a page at once, O(queue) array building per shape plus O(requests * shapes * log(queue)), no sort of the queue. Read-only.';

CREATE OR REPLACE FUNCTION respool._queue_position(p_pool_id uuid, p_request_id uuid)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    me respool.queue_entries;
    g record;
    v_rank bigint;
    v_in_share boolean;
    v_share double precision;
    ahead bigint := 0;
    n bigint;
BEGIN
    SELECT * INTO me FROM respool.queue_entries WHERE pool_id = p_pool_id AND request_id = p_request_id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT q.rank, q.in_share, q.share INTO v_rank, v_in_share, v_share FROM respool._queue_groups(p_pool_id) q
     WHERE q.policy_id = me.policy_id AND q.preemptible = me.preemptible AND q.resources = me.resources
       AND q.node_selector = me.node_selector;
    -- Count only what is ahead: whole shapes of a higher (rank, in-share) class, and the
    -- earlier entries of shapes in the request's own class. A policy that queues one shape only
    -- is counted on queue_entries_policy_idx (no comparison of resources per entry).
    FOR g IN SELECT * FROM (SELECT q.*, count(*) OVER (PARTITION BY q.policy_id) AS policy_shapes
                              FROM respool._queue_groups(p_pool_id) q) q
              WHERE (q.rank, q.in_share, -q.share) >= (v_rank, v_in_share, -v_share) LOOP
        -- fair share (docs/scheduling.md): the class is (rank, in-share, -dominant share); share is 0 in fifo pools.
        IF g.policy_shapes = 1 AND (g.rank, g.in_share, -g.share) > (v_rank, v_in_share, -v_share) THEN
            SELECT count(*) INTO n FROM respool.queue_entries e WHERE e.policy_id = g.policy_id;
        ELSIF g.policy_shapes = 1 THEN
            SELECT count(*) INTO n FROM respool.queue_entries e
             WHERE e.policy_id = g.policy_id AND (e.queued_at, e.request_id) < (me.queued_at, me.request_id);
        ELSIF (g.rank, g.in_share, -g.share) > (v_rank, v_in_share, -v_share) THEN
            SELECT count(*) INTO n FROM respool.queue_entries e
             WHERE e.pool_id = p_pool_id AND e.policy_id = g.policy_id
               AND e.preemptible = g.preemptible AND e.resources = g.resources
               AND e.node_selector = g.node_selector;
        ELSE
            SELECT count(*) INTO n FROM respool.queue_entries e
             WHERE e.pool_id = p_pool_id AND e.policy_id = g.policy_id
               AND e.preemptible = g.preemptible AND e.resources = g.resources
               AND e.node_selector = g.node_selector
               AND (e.queued_at, e.request_id) < (me.queued_at, me.request_id);
        END IF;
        ahead := ahead + n;
    END LOOP;
    RETURN ahead + 1;
END $$;
COMMENT ON FUNCTION respool._queue_position(uuid, uuid) IS 'A queued request''s 1-based position in one pool''s queue, exactly as in _queue_order, by counting only the entries ahead of it (whole shapes of a higher class, earlier entries of its own class); NULL when it is not in that queue.';
