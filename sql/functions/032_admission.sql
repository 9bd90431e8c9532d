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

CREATE OR REPLACE FUNCTION respool._node_could_hold(p_node_id uuid, p_need jsonb)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN NOT EXISTS (SELECT FROM jsonb_each_text(p_need) x
                         LEFT JOIN respool.node_resources nr ON nr.node_id = p_node_id AND nr.key = x.key
                        WHERE CASE WHEN nr.key IS NULL THEN NOT respool._is_soft_key(x.key)
                                   ELSE x.value::bigint > nr.capacity END);
END $$;
COMMENT ON FUNCTION respool._node_could_hold(uuid, jsonb) IS
    'True when the node, empty, could hold every key of p_need at once (a soft key it lacks is unbounded, any other key it lacks has room 0): whatever its state and usage now. Read-only.';

CREATE OR REPLACE FUNCTION respool._node_rejection(p_pool_id uuid, p_resources jsonb, p_selector jsonb,
                                                   p_request_id uuid, OUT reason text, OUT message text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_pool text;
    v_needs jsonb[];
    v_distinct boolean := false;
    v_gang uuid;
    v_matching integer;
    v_bad record;
BEGIN
    -- Could hold: no amount above the node capacity of a key, no non-soft key the node lacks
    -- (respool._node_could_hold). A gang is judged member by member; with distinct_nodes it needs
    -- as many matching nodes that could hold a member as members; and an arrangement of all its
    -- members on the matching nodes, empty (exact for small gangs, a necessary condition for
    -- large ones).
    v_pool := (SELECT name FROM respool.pools WHERE id = p_pool_id);
    IF NOT respool._pool_has_nodes(p_pool_id) THEN
        -- A selector selects nodes: a pool without nodes is no candidate for it (docs/placement.md).
        IF p_selector IS NOT NULL AND p_selector <> '{}' THEN
            reason := 'no_fitting_node';
            message := format('pool %s has no nodes, so no node matches node_selector %s', v_pool, p_selector::text);
        END IF;
        RETURN;
    END IF;
    -- A gang is placed member by member: each member must fit a node on its own.
    SELECT gang_id, distinct_nodes INTO v_gang, v_distinct FROM respool.requests WHERE id = p_request_id;
    IF v_gang IS NOT NULL THEN
        v_needs := ARRAY(SELECT m.resources FROM respool.requests m
                          WHERE m.gang_id = v_gang AND m.status = 'queued' ORDER BY m.queued_at, m.id);
    END IF;
    IF coalesce(cardinality(v_needs), 0) = 0 THEN
        v_needs := ARRAY[p_resources];
        v_distinct := false;
        -- The common case first: one matching node that could hold it, found by probing nodes
        -- until one does (in a pool of alike machines, the first).
        IF EXISTS (SELECT FROM respool.nodes n
                    WHERE n.pool_id = p_pool_id AND respool._node_matches(n.name, n.labels, p_selector)
                      AND respool._node_could_hold(n.id, p_resources)) THEN
            RETURN;
        END IF;
    END IF;
    SELECT count(*) INTO v_matching FROM respool.nodes n
     WHERE n.pool_id = p_pool_id AND respool._node_matches(n.name, n.labels, p_selector);
    IF v_matching = 0 THEN
        reason := 'no_fitting_node';
        message := format('no node of pool %s matches node_selector %s', v_pool, p_selector::text);
        RETURN;
    END IF;
    -- A need no matching node could hold even empty: an amount above the node's capacity of a key
    -- it tracks, or a non-soft key it lacks.
    SELECT x.key, x.value::bigint AS need, max(coalesce(nr.capacity, 0)) AS largest INTO v_bad
      FROM unnest(v_needs) need_map CROSS JOIN LATERAL jsonb_each_text(need_map) x
     CROSS JOIN respool.nodes n
      LEFT JOIN respool.node_resources nr ON nr.node_id = n.id AND nr.key = x.key
     WHERE n.pool_id = p_pool_id AND respool._node_matches(n.name, n.labels, p_selector)
       AND NOT (nr.key IS NULL AND respool._is_soft_key(x.key))
     GROUP BY need_map, x.key, x.value
    HAVING bool_and(nr.key IS NULL OR x.value::bigint > nr.capacity)
     ORDER BY x.key LIMIT 1;
    IF FOUND THEN
        reason := 'no_fitting_node';
        message := format('%s: needs %s on one node, the largest matching node of pool %s has %s',
                          v_bad.key, v_bad.need, v_pool, v_bad.largest);
    ELSE
        -- Each key fitting some matching node is not enough: one node must hold every key of a
        -- need at once (a request never spans nodes). With distinct_nodes, count the matching
        -- nodes that could hold a member even empty.
        SELECT count(*) INTO v_matching FROM respool.nodes n
         WHERE n.pool_id = p_pool_id AND respool._node_matches(n.name, n.labels, p_selector)
           AND EXISTS (SELECT FROM unnest(v_needs) need_map WHERE respool._node_could_hold(n.id, need_map));
        IF EXISTS (SELECT FROM unnest(v_needs) need_map
                    WHERE NOT EXISTS (SELECT FROM respool.nodes n
                                       WHERE n.pool_id = p_pool_id
                                         AND respool._node_matches(n.name, n.labels, p_selector)
                                         AND respool._node_could_hold(n.id, need_map))) THEN
            reason := 'no_fitting_node';
            message := format('each key fits some matching node of pool %s, but no node could hold all of them at once',
                              v_pool);
        ELSIF v_distinct AND v_matching < cardinality(v_needs) THEN
            reason := 'no_fitting_node';
            message := format('a gang of %s members on distinct nodes: pool %s has %s matching nodes that could hold a member',
                              cardinality(v_needs), v_pool, v_matching);
        ELSIF cardinality(v_needs) > 1
              AND (respool._gang_arrangement(p_pool_id, v_needs, p_selector, v_distinct, false)).placeable = false THEN
            -- Each member fits some node, but no arrangement of all of them on the matching
            -- nodes exists, even with every node empty.
            reason := 'no_fitting_node';
            message := format('no arrangement of the gang''s %s members%s on the matching nodes of pool %s exists, even with every node empty',
                              cardinality(v_needs), CASE WHEN v_distinct THEN ' (on distinct nodes)' ELSE '' END,
                              v_pool);
        END IF;
    END IF;
END $$;
COMMENT ON FUNCTION respool._node_rejection(uuid, jsonb, jsonb, uuid) IS
    'The node rule of the rejection table (docs/placement.md). In a pool with nodes: no_fitting_node when no node of the pool, in any state and empty, could ever hold the request (none matches the selector, or none could hold all its amounts at once); a gang (p_request_id a member) also when its members could never be arranged on the matching nodes (respool._gang_arrangement). In a pool without nodes: no_fitting_node for a request with a node selector. Else (NULL, NULL). Read-only.';

CREATE OR REPLACE FUNCTION respool._rejection(p_resources jsonb, p_preemptible boolean, p_pool_id uuid,
                                              p_policy_id uuid, p_selector jsonb DEFAULT '{}',
                                              p_request_id uuid DEFAULT NULL, OUT reason text, OUT message text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    WITH k AS (
        SELECT x.key, x.value::bigint AS need, respool._effective_capacity(x.key, pr.capacity) AS cap,
               coalesce(pol.configured, 0) AS reserved, pol."limit" AS lim
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
    IF reason IS NULL THEN
        SELECT n.reason, n.message INTO reason, message
          FROM respool._node_rejection(p_pool_id, p_resources, p_selector, p_request_id) n;
    END IF;
END $$;
COMMENT ON FUNCTION respool._rejection(jsonb, boolean, uuid, uuid, jsonb, uuid) IS
    'The rejection table (docs/admission.md) for one candidate pool, then the node rule (respool._node_rejection: p_selector, and p_request_id for a gang member): always one row, (NULL, NULL) when the request can ever fit there.';

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
    SELECT p.id, p.pool_id, pl.name, rej.reason, rej.message
      FROM respool._subject_policies(p_subject) s
      JOIN respool.policies p ON p.id = s.policy_id
      JOIN respool.pools pl ON pl.id = p.pool_id
     CROSS JOIN LATERAL respool._rejection(p_resources, p_preemptible, p.pool_id, p.id, p_selector, p_request_id) rej
     WHERE p.pool_id = ANY (p_pool_ids)
     ORDER BY p.priority DESC, pl.name;
END $$;
COMMENT ON FUNCTION respool._candidate_rejections(text, uuid[], jsonb, boolean, jsonb, uuid) IS
    'Every candidate pool of a request (the subject''s policies on p_pool_ids, respool._subject_policies), in candidate order, with its rejection (docs/admission.md; reason and message NULL when the request can ever fit there). Read-only.';

CREATE OR REPLACE FUNCTION respool._node_blocker(p_resources jsonb, p_pool_id uuid, p_selector jsonb)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_active integer;
    v_key text;
    v_best bigint;
BEGIN
    IF p_selector IS NULL OR NOT respool._pool_has_nodes(p_pool_id)
       OR respool._node_for(p_pool_id, p_resources, p_selector) IS NOT NULL THEN
        RETURN NULL;
    END IF;
    SELECT count(*) INTO v_active FROM respool.nodes n
     WHERE n.pool_id = p_pool_id AND n.state = 'active' AND respool._node_matches(n.name, n.labels, p_selector);
    IF v_active = 0 THEN
        RETURN CASE WHEN p_selector = '{}' THEN 'waiting for a node: every node of the pool is cordoned or draining'
                    ELSE format('waiting for a node: no active node matches node_selector %s', p_selector::text) END;
    END IF;
    -- The first key (by name) on which no active matching node has room, and the most free there.
    SELECT x.key, max(coalesce(nr.capacity - nr.used, 0)) INTO v_key, v_best
      FROM jsonb_each_text(p_resources) x
     CROSS JOIN respool.nodes n
      LEFT JOIN respool.node_resources nr ON nr.node_id = n.id AND nr.key = x.key
     WHERE n.pool_id = p_pool_id AND n.state = 'active' AND respool._node_matches(n.name, n.labels, p_selector)
       AND NOT (nr.key IS NULL AND respool._is_soft_key(x.key))
     GROUP BY x.key, x.value
    HAVING bool_and(nr.key IS NULL OR nr.used + x.value::bigint > nr.capacity)
     ORDER BY x.key LIMIT 1;
    IF v_key IS NULL THEN
        RETURN 'waiting for a node: no single active node has room for all of its keys at once';
    END IF;
    RETURN format('waiting for %s on one node: needs %s, the most free on an active matching node is %s',
                  v_key, p_resources ->> v_key, v_best);
END $$;
COMMENT ON FUNCTION respool._node_blocker(jsonb, uuid, jsonb) IS
    'Why a request of these resources and node selector waits for a node in a pool with nodes (docs/placement.md): NULL when an active matching node has room now (or the pool has no nodes, or p_selector is NULL: a gang), else one sentence (no active matching node, or the first key no active matching node has room for, with the most free). Read-only.';
