-- Placement: the one seam every grant goes through (docs/engine.md, "The placement seam").
--
--   respool._fits     does a request fit what is free: admission rules 1-3 (docs/admission.md)
--                     on the pool and policy counters, and the earmark rule (docs/preemption.md);
--   respool._place    charges granted requests and records where they were placed;
--   respool._unplace  gives a holding request's units back (every path that ends a holding).
--
-- In a pool without nodes a grant is placed in the pool as a whole. In a pool backed by nodes
-- (docs/placement.md) _fits also needs a node that fits, _place puts each grant on one node and
-- its devices, _unplace gives them back. Read-only planners (what-if, ETA, the starvation guard,
-- victim choice) test room maps with the _fits_room_* functions, each named by the rule it
-- applies to a key the room map lacks.

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
                     CASE WHEN pol.reserved = 0 AND pol.configured > 0
                          -- outside the policy's time windows (docs/preemption.md)
                          THEN format('waiting for %s: the reserved share of %s is in force only inside the policy''s time windows',
                                      k.key, pol.configured)
                          ELSE format('waiting for %s: reserved share for non-preemptible work %s/%s used, needs %s',
                                      k.key, coalesce(pol.np_used, 0), coalesce(pol.reserved, 0), k.need) END
                 -- A counter nothing bounds still has a ceiling, so that no sum overflows.
                 WHEN k.need > 0 AND ((c.cap IS NULL AND c.pool_used + k.need > respool._max_total())
                                      OR (pol."limit" IS NULL AND c.subject_used + k.need > respool._max_total())) THEN
                     format('waiting for %s: %s units are held, the most one counter can hold is %s',
                            k.key, greatest(c.pool_used, c.subject_used), respool._max_total())
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
    'Admission rules 1-3 (docs/admission.md) against the current counters of a pool and a policy: NULL when admissible, else one sentence naming the first blocking key. The rules of respool._fits; read-only.';

CREATE OR REPLACE FUNCTION respool._deficit(p_resources jsonb, p_pool_id uuid, p_request_id uuid)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT jsonb_object_agg(x.key, u.used - u.leaving + u.earmarked + x.value::bigint - u.bound)
              FROM jsonb_each_text(p_resources) x
              JOIN respool._usage(p_pool_id, p_request_id) u
                ON u.policy_id IS NULL AND u.key = x.key AND u.bound IS NOT NULL);
END $$;
COMMENT ON FUNCTION respool._deficit(jsonb, uuid, uuid) IS
    'What preemption must free for a need to fit the pool (the reconciler''s side of respool._fits): {tracked key: used - leaving + earmarked + need - capacity} (> 0: units missing), victims in their grace period counted as gone and units earmarked for requests other than p_request_id as taken; NULL when the need has no tracked key. Read-only.';

CREATE OR REPLACE FUNCTION respool._excess(p_pool_id uuid, p_policy_id uuid)
RETURNS TABLE (key text, over bigint, bound bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT u.key, u.used - u.leaving - u.bound, u.bound
      FROM respool._usage(p_pool_id) u
     WHERE u.policy_id IS NOT DISTINCT FROM p_policy_id AND u.bound IS NOT NULL
       AND u.used - u.leaving > u.bound
     ORDER BY u.key;
END $$;
COMMENT ON FUNCTION respool._excess(uuid, uuid) IS
    'The keys on which holders exceed a bound after a shrink (p_policy_id NULL: the pool''s capacities, a removed custom key counting as capacity 0; else that policy''s limits): units over and the bound, victims in their grace period counted as gone. Empty when everything fits. Read-only.';

CREATE OR REPLACE FUNCTION respool._leaves_earmarks(p_resources jsonb, p_pool_id uuid, p_request_id uuid,
                                                    p_earmark_pool_id uuid)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- Once every victim in its grace period has left (their units gone) and every earmarked
    -- request has its units, would this request still fit? Checked only while earmarks exist.
    -- The two cheap tests first, as statements of their own: nearly always one of them ends it.
    IF p_earmark_pool_id IS NOT DISTINCT FROM p_pool_id
       OR NOT EXISTS (SELECT FROM respool.requests b
                       WHERE b.earmark_pool_id = p_pool_id AND b.status = 'queued'
                         AND b.id IS DISTINCT FROM p_request_id) THEN
        RETURN true;
    END IF;
    RETURN NOT EXISTS (
           SELECT FROM jsonb_each_text(p_resources) x
             JOIN respool._usage(p_pool_id, p_request_id) u
               ON u.policy_id IS NULL AND u.key = x.key AND u.bound IS NOT NULL
            WHERE u.used - u.leaving + u.earmarked + x.value::bigint > u.bound);
END $$;
COMMENT ON FUNCTION respool._leaves_earmarks(jsonb, uuid, uuid, uuid) IS
    'The earmark rule (docs/preemption.md): true when granting p_resources in the pool to request p_request_id (NULL: a request not stored yet) leaves every unit earmarked for another request (units victims in their grace period will free) to it. Always true for the earmark holder itself (p_earmark_pool_id = p_pool_id) and while the pool has no earmarks. Read-only.';

CREATE OR REPLACE FUNCTION respool._fit_node(p_resources jsonb, p_preemptible boolean, p_pool_id uuid,
                                             p_policy_id uuid, p_request_id uuid DEFAULT NULL,
                                             p_earmark_pool_id uuid DEFAULT NULL, p_selector jsonb DEFAULT '{}',
                                             OUT fits boolean, OUT node_id uuid)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    fits := respool._blocker(p_resources, p_preemptible, p_pool_id, p_policy_id) IS NULL
            AND respool._leaves_earmarks(p_resources, p_pool_id, p_request_id, p_earmark_pool_id);
    IF fits AND p_selector IS NOT NULL AND respool._pool_has_nodes(p_pool_id) THEN
        node_id := respool._node_for(p_pool_id, p_resources, p_selector, p_request_id);
        fits := node_id IS NOT NULL;
    END IF;
END $$;
COMMENT ON FUNCTION respool._fit_node(jsonb, boolean, uuid, uuid, uuid, uuid, jsonb) IS
    'THE fit decision of every grant: fits is true when p_resources (preemptible or not) of the subject of policy p_policy_id fit what is free in pool p_pool_id now: admission rules 1-3 on the pool and policy counters (respool._blocker), the earmark rule (respool._leaves_earmarks; p_request_id / p_earmark_pool_id: the request''s id and earmark, NULL for a request of that shape not stored yet) and, in a pool with nodes, an active node matching p_selector with room for it: node_id, the node the grant goes to (respool._node_for; p_selector NULL: the node rule is left to the caller, which places a gang member by member). Without nodes, k requests of one shape fit together exactly when one of k times the need fits (every rule is "used + need <= bound"); with nodes, respool._node_slots bounds them. Read-only; the caller holds the pool lock for the answer to stay true.';

CREATE OR REPLACE FUNCTION respool._fits(p_resources jsonb, p_preemptible boolean, p_pool_id uuid, p_policy_id uuid,
                                         p_request_id uuid DEFAULT NULL, p_earmark_pool_id uuid DEFAULT NULL,
                                         p_selector jsonb DEFAULT '{}')
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (respool._fit_node(p_resources, p_preemptible, p_pool_id, p_policy_id, p_request_id, p_earmark_pool_id,
                              p_selector)).fits;
END $$;
COMMENT ON FUNCTION respool._fits(jsonb, boolean, uuid, uuid, uuid, uuid, jsonb) IS
    'respool._fit_node''s decision alone (true or false), for the set-based run''s bisection and read-only planners.';

CREATE OR REPLACE FUNCTION respool._fits_room_unbounded(p_need jsonb, p_room jsonb)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN NOT EXISTS (SELECT FROM jsonb_each_text(p_need) x
                        WHERE p_room ? x.key AND x.value::bigint > (p_room ->> x.key)::bigint);
END $$;
COMMENT ON FUNCTION respool._fits_room_unbounded(jsonb, jsonb) IS
    'True when every key of p_need fits the room map {key: units}; a key the room map lacks is unbounded (free units of a pool: an untracked key). Read-only planners and the cheap first test of a pass.';

CREATE OR REPLACE FUNCTION respool._fits_room_vector(p_need bigint[], p_room bigint[])
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    FOR j IN 1..coalesce(cardinality(p_need), 0) LOOP
        IF p_need[j] > 0 AND p_need[j] > p_room[j] THEN
            RETURN false;
        END IF;
    END LOOP;
    RETURN true;
END $$;
COMMENT ON FUNCTION respool._fits_room_vector(bigint[], bigint[]) IS
    'respool._fits_room_unbounded on unit vectors: p_need and p_room hold the units of the same keys (a pool''s tracked keys) by position; a key not in the vectors is unbounded. For the ETA simulation''s inner loop, which keeps units in arrays.';

CREATE OR REPLACE FUNCTION respool._fits_room_zero(p_need jsonb, p_room jsonb)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN NOT EXISTS (SELECT FROM jsonb_each_text(p_need) x
                        WHERE x.value::bigint > coalesce((p_room ->> x.key)::bigint, 0));
END $$;
COMMENT ON FUNCTION respool._fits_room_zero(jsonb, jsonb) IS
    'True when every key of p_need fits the room map {key: units}; a key the room map lacks has room 0 (a reserved share the subject has no counter for).';

CREATE OR REPLACE FUNCTION respool._fits_every_room(p_need jsonb, p_room jsonb)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN NOT EXISTS (SELECT FROM jsonb_each_text(coalesce(p_room, '{}')) m
                        WHERE coalesce((p_need ->> m.key)::bigint, 0) > m.value::bigint);
END $$;
COMMENT ON FUNCTION respool._fits_every_room(jsonb, jsonb) IS
    'True when no key of the room map {key: units} is passed; a key p_need lacks needs 0, so a room already below 0 fails whatever the need (a limit binds even keys the request does not ask for). A key the room map lacks is unbounded.';

CREATE OR REPLACE FUNCTION respool._take_units(p_map jsonb, p_units jsonb, p_sign integer)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(m.key, m.value::bigint - p_sign * coalesce((p_units ->> m.key)::bigint, 0)), '{}')
              FROM jsonb_each_text(p_map) m);
END $$;
COMMENT ON FUNCTION respool._take_units(jsonb, jsonb, integer) IS
    'p_map {key: units} minus (p_sign 1) or plus (p_sign -1) the amounts p_units holds of the same keys; keys p_map lacks are ignored.';

CREATE OR REPLACE FUNCTION respool._move_units(p_pool_id uuid, p_policy_id uuid, p_units jsonb, p_np jsonb,
                                               p_sign integer)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_keys integer := (SELECT count(*) FROM jsonb_object_keys(p_units));
    v_moved text[];
BEGIN
    -- One guarded statement per table: a charge that would pass a capacity or a limit moves
    -- fewer keys than it has and fails below instead of over-allocating.
    WITH moved AS (
        UPDATE respool.pool_resources pr SET used = pr.used + p_sign * x.value::bigint
          FROM jsonb_each_text(p_units) x
         WHERE pr.pool_id = p_pool_id AND pr.key = x.key
           AND (p_sign < 0 OR pr.used + x.value::bigint <= pr.capacity
                OR (pr.capacity IS NULL AND respool._is_soft_key(pr.key)
                    AND pr.used + x.value::bigint <= respool._max_total()))
        RETURNING pr.key)
    SELECT coalesce(array_agg(key), '{}') INTO v_moved FROM moved;
    IF cardinality(v_moved) < v_keys THEN
        -- Only a soft key the pool does not list may be charged without a counter: it gets an
        -- untracked one.
        IF p_sign < 0 OR EXISTS (SELECT FROM jsonb_object_keys(p_units) k(key)
                                  WHERE k.key <> ALL (v_moved)
                                    AND (NOT respool._is_soft_key(k.key)
                                         OR EXISTS (SELECT FROM respool.pool_resources
                                                     WHERE pool_id = p_pool_id AND key = k.key))) THEN
            RAISE EXCEPTION 'moving % units % in pool % would pass its capacity or finds no counter',
                p_sign, p_units, p_pool_id USING ERRCODE = 'RP500';
        END IF;
        INSERT INTO respool.pool_resources (pool_id, key, used)
        SELECT p_pool_id, x.key, x.value::bigint FROM jsonb_each_text(p_units) x WHERE x.key <> ALL (v_moved);
    END IF;
    WITH moved AS (
        UPDATE respool.policy_resources pol
           SET used = pol.used + p_sign * x.value::bigint,
               np_used = pol.np_used + p_sign * coalesce((p_np ->> x.key)::bigint, 0)
          FROM jsonb_each_text(p_units) x
         WHERE pol.policy_id = p_policy_id AND pol.key = x.key
           AND (p_sign < 0 OR pol.used + x.value::bigint <= coalesce(pol."limit", respool._max_total()))
        RETURNING pol.key)
    SELECT coalesce(array_agg(key), '{}') INTO v_moved FROM moved;
    IF cardinality(v_moved) < v_keys THEN
        -- A key the policy has no counter for (no limit, no reservation) gets one.
        IF p_sign < 0 OR EXISTS (SELECT FROM respool.policy_resources
                                  WHERE policy_id = p_policy_id AND key IN (SELECT jsonb_object_keys(p_units))
                                    AND key <> ALL (v_moved)) THEN
            RAISE EXCEPTION 'moving % units % of policy % would pass its limit or finds no counter',
                p_sign, p_units, p_policy_id USING ERRCODE = 'RP500';
        END IF;
        INSERT INTO respool.policy_resources (policy_id, key, used, np_used)
        SELECT p_policy_id, x.key, x.value::bigint, coalesce((p_np ->> x.key)::bigint, 0)
          FROM jsonb_each_text(p_units) x WHERE x.key <> ALL (v_moved);
    END IF;
END $$;
COMMENT ON FUNCTION respool._move_units(uuid, uuid, jsonb, jsonb, integer) IS
    'Charges (p_sign 1) or returns (p_sign -1) units {key: n} on a pool''s counters and one policy''s counters (p_np: the non-preemptible part), one statement per table. A charge is guarded (used + n <= capacity / limit, or respool._max_total() for a counter nothing else bounds) and raises RP500 rather than over-allocate; a soft key the pool does not list gets an untracked counter, a key the policy does not bound a plain one. CHECK used >= 0 catches a double return.';

CREATE OR REPLACE FUNCTION respool._place(p_pool_id uuid, p_policy_id uuid, p_granted respool.requests[],
                                          p_nodes uuid[] DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_req respool.requests;
    v_node uuid;
    v_gang_nodes uuid[] := '{}';
BEGIN
    -- The charge: one guarded statement per counter table for all of them.
    IF cardinality(p_granted) = 1 THEN
        PERFORM respool._move_units(p_pool_id, p_policy_id, p_granted[1].resources, p_granted[1].np_charge, 1);
    ELSE
        PERFORM respool._move_units(p_pool_id, p_policy_id,
                                    respool._sum_units(ARRAY(SELECT g.resources FROM unnest(p_granted) g)),
                                    respool._sum_units(ARRAY(SELECT g.np_charge FROM unnest(p_granted) g)), 1);
    END IF;
    IF NOT respool._pool_has_nodes(p_pool_id) THEN
        RETURN;  -- placed in the pool as a whole: nothing below the pool to record
    END IF;
    -- The placement: one node each, in grant order (a gang member by member; with distinct_nodes
    -- never on a node another member of the same grant took).
    FOR i IN 1..cardinality(p_granted) LOOP
        v_req := p_granted[i];
        -- (a node respool._fit_node already chose for this grant, under the same lock)
        v_node := coalesce(p_nodes[i],
                           respool._node_for(p_pool_id, v_req.resources, v_req.node_selector, v_req.id,
                                             CASE WHEN v_req.distinct_nodes THEN v_gang_nodes ELSE '{}' END));
        IF v_node IS NULL THEN
            RAISE EXCEPTION 'request % fits no node of pool % now', v_req.id, p_pool_id USING ERRCODE = 'RP501';
        END IF;
        PERFORM respool._place_on_node(v_req, v_node);
        v_gang_nodes := v_gang_nodes || v_node;
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._place(uuid, uuid, respool.requests[], uuid[]) IS
    'Places requests the caller has just moved to allocated (in a pool it has locked, under one policy): charges their resources (np_charge: the non-preemptible part) on the pool''s and the policy''s counters in one guarded statement per table, RP500 rather than over-allocate; in a pool with nodes puts each, in order, on its node (p_nodes[i] when the caller''s respool._fit_node chose it, else the one respool._node_for chooses now) and its first free devices (respool._place_on_node; gang members with distinct_nodes on different nodes), RP501 when one fits no node (a gang that cannot be placed member by member: the caller''s subtransaction takes it back). The caller checked respool._fit_node first. The counterpart is respool._unplace.';

CREATE OR REPLACE FUNCTION respool._unplace(p_request_id uuid)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests := (SELECT q FROM respool.requests q WHERE q.id = p_request_id);
    v_node uuid;
    v_units jsonb;
BEGIN
    PERFORM respool._move_units(r.pool_id, r.policy_id, r.resources, r.np_charge, -1);
    DELETE FROM respool.placements WHERE request_id = p_request_id RETURNING node_id, resources INTO v_node, v_units;
    IF FOUND THEN
        UPDATE respool.node_resources nr SET used = nr.used - x.value::bigint
          FROM jsonb_each_text(v_units) x
         WHERE nr.node_id = v_node AND nr.key = x.key;
        -- Where it ran stays readable once it ends (docs/placement.md, "Where a request ran"):
        -- the same document as its placement had, from the node and the devices it still holds.
        UPDATE respool.requests SET last_placement = (
                   SELECT jsonb_build_object(
                              'node', n.name, 'labels', n.labels,
                              'devices', coalesce((SELECT jsonb_object_agg(d.key, d.ids)
                                                     FROM (SELECT nd.key, jsonb_agg(nd.device ORDER BY nd.position) AS ids
                                                             FROM respool.node_devices nd
                                                            WHERE nd.holder_id = p_request_id
                                                            GROUP BY nd.key) d), '{}'::jsonb))
                     FROM respool.nodes n WHERE n.id = v_node)
         WHERE id = p_request_id;
        UPDATE respool.node_devices SET holder_id = NULL WHERE holder_id = p_request_id;
    END IF;
END $$;
COMMENT ON FUNCTION respool._unplace(uuid) IS
    'Gives a holding request''s units back: returns them to its pool''s and policy''s counters and, when it was placed on a node, to the node''s counters and devices, and removes its placement (CHECK used >= 0 catches a double return), keeping it as the request''s last_placement. Every path that ends a holding goes through it: release, cancel, lease expiry, max_seconds, preemption, grace end, forced deletes and node removal. The caller changes the status, which clears the lease, runtime cap and charge (respool._set_status).';

-- Nodes (docs/placement.md). In a pool backed by nodes every grant is also placed on one active node
-- that matches the request's node_selector and has room for every key of the request it tracks
-- (a soft key a node lacks is unbounded there, any other key it lacks has room 0), and on the
-- first free device ids of each key with named devices. The pool's counters keep every rule of
-- an abstract pool; the node counters add the node rule. Everything below reads only counters
-- that change under the pool's row lock, which every caller holds.

CREATE OR REPLACE FUNCTION respool._pool_has_nodes(p_pool_id uuid)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT FROM respool.nodes WHERE pool_id = p_pool_id);
END $$;
COMMENT ON FUNCTION respool._pool_has_nodes(uuid) IS
    'True when the pool is backed by nodes (any state): its grants are placed on nodes (docs/placement.md). One index probe.';

CREATE OR REPLACE FUNCTION respool._node_matches(p_name text, p_labels jsonb, p_selector jsonb)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    -- (SQL, so that the planner inlines it into the queries over a pool's nodes)
    SELECT p_selector IS NULL OR p_selector = '{}'
        OR (p_labels || jsonb_build_object('node', p_name)) @> p_selector
$$;
COMMENT ON FUNCTION respool._node_matches(text, jsonb, jsonb) IS
    'True when a node (name, labels) carries every label of the selector {label: value}; the built-in label node is its name. An empty or NULL selector matches every node.';

CREATE OR REPLACE FUNCTION respool._node_for(p_pool_id uuid, p_resources jsonb, p_selector jsonb,
                                             p_request_id uuid DEFAULT NULL, p_exclude uuid[] DEFAULT '{}')
RETURNS uuid LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_spread boolean;
    v_mine uuid;
    v_earmarks boolean;
    v_keys text[];
    v_need bigint[];
    v_hard integer;  -- keys of the request a node must track (non-soft keys)
    v_job boolean := false;
BEGIN
    SELECT placement = 'spread' INTO v_spread FROM respool.pools WHERE id = p_pool_id;
    IF p_request_id IS NOT NULL THEN
        SELECT earmark_node_id, command IS NOT NULL INTO v_mine, v_job FROM respool.requests WHERE id = p_request_id;
    END IF;
    -- Units that victims in their grace period free on a node are kept for the request they were
    -- preempted for (docs/preemption.md): others get a node's room net of them.
    v_earmarks := EXISTS (SELECT FROM respool.requests b
                           WHERE b.earmark_pool_id = p_pool_id AND b.status = 'queued'
                             AND b.earmark_node_id IS NOT NULL AND b.id IS DISTINCT FROM p_request_id);
    SELECT array_agg(x.key), array_agg(x.value::bigint), count(*) FILTER (WHERE NOT respool._is_soft_key(x.key))
      INTO v_keys, v_need, v_hard
      FROM jsonb_each_text(p_resources) x WHERE x.value::bigint > 0;
    -- One pass over the pool's active nodes and their counters of the request's keys: a node
    -- fits when every key it tracks has room and it tracks every non-soft key.
    RETURN (
        SELECT n.id
          FROM respool.nodes n
          LEFT JOIN respool.node_resources nr ON nr.node_id = n.id AND nr.key = ANY (v_keys)
         WHERE n.pool_id = p_pool_id AND n.state = 'active' AND n.id <> ALL (p_exclude)
           AND (NOT v_job OR n.agent IS DISTINCT FROM 'lost')  -- a lost agent takes no new jobs (docs/jobs.md)
           AND (p_selector = '{}' OR (n.labels || jsonb_build_object('node', n.name)) @> p_selector)
         GROUP BY n.id, n.name
        HAVING bool_and(nr.key IS NULL OR nr.used + v_need[array_position(v_keys, nr.key)] <= nr.capacity)
           AND count(nr.key) FILTER (WHERE NOT respool._is_soft_key(nr.key)) = v_hard
           AND (NOT v_earmarks OR respool._node_leaves_earmarks(n.id, p_resources, p_request_id))
         -- What the node is left with once the request is placed (docs/placement.md): nodes
         -- differ in which keys they name devices for, so free-now would order them otherwise.
         ORDER BY n.id IS NOT DISTINCT FROM v_mine DESC,
                  CASE WHEN v_spread THEN -1 ELSE 1 END
                  * coalesce(sum(nr.capacity - nr.used - v_need[array_position(v_keys, nr.key)])
                             FILTER (WHERE nr.devices > 0), 0),
                  CASE WHEN v_spread THEN -1 ELSE 1 END
                  * coalesce(sum(nr.capacity - nr.used - v_need[array_position(v_keys, nr.key)]), 0),
                  n.name
         LIMIT 1);
END $$;
COMMENT ON FUNCTION respool._node_for(uuid, jsonb, jsonb, uuid, uuid[]) IS
    'The node a grant of p_resources goes to in a pool with nodes (docs/placement.md), NULL when none fits now: an active node of the pool, not in p_exclude, matching the selector (for a job: whose agent is not lost, docs/jobs.md), where every key of the request fits (node used + need <= node capacity; a soft key the node lacks is unbounded, any other key it lacks has room 0) and that leaves units earmarked on it for other requests to them. The node earmarked for p_request_id first; then the pool''s placement: pack takes the node left with the fewest free units of the request''s device keys (keys the node names devices for) once it is placed, then the fewest left over its keys, then the name; spread the most. Read-only; the caller holds the pool lock.';

CREATE OR REPLACE FUNCTION respool._node_leaves_earmarks(p_node_id uuid, p_resources jsonb, p_request_id uuid)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- On this node, victims in their grace period count as gone and the needs of the requests
    -- they were preempted for (other than p_request_id) as taken.
    RETURN NOT EXISTS (
        SELECT FROM jsonb_each_text(p_resources) x
          JOIN respool.node_resources nr ON nr.node_id = p_node_id AND nr.key = x.key
         WHERE nr.used + x.value::bigint
               - coalesce((SELECT sum((pl.resources ->> x.key)::bigint)
                             FROM respool.placements pl JOIN respool.requests v ON v.id = pl.request_id
                            WHERE pl.node_id = p_node_id AND v.status = 'preempting'), 0)
               + coalesce((SELECT sum((b.resources ->> x.key)::bigint) FROM respool.requests b
                            WHERE b.earmark_node_id = p_node_id AND b.status = 'queued'
                              AND b.id IS DISTINCT FROM p_request_id), 0)
               > nr.capacity);
END $$;
COMMENT ON FUNCTION respool._node_leaves_earmarks(uuid, jsonb, uuid) IS
    'The earmark rule on one node: true when p_resources fit the node once its victims in their grace period have left and every request earmarked on it (other than p_request_id) has its units. Read-only.';

CREATE OR REPLACE FUNCTION respool._node_slots(p_pool_id uuid, p_resources jsonb, p_selector jsonb)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- Requests of one shape are placed one per node slot: on a node, as many as fit on every
    -- key it tracks; a node lacking a non-soft key of the shape holds none.
    RETURN (SELECT coalesce(sum(s.slots), 0) FROM (
        SELECT CASE WHEN bool_or(nr.key IS NULL AND NOT respool._is_soft_key(x.key)) THEN 0
                    ELSE coalesce(min((nr.capacity - nr.used) / x.value::bigint)
                                  FILTER (WHERE nr.key IS NOT NULL AND x.value::bigint > 0), respool._max_batch()) END
                   AS slots
          FROM respool.nodes n
         CROSS JOIN jsonb_each_text(p_resources) x
          LEFT JOIN respool.node_resources nr ON nr.node_id = n.id AND nr.key = x.key
         WHERE n.pool_id = p_pool_id AND n.state = 'active' AND respool._node_matches(n.name, n.labels, p_selector)
         GROUP BY n.id) s WHERE s.slots > 0);
END $$;
COMMENT ON FUNCTION respool._node_slots(uuid, jsonb, jsonb) IS
    'How many requests of one shape (resources, selector) the active matching nodes of a pool hold now, placed one per node slot: per node the fewest whole needs that fit its free units of any key it tracks. Exact for requests alike (nodes are independent), so a set-based run in a pool with nodes grants at most this many. Only while no earmark is pending in the pool. Read-only.';

CREATE OR REPLACE FUNCTION respool._place_on_node(p_request respool.requests, p_node_id uuid)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_units jsonb;
    v_over boolean;
    v_named bigint;
    v_taken integer;
BEGIN
    -- The charge: the request's units of the keys the node tracks, on the node's counters, in one
    -- statement. A charge that passes a capacity raises below and the transaction rolls back:
    -- a bug fails loudly instead of over-allocating.
    WITH charged AS (
        UPDATE respool.node_resources nr SET used = nr.used + x.value::bigint
          FROM jsonb_each_text(p_request.resources) x
         WHERE nr.node_id = p_node_id AND nr.key = x.key
        RETURNING nr.key, x.value::bigint AS n, nr.used > nr.capacity AS over, nr.devices > 0 AS named)
    SELECT coalesce(jsonb_object_agg(c.key, c.n), '{}'), coalesce(bool_or(c.over), false),
           coalesce(sum(c.n) FILTER (WHERE c.named), 0)
      INTO v_units, v_over, v_named
      FROM charged c;
    IF v_over THEN
        RAISE EXCEPTION 'placing request % on node %: % would pass the node''s capacity', p_request.id, p_node_id, v_units
            USING ERRCODE = 'RP500';
    END IF;
    -- Devices: the first free ids of each named key, in the node's list order. The holder column
    -- takes one holder per device; a device already held is never taken (holder_id IS NULL).
    IF v_named > 0 THEN
        WITH wanted AS (
            SELECT d.key, d.device
              FROM (SELECT d.key, d.device, row_number() OVER (PARTITION BY d.key ORDER BY d.position) AS n
                      FROM respool.node_devices d
                     WHERE d.node_id = p_node_id AND d.holder_id IS NULL AND v_units ? d.key) d
             WHERE d.n <= (v_units ->> d.key)::bigint)
        UPDATE respool.node_devices t SET holder_id = p_request.id
          FROM wanted w
         WHERE t.node_id = p_node_id AND t.key = w.key AND t.device = w.device AND t.holder_id IS NULL;
        GET DIAGNOSTICS v_taken = ROW_COUNT;
        IF v_taken <> v_named THEN
            RAISE EXCEPTION 'placing request % on node %: % free devices for % named units', p_request.id, p_node_id,
                v_taken, v_named USING ERRCODE = 'RP500';
        END IF;
    END IF;
    INSERT INTO respool.placements (request_id, node_id, resources) VALUES (p_request.id, p_node_id, v_units);
END $$;
COMMENT ON FUNCTION respool._place_on_node(respool.requests, uuid) IS
    'Charges a granted request on one node: its units of the keys the node tracks on the node''s counters (one statement; a charge that would pass a capacity raises RP500 and rolls back), the first free device ids of each named key in list order (one holder per device; RP500 when fewer are free than needed), and its placement row. The caller chose the node (respool._node_for) under the pool lock.';

-- Gangs on nodes (docs/placement.md, gangs on nodes): an arrangement of a gang's members on a
-- pool's nodes, each member on one node, found by a bounded search instead of member by member.

CREATE OR REPLACE FUNCTION respool._gang_max_exact()
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 12 $$;
COMMENT ON FUNCTION respool._gang_max_exact() IS
    'The largest gang whose arrangement on nodes is searched exactly (respool._gang_arrangement); larger gangs are judged by a necessary condition only (docs/placement.md).';

CREATE OR REPLACE FUNCTION respool._gang_arrangement(p_pool_id uuid, p_needs jsonb[], p_selector jsonb,
                                                     p_distinct boolean, p_now boolean,
                                                     p_request_id uuid DEFAULT NULL,
                                                     OUT placeable boolean, OUT nodes uuid[])
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_keys text[];
    v_nk integer;
    v_node_ids uuid[];
    v_nn integer;
    v_m integer := coalesce(cardinality(p_needs), 0);
    room bigint[];      -- room[(n-1)*K + k]: what node n has left of key k (soft key it lacks: unbounded)
    need bigint[];      -- need[(m-1)*K + k]
    ord integer[];      -- members, largest first
    choice integer[];
    lob integer[];      -- per depth: the first node its member may take
    used boolean[];
    d integer;
    m integer;
    lo integer;
    found integer;
    ok boolean;
    same boolean;
    v_steps integer := 0;
    v_earmarks boolean;
    big constant bigint := 9223372036854775807;
    r record;
BEGIN
    nodes := NULL;
    IF v_m = 0 THEN
        placeable := true;
        RETURN;
    END IF;
    SELECT array_agg(DISTINCT x.key ORDER BY x.key) INTO v_keys
      FROM unnest(p_needs) nm CROSS JOIN LATERAL jsonb_each_text(nm) x WHERE x.value::bigint > 0;
    v_nk := coalesce(cardinality(v_keys), 0);
    -- The candidate nodes: p_now, the active ones with what is free on them now (net of units
    -- earmarked there for other requests, victims in their grace period counted as gone);
    -- otherwise every node of the pool in any state, empty. In the pool's placement order
    -- (pack: fewest free first), so that the first arrangement found is close to its choice.
    v_earmarks := p_now AND EXISTS (SELECT FROM respool.requests b
                                     WHERE b.earmark_pool_id = p_pool_id AND b.status = 'queued'
                                       AND b.earmark_node_id IS NOT NULL AND b.id IS DISTINCT FROM p_request_id);
    room := '{}';
    v_node_ids := '{}';
    FOR r IN
        SELECT n.id,
               ARRAY(SELECT CASE WHEN nr.key IS NULL THEN CASE WHEN respool._is_soft_key(k.key) THEN big ELSE 0 END
                                 WHEN NOT p_now THEN nr.capacity
                                 ELSE nr.capacity - nr.used
                                      - CASE WHEN v_earmarks THEN greatest(0,
                                            coalesce((SELECT sum((b.resources ->> k.key)::bigint) FROM respool.requests b
                                                       WHERE b.earmark_node_id = n.id AND b.status = 'queued'
                                                         AND b.id IS DISTINCT FROM p_request_id), 0)
                                            - coalesce((SELECT sum((pl.resources ->> k.key)::bigint)
                                                          FROM respool.placements pl
                                                          JOIN respool.requests v ON v.id = pl.request_id
                                                         WHERE pl.node_id = n.id AND v.status = 'preempting'), 0))
                                             ELSE 0 END END
                       FROM unnest(v_keys) WITH ORDINALITY k(key, i)
                       LEFT JOIN respool.node_resources nr ON nr.node_id = n.id AND nr.key = k.key
                      ORDER BY k.i) AS rm,
               (SELECT coalesce(sum(nr.capacity - CASE WHEN p_now THEN nr.used ELSE 0 END), 0)
                  FROM respool.node_resources nr WHERE nr.node_id = n.id AND nr.key = ANY (v_keys)) AS free
          FROM respool.nodes n
         WHERE n.pool_id = p_pool_id AND (NOT p_now OR n.state = 'active')
           AND respool._node_matches(n.name, n.labels, p_selector)
         ORDER BY CASE WHEN (SELECT placement FROM respool.pools WHERE id = p_pool_id) = 'spread' THEN -1 ELSE 1 END
                  * (SELECT coalesce(sum(nr.capacity - CASE WHEN p_now THEN nr.used ELSE 0 END), 0)
                       FROM respool.node_resources nr WHERE nr.node_id = n.id AND nr.key = ANY (v_keys)),
                  n.name
    LOOP
        v_node_ids := v_node_ids || r.id;
        room := room || r.rm;
    END LOOP;
    v_nn := cardinality(v_node_ids);
    need := ARRAY(SELECT coalesce((p_needs[i] ->> k.key)::bigint, 0)
                    FROM generate_series(1, v_m) i CROSS JOIN unnest(v_keys) WITH ORDINALITY k(key, j)
                   ORDER BY i, k.j);
    IF v_nn = 0 OR (p_distinct AND v_nn < v_m) THEN
        placeable := false;
        RETURN;
    END IF;
    IF v_m > respool._gang_max_exact() THEN
        -- A necessary condition only (a large gang): per key the members' sum fits the nodes'
        -- sum, and the nodes can hold as many members as there are, a node at most as many as
        -- its room holds of the smallest needs of every key (distinct_nodes: one).
        placeable := NOT EXISTS (
                SELECT FROM generate_series(1, v_nk) k
                 WHERE (SELECT sum(need[(i - 1) * v_nk + k]) FROM generate_series(1, v_m) i)
                       > (SELECT sum(least(room[(n - 1) * v_nk + k], big / (v_nn + 1))) FROM generate_series(1, v_nn) n))
            AND (SELECT sum(c.cnt) FROM (
                    SELECT (SELECT CASE WHEN p_distinct THEN least(min(s.cnt), 1) ELSE min(s.cnt) END FROM (
                              SELECT k, (SELECT count(*) FROM (
                                           SELECT sum(need[(i - 1) * v_nk + k]) OVER (ORDER BY need[(i - 1) * v_nk + k], i) AS run
                                             FROM generate_series(1, v_m) i) p
                                          WHERE p.run <= room[(n - 1) * v_nk + k]) AS cnt
                                FROM generate_series(1, v_nk) k) s) AS cnt
                      FROM generate_series(1, v_nn) n) c) >= v_m;
        RETURN;
    END IF;
    -- Exact: depth-first over the members, largest first (by their share of the largest room
    -- of each key); alike members take nodes in increasing order and nodes with alike rooms are
    -- tried once per member (both only cut arrangements that mirror one already tried).
    ord := ARRAY(SELECT i FROM generate_series(1, v_m) i
                  ORDER BY (SELECT sum(need[(i - 1) * v_nk + k]::double precision
                                       / greatest(1, (SELECT max(least(room[(n - 1) * v_nk + k], big / 2))
                                                        FROM generate_series(1, v_nn) n)))
                              FROM generate_series(1, v_nk) k) DESC, i);
    choice := array_fill(0, ARRAY[v_m]);
    lob := array_fill(1, ARRAY[v_m]);
    used := array_fill(false, ARRAY[v_nn]);
    d := 1;
    LOOP
        v_steps := v_steps + 1;
        IF v_steps > 20000 THEN
            placeable := NULL;  -- undecided within the budget: the caller treats it as may fit
            RETURN;
        END IF;
        m := ord[d];
        IF choice[d] > 0 THEN  -- take the member back from the node it was on, try the next
            FOR k IN 1..v_nk LOOP
                IF room[(choice[d] - 1) * v_nk + k] <> big THEN
                    room[(choice[d] - 1) * v_nk + k] := room[(choice[d] - 1) * v_nk + k] + need[(m - 1) * v_nk + k];
                END IF;
            END LOOP;
            used[choice[d]] := false;
            lo := choice[d] + 1;
        ELSIF d > 1 AND need[(m - 1) * v_nk + 1:m * v_nk] = need[(ord[d - 1] - 1) * v_nk + 1:ord[d - 1] * v_nk] THEN
            lo := choice[d - 1] + CASE WHEN p_distinct THEN 1 ELSE 0 END;
            lob[d] := lo;
        ELSE
            lo := 1;
            lob[d] := lo;
        END IF;
        found := 0;
        FOR n IN lo..v_nn LOOP
            CONTINUE WHEN p_distinct AND used[n];
            ok := true;
            FOR k IN 1..v_nk LOOP
                IF need[(m - 1) * v_nk + k] > room[(n - 1) * v_nk + k] THEN
                    ok := false;
                    EXIT;
                END IF;
            END LOOP;
            CONTINUE WHEN NOT ok;
            same := false;
            FOR n2 IN lob[d]..n - 1 LOOP
                IF NOT (p_distinct AND used[n2])
                   AND room[(n2 - 1) * v_nk + 1:n2 * v_nk] = room[(n - 1) * v_nk + 1:n * v_nk] THEN
                    same := true;
                    EXIT;
                END IF;
            END LOOP;
            CONTINUE WHEN same;
            found := n;
            EXIT;
        END LOOP;
        IF found = 0 THEN
            choice[d] := 0;
            d := d - 1;
            IF d = 0 THEN
                placeable := false;
                RETURN;
            END IF;
        ELSE
            FOR k IN 1..v_nk LOOP
                IF room[(found - 1) * v_nk + k] <> big THEN
                    room[(found - 1) * v_nk + k] := room[(found - 1) * v_nk + k] - need[(m - 1) * v_nk + k];
                END IF;
            END LOOP;
            used[found] := true;
            choice[d] := found;
            d := d + 1;
            IF d > v_m THEN
                placeable := true;
                nodes := ARRAY(SELECT v_node_ids[choice[array_position(ord, i)]] FROM generate_series(1, v_m) i);
                RETURN;
            END IF;
        END IF;
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._gang_arrangement(uuid, jsonb[], jsonb, boolean, boolean, uuid) IS
    'Whether a gang''s members (p_needs, in member order) can be arranged on the nodes of a pool matching p_selector, each member on one node (with p_distinct on different nodes), every key of a member fitting its node (a soft key the node lacks is unbounded, any other key it lacks has room 0). p_now: on the active nodes'' free units now (net of units earmarked there for other requests), and nodes gives the node of each member; else on every node in any state, empty (can the gang ever be placed). Exact for gangs of up to respool._gang_max_exact() members (a bounded depth-first search; placeable NULL when it runs out of steps: undecided); above, placeable is a necessary condition only (per key the sum fits, and the nodes can hold as many members) and nodes is NULL. Read-only.';
