-- Usage arithmetic: what a pool's counters and its policies' counters mean once victims in their
-- grace period and earmarks are counted (docs/preemption.md). The pool's rows are the pool place of
-- the capacity model (respool._pool_place, 029_capacity.sql).

CREATE OR REPLACE FUNCTION respool._usage(p_pool_id uuid, p_except uuid DEFAULT NULL)
RETURNS TABLE (policy_id uuid, key text, bound bigint, reserved bigint, used bigint, leaving bigint,
               earmarked bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_keys jsonb;
    v_moving boolean;
BEGIN
    SELECT respool._place_keys(p_pool_id, 'pool'), respool._moving(p_pool_id, p_except) INTO v_keys, v_moving;
    -- One row per counter of the pool (policy_id NULL, bound = effective capacity, NULL when
    -- untracked) and per counter of its policies (bound = limit, NULL when none):
    --   used      the counter (every unit charged to an allocated or preempting request);
    --   leaving   units of victims in their grace period, which count as already gone;
    --   earmarked units those victims free for the queued requests they were preempted for
    --             (other than p_except), which count as already taken; pool rows only.
    -- So "usage that must fit" is used - leaving (shrinks), and "usage a grant competes with" is
    -- used - leaving + earmarked (preemption, earmarks). Without a grace period both are 0.
    RETURN QUERY
    -- (a rate key has no bound here: preemption never frees its units, docs/rates.md; its
    -- used is the sum of the charges inside its window, 039_rates.sql)
    SELECT NULL::uuid, p.key, CASE WHEN rk.key IS NULL THEN p.capacity END, NULL::bigint, p.used, p.leaving, p.earmarked
      FROM respool._pool_place(p_pool_id, v_keys, p_except, v_moving) p
      LEFT JOIN respool.pool_rates rk ON rk.pool_id = p_pool_id AND rk.key = p.key
    UNION ALL
    SELECT pol.policy_id, pol.key, CASE WHEN rk.key IS NULL THEN pol."limit" END, pol.reserved, pol.used,
           coalesce(l.n, 0)::bigint, 0::bigint
      FROM respool.policy_resources pol JOIN respool.policies p ON p.id = pol.policy_id
      LEFT JOIN respool.pool_rates rk ON rk.pool_id = p_pool_id AND rk.key = pol.key
      LEFT JOIN (SELECT r.policy_id, x.key, sum(x.value::bigint) AS n
                   FROM respool.requests r CROSS JOIN LATERAL jsonb_each_text(r.resources) x
                  WHERE v_moving AND r.pool_id = p_pool_id AND r.status = 'preempting'
                  GROUP BY r.policy_id, x.key) l ON l.policy_id = pol.policy_id AND l.key = pol.key
     WHERE p.pool_id = p_pool_id;
END $$;
COMMENT ON FUNCTION respool._usage(uuid, uuid) IS 'The usage arithmetic of one pool, in one place: per pool counter (policy_id NULL: the pool place of respool._pool_place) and per policy counter, its bound (effective capacity / limit; none for a rate key, whose units preemption never frees), reserved share, used, units leaving with victims in their grace period and (pool rows) units earmarked for requests other than p_except. Read-only.';
