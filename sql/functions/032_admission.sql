-- Admission (docs/admission.md): whether earmarks keep a queued request waiting, the public blocker,
-- and the rejection table (can it ever fit a candidate pool). Whether it fits now is the placement
-- seam's decision (031_placement.sql).

CREATE OR REPLACE FUNCTION respool._earmark_blocks(p_request respool.requests, p_pool_id uuid)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN NOT respool._leaves_earmarks(p_request.resources, p_pool_id, p_request.id, p_request.earmark_pool_id);
END $$;
COMMENT ON FUNCTION respool._earmark_blocks(respool.requests, uuid) IS
    'True when granting p_request would take units earmarked for another request (units that victims in their grace period will free): the earmark rule of respool._fits (respool._leaves_earmarks), for explaining why a request waits. Never true for the earmark holder itself.';

CREATE OR REPLACE FUNCTION respool._rejection(p_resources jsonb, p_preemptible boolean, p_pool_id uuid,
                                              p_policy_id uuid, OUT reason text, OUT message text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    WITH k AS (
        SELECT x.key, x.value::bigint AS need, respool._effective_capacity(x.key, pr.capacity) AS cap,
               coalesce(pol.reserved, 0) AS reserved, pol."limit" AS lim
          FROM jsonb_each_text(p_resources) x
          LEFT JOIN respool.pool_resources pr ON pr.pool_id = p_pool_id AND pr.key = x.key
          LEFT JOIN respool.policy_resources pol ON pol.policy_id = p_policy_id AND pol.key = x.key
    ), pool AS (SELECT name FROM respool.pools WHERE id = p_pool_id)
    SELECT c.reason, c.message INTO reason, message FROM (VALUES (1)) AS one(x) LEFT JOIN LATERAL (
        SELECT 1 AS rank, key, 'pool_missing_key' AS reason,
               format('pool %s does not provide %s', (SELECT name FROM pool), key) AS message
          FROM k WHERE cap = 0
        UNION ALL
        SELECT 2, key, 'exceeds_capacity',
               format('%s: needs %s, pool %s has %s', key, need, (SELECT name FROM pool), cap)
          FROM k WHERE cap > 0 AND need > cap
        UNION ALL
        SELECT 3, key, 'exceeds_limit',
               format('%s: needs %s, the subject''s limit in pool %s is %s', key, need, (SELECT name FROM pool), lim)
          FROM k WHERE lim IS NOT NULL AND need > lim
        UNION ALL
        SELECT 4, key, 'exceeds_reserved',
               format('%s: non-preemptible request needs %s, the subject''s reserved share in pool %s is %s',
                      key, need, (SELECT name FROM pool), reserved)
          FROM k WHERE NOT p_preemptible AND cap IS NOT NULL AND need > reserved
        ORDER BY 1, 2
        LIMIT 1
    ) c ON true;
END $$;
COMMENT ON FUNCTION respool._rejection(jsonb, boolean, uuid, uuid) IS
    'The rejection table (docs/admission.md) for one candidate pool: always one row, (NULL, NULL) when the request can ever fit there.';

CREATE OR REPLACE FUNCTION respool.blocker(p_resources jsonb, p_preemptible boolean, p_pool_id uuid,
                                          p_policy_id uuid)
RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN respool._blocker(p_resources, p_preemptible, p_pool_id, p_policy_id);
END $$;
COMMENT ON FUNCTION respool.blocker(jsonb, boolean, uuid, uuid) IS
    'Public explanation of why a request of these resources (preemptible or not) of the subject of policy p_policy_id would wait in pool p_pool_id now: NULL when admission rules 1-3 (docs/admission.md) admit it, else one sentence naming the first blocking key (pool full, subject limit, reserved share for non-preemptible work). Read-only; does not look at earmarks.';

CREATE OR REPLACE FUNCTION respool._candidate_rejections(p_subject text, p_pool_ids uuid[], p_resources jsonb,
                                                         p_preemptible boolean)
RETURNS TABLE (policy_id uuid, pool_id uuid, pool_name text, reason text, message text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- The one per-candidate rejection loop (create, requeue, reject): candidates in the order
    -- admission tries them (policy priority desc, pool name; docs/admission.md).
    RETURN QUERY
    SELECT p.id, p.pool_id, pl.name, rej.reason, rej.message
      FROM respool.policies p
      JOIN respool.pools pl ON pl.id = p.pool_id
     CROSS JOIN LATERAL respool._rejection(p_resources, p_preemptible, p.pool_id, p.id) rej
     WHERE p.subject = p_subject AND p.pool_id = ANY (p_pool_ids)
     ORDER BY p.priority DESC, pl.name;
END $$;
COMMENT ON FUNCTION respool._candidate_rejections(text, uuid[], jsonb, boolean) IS
    'Every candidate pool of a request (the subject''s policies on p_pool_ids), in candidate order, with its rejection (docs/admission.md; reason and message NULL when the request can ever fit there). Read-only.';
