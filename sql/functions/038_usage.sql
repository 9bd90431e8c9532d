-- Usage arithmetic: what a pool's counters mean once victims in their grace period and earmarks
-- are counted (docs/preemption.md), and free units for the cheap first test of a pass.

CREATE OR REPLACE FUNCTION respool._usage(p_pool_id uuid, p_except uuid DEFAULT NULL)
RETURNS TABLE (policy_id uuid, key text, bound bigint, reserved bigint, used bigint, leaving bigint,
               earmarked bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- One row per counter of the pool (policy_id NULL, bound = effective capacity, NULL when
    -- untracked) and per counter of its policies (bound = limit, NULL when none):
    --   used      the counter (every unit charged to an allocated or preempting request);
    --   leaving   units of victims in their grace period, which count as already gone;
    --   earmarked units those victims free for the queued requests they were preempted for
    --             (other than p_except), which count as already taken; pool rows only.
    -- So "usage that must fit" is used - leaving (shrinks), and "usage a grant competes with" is
    -- used - leaving + earmarked (preemption, earmarks). Without a grace period both are 0.
    RETURN QUERY
    WITH moving AS (
        SELECT r.policy_id, x.key, x.value::bigint AS n, true AS is_leaving
          FROM respool.requests r CROSS JOIN LATERAL jsonb_each_text(r.resources) x
         WHERE r.pool_id = p_pool_id AND r.status = 'preempting'
        UNION ALL
        -- (the queue entry's resources: a gang's entry holds its members' sum, docs/scheduling.md)
        SELECT NULL, x.key, x.value::bigint, false
          FROM respool.requests r
          JOIN respool.queue_entries e ON e.request_id = r.id AND e.pool_id = p_pool_id
         CROSS JOIN LATERAL jsonb_each_text(e.resources) x
         WHERE r.earmark_pool_id = p_pool_id AND r.status = 'queued' AND r.id IS DISTINCT FROM p_except
    )
    SELECT NULL::uuid, pr.key, respool._effective_capacity(pr.key, pr.capacity), NULL::bigint, pr.used,
           coalesce((SELECT sum(m.n) FROM moving m WHERE m.key = pr.key AND m.is_leaving), 0)::bigint,
           coalesce((SELECT sum(m.n) FROM moving m WHERE m.key = pr.key AND NOT m.is_leaving), 0)::bigint
      FROM respool.pool_resources pr
     WHERE pr.pool_id = p_pool_id
    UNION ALL
    SELECT pol.policy_id, pol.key, pol."limit", pol.reserved, pol.used,
           coalesce((SELECT sum(m.n) FROM moving m
                      WHERE m.key = pol.key AND m.is_leaving AND m.policy_id = pol.policy_id), 0)::bigint,
           0::bigint
      FROM respool.policy_resources pol JOIN respool.policies p ON p.id = pol.policy_id
     WHERE p.pool_id = p_pool_id;
END $$;
COMMENT ON FUNCTION respool._usage(uuid, uuid) IS 'The usage arithmetic of one pool, in one place: per pool counter (policy_id NULL) and per policy counter, its bound (effective capacity / limit), reserved share, used, units leaving with victims in their grace period and (pool rows) units earmarked for requests other than p_except. Read-only.';

CREATE OR REPLACE FUNCTION respool._free_units(p_pool_id uuid)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(key, capacity - used), '{}')
              FROM respool.pool_resources WHERE pool_id = p_pool_id AND capacity IS NOT NULL);
END $$;
COMMENT ON FUNCTION respool._free_units(uuid) IS 'Free units (capacity - used, may be negative after a shrink) per tracked key of a pool.';

