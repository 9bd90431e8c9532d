-- Placement: the one seam every grant goes through (docs/engine.md, "The placement seam"), and
-- every placement rule: node choice, node slots, gangs on nodes, the node rejections and blockers.
--
--   respool._fits     does a request fit what is free: admission rules 1-3 (docs/admission.md)
--                     on the pool and policy counters, and the earmark rule (docs/preemption.md);
--   respool._place    charges granted requests and records where they were placed;
--   respool._unplace  gives a holding request's units back (every path that ends a holding).
--
-- In a pool without nodes a grant is placed in the pool as a whole. In a pool backed by nodes
-- (docs/placement.md) _fits also needs a node that fits, _place puts each grant on one node and
-- its devices, _unplace gives them back. Every room, fit and count here is the capacity model's
-- (029_capacity.sql: respool._pool_place, respool._node_places, respool._room, respool._fits_room, respool._how_many).

CREATE OR REPLACE FUNCTION respool._blocker(p_resources jsonb, p_preemptible boolean, p_pool_id uuid, p_policy_id uuid)
RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- PL/pgSQL, not SQL: PostgreSQL before 18 plans a SQL function's body on every call, and
    -- this runs for every grant attempt and every read of a queued request.
    -- Per key: the pool place's room (respool._pool_place), the subject's room under its limit (a
    -- key without one: the counter's ceiling) and, for non-preemptible work on a bounded key,
    -- under its reserved share. Limits bind keys the request does not ask for (need 0).
    RETURN (SELECT msg FROM (
        SELECT k.key,
               CASE
                 WHEN k.capacity IS NOT NULL AND k.need > 0 AND NOT respool._fits_room(k.need, k.room) THEN
                     format('waiting for %s: pool %s/%s used, needs %s', k.key, k.used, k.capacity, k.need)
                 WHEN pol."limit" IS NOT NULL AND NOT respool._fits_room(k.need, s.room) THEN
                     format('waiting for %s: subject limit reached, %s/%s used, needs %s',
                            k.key, s.used, pol."limit", k.need)
                 WHEN NOT p_preemptible AND k.capacity IS NOT NULL AND k.need > 0
                      AND NOT respool._fits_room(k.need, respool._room(coalesce(pol.reserved, 0), coalesce(pol.np_used, 0))) THEN
                     CASE WHEN pol.reserved = 0 AND pol.configured > 0
                          -- outside the policy's time windows (docs/preemption.md)
                          THEN format('waiting for %s: the reserved share of %s is in force only inside the policy''s time windows',
                                      k.key, pol.configured)
                          ELSE format('waiting for %s: reserved share for non-preemptible work %s/%s used, needs %s',
                                      k.key, coalesce(pol.np_used, 0), coalesce(pol.reserved, 0), k.need) END
                 -- A counter nothing bounds still has a ceiling, so that no sum overflows.
                 WHEN k.need > 0 AND (NOT respool._fits_room(k.need, k.room) OR NOT respool._fits_room(k.need, s.room)) THEN
                     format('waiting for %s: %s units are held, the most one counter can hold is %s',
                            k.key, greatest(k.used, s.used), respool._max_total())
               END AS msg
          FROM (SELECT p.key, p.need, p.capacity, p.used, p.room FROM respool._pool_place(p_pool_id, p_resources) p
                UNION ALL
                SELECT l.key, 0, NULL, NULL, NULL FROM respool.policy_resources l
                 WHERE l.policy_id = p_policy_id AND l."limit" IS NOT NULL AND NOT p_resources ? l.key) k
          LEFT JOIN respool.policy_resources pol ON pol.policy_id = p_policy_id AND pol.key = k.key
         CROSS JOIN LATERAL (SELECT coalesce(pol.used, 0) AS used,
                                    respool._room(pol."limit", coalesce(pol.used, 0)) AS room) s
    ) checks
    WHERE msg IS NOT NULL
    ORDER BY key
    LIMIT 1);
END $$;
COMMENT ON FUNCTION respool._blocker(jsonb, boolean, uuid, uuid) IS
    'Admission rules 1-3 (docs/admission.md) against the current counters of a pool and a policy: NULL when admissible, else one sentence naming the first blocking key. Rooms from the capacity model (respool._pool_place, respool._room); the rules of respool._fits; read-only.';

CREATE OR REPLACE FUNCTION respool._fit_count(p_resources jsonb, p_preemptible boolean, p_pool_id uuid,
                                              p_policy_id uuid)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_moving boolean := respool._earmarked(p_pool_id);
    n bigint;
BEGIN
    -- The bounds of respool._blocker and the earmark rule are all "k * need <= room": the
    -- least respool._how_many over them is the count, by division.
    SELECT min(least(CASE WHEN k.need > 0 THEN respool._how_many(k.need, k.room) END,
                     respool._how_many(k.need, respool._room(pol."limit", coalesce(pol.used, 0))),
                     CASE WHEN NOT p_preemptible AND k.capacity IS NOT NULL AND k.need > 0
                          THEN respool._how_many(k.need, respool._room(coalesce(pol.reserved, 0), coalesce(pol.np_used, 0)))
                     END))
      INTO n
      FROM (SELECT p.key, p.need, p.capacity, p.room FROM respool._pool_place(p_pool_id, p_resources, NULL, v_moving) p
            UNION ALL
            SELECT l.key, 0, NULL, NULL FROM respool.policy_resources l
             WHERE l.policy_id = p_policy_id AND l."limit" IS NOT NULL AND NOT p_resources ? l.key) k
      LEFT JOIN respool.policy_resources pol ON pol.policy_id = p_policy_id AND pol.key = k.key;
    RETURN least(coalesce(n, respool._max_batch()), respool._max_batch());
END $$;
COMMENT ON FUNCTION respool._fit_count(jsonb, boolean, uuid, uuid) IS
    'How many requests of one shape fit the pool and policy counters together now (at most respool._max_batch()): the largest k for which respool._fits of k times the need holds without a node check (rules 1-3, earmarks for any other request), by division (respool._how_many), not by re-testing. In a pool with nodes respool._node_slots bounds it further. Read-only.';

CREATE OR REPLACE FUNCTION respool._deficit(p_resources jsonb, p_pool_id uuid, p_request_id uuid)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_moving boolean := respool._moving(p_pool_id, p_request_id);
BEGIN
    RETURN (SELECT jsonb_object_agg(p.key, p.need - p.room_settled)
              FROM respool._pool_place(p_pool_id, p_resources, p_request_id, v_moving) p
             WHERE p.capacity IS NOT NULL);
END $$;
COMMENT ON FUNCTION respool._deficit(jsonb, uuid, uuid) IS
    'What preemption must free for a need to fit the pool (the reconciler''s side of respool._fits): {bounded key: need - room_settled} (> 0: units missing; respool._pool_place: victims in their grace period counted as gone, units earmarked for requests other than p_request_id as taken); NULL when the need has no bounded key. Read-only.';

CREATE OR REPLACE FUNCTION respool._excess(p_pool_id uuid, p_policy_id uuid)
RETURNS TABLE (key text, over bigint, bound bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT u.key, -r.room, u.bound
      FROM respool._usage(p_pool_id) u
     CROSS JOIN LATERAL (SELECT respool._room(u.bound, u.used - u.leaving) AS room) r
     WHERE u.policy_id IS NOT DISTINCT FROM p_policy_id AND u.bound IS NOT NULL
       AND NOT respool._fits_room(0, r.room)
     ORDER BY u.key;
END $$;
COMMENT ON FUNCTION respool._excess(uuid, uuid) IS
    'The keys on which holders exceed a bound after a shrink (p_policy_id NULL: the pool''s capacities, a removed custom key counting as capacity 0; else that policy''s limits): units over and the bound, victims in their grace period counted as gone (a room below 0, respool._room). Empty when everything fits. Read-only.';

CREATE OR REPLACE FUNCTION respool._leaves_earmarks(p_resources jsonb, p_pool_id uuid, p_request_id uuid,
                                                    p_earmark_pool_id uuid)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- Once every victim in its grace period has left (their units gone) and every earmarked
    -- request has its units, would this request still fit? Checked only while earmarks exist.
    -- The two cheap tests first, as statements of their own: nearly always one of them ends it.
    IF p_earmark_pool_id IS NOT DISTINCT FROM p_pool_id OR NOT respool._earmarked(p_pool_id, p_request_id) THEN
        RETURN true;
    END IF;
    RETURN NOT EXISTS (SELECT FROM respool._pool_place(p_pool_id, p_resources, p_request_id, true) p
                        WHERE p.capacity IS NOT NULL AND NOT respool._fits_room(p.need, p.room_settled));
END $$;
COMMENT ON FUNCTION respool._leaves_earmarks(jsonb, uuid, uuid, uuid) IS
    'The earmark rule (docs/preemption.md): true when granting p_resources in the pool to request p_request_id (NULL: a request not stored yet) leaves every unit earmarked for another request (units victims in their grace period will free) to it: the need fits the pool place''s room_settled (respool._pool_place). Always true for the earmark holder itself (p_earmark_pool_id = p_pool_id) and while the pool has no earmarks. Read-only.';

CREATE OR REPLACE FUNCTION respool._fit_node(p_resources jsonb, p_preemptible boolean, p_pool_id uuid,
                                             p_policy_id uuid, p_request_id uuid DEFAULT NULL,
                                             p_earmark_pool_id uuid DEFAULT NULL, p_selector jsonb DEFAULT '{}',
                                             OUT fits boolean, OUT node_id uuid)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- The fit decision of every grant. p_selector NULL leaves the node rule to the caller, which
    -- places a gang member by member. Without nodes, k requests of one shape fit together exactly
    -- when one of k times the need fits (every rule is "used + need <= bound"); with nodes,
    -- respool._node_slots bounds them.
    fits := respool._blocker(p_resources, p_preemptible, p_pool_id, p_policy_id) IS NULL
            AND respool._leaves_earmarks(p_resources, p_pool_id, p_request_id, p_earmark_pool_id);
    IF fits AND p_selector IS NOT NULL AND respool._pool_has_nodes(p_pool_id)
       AND NOT respool._holds_no_node(p_pool_id, p_resources, p_request_id) THEN
        node_id := respool._node_for(p_pool_id, p_resources, p_selector, p_request_id);
        fits := node_id IS NOT NULL;
    END IF;
END $$;
COMMENT ON FUNCTION respool._fit_node(jsonb, boolean, uuid, uuid, uuid, uuid, jsonb) IS
    'Whether p_resources (preemptible or not) of policy p_policy_id''s subject fit what is free in pool p_pool_id now: admission rules 1-3 (respool._blocker), the earmark rule (respool._leaves_earmarks; p_request_id / p_earmark_pool_id: the request''s id and earmark, NULL for one not stored yet) and, in a pool with nodes, an active node matching p_selector with room: node_id, the node respool._node_for chooses (p_selector NULL: no node check; none for a request that holds no node, respool._holds_no_node). Read-only; true only while the caller holds the pool lock.';

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

CREATE OR REPLACE FUNCTION respool._take_units(p_map jsonb, p_units jsonb, p_sign integer)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(m.key, m.value::bigint - p_sign * coalesce((p_units ->> m.key)::bigint, 0)), '{}')
              FROM jsonb_each_text(p_map) m);
END $$;
COMMENT ON FUNCTION respool._take_units(jsonb, jsonb, integer) IS
    'p_map {key: units} minus (p_sign 1) or plus (p_sign -1) the amounts p_units holds of the same keys; keys p_map lacks are ignored.';

DROP FUNCTION IF EXISTS respool._move_extra(uuid, jsonb, integer, boolean);

DROP FUNCTION IF EXISTS respool._move_units(uuid, uuid, jsonb, jsonb, integer);

CREATE OR REPLACE FUNCTION respool._move_units(p_pool_id uuid, p_policy_id uuid, p_units jsonb, p_np jsonb,
                                               p_sign integer, p_guard boolean DEFAULT true)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_pool_moved text[];
    v_policy_moved text[];
    v_keys bigint;
BEGIN
    -- One guarded statement for both tables: a charge that would pass a capacity or a limit
    -- moves fewer keys than it has and fails below instead of over-allocating.
    WITH pool_moved AS (
        UPDATE respool.pool_resources pr SET used = pr.used + p_sign * x.value::bigint
          FROM jsonb_each_text(p_units) x
         WHERE pr.pool_id = p_pool_id AND pr.key = x.key
           AND (NOT p_guard OR p_sign < 0 OR pr.used + x.value::bigint <= pr.capacity
                OR (pr.capacity IS NULL AND respool._is_soft_key(pr.key)
                    AND pr.used + x.value::bigint <= respool._max_total()))
        RETURNING pr.key),
         policy_moved AS (
        UPDATE respool.policy_resources pol
           SET used = pol.used + p_sign * x.value::bigint,
               np_used = pol.np_used + p_sign * coalesce((p_np ->> x.key)::bigint, 0)
          FROM jsonb_each_text(p_units) x
         WHERE pol.policy_id = p_policy_id AND pol.key = x.key
           AND (p_sign < 0 OR pol.used + x.value::bigint <= coalesce(pol."limit", respool._max_total()))
        RETURNING pol.key)
    SELECT ARRAY(SELECT key FROM pool_moved), ARRAY(SELECT key FROM policy_moved),
           (SELECT count(*) FROM jsonb_object_keys(p_units))
      INTO v_pool_moved, v_policy_moved, v_keys;
    IF cardinality(v_pool_moved) < v_keys THEN
        -- A charge of a key without a counter gets one when the key is soft and the pool does
        -- not list it (untracked), or when the charge is unguarded (a node change).
        IF p_sign < 0 OR (p_guard AND EXISTS (SELECT FROM jsonb_object_keys(p_units) k(key)
                                               WHERE k.key <> ALL (v_pool_moved)
                                                 AND (NOT respool._is_soft_key(k.key)
                                                      OR EXISTS (SELECT FROM respool.pool_resources
                                                                  WHERE pool_id = p_pool_id AND key = k.key)))) THEN
            RAISE EXCEPTION 'moving % units % in pool % would pass its capacity or finds no counter',
                p_sign, p_units, p_pool_id USING ERRCODE = 'RP500';
        END IF;
        INSERT INTO respool.pool_resources (pool_id, key, used)
        SELECT p_pool_id, x.key, x.value::bigint FROM jsonb_each_text(p_units) x WHERE x.key <> ALL (v_pool_moved);
    END IF;
    IF p_policy_id IS NOT NULL AND cardinality(v_policy_moved) < v_keys THEN
        -- A key the policy has no counter for (no limit, no reservation) gets one.
        IF p_sign < 0 OR EXISTS (SELECT FROM respool.policy_resources
                                  WHERE policy_id = p_policy_id AND key IN (SELECT jsonb_object_keys(p_units))
                                    AND key <> ALL (v_policy_moved)) THEN
            RAISE EXCEPTION 'moving % units % of policy % would pass its limit or finds no counter',
                p_sign, p_units, p_policy_id USING ERRCODE = 'RP500';
        END IF;
        INSERT INTO respool.policy_resources (policy_id, key, used, np_used)
        SELECT p_policy_id, x.key, x.value::bigint, coalesce((p_np ->> x.key)::bigint, 0)
          FROM jsonb_each_text(p_units) x WHERE x.key <> ALL (v_policy_moved);
    END IF;
END $$;
COMMENT ON FUNCTION respool._move_units(uuid, uuid, jsonb, jsonb, integer, boolean) IS
    'Charges (p_sign 1) or returns (-1) units {key: n} on a pool''s counters and one policy''s (p_np: the non-preemptible part; p_policy_id NULL: the pool''s alone) in one statement, guarded: used + n <= capacity on the pool (unless p_guard is false: a node change) and <= limit on the policy (respool._max_total() where nothing else bounds); RP500 rather than over-allocate. A soft key the pool does not list, an unguarded charge and a key the policy does not bound get a counter. CHECK used >= 0 catches a double return.';

CREATE OR REPLACE FUNCTION respool._move_pool_units(p_pool_id uuid, p_units jsonb, p_sign integer,
                                                    p_guard boolean DEFAULT true)
RETURNS void LANGUAGE sql AS $$
    SELECT respool._move_units(p_pool_id, NULL, p_units, NULL, p_sign, p_guard)
$$;
COMMENT ON FUNCTION respool._move_pool_units(uuid, jsonb, integer, boolean) IS
    'respool._move_units on a pool''s counters alone.';

CREATE OR REPLACE FUNCTION respool._placing_order(p_needs jsonb[])
RETURNS integer[] LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF cardinality(p_needs) <= 1 THEN
        RETURN ARRAY(SELECT generate_subscripts(p_needs, 1));
    END IF;
    RETURN ARRAY(SELECT u.i FROM unnest(p_needs) WITH ORDINALITY u(m, i)
                  ORDER BY (SELECT coalesce(sum(s.memory_mb), 0) FROM respool._slice_needs(u.m) s) DESC, u.i);
END $$;
COMMENT ON FUNCTION respool._placing_order(jsonb[]) IS
    'The order in which the requests of one grant (a gang, a run) are put on nodes and devices: the most slice memory first (docs/placement.md, gangs of slices), then grant order. Indices into p_needs.';

CREATE OR REPLACE FUNCTION respool._place(p_pool_id uuid, p_policy_id uuid, p_granted respool.requests[],
                                          p_nodes uuid[] DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_req respool.requests;
    v_node uuid;
    v_gang_nodes uuid[] := '{}';
    i integer;
BEGIN
    -- The caller checked respool._fit_node first. RP501 (a gang that cannot be placed member by
    -- member) is for the caller's subtransaction to take the whole grant back.
    -- The charge: one guarded statement for all of them, both counter tables.
    IF cardinality(p_granted) = 1 THEN
        PERFORM respool._move_units(p_pool_id, p_policy_id, p_granted[1].resources, p_granted[1].np_charge, 1);
    ELSE
        PERFORM respool._move_units(p_pool_id, p_policy_id,
                                    respool._sum_units(ARRAY(SELECT g.resources FROM unnest(p_granted) g)),
                                    respool._sum_units(ARRAY(SELECT g.np_charge FROM unnest(p_granted) g)), 1);
    END IF;
    PERFORM respool._charge_rates(p_pool_id, p_policy_id, p_granted);  -- rate keys: 039_rates.sql
    IF NOT respool._pool_has_nodes(p_pool_id) THEN
        RETURN;  -- placed in the pool as a whole: nothing below the pool to record
    END IF;
    -- The placement: one node each, in placing order (a gang member by member; with distinct_nodes
    -- never on a node another member of the same grant took).
    FOREACH i IN ARRAY CASE WHEN cardinality(p_granted) = 1 THEN ARRAY[1]
                            ELSE respool._placing_order(ARRAY(SELECT g.resources FROM unnest(p_granted) g)) END LOOP
        v_req := p_granted[i];
        IF p_nodes[i] IS NULL AND v_req.command IS NULL
           AND respool._holds_no_node(p_pool_id, v_req.resources) THEN
            CONTINUE;  -- only rate keys: charged on the pool above, held on no node
        END IF;
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
    'Places requests the caller has just moved to allocated, in a pool it has locked, under one policy: charges their resources (np_charge: the non-preemptible part) on the pool''s and policy''s counters, RP500 rather than over-allocate; in a pool with nodes puts each, in respool._placing_order (but one holding only rate keys of the pool and no job: respool._holds_no_node), on p_nodes[i] or else the node respool._node_for chooses now, with its devices (respool._place_on_node; distinct_nodes gang members on different nodes), RP501 when one fits no node. Counterpart: respool._unplace.';

CREATE OR REPLACE FUNCTION respool._placement_json(p_request_id uuid)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_devices jsonb;
    v_slices jsonb := '{}';
    v_slice_devices jsonb := '{}';
    v_modes jsonb := '{}';
BEGIN
    IF NOT EXISTS (SELECT FROM respool.placements WHERE request_id = p_request_id) THEN
        RETURN NULL;  -- a pool without nodes: the common case, one index probe
    END IF;
    v_devices := coalesce((SELECT jsonb_object_agg(d.key, d.ids)
                             FROM (SELECT nd.key, jsonb_agg(nd.device ORDER BY nd.position) AS ids
                                     FROM respool.node_devices nd WHERE nd.holder_id = p_request_id
                                    GROUP BY nd.key) d), '{}');
    IF EXISTS (SELECT FROM respool.device_slices WHERE request_id = p_request_id) THEN
        SELECT jsonb_object_agg(ds.key, jsonb_build_object(ds.device, jsonb_strip_nulls(
                   jsonb_build_object('memory_mb', ds.memory_mb, 'share', ds.share)))),
               jsonb_object_agg(ds.key, jsonb_build_array(ds.device)),
               jsonb_object_agg(ds.key, coalesce(nr.sharing, 'exclusive'))
          INTO v_slices, v_slice_devices, v_modes
          FROM respool.device_slices ds
          LEFT JOIN respool.node_resources nr ON nr.node_id = ds.node_id AND nr.key = ds.key
         WHERE ds.request_id = p_request_id;
    END IF;
    RETURN (SELECT jsonb_build_object(
                'node', n.name, 'labels', n.labels, 'devices', v_devices || v_slice_devices, 'slices', v_slices,
                'isolation', coalesce((SELECT jsonb_object_agg(k, 'exclusive') FROM jsonb_object_keys(v_devices) k), '{}')
                             || v_modes)
              FROM respool.placements pl JOIN respool.nodes n ON n.id = pl.node_id
             WHERE pl.request_id = p_request_id);
END $$;
COMMENT ON FUNCTION respool._placement_json(uuid) IS
    'Where a holding request is placed (docs/placement.md): {"node", "labels", "devices": {key: [ids in list order]}, "slices": {key: {device: {"memory_mb", "share" (when asked)}}}, "isolation": {key: exclusive for whole devices, else the node''s sharing mode}}; a slice''s device is listed in devices too. NULL when it has no placement. Read-only.';

CREATE OR REPLACE FUNCTION respool._unplace(p_request_id uuid, p_record boolean DEFAULT true)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r record;
    v_node uuid;
    v_units jsonb;
    v_extra jsonb;
    v_doc jsonb;
BEGIN
    SELECT pool_id, policy_id, resources, np_charge INTO r FROM respool.requests WHERE id = p_request_id;
    -- (units of rate keys come back with time, not here: 039_rates.sql)
    PERFORM respool._move_units(r.pool_id, r.policy_id, respool._without_rates(r.pool_id, r.resources),
                                respool._without_rates(r.pool_id, r.np_charge), -1);
    -- Where it ran stays readable once it ends (docs/placement.md, "Where a request ran"): the
    -- same document as its placement had, read before its devices and slices are given back.
    v_doc := respool._placement_json(p_request_id);  -- (NULL: no placement, nothing below to give back)
    IF v_doc IS NOT NULL THEN
        DELETE FROM respool.placements WHERE request_id = p_request_id
        RETURNING node_id, resources, extra INTO v_node, v_units, v_extra;
        UPDATE respool.node_resources nr SET used = nr.used - x.value::bigint
          FROM jsonb_each_text(v_units) x
         WHERE nr.node_id = v_node AND nr.key = x.key;
        IF v_extra <> '{}' THEN
            PERFORM respool._move_pool_units(r.pool_id, v_extra, -1);
        END IF;
        IF p_record THEN
            UPDATE respool.requests SET last_placement = v_doc WHERE id = p_request_id;
        END IF;
        UPDATE respool.node_devices SET holder_id = NULL WHERE holder_id = p_request_id;
        WITH gone AS (DELETE FROM respool.device_slices WHERE request_id = p_request_id
                      RETURNING node_id, key, device, memory_mb, share)
        UPDATE respool.node_devices d
           SET memory_used = d.memory_used - g.memory_mb, share_used = d.share_used - coalesce(g.share, 0)
          FROM gone g
         WHERE d.node_id = g.node_id AND d.key = g.key AND d.device = g.device;
    END IF;
    RETURN v_doc;
END $$;
COMMENT ON FUNCTION respool._unplace(uuid, boolean) IS
    'Gives a holding request''s units back: to its pool''s and policy''s counters and, when placed on a node, to the node''s counters, devices and slices (and the pool''s slice counters what its whole shared devices took); removes its placement (CHECK used >= 0 catches a double return). Returns the placement''s document (respool._placement_json; NULL without one), which it keeps as last_placement unless p_record is false: then the caller writes it with the status (respool._set_status). Every path that ends a holding goes through it.';

-- Nodes (docs/placement.md). In a pool backed by nodes every grant is also placed on one active node
-- that matches the request's node_selector and has room for every key of the request (the node
-- places of respool._node_places, under the key rule), and on the first free device ids of each key
-- with named devices. The pool's counters keep every rule of an abstract pool; the node counters
-- add the node rule. Everything below reads only counters that change under the pool's row lock,
-- which every caller holds.

CREATE OR REPLACE FUNCTION respool._pool_has_nodes(p_pool_id uuid)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT FROM respool.nodes WHERE pool_id = p_pool_id);
END $$;
COMMENT ON FUNCTION respool._pool_has_nodes(uuid) IS
    'True when the pool is backed by nodes (any state): its grants are placed on nodes (docs/placement.md). One index probe.';

CREATE OR REPLACE FUNCTION respool._holds_no_node(p_pool_id uuid, p_resources jsonb, p_request_id uuid DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- Rate keys are the pool's budget, never a node's (docs/rates.md): a request that asks
    -- nothing else (but the step_run every request carries) has nothing to hold on a node.
    -- A job still runs on its node's agent.
    RETURN EXISTS (SELECT FROM jsonb_object_keys(p_resources) k(key)
                    WHERE k.key <> 'step_run'
                      AND EXISTS (SELECT FROM respool.pool_rates r WHERE r.pool_id = p_pool_id AND r.key = k.key))
       AND NOT EXISTS (SELECT FROM jsonb_object_keys(p_resources) k(key)
                        WHERE k.key <> 'step_run'
                          AND NOT EXISTS (SELECT FROM respool.pool_rates r WHERE r.pool_id = p_pool_id AND r.key = k.key))
       AND (p_request_id IS NULL
            OR NOT EXISTS (SELECT FROM respool.requests q WHERE q.id = p_request_id AND q.command IS NOT NULL));
END $$;
COMMENT ON FUNCTION respool._holds_no_node(uuid, jsonb, uuid) IS
    'True when a grant of p_resources in the pool is placed on no node: apart from the step_run every request carries, it asks only rate keys of the pool, at least one (docs/rates.md), and request p_request_id (NULL: none stored yet) is no job (a job runs on its node''s agent). Such a holder has no placement row, no node counts it and its placement is null. Read-only.';

CREATE OR REPLACE FUNCTION respool._node_matches(p_name text, p_labels jsonb, p_selector jsonb)
RETURNS boolean LANGUAGE sql STABLE PARALLEL SAFE AS $$
    -- (SQL and STABLE, as jsonb_build_object is, so that the planner inlines it into the queries
    -- over a pool's nodes instead of calling it per node)
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
    v_job boolean := false;
    v_moving boolean := respool._earmarked(p_pool_id, p_request_id);
    v_dev jsonb;
BEGIN
    -- Order: pack takes the node left with the fewest free units of the request's device keys
    -- (keys the node names devices for) once it is placed, then the fewest left over the keys it
    -- bounds, then the name; spread the most. A slice of a shared device first by the device it
    -- would take (pack: least memory left; spread: most), then the same node rules.
    SELECT placement = 'spread' INTO v_spread FROM respool.pools WHERE id = p_pool_id;
    v_dev := respool._device_fit_map(p_pool_id, p_resources, v_spread);
    IF p_request_id IS NOT NULL THEN
        SELECT earmark_node_id, command IS NOT NULL INTO v_mine, v_job FROM respool.requests WHERE id = p_request_id;
    END IF;
    -- One pass over the pool's active node places for the request's keys; rooms are net of
    -- units earmarked on a node for other requests (docs/preemption.md) while there are any.
    RETURN (
        SELECT p.node_id
          FROM respool._node_places(p_pool_id, p_resources, p_request_id, v_moving) p
         WHERE p.state = 'active' AND p.node_id <> ALL (p_exclude)
           AND (NOT v_job OR p.agent IS DISTINCT FROM 'lost')  -- a lost agent takes no new jobs (docs/jobs.md)
           AND respool._node_matches(p.node_name, p.labels, p_selector)
         GROUP BY p.node_id, p.node_name
        HAVING bool_and(respool._fits_room(p.need, p.room))
               -- the device level: a device for each slice, untouched devices for whole ones
               AND (v_dev IS NULL OR coalesce((v_dev -> p.node_id::text ->> 0)::boolean, true))
         -- What the node is left with once the request is placed (docs/placement.md): nodes
         -- differ in which keys they name devices for, so free-now would order them otherwise.
         -- (v_dev guarded by CASE: without it every node's id would be written out as text)
         ORDER BY p.node_id IS NOT DISTINCT FROM v_mine DESC,
                  CASE WHEN v_spread THEN -1 ELSE 1 END
                  * CASE WHEN v_dev IS NOT NULL THEN (v_dev -> p.node_id::text ->> 2)::bigint END NULLS LAST,
                  -- (whole devices: what is left of the untouched ones, where the devices decide)
                  CASE WHEN v_spread THEN -1 ELSE 1 END
                  * coalesce(CASE WHEN v_dev IS NOT NULL THEN (v_dev -> p.node_id::text ->> 4)::bigint END,
                             sum(p.free - p.need) FILTER (WHERE p.capacity IS NOT NULL AND p.devices > 0), 0),
                  CASE WHEN v_spread THEN -1 ELSE 1 END
                  * coalesce(sum(p.free - p.need) FILTER (WHERE p.capacity IS NOT NULL), 0),
                  p.node_name
         LIMIT 1);
END $$;
COMMENT ON FUNCTION respool._node_for(uuid, jsonb, jsonb, uuid, uuid[]) IS
    'The node a grant of p_resources goes to in a pool with nodes (docs/placement.md), NULL when none fits now: an active node of the pool, not in p_exclude, matching the selector (a job: agent not lost), whose room (respool._node_places, net of earmarks for others) fits every key and whose devices hold it (respool._device_fit, in a pool that shares). Order: the node earmarked for p_request_id; a slice''s device (pack: least memory left; spread: most); the pool''s placement order. Read-only.';

CREATE OR REPLACE FUNCTION respool._node_slots(p_pool_id uuid, p_resources jsonb, p_selector jsonb)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_dev jsonb;
BEGIN
    -- Requests of one shape are placed one per node slot: per node, the count that fits its
    -- room of every key (respool._how_many; a node lacking a non-soft key holds none).
    -- In a pool that shares devices, also the count its devices hold (respool._device_fit).
    v_dev := respool._device_fit_map(p_pool_id, p_resources);
    RETURN (SELECT coalesce(sum(s.slots), 0) FROM (
        SELECT least(min(respool._how_many(p.need, p.room)), respool._max_batch(),
                     (v_dev -> p.node_id::text ->> 3)::bigint) AS slots
          FROM respool._node_places(p_pool_id, p_resources) p
         WHERE p.state = 'active' AND respool._node_matches(p.node_name, p.labels, p_selector)
         GROUP BY p.node_id) s WHERE s.slots > 0);
END $$;
COMMENT ON FUNCTION respool._node_slots(uuid, jsonb, jsonb) IS
    'How many requests of one shape (resources, selector) the active matching nodes of a pool hold now, placed one per node slot: per node the count that fits its room of every key (respool._how_many, at most respool._max_batch()) and, in a pool that shares devices, that its devices hold (respool._device_fit). Exact for requests alike (nodes are independent), so a set-based run in a pool with nodes grants at most this many. Only while no earmark is pending in the pool. Read-only.';

CREATE OR REPLACE FUNCTION respool._place_on_node(p_request respool.requests, p_node_id uuid)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_units jsonb;
    v_over boolean;
    v_named bigint;
    v_taken integer;
    v_pool_id uuid;
    v_shares boolean;
    v_extra jsonb := '{}';
    v_spread boolean;
    v_sl record;
    v_device text;
BEGIN
    SELECT n.pool_id, EXISTS (SELECT FROM respool.node_resources nr WHERE nr.node_id = n.id AND nr.sharing IS NOT NULL)
      INTO v_pool_id, v_shares
      FROM respool.nodes n WHERE n.id = p_node_id;
    -- Whole devices of a shared key also take their memory and share on the node's and the pool's
    -- slice counters (docs/placement.md, "Sharing a GPU"), so those stay exact.
    IF v_shares THEN
        v_extra := respool._whole_device_extra(p_node_id, p_request.resources);
    END IF;
    -- The charge: the request's units of the keys the node tracks, on the node's counters, in one
    -- statement. A charge that passes a capacity raises below and the transaction rolls back:
    -- a bug fails loudly instead of over-allocating.
    WITH charged AS (
        UPDATE respool.node_resources nr SET used = nr.used + x.value::bigint
          FROM jsonb_each_text(p_request.resources || v_extra) x
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
    IF v_extra <> '{}' THEN
        PERFORM respool._move_pool_units(v_pool_id, v_extra, 1);
    END IF;
    -- Devices: the first free ids of each named key, in the node's list order. The holder column
    -- takes one holder per device; a device already held is never taken (holder_id IS NULL), and
    -- a device with slices never (CHECK never_whole_and_sliced; the device places say which
    -- devices are untouched).
    IF v_named > 0 AND NOT v_shares THEN
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
    ELSIF v_named > 0 THEN
        WITH wanted AS (
            SELECT d.key, d.device
              FROM (SELECT p.key, p.device, p.wanted, row_number() OVER (PARTITION BY p.key ORDER BY p.position) AS n
                      FROM respool._device_places(v_pool_id, p_request.resources, false, p_node_id) p
                     WHERE p.node_id = p_node_id AND NOT p.slice AND p.fits) d
             WHERE d.n <= d.wanted)
        UPDATE respool.node_devices t SET holder_id = p_request.id
          FROM wanted w
         WHERE t.holder_id IS NULL AND t.node_id = p_node_id AND t.key = w.key AND t.device = w.device;
        GET DIAGNOSTICS v_taken = ROW_COUNT;
    END IF;
    IF v_named > 0 AND v_taken <> v_named THEN
        RAISE EXCEPTION 'placing request % on node %: % free devices for % named units', p_request.id, p_node_id,
            v_taken, v_named USING ERRCODE = 'RP500';
    END IF;
    -- Slices: each on the device of its shared key the placement order takes (pack: least memory
    -- left once placed; spread: most; then list order), counted on the device under a guard.
    IF v_shares THEN
        SELECT placement = 'spread' INTO v_spread FROM respool.pools WHERE id = v_pool_id;
        FOR v_sl IN SELECT s.key, s.memory_mb, s.share FROM respool._slice_needs(p_request.resources) s
                      JOIN respool.node_resources nr ON nr.node_id = p_node_id AND nr.key = s.key AND nr.sharing IS NOT NULL
                     ORDER BY s.key LOOP
            SELECT p.device INTO v_device
              FROM respool._device_places(v_pool_id, p_request.resources, false, p_node_id) p
             WHERE p.node_id = p_node_id AND p.slice AND p.key = v_sl.key AND p.fits
             ORDER BY respool._device_rank(v_spread, p.room_memory - p.need_memory), p.position
             LIMIT 1;
            IF v_device IS NULL THEN
                RAISE EXCEPTION 'request % fits no %s device of node % now', p_request.id, v_sl.key, p_node_id
                    USING ERRCODE = 'RP501';
            END IF;
            UPDATE respool.node_devices d
               SET memory_used = d.memory_used + v_sl.memory_mb, share_used = d.share_used + coalesce(v_sl.share, 0)
             WHERE d.node_id = p_node_id AND d.key = v_sl.key AND d.device = v_device AND d.holder_id IS NULL
               AND d.memory_used + v_sl.memory_mb <= d.memory_mb AND d.share_used + coalesce(v_sl.share, 0) <= 100;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'placing a slice of request % on device % % of node %: it would pass the device''s offer',
                    p_request.id, v_sl.key, v_device, p_node_id USING ERRCODE = 'RP500';
            END IF;
            INSERT INTO respool.device_slices (request_id, node_id, key, device, memory_mb, share)
            VALUES (p_request.id, p_node_id, v_sl.key, v_device, v_sl.memory_mb, v_sl.share);
        END LOOP;
    END IF;
    INSERT INTO respool.placements (request_id, node_id, resources, extra) VALUES (p_request.id, p_node_id, v_units, v_extra);
END $$;
COMMENT ON FUNCTION respool._place_on_node(respool.requests, uuid) IS
    'Charges a granted request on one node (chosen by respool._node_for under the pool lock): its units of the keys the node tracks (one statement, RP500 rather than pass a capacity), the first free untouched device ids of each named key in list order, its slices on the devices the placement order takes (guarded, RP500; RP501 when none holds it now), whole shared devices'' memory and share on the node''s and pool''s slice counters (placements.extra), and its placement row.';

CREATE OR REPLACE FUNCTION respool._node_rejection(p_pool_id uuid, p_resources jsonb, p_selector jsonb,
                                                   p_request_id uuid, OUT reason text, OUT message text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_pool text;
    v_needs jsonb[];
    v_keys jsonb;
    v_distinct boolean := false;
    v_gang uuid;
    v_matching integer;
    v_bad record;
BEGIN
    -- Could hold: every key of a need fits the node's room when empty (respool._could_hold, the
    -- key rule deciding a key it lacks). A gang is judged member by member; with distinct_nodes
    -- it needs as many matching nodes that could hold a member as members; and an arrangement of
    -- all its members on the matching nodes, empty (exact for small gangs, a necessary condition
    -- for large ones).
    IF NOT respool._pool_has_nodes(p_pool_id) THEN
        -- A selector selects nodes: a pool without nodes is no candidate for it (docs/placement.md).
        IF p_selector IS NOT NULL AND p_selector <> '{}' THEN
            v_pool := (SELECT name FROM respool.pools WHERE id = p_pool_id);
            reason := 'no_fitting_node';
            message := format('pool %s has no nodes, so no node matches node_selector %s', v_pool, p_selector::text);
        END IF;
        RETURN;
    END IF;
    v_pool := (SELECT name FROM respool.pools WHERE id = p_pool_id);
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
                      AND respool._could_hold(n.id, p_resources)) THEN
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
    -- A need no matching node could hold even empty: on every matching node that bounds the key
    -- (a soft key it lacks does not), the key's room when empty is too small.
    v_keys := (SELECT jsonb_object_agg(x.key, 0) FROM unnest(v_needs) nm CROSS JOIN LATERAL jsonb_object_keys(nm) x(key));
    SELECT x.key, x.value::bigint AS need, max(p.capacity) AS largest INTO v_bad
      FROM unnest(v_needs) need_map CROSS JOIN LATERAL jsonb_each_text(need_map) x
      JOIN respool._node_places(p_pool_id, v_keys) p ON p.key = x.key
     WHERE respool._node_matches(p.node_name, p.labels, p_selector) AND p.capacity IS NOT NULL
     GROUP BY need_map, x.key, x.value
    HAVING bool_and(NOT respool._fits_room(x.value::bigint, p.room_ever))
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
           AND EXISTS (SELECT FROM unnest(v_needs) need_map WHERE respool._could_hold(n.id, need_map));
        IF EXISTS (SELECT FROM unnest(v_needs) need_map
                    WHERE NOT EXISTS (SELECT FROM respool.nodes n
                                       WHERE n.pool_id = p_pool_id
                                         AND respool._node_matches(n.name, n.labels, p_selector)
                                         AND respool._could_hold(n.id, need_map))) THEN
            reason := 'no_fitting_node';
            message := format('each key fits some matching node of pool %s, but no node could hold all of them at once',
                              v_pool);
            -- A slice bigger than every shared device's offer says so (docs/placement.md).
            SELECT p.key, max(p.need_memory) AS need, max(p.memory) AS largest INTO v_bad
              FROM unnest(v_needs) need_map CROSS JOIN LATERAL respool._device_places(p_pool_id, need_map) p
             WHERE p.slice AND respool._node_matches(p.node_name, p.labels, p_selector)
             GROUP BY need_map, p.key
            HAVING NOT bool_or(p.fits_ever)
             ORDER BY p.key LIMIT 1;
            IF FOUND THEN
                message := format('%s_memory_mb: a slice of %s MiB fits no single device: the largest shared %s device of a matching node of pool %s offers %s MiB',
                                  v_bad.key, v_bad.need, v_bad.key, v_pool, v_bad.largest);
            END IF;
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
    'The node rule of the rejection table (docs/placement.md). In a pool with nodes: no_fitting_node when no node of the pool, in any state and empty, could ever hold the request (none matches the selector, or none could hold all its amounts at once: respool._could_hold); a gang (p_request_id a member) also when its members could never be arranged on the matching nodes (respool._gang_arrangement). In a pool without nodes: no_fitting_node for a request with a node selector. Else (NULL, NULL). Read-only.';

CREATE OR REPLACE FUNCTION respool._node_blocker(p_resources jsonb, p_pool_id uuid, p_selector jsonb)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_active integer;
    v_key text;
    v_best bigint;
    v_dev record;
BEGIN
    IF p_selector IS NULL OR NOT respool._pool_has_nodes(p_pool_id)
       OR respool._holds_no_node(p_pool_id, p_resources)
       OR respool._node_for(p_pool_id, p_resources, p_selector) IS NOT NULL THEN
        RETURN NULL;
    END IF;
    SELECT count(*) INTO v_active FROM respool.nodes n
     WHERE n.pool_id = p_pool_id AND n.state = 'active' AND respool._node_matches(n.name, n.labels, p_selector);
    IF v_active = 0 THEN
        RETURN CASE WHEN p_selector = '{}' THEN 'waiting for a node: every node of the pool is cordoned or draining'
                    ELSE format('waiting for a node: no active node matches node_selector %s', p_selector::text) END;
    END IF;
    -- The first key (by name) on which no active matching node that bounds it has room, and the
    -- most free there.
    SELECT p.key, max(p.free) INTO v_key, v_best
      FROM respool._node_places(p_pool_id, p_resources) p
     WHERE p.state = 'active' AND respool._node_matches(p.node_name, p.labels, p_selector) AND p.capacity IS NOT NULL
     GROUP BY p.key
    HAVING bool_and(NOT respool._fits_room(p.need, p.free))
     ORDER BY p.key LIMIT 1;
    IF v_key IS NULL AND respool._pool_shares(p_pool_id) THEN
        -- The device level (docs/placement.md, "Sharing a GPU"): the first key whose devices hold
        -- it on no active matching node now.
        SELECT x.key, x.slice, max(x.wanted) AS wanted, max(x.fitting) AS fitting, max(x.need_memory) AS need_memory,
               max(x.need_share) AS need_share, greatest(max(x.most_memory), 0) AS most_memory,
               greatest(max(x.most_share), 0) AS most_share
          INTO v_dev
          FROM (SELECT p.node_id, p.key, p.slice, max(p.wanted) AS wanted, count(*) FILTER (WHERE p.fits) AS fitting,
                       max(p.need_memory) AS need_memory, max(p.need_share) AS need_share,
                       max(p.room_memory) AS most_memory, max(p.room_share) AS most_share
                  FROM respool._device_places(p_pool_id, p_resources) p
                 WHERE p.state = 'active' AND respool._node_matches(p.node_name, p.labels, p_selector)
                 GROUP BY p.node_id, p.key, p.slice) x
         GROUP BY x.key, x.slice
        HAVING bool_and(x.fitting < x.wanted)
         ORDER BY x.key LIMIT 1;
        IF FOUND AND v_dev.slice THEN
            RETURN format('waiting for a %s slice: needs %s MiB%s on one device, the most free on a device of an active matching node is %s MiB%s',
                          v_dev.key, v_dev.need_memory,
                          CASE WHEN v_dev.need_share > 0 THEN format(' and share %s', v_dev.need_share) ELSE '' END,
                          v_dev.most_memory,
                          CASE WHEN v_dev.need_share > 0 THEN format(' (most share free %s)', v_dev.most_share) ELSE '' END);
        ELSIF FOUND THEN
            RETURN format('waiting for %s on one node: needs %s whole devices, an active matching node has at most %s without a holder or slices',
                          v_dev.key, v_dev.wanted, v_dev.fitting);
        END IF;
    END IF;
    IF v_key IS NULL THEN
        RETURN 'waiting for a node: no single active node has room for all of its keys at once';
    END IF;
    RETURN format('waiting for %s on one node: needs %s, the most free on an active matching node is %s',
                  v_key, p_resources ->> v_key, v_best);
END $$;
COMMENT ON FUNCTION respool._node_blocker(jsonb, uuid, jsonb) IS
    'Why a request of these resources and node selector waits for a node in a pool with nodes (docs/placement.md): NULL when an active matching node has room now (respool._node_for; or the pool has no nodes, or p_selector is NULL: a gang, or it asks only rate keys: respool._holds_no_node), else one sentence (no active matching node, or the first key no active matching node has room for, with the most free; with shared devices, the first slice or whole-device key no device of an active matching node holds now). Read-only.';

-- Gangs on nodes (docs/placement.md, gangs on nodes): an arrangement of a gang's members on a
-- pool's nodes, each member on one node, found by a bounded search instead of member by member.

CREATE OR REPLACE FUNCTION respool._gang_max_exact()
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 12 $$;
COMMENT ON FUNCTION respool._gang_max_exact() IS
    'The largest gang whose arrangement on nodes is searched exactly (respool._gang_arrangement); larger gangs are judged by a necessary condition only (docs/placement.md).';

CREATE OR REPLACE FUNCTION respool._gang_rooms(p_pool_id uuid, p_keys text[], p_selector jsonb, p_now boolean,
                                               p_request_id uuid, OUT node_ids uuid[], OUT room bigint[])
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_need jsonb := (SELECT coalesce(jsonb_object_agg(k, 0), '{}') FROM unnest(p_keys) k);
    v_moving boolean := p_now AND respool._earmarked(p_pool_id, p_request_id);
BEGIN
    -- The candidate nodes: p_now, the active ones with their room now (net of units earmarked
    -- there for other requests, respool._node_places); otherwise every node of the pool in any state,
    -- empty. In the pool's placement order (pack: fewest free first), so that the first
    -- arrangement found is close to its choice. Keys in p_keys order (sorted).
    SELECT coalesce(array_agg(g.node_id ORDER BY g.ord, g.node_name) FILTER (WHERE g.first), '{}'),
           coalesce(array_agg(g.room ORDER BY g.ord, g.node_name, g.key), '{}')
      INTO node_ids, room
      FROM (SELECT p.node_id, p.node_name, p.key,
                   CASE WHEN p_now THEN p.room ELSE p.room_ever END AS room,
                   p.key = min(p.key) OVER (PARTITION BY p.node_id) AS first,
                   CASE WHEN (SELECT placement FROM respool.pools WHERE id = p_pool_id) = 'spread' THEN -1 ELSE 1 END
                   * coalesce(sum(CASE WHEN p_now THEN p.free ELSE p.capacity END)
                                  FILTER (WHERE p.capacity IS NOT NULL) OVER (PARTITION BY p.node_id), 0) AS ord
              FROM respool._node_places(p_pool_id, v_need, p_request_id, v_moving) p
             WHERE (NOT p_now OR p.state = 'active') AND respool._node_matches(p.node_name, p.labels, p_selector)) g;
END $$;
COMMENT ON FUNCTION respool._gang_rooms(uuid, text[], jsonb, boolean, uuid) IS
    'The nodes of a pool matching p_selector a gang may use, in the pool''s placement order, and each one''s room of p_keys (sorted), flattened (room[(n-1)*K + k]; respool._node_places, the key rule deciding a key a node lacks). p_now: the active nodes, room now net of earmarks held there for requests other than p_request_id; else every node in any state, empty. Read-only.';

CREATE OR REPLACE FUNCTION respool._gang_devices(p_pool_id uuid, p_needs jsonb[], p_node_ids uuid[], p_now boolean)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_need jsonb;
BEGIN
    -- The shared device keys the members ask (whole devices of K or slices of K), as a need of
    -- one whole device of each: its device places list every device of those keys.
    SELECT jsonb_object_agg(k.key, 1) INTO v_need
      FROM (SELECT x.key FROM unnest(p_needs) m CROSS JOIN LATERAL jsonb_object_keys(m) x(key)
            UNION
            SELECT s.key FROM unnest(p_needs) m CROSS JOIN LATERAL respool._slice_needs(m) s) k
     WHERE EXISTS (SELECT FROM respool.node_resources nr JOIN respool.nodes n ON n.id = nr.node_id
                    WHERE n.pool_id = p_pool_id AND nr.key = k.key AND nr.sharing IS NOT NULL);
    IF v_need IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT coalesce(jsonb_agg(jsonb_build_array(array_position(p_node_ids, p.node_id), p.key, p.memory,
                                                        CASE WHEN p_now THEN p.room_memory ELSE p.memory END,
                                                        CASE WHEN p_now THEN p.room_share ELSE p.share END)
                                      ORDER BY array_position(p_node_ids, p.node_id), p.key, p.position), '[]')
              FROM respool._device_places(p_pool_id, v_need) p
             WHERE p.sharing IS NOT NULL AND p.node_id = ANY (p_node_ids));
END $$;
COMMENT ON FUNCTION respool._gang_devices(uuid, jsonb[], uuid[], boolean) IS
    'The shared devices a gang''s members (p_needs) may use on the nodes p_node_ids, from the device places (respool._device_places): [[node index in p_node_ids, key, offer, memory room, share room], ...] in node, key and list order; rooms now (p_now; a device held whole -1) or empty. NULL when the members ask no key a node of the pool shares. Read-only.';

CREATE OR REPLACE FUNCTION respool._gang_devices_fit(p_choice integer[], p_needs jsonb[], p_devices jsonb, p_spread boolean)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    dn integer[] := ARRAY(SELECT (e.d ->> 0)::integer FROM jsonb_array_elements(p_devices) WITH ORDINALITY e(d, j) ORDER BY e.j);
    dk text[] := ARRAY(SELECT e.d ->> 1 FROM jsonb_array_elements(p_devices) WITH ORDINALITY e(d, j) ORDER BY e.j);
    doffer bigint[] := ARRAY(SELECT (e.d ->> 2)::bigint FROM jsonb_array_elements(p_devices) WITH ORDINALITY e(d, j) ORDER BY e.j);
    dm bigint[] := ARRAY(SELECT (e.d ->> 3)::bigint FROM jsonb_array_elements(p_devices) WITH ORDINALITY e(d, j) ORDER BY e.j);
    ds bigint[] := ARRAY(SELECT (e.d ->> 4)::bigint FROM jsonb_array_elements(p_devices) WITH ORDINALITY e(d, j) ORDER BY e.j);
    t record;
    i integer;
BEGIN
    FOREACH i IN ARRAY respool._placing_order(p_needs) LOOP  -- the order placing takes them in
        t := respool._devices_take(p_choice[i], p_needs[i], p_spread, dn, dk, doffer, dm, ds);
        IF t.taken IS NULL THEN
            RETURN false;
        END IF;
        dm := t.p_mem;
        ds := t.p_share;
    END LOOP;
    RETURN true;
END $$;
COMMENT ON FUNCTION respool._gang_devices_fit(integer[], jsonb[], jsonb, boolean) IS
    'Whether the shared devices (respool._gang_devices) take a gang''s members p_needs on the nodes p_choice (node indices, member order) the way placing does (respool._placing_order, respool._devices_take; p_spread: the pool places by spread).';

CREATE OR REPLACE FUNCTION respool._gang_bound(p_need bigint[], p_room bigint[], p_nk integer, p_m integer,
                                               p_nn integer, p_distinct boolean)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    big constant bigint := 9223372036854775807;
BEGIN
    -- Per key the members' sum fits the nodes' sum (rooms capped so the sum does not overflow),
    -- and the nodes can hold as many members as there are, a node at most as many as its room
    -- holds of the smallest needs of every key (distinct_nodes: one).
    RETURN NOT EXISTS (
            SELECT FROM generate_series(1, p_nk) k
             WHERE NOT respool._fits_room(
                           (SELECT sum(p_need[(i - 1) * p_nk + k]) FROM generate_series(1, p_m) i)::bigint,
                           (SELECT sum(least(p_room[(n - 1) * p_nk + k], big / (p_nn + 1))) FROM generate_series(1, p_nn) n)::bigint))
        AND (SELECT sum(c.cnt) FROM (
                SELECT (SELECT CASE WHEN p_distinct THEN least(min(s.cnt), 1) ELSE min(s.cnt) END FROM (
                          SELECT k, (SELECT count(*) FROM (
                                       SELECT sum(p_need[(i - 1) * p_nk + k]) OVER (ORDER BY p_need[(i - 1) * p_nk + k], i) AS run
                                         FROM generate_series(1, p_m) i) p
                                      WHERE respool._fits_room(p.run::bigint, p_room[(n - 1) * p_nk + k])) AS cnt
                            FROM generate_series(1, p_nk) k) s) AS cnt
                  FROM generate_series(1, p_nn) n) c) >= p_m;
END $$;
COMMENT ON FUNCTION respool._gang_bound(bigint[], bigint[], integer, integer, integer, boolean) IS
    'A necessary condition for p_m members (needs flattened p_nk per member) to be arranged on p_nn nodes (rooms flattened p_nk per node), each on one node (p_distinct: different ones): per key the needs'' sum fits the rooms'' sum, and the nodes together can take p_m members. False means no arrangement exists; true decides nothing.';

CREATE OR REPLACE FUNCTION respool._gang_search(p_need bigint[], p_room bigint[], p_nk integer, p_m integer,
                                                p_nn integer, p_distinct boolean, p_needs jsonb[] DEFAULT NULL,
                                                p_devices jsonb DEFAULT NULL, p_spread boolean DEFAULT false)
RETURNS integer[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_found integer[];
    room bigint[] := p_room;
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
    big constant bigint := 9223372036854775807;
BEGIN
    -- Depth-first over the members, largest first (by their share of the largest room of each
    -- key); alike members take nodes in increasing order and nodes with alike rooms are tried
    -- once per member (both only cut arrangements that mirror one already tried).
    ord := ARRAY(SELECT i FROM generate_series(1, p_m) i
                  ORDER BY (SELECT sum(p_need[(i - 1) * p_nk + k]::double precision
                                       / greatest(1, (SELECT max(least(room[(n - 1) * p_nk + k], big / 2))
                                                        FROM generate_series(1, p_nn) n)))
                              FROM generate_series(1, p_nk) k) DESC, i);
    choice := array_fill(0, ARRAY[p_m]);
    lob := array_fill(1, ARRAY[p_m]);
    used := array_fill(false, ARRAY[p_nn]);
    d := 1;
    LOOP
        v_steps := v_steps + 1;
        IF v_steps > 20000 THEN
            RETURN NULL;  -- undecided within the budget
        END IF;
        m := ord[d];
        IF choice[d] > 0 THEN  -- take the member back from the node it was on, try the next
            FOR k IN 1..p_nk LOOP
                room[(choice[d] - 1) * p_nk + k] := room[(choice[d] - 1) * p_nk + k] + p_need[(m - 1) * p_nk + k];
            END LOOP;
            used[choice[d]] := false;
            lo := choice[d] + 1;
        ELSIF d > 1 AND p_need[(m - 1) * p_nk + 1:m * p_nk] = p_need[(ord[d - 1] - 1) * p_nk + 1:ord[d - 1] * p_nk] THEN
            lo := choice[d - 1] + CASE WHEN p_distinct THEN 1 ELSE 0 END;
            lob[d] := lo;
        ELSE
            lo := 1;
            lob[d] := lo;
        END IF;
        found := 0;
        FOR n IN lo..p_nn LOOP
            CONTINUE WHEN p_distinct AND used[n];
            ok := true;
            FOR k IN 1..p_nk LOOP
                IF NOT respool._fits_room(p_need[(m - 1) * p_nk + k], room[(n - 1) * p_nk + k]) THEN
                    ok := false;
                    EXIT;
                END IF;
            END LOOP;
            CONTINUE WHEN NOT ok;
            same := false;
            FOR n2 IN lob[d]..n - 1 LOOP
                IF NOT (p_distinct AND used[n2])
                   AND room[(n2 - 1) * p_nk + 1:n2 * p_nk] = room[(n - 1) * p_nk + 1:n * p_nk] THEN
                    same := true;
                    EXIT;
                END IF;
            END LOOP;
            CONTINUE WHEN same AND p_devices IS NULL;  -- (alike node rooms may differ in their devices)
            found := n;
            EXIT;
        END LOOP;
        IF found = 0 THEN
            choice[d] := 0;
            d := d - 1;
            IF d = 0 THEN
                RETURN '{}';
            END IF;
        ELSE
            FOR k IN 1..p_nk LOOP
                room[(found - 1) * p_nk + k] := room[(found - 1) * p_nk + k] - p_need[(m - 1) * p_nk + k];
            END LOOP;
            used[found] := true;
            choice[d] := found;
            d := d + 1;
            IF d > p_m THEN
                v_found := ARRAY(SELECT choice[array_position(ord, i)] FROM generate_series(1, p_m) i);
                IF p_devices IS NULL OR respool._gang_devices_fit(v_found, p_needs, p_devices, p_spread) THEN
                    RETURN v_found;
                END IF;
                d := p_m;  -- the shared devices cannot take this arrangement: try the next one
            END IF;
        END IF;
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._gang_search(bigint[], bigint[], integer, integer, integer, boolean, jsonb[], jsonb, boolean) IS
    'An exact, bounded search (at most 20,000 steps) for an arrangement of p_m members (needs flattened p_nk per member) on p_nn nodes (rooms flattened p_nk per node, respool._gang_rooms), each member on one node (p_distinct: different ones), every key fitting and, with p_devices, the shared devices taking the members (p_needs) as placing would (respool._gang_devices_fit). Returns the node index of each member in member order, ''{}'' when none exists, NULL when undecided within the step budget.';

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
    v_room bigint[];    -- v_room[(n-1)*K + k]: what node n has left of key k
    v_need bigint[];    -- v_need[(m-1)*K + k]
    v_choice integer[];
BEGIN
    nodes := NULL;
    IF v_m = 0 THEN
        placeable := true;
        RETURN;
    END IF;
    SELECT array_agg(DISTINCT x.key ORDER BY x.key) INTO v_keys
      FROM unnest(p_needs) nm CROSS JOIN LATERAL jsonb_each_text(nm) x WHERE x.value::bigint > 0;
    v_nk := coalesce(cardinality(v_keys), 0);
    SELECT g.node_ids, g.room INTO v_node_ids, v_room
      FROM respool._gang_rooms(p_pool_id, v_keys, p_selector, p_now, p_request_id) g;
    v_nn := cardinality(v_node_ids);
    v_need := ARRAY(SELECT coalesce((p_needs[i] ->> k.key)::bigint, 0)
                      FROM generate_series(1, v_m) i CROSS JOIN unnest(v_keys) WITH ORDINALITY k(key, j)
                     ORDER BY i, k.j);
    IF v_nn = 0 OR (p_distinct AND v_nn < v_m) THEN
        placeable := false;
        RETURN;
    END IF;
    IF v_m > respool._gang_max_exact() THEN
        -- A large gang: a necessary condition only.
        placeable := respool._gang_bound(v_need, v_room, v_nk, v_m, v_nn, p_distinct);
        RETURN;
    END IF;
    v_choice := respool._gang_search(v_need, v_room, v_nk, v_m, v_nn, p_distinct, p_needs,
                                     respool._gang_devices(p_pool_id, p_needs, v_node_ids, p_now),
                                     (SELECT placement = 'spread' FROM respool.pools WHERE id = p_pool_id));
    IF v_choice IS NULL THEN
        placeable := NULL;  -- undecided within the budget: the caller treats it as may fit
    ELSIF v_choice = '{}' THEN
        placeable := false;
    ELSE
        placeable := true;
        nodes := ARRAY(SELECT v_node_ids[c] FROM unnest(v_choice) WITH ORDINALITY u(c, i) ORDER BY u.i);
    END IF;
END $$;
COMMENT ON FUNCTION respool._gang_arrangement(uuid, jsonb[], jsonb, boolean, boolean, uuid) IS
    'Whether a gang''s members (p_needs, in member order) can be arranged on the nodes of a pool matching p_selector, each on one node (p_distinct: different ones), every key fitting (respool._gang_rooms) and the shared devices taking them as placing would (respool._gang_devices). p_now: on the active nodes'' free units now, net of earmarks for other requests, and nodes gives each member''s node; else on every node, empty. Exact up to respool._gang_max_exact() members (placeable NULL: undecided within the search budget); above, a necessary condition only, nodes NULL. Read-only.';
