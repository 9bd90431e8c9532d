-- Usage arithmetic: what a pool's counters mean once victims in their grace period and earmarks
-- are counted (SPEC §5), and free units for the cheap first admission test.

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
        -- (the queue entry's resources: a gang's entry holds its members' sum, SPEC §11.6)
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
COMMENT ON FUNCTION respool._usage(uuid, uuid) IS
    'The usage arithmetic of one pool, in one place: per pool counter (policy_id NULL) and per policy counter, its bound (effective capacity / limit), reserved share, used, units leaving with victims in their grace period and (pool rows) units earmarked for requests other than p_except. Read-only.';

CREATE OR REPLACE FUNCTION respool._free_units(p_pool_id uuid)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(key, capacity - used), '{}')
              FROM respool.pool_resources WHERE pool_id = p_pool_id AND capacity IS NOT NULL);
END $$;
COMMENT ON FUNCTION respool._free_units(uuid) IS 'Free units (capacity - used, may be negative after a shrink) per tracked key of a pool.';

CREATE OR REPLACE FUNCTION respool._fits_free(p_resources jsonb, p_free jsonb)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN NOT EXISTS (SELECT FROM jsonb_each_text(p_resources) x
                        WHERE p_free ? x.key AND x.value::bigint > (p_free ->> x.key)::bigint);
END $$;
COMMENT ON FUNCTION respool._fits_free(jsonb, jsonb) IS
    'Admission rule 1 alone against a _free_units map (keys the map lacks are not checked): a cheap necessary condition before the full check.';

CREATE OR REPLACE FUNCTION respool._take_units(p_map jsonb, p_units jsonb, p_sign integer)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(m.key, m.value::bigint - p_sign * coalesce((p_units ->> m.key)::bigint, 0)), '{}')
              FROM jsonb_each_text(p_map) m);
END $$;
COMMENT ON FUNCTION respool._take_units(jsonb, jsonb, integer) IS
    'p_map {key: units} minus (p_sign 1) or plus (p_sign -1) the amounts p_units holds of the same keys; keys p_map lacks are ignored.';

CREATE OR REPLACE FUNCTION respool._any_over(p_map jsonb)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN EXISTS (SELECT FROM jsonb_each_text(p_map) m WHERE m.value::bigint > 0);
END $$;
COMMENT ON FUNCTION respool._any_over(jsonb) IS 'True when some key of an excess/deficit map {key: units} is still positive.';

CREATE OR REPLACE FUNCTION respool._holds_any(p_resources jsonb, p_map jsonb)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN EXISTS (SELECT FROM jsonb_each_text(p_resources) x
                    WHERE x.value::bigint > 0 AND coalesce((p_map ->> x.key)::bigint, 0) > 0);
END $$;
COMMENT ON FUNCTION respool._holds_any(jsonb, jsonb) IS
    'True when p_resources holds units of a key that is still positive in the map {key: units}: a victim that would help.';
