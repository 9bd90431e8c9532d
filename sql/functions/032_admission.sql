-- Admission (docs/admission.md): whether earmarks keep a queued request waiting, the public blocker,
-- and the rejection table (can it ever fit a candidate pool; its node rule, respool._node_rejection,
-- is with the other placement rules). Whether it fits now is the placement seam's decision
-- (031_placement.sql); every capacity it reads is the capacity model's (029_capacity.sql).

CREATE OR REPLACE FUNCTION respool._earmark_blocks(p_request respool.requests, p_pool_id uuid)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN NOT respool._leaves_earmarks(p_request.resources, p_pool_id, p_request.id, p_request.earmark_pool_id);
END $$;
COMMENT ON FUNCTION respool._earmark_blocks(respool.requests, uuid) IS
    'True when granting p_request would take units earmarked for another request (units that victims in their grace period will free): the earmark rule of respool._fits (respool._leaves_earmarks), for explaining why a request waits. Never true for the earmark holder itself.';

CREATE OR REPLACE FUNCTION respool._rejection(p_resources jsonb, p_preemptible boolean, p_pool_id uuid,
                                              p_policy_id uuid, p_selector jsonb DEFAULT '{}',
                                              p_request_id uuid DEFAULT NULL, OUT reason text, OUT message text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    n record;
BEGIN
    -- Can it ever fit: the need against the pool place empty (respool._pool_place, room_ever; the key
    -- rule makes a key the pool lacks capacity 0) and against the policy's bounds when unused.
    WITH k AS (
        SELECT p.key, p.need, p.capacity AS cap, p.room_ever, coalesce(pol.configured, 0) AS reserved, pol."limit" AS lim
          FROM respool._pool_place(p_pool_id, p_resources) p
          LEFT JOIN respool.policy_resources pol ON pol.policy_id = p_policy_id AND pol.key = p.key
    ), pool AS (SELECT name FROM respool.pools WHERE id = p_pool_id)
    SELECT c.reason, c.message INTO reason, message FROM (VALUES (1)) AS one(x) LEFT JOIN LATERAL (
        SELECT 1 AS rank, key, 'pool_missing_key' AS reason,
               format('pool %s does not provide %s', (SELECT name FROM pool), key) AS message
          FROM k WHERE cap = 0
        UNION ALL
        SELECT 2, key, 'exceeds_capacity',
               format('%s: needs %s, pool %s has %s', key, need, (SELECT name FROM pool), cap)
          FROM k WHERE cap > 0 AND NOT respool._fits_room(need, room_ever)
        UNION ALL
        SELECT 3, key, 'exceeds_limit',
               format('%s: needs %s, the subject''s limit in pool %s is %s', key, need, (SELECT name FROM pool), lim)
          FROM k WHERE lim IS NOT NULL AND NOT respool._fits_room(need, respool._room(lim, 0))
        UNION ALL
        SELECT 4, key, 'exceeds_reserved',
               format('%s: non-preemptible request needs %s, the subject''s reserved share in pool %s is %s',
                      key, need, (SELECT name FROM pool), reserved)
          FROM k WHERE NOT p_preemptible AND cap IS NOT NULL AND NOT respool._fits_room(need, respool._room(reserved, 0))
        ORDER BY 1, 2
        LIMIT 1
    ) c ON true;
    IF reason IS NULL THEN
        n := respool._node_rejection(p_pool_id, p_resources, p_selector, p_request_id);
        reason := n.reason;
        message := n.message;
    END IF;
END $$;
COMMENT ON FUNCTION respool._rejection(jsonb, boolean, uuid, uuid, jsonb, uuid) IS
    'The rejection table (docs/admission.md) for one candidate pool (the pool place empty, respool._pool_place), then the node rule (respool._node_rejection: p_selector, and p_request_id for a gang member): always one row, (NULL, NULL) when the request can ever fit there.';

CREATE OR REPLACE FUNCTION respool.blocker(p_resources jsonb, p_preemptible boolean, p_pool_id uuid,
                                          p_policy_id uuid)
RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN respool._blocker(p_resources, p_preemptible, p_pool_id, p_policy_id);
END $$;
COMMENT ON FUNCTION respool.blocker(jsonb, boolean, uuid, uuid) IS
    'Public explanation of why a request of these resources (preemptible or not) of the subject of policy p_policy_id would wait in pool p_pool_id now: NULL when admission rules 1-3 (docs/admission.md) admit it, else one sentence naming the first blocking key (pool full, subject limit, reserved share for non-preemptible work). Read-only; does not look at earmarks.';

CREATE OR REPLACE FUNCTION respool._subject_policies(p_subject text)
RETURNS TABLE (policy_id uuid, pool_id uuid)
LANGUAGE sql STABLE AS $$
    -- Exact policies on subject (an index probe), then the patterns (few: a partial index);
    -- per pool the exact one, else the pattern with the longest literal prefix (two patterns of
    -- one pool never share a literal prefix: a unique index).
    SELECT DISTINCT ON (m.pool_id) m.id, m.pool_id FROM (
        SELECT p.id, p.pool_id, 0 AS rank FROM respool.policies p WHERE p.subject = p_subject
        UNION ALL
        SELECT p.id, p.pool_id, 1 + 1000 - length(p.literal_prefix) FROM respool.policies p
         WHERE p.is_pattern AND p_subject LIKE replace(replace(p.subject, '_', '\_'), '*', '%')
    ) m
    ORDER BY m.pool_id, m.rank
$$;
COMMENT ON FUNCTION respool._subject_policies(text) IS
    'The policy a request of p_subject goes through on each pool where it has one (docs/preemption.md, team quotas): the exact subject''s policy, else the pattern policy (subject with *) whose literal prefix (the text before the first *) is longest among those matching. One row per pool. Read-only.';

CREATE OR REPLACE FUNCTION respool._policy_for(p_subject text, p_pool_id uuid)
RETURNS uuid LANGUAGE sql STABLE AS $$
    SELECT s.policy_id FROM respool._subject_policies(p_subject) s WHERE s.pool_id = p_pool_id
$$;
COMMENT ON FUNCTION respool._policy_for(text, uuid) IS
    'The policy of p_subject on one pool (respool._subject_policies), NULL when it has none there. Read-only.';

CREATE OR REPLACE FUNCTION respool._candidate_rejections(p_subject text, p_pool_ids uuid[], p_resources jsonb,
                                                         p_preemptible boolean, p_selector jsonb DEFAULT '{}',
                                                         p_request_id uuid DEFAULT NULL)
RETURNS TABLE (policy_id uuid, pool_id uuid, pool_name text, reason text, message text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- The one per-candidate rejection loop (create, requeue, reject): candidates in the order
    -- admission tries them (policy priority desc, pool name; docs/admission.md).
    RETURN QUERY
    SELECT s.policy_id, s.pool_id, pl.name, rej.reason, rej.message
      FROM respool._subject_policies(p_subject) s
     -- (a probe per candidate, not a join over every policy)
     CROSS JOIN LATERAL (SELECT p.priority FROM respool.policies p WHERE p.id = s.policy_id LIMIT 1) p
      JOIN respool.pools pl ON pl.id = s.pool_id
     CROSS JOIN LATERAL respool._rejection(p_resources, p_preemptible, s.pool_id, s.policy_id, p_selector,
                                           p_request_id) rej
     WHERE s.pool_id = ANY (p_pool_ids)
     ORDER BY p.priority DESC, pl.name;
END $$;
COMMENT ON FUNCTION respool._candidate_rejections(text, uuid[], jsonb, boolean, jsonb, uuid) IS
    'Every candidate pool of a request (the subject''s policies on p_pool_ids, respool._subject_policies), in candidate order, with its rejection (docs/admission.md; reason and message NULL when the request can ever fit there). Read-only.';

