-- Admission (SPEC §4): what blocks a queued request now, whether earmarks keep it waiting, and the
-- rejection table (can it ever fit a candidate pool).

CREATE OR REPLACE FUNCTION respool._blocker(p_resources jsonb, p_preemptible boolean, p_pool_id uuid, p_policy_id uuid)
RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- PL/pgSQL, not SQL: PostgreSQL before 18 plans a SQL function's body on every call, and
    -- this runs for every grant attempt and every read of a queued request.
    RETURN (SELECT msg FROM (
        SELECT k.key,
               CASE
                 WHEN c.cap IS NOT NULL AND k.need > 0 AND c.pool_used + k.need > c.cap THEN
                     format('waiting for %s: pool %s/%s used, needs %s', k.key, c.pool_used, c.cap, k.need)
                 WHEN pol."limit" IS NOT NULL AND c.subject_used + k.need > pol."limit" THEN
                     format('waiting for %s: subject limit reached, %s/%s used, needs %s',
                            k.key, c.subject_used, pol."limit", k.need)
                 WHEN NOT p_preemptible AND c.cap IS NOT NULL AND k.need > 0
                      AND coalesce(pol.np_used, 0) + k.need > coalesce(pol.reserved, 0) THEN
                     format('waiting for %s: reserved share for non-preemptible work %s/%s used, needs %s',
                            k.key, coalesce(pol.np_used, 0), coalesce(pol.reserved, 0), k.need)
               END AS msg
          FROM (SELECT x.key, x.value::bigint AS need FROM jsonb_each_text(p_resources) x
                UNION ALL
                SELECT l.key, 0 FROM respool.policy_resources l
                 WHERE l.policy_id = p_policy_id AND l."limit" IS NOT NULL AND NOT p_resources ? l.key) k
          LEFT JOIN respool.pool_resources pr ON pr.pool_id = p_pool_id AND pr.key = k.key
          LEFT JOIN respool.policy_resources pol ON pol.policy_id = p_policy_id AND pol.key = k.key
         CROSS JOIN LATERAL (SELECT respool._effective_capacity(k.key, pr.capacity) AS cap,
                                    coalesce(pr.used, 0) AS pool_used,
                                    coalesce(pol.used, 0) AS subject_used) c
    ) checks
    WHERE msg IS NOT NULL
    ORDER BY key
    LIMIT 1);
END $$;
COMMENT ON FUNCTION respool._blocker(jsonb, boolean, uuid, uuid) IS
    'Admission rules 1-3 of SPEC §4 against the current counters: NULL when admissible, else what blocks it.';

CREATE OR REPLACE FUNCTION respool._earmark_blocks(p_request respool.requests, p_pool_id uuid)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- Once every victim in its grace period has left (their units gone) and every earmarked
    -- request has its units, would p_request still fit? Checked only while earmarks exist.
    -- The two cheap tests first, as statements of their own: nearly always one of them ends it.
    IF p_request.earmark_pool_id IS NOT DISTINCT FROM p_pool_id
       OR NOT EXISTS (SELECT FROM respool.requests b
                       WHERE b.earmark_pool_id = p_pool_id AND b.status = 'queued'
                         AND b.id <> p_request.id) THEN
        RETURN false;
    END IF;
    RETURN EXISTS (
           SELECT FROM jsonb_each_text(p_request.resources) x
             JOIN respool._usage(p_pool_id, p_request.id) u
               ON u.policy_id IS NULL AND u.key = x.key AND u.bound IS NOT NULL
            WHERE u.used - u.leaving + u.earmarked + x.value::bigint > u.bound);
END $$;
COMMENT ON FUNCTION respool._earmark_blocks(respool.requests, uuid) IS
    'True when granting p_request would take units earmarked for another request (units that victims in their grace period will free). Never true for the earmark holder itself.';

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
    'The §4 rejection table for one candidate pool: always one row, (NULL, NULL) when the request can ever fit there.';

CREATE OR REPLACE FUNCTION respool.blocker(p_resources jsonb, p_preemptible boolean, p_pool_id uuid,
                                          p_policy_id uuid)
RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN respool._blocker(p_resources, p_preemptible, p_pool_id, p_policy_id);
END $$;
COMMENT ON FUNCTION respool.blocker(jsonb, boolean, uuid, uuid) IS
    'Public explanation of why a request of these resources (preemptible or not) of the subject of policy p_policy_id would wait in pool p_pool_id now: NULL when admission rules 1-3 of SPEC §4 admit it, else one sentence naming the first blocking key (pool full, subject limit, reserved share for non-preemptible work). Read-only; does not look at earmarks.';

CREATE OR REPLACE FUNCTION respool._candidate_rejections(p_subject text, p_pool_ids uuid[], p_resources jsonb,
                                                         p_preemptible boolean)
RETURNS TABLE (policy_id uuid, pool_id uuid, pool_name text, reason text, message text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- The one per-candidate rejection loop (create, requeue, reject): candidates in the order
    -- SPEC §4 tries them (policy priority desc, pool name).
    RETURN QUERY
    SELECT p.id, p.pool_id, pl.name, rej.reason, rej.message
      FROM respool.policies p
      JOIN respool.pools pl ON pl.id = p.pool_id
     CROSS JOIN LATERAL respool._rejection(p_resources, p_preemptible, p.pool_id, p.id) rej
     WHERE p.subject = p_subject AND p.pool_id = ANY (p_pool_ids)
     ORDER BY p.priority DESC, pl.name;
END $$;
COMMENT ON FUNCTION respool._candidate_rejections(text, uuid[], jsonb, boolean) IS
    'Every candidate pool of a request (the subject''s policies on p_pool_ids), in candidate order, with its §4 rejection (reason and message NULL when the request can ever fit there). Read-only.';
