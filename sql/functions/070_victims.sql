-- Victims (docs/preemption.md): which preemptible allocations go, and shrink enforcement.
-- One minimal-set routine (respool._minimal_victims) serves both shrinks and preemption for the
-- queue; victim order is lowest priority first, then most recently allocated, a gang one unit.

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
CREATE OR REPLACE FUNCTION respool._minimal_victims(p_ids uuid[], p_policies uuid[], p_held jsonb[],
                                                   p_deficit jsonb, p_over jsonb DEFAULT NULL,
                                                   p_own_policy uuid DEFAULT NULL,
                                                   OUT victims uuid[], OUT covered boolean)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    deficit jsonb := p_deficit;  -- key -> units still missing / still over (> 0)
    over jsonb := p_over;        -- "policy/key" -> units that policy holds above its reserved share
    chosen uuid[] := '{}';
    held jsonb[] := '{}';
    i integer;
    k text;
    n bigint;
    useful boolean;
BEGIN
    -- The walk, in victim order: a victim is useful when it holds a key still missing (and, with
    -- p_over, its subject is above its reserved share of that key, or it is p_own_policy's own
    -- work). A victim counts against every missing key it holds, so one taken for one key also
    -- pays for the others.
    FOR i IN 1..coalesce(cardinality(p_ids), 0) LOOP
        EXIT WHEN NOT respool._any_over(deficit);
        useful := false;
        FOR k, n IN SELECT key, value::bigint FROM jsonb_each_text(p_held[i]) LOOP
            IF n > 0 AND coalesce((deficit ->> k)::bigint, 0) > 0
               AND (over IS NULL OR p_policies[i] = p_own_policy
                    OR coalesce((over ->> (p_policies[i] || '/' || k))::bigint, 0) > 0) THEN
                useful := true;
            END IF;
        END LOOP;
        CONTINUE WHEN NOT useful;
        chosen := chosen || p_ids[i];
        held := held || p_held[i];
        IF over IS NOT NULL THEN
            FOR k, n IN SELECT key, value::bigint FROM jsonb_each_text(p_held[i]) WHERE deficit ? key LOOP
                over := jsonb_set(over, ARRAY[p_policies[i] || '/' || k],
                                  to_jsonb(coalesce((over ->> (p_policies[i] || '/' || k))::bigint, 0) - n));
            END LOOP;
        END IF;
        deficit := respool._take_units(deficit, p_held[i], 1);
    END LOOP;
    covered := NOT respool._any_over(deficit);
    -- Minimal set: put back, latest pick first, every victim that can be done without (with its
    -- units back, no key it holds is missing again).
    FOR i IN REVERSE cardinality(chosen)..1 LOOP
        IF NOT respool._holds_any(held[i], respool._take_units(deficit, held[i], -1)) THEN
            deficit := respool._take_units(deficit, held[i], -1);
            chosen[i] := NULL;
        END IF;
    END LOOP;
    victims := array_remove(chosen, NULL);
END $$;
COMMENT ON FUNCTION respool._minimal_victims(uuid[], uuid[], jsonb[], jsonb, jsonb, uuid) IS 'THE minimal-victim routine: walks the candidates (p_ids with their policies and held units, in victim order) taking each that frees a key of p_deficit {key: units} still missing (with p_over {"policy/key": units above the reserved share}: only from a subject above its share of that key, or p_own_policy''s own work), then drops every chosen victim not needed, latest pick first. victims: the minimal set in pick order; covered: whether it covers the deficit. Read-only.';

CREATE OR REPLACE FUNCTION respool._borrowers(p_pool_id uuid)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
    -- Only these subjects can lose work to reclaim or priority preemption.
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(p.id, respool._rank(p.priority, p.priority_lane)), '{}')
      FROM respool.policies p
     WHERE p.pool_id = p_pool_id
       AND EXISTS (SELECT FROM respool.policy_resources pol JOIN respool.pool_resources pr
                            ON pr.pool_id = p_pool_id AND pr.key = pol.key AND pr.capacity IS NOT NULL
                    WHERE pol.policy_id = p.id AND pol.used > pol.reserved)
       AND EXISTS (SELECT FROM respool.requests q
                    WHERE q.pool_id = p_pool_id AND q.policy_id = p.id AND q.status = 'allocated'
                      AND q.preemptible));
END $$;
COMMENT ON FUNCTION respool._borrowers(uuid) IS
    '{policy id: rank (respool._rank)} of the pool''s subjects that hold preemptible work and use more than their reserved share (in force) of a tracked key.';

CREATE OR REPLACE FUNCTION respool._headroom(p_pool_id uuid, p_column text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
    -- {policy id: {key: room}}: room under the limit (p_column 'limit') or under the reserved
    -- share for non-preemptible work (p_column 'np').
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(policy_id, room), '{}') FROM (
        SELECT pol.policy_id,
               jsonb_object_agg(pol.key, CASE p_column WHEN 'limit' THEN respool._room(pol."limit", pol.used)
                                                       ELSE respool._room(pol.reserved, pol.np_used) END) AS room
          FROM respool.policy_resources pol JOIN respool.policies p ON p.id = pol.policy_id
         WHERE p.pool_id = p_pool_id AND (p_column <> 'limit' OR pol."limit" IS NOT NULL)
         GROUP BY pol.policy_id) x);
END $$;
COMMENT ON FUNCTION respool._headroom(uuid, text) IS
    'Per policy of a pool and key: its room (respool._room) under its limit, or under its reserved share for non-preemptible work.';

CREATE OR REPLACE FUNCTION respool._may_preempt(p_mode text, p_policy_id uuid, p_preemptible boolean,
                                                p_rank bigint, p_lane boolean, p_group text,
                                                v_policy_id uuid, v_rank bigint, v_lane boolean, v_group text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    -- reclaim: another subject's work (or, for non-preemptible work, its own preemptible work),
    -- never another lane's work for a lane request; priority: strictly lower rank, never lane
    -- work (lanes outrank everything, and never preempt each other); never its own group.
    SELECT CASE p_mode
             WHEN 'reclaim' THEN (v_policy_id <> p_policy_id OR NOT p_preemptible)
                                 AND NOT (p_lane AND v_lane AND v_policy_id <> p_policy_id)
             ELSE v_rank < p_rank AND NOT v_lane AND v_policy_id <> p_policy_id END
           AND (p_group IS NULL OR v_group IS DISTINCT FROM p_group)
$$;
COMMENT ON FUNCTION respool._may_preempt(text, uuid, boolean, bigint, boolean, text, uuid, bigint, boolean, text) IS 'THE victim eligibility rule (docs/preemption.md): whether a queued request (policy, preemptible, rank, lane flag, preemption group) may take a victim unit by p_mode. Reclaim: another policy''s work, or its own preemptible work when the request is non-preemptible; a lane request never reclaims from another lane policy. Priority: a strictly lower rank (respool._rank), never a lane allocation nor its own policy. Never its own preemption group. Borrowing (above the share) is respool._minimal_victims''s test.';

CREATE OR REPLACE FUNCTION respool._choose_victims(p_pool_id uuid, p_request respool.requests, p_policy_id uuid,
                                                   p_mode text)
RETURNS uuid[] LANGUAGE plpgsql STABLE AS $$
DECLARE
    me respool.policies := (SELECT p FROM respool.policies p WHERE p.id = p_policy_id);
    deficit jsonb;   -- tracked key -> units still missing for p_request (> 0: missing)
    over jsonb;      -- "policy/key" -> units that policy holds above its reserved share
    v_ids uuid[];
    v_policies uuid[];
    v_held jsonb[];
    m record;
BEGIN
    deficit := respool._deficit(p_request.resources, p_pool_id, p_request.id);
    IF deficit IS NULL OR NOT respool._any_over(deficit) THEN
        RETURN '{}';  -- fits already: nothing to preempt
    END IF;
    SELECT coalesce(jsonb_object_agg(u.policy_id || '/' || u.key, u.used - u.leaving - u.reserved), '{}')
      INTO over
      FROM respool._usage(p_pool_id) u
     WHERE u.policy_id IS NOT NULL AND deficit ? u.key;

    -- Victim order: the requester's own subject first (a non-preemptible request reclaiming its
    -- own preemptible work), then lowest priority, then most recently allocated; a gang is one unit.
    SELECT array_agg(u.id ORDER BY (u.policy_id = p_policy_id) DESC, u.priority, u.allocated_at DESC, u.id DESC),
           array_agg(u.policy_id ORDER BY (u.policy_id = p_policy_id) DESC, u.priority, u.allocated_at DESC, u.id DESC),
           array_agg(u.resources ORDER BY (u.policy_id = p_policy_id) DESC, u.priority, u.allocated_at DESC, u.id DESC)
      INTO v_ids, v_policies, v_held
      FROM respool._victim_units(p_pool_id) u
     WHERE respool._may_preempt(p_mode, p_policy_id, p_request.preemptible, respool._rank(me.priority, me.priority_lane),
                                me.priority_lane, p_request.preemption_group,
                                u.policy_id, u.rank, u.lane, u.preemption_group);
    m := respool._minimal_victims(v_ids, v_policies, v_held, deficit, over, p_policy_id);
    IF NOT m.covered THEN
        RETURN NULL;  -- even every eligible victim would not make room: preempt nobody
    END IF;
    RETURN m.victims;
END $$;
COMMENT ON FUNCTION respool._choose_victims(uuid, respool.requests, uuid, text) IS
    'The victim set for a queued request blocked by pool capacity (docs/preemption.md): the units respool._may_preempt allows (reclaim: other subjects'' preemptible allocations above their reserved share, and for a non-preemptible request its own subject''s preemptible work first; priority: strictly lower-ranked borrowers; lanes and preemption groups as it says). Victim order: lowest priority, then most recently allocated; the walk stops once the request fits and unneeded victims are dropped (respool._minimal_victims). {} when it already fits, NULL when no set makes it fit.';

CREATE OR REPLACE FUNCTION respool._shed(p_pool_id uuid, p_policy_id uuid, p_excess jsonb,
                                         p_reason text, p_message text, p_now timestamptz,
                                         p_node_id uuid DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_ids uuid[];
    v_policies uuid[];
    v_held jsonb[];
    v_victims uuid[];
    v_id uuid;
BEGIN
    -- Victim order: lowest priority, then most recently allocated; a gang is one unit.
    SELECT array_agg(u.id ORDER BY u.priority, u.allocated_at DESC, u.id DESC),
           array_agg(u.policy_id ORDER BY u.priority, u.allocated_at DESC, u.id DESC),
           array_agg(u.resources ORDER BY u.priority, u.allocated_at DESC, u.id DESC)
      INTO v_ids, v_policies, v_held
      FROM respool._victim_units(p_pool_id, p_node_id) u
     WHERE p_policy_id IS NULL OR u.policy_id = p_policy_id;
    v_victims := (respool._minimal_victims(v_ids, v_policies, v_held, p_excess)).victims;
    FOREACH v_id IN ARRAY v_victims LOOP
        PERFORM respool._preempt(v_id, p_reason, p_message, p_now);
    END LOOP;
    RETURN cardinality(v_victims);
END $$;
COMMENT ON FUNCTION respool._shed(uuid, uuid, jsonb, text, text, timestamptz, uuid) IS
    'Preempts preemptible allocations (of one policy, or of the whole pool; with p_node_id only those placed on that node, counted by what they hold there) until no key of p_excess {key: units over} is over any more: victim order lowest priority, then most recently allocated; a minimal set (respool._minimal_victims). Returns how many; when even all of them do not suffice, all of them go.';

CREATE OR REPLACE FUNCTION respool._enforce_shrinks(p_pool_id uuid, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_excess jsonb;
    v_message text;
    pol record;
    n integer := 0;
BEGIN
    -- Nodes first (docs/placement.md): a shrunk node sheds on that node only, a draining node
    -- loses its preemptible holders.
    IF respool._pool_has_nodes(p_pool_id) THEN
        n := respool._enforce_node_changes(p_pool_id, p_now);
    END IF;
    -- Capacity (I1), every key at once: usage above a shrunk capacity, not counting victims
    -- already leaving. A custom key removed from the pool has capacity 0 (docs/admission.md), so its
    -- holders go; a removed soft key is untracked (bound NULL) and sheds nothing.
    SELECT jsonb_object_agg(x.key, x.over),
           'preempted: pool capacity of ' || string_agg(format('%s shrank to %s', x.key, x.bound), ', ' ORDER BY x.key)
      INTO v_excess, v_message
      FROM respool._excess(p_pool_id, NULL) x;
    IF v_excess IS NOT NULL THEN
        n := n + respool._shed(p_pool_id, NULL::uuid, v_excess, 'capacity_shrink', v_message, p_now);
    END IF;
    -- Limits (I2), per subject and every limited key at once, read after the capacity victims left.
    FOR pol IN SELECT p.id, p.subject FROM respool.policies p WHERE p.pool_id = p_pool_id
                ORDER BY p.subject LOOP
        SELECT jsonb_object_agg(x.key, x.over),
               format('preempted: the limit of %s on ', pol.subject)
               || string_agg(format('%s was lowered to %s', x.key, x.bound), ', ' ORDER BY x.key)
          INTO v_excess, v_message
          FROM respool._excess(p_pool_id, pol.id) x;
        CONTINUE WHEN v_excess IS NULL;
        n := n + respool._shed(p_pool_id, pol.id, v_excess, 'limit_shrink', v_message, p_now);
    END LOOP;
    RETURN n;
END $$;
COMMENT ON FUNCTION respool._enforce_shrinks(uuid, timestamptz) IS
    'Step 2: in a pool with nodes first the nodes (respool._enforce_node_changes); then preempts allocations until usage fits every shrunk capacity (a removed custom key is capacity 0) and every lowered limit of the pool, all keys at once, with a minimal victim set (victims in their grace period already count as gone). Returns how many were preempted.';

CREATE OR REPLACE FUNCTION respool._enforce_node_changes(p_pool_id uuid, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    nd record;
    v_excess jsonb;
    v_message text;
    v_id uuid;
    v_keys jsonb := respool._place_keys(p_pool_id, 'node');
    n integer := 0;
BEGIN
    -- Only nodes with something to do: draining, or a key whose room is below 0 (a shrink).
    FOR nd IN SELECT n.id, n.name, n.state FROM respool.nodes n
               WHERE n.pool_id = p_pool_id
                 AND (n.state = 'draining'
                      OR EXISTS (SELECT FROM respool.node_resources nr
                                  WHERE nr.node_id = n.id AND NOT respool._fits_room(0, respool._room(nr.capacity, nr.used))))
               ORDER BY n.name LOOP
        -- A shrunk node (I5): the minimal set on that node, victims leaving counted as gone (the
        -- node place's room with its leaving units back, respool._node_places).
        SELECT jsonb_object_agg(p.key, -r.room),
               format('preempted: node %s capacity of ', nd.name)
               || string_agg(format('%s shrank to %s', p.key, p.capacity), ', ' ORDER BY p.key)
          INTO v_excess, v_message
          FROM respool._node_places(p_pool_id, v_keys, NULL, true) p
         CROSS JOIN LATERAL (SELECT respool._room(p.capacity, p.used - p.leaving) AS room) r
         WHERE p.node_id = nd.id AND p.capacity IS NOT NULL AND NOT respool._fits_room(0, r.room);
        IF v_excess IS NOT NULL THEN
            n := n + respool._shed(p_pool_id, NULL::uuid, v_excess, 'capacity_shrink', v_message, p_now, nd.id);
        END IF;
        -- A draining node: every preemptible holder goes (victim order; the pool's grace).
        CONTINUE WHEN nd.state <> 'draining';
        FOR v_id IN SELECT u.id FROM respool._victim_units(p_pool_id, nd.id) u
                     ORDER BY u.priority, u.allocated_at DESC, u.id DESC LOOP
            CONTINUE WHEN (SELECT status FROM respool.requests WHERE id = v_id) <> 'allocated';
            PERFORM respool._preempt(v_id, 'node_drain', format('preempted: node %s is draining', nd.name), p_now);
            n := n + 1;
        END LOOP;
    END LOOP;
    RETURN n;
END $$;
COMMENT ON FUNCTION respool._enforce_node_changes(uuid, timestamptz) IS
    'Nodes of a pool (docs/placement.md), pool locked: on a node whose usage passes a shrunk capacity, preempts the minimal set of its holders that makes it fit (reason capacity_shrink; victims in their grace period count as gone); on a draining node, preempts every preemptible holder (reason node_drain, the pool''s grace period; non-preemptible holders finish on their own). Returns how many were preempted.';

CREATE OR REPLACE FUNCTION respool._keep_smaller_set(p_node_id uuid, p_name text, p_set uuid[],
                                                   p_ids uuid[], p_prios integer[],
                                                   INOUT node_id uuid, INOUT victims uuid[], INOUT best_count integer,
                                                   INOUT best_top integer, INOUT best_name text)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_count integer := cardinality(p_set);
    -- the set's top victim priority (p_prios: the priority of each of p_ids)
    v_top integer := (SELECT max(p_prios[i]) FROM generate_subscripts(p_ids, 1) i WHERE p_ids[i] = ANY (p_set));
BEGIN
    -- The smallest set: fewest victims, then the lowest top victim priority, then the node's name.
    IF best_count IS NULL OR (v_count, v_top, p_name) < (best_count, best_top, best_name) THEN
        node_id := p_node_id;
        victims := p_set;
        best_count := v_count;
        best_top := v_top;
        best_name := p_name;
    END IF;
END $$;
COMMENT ON FUNCTION respool._keep_smaller_set(uuid, text, uuid[], uuid[], integer[], uuid, uuid[], integer, integer, text) IS
    'One step of a walk for the smallest victim set over nodes: the candidate set p_set on node p_node_id (p_name) replaces the best so far (node_id, victims and its count, top victim priority and node name; all NULL before the first) when it is smaller: fewer victims, then a lower top victim priority, then the node''s name. Returns the best after it. Read-only.';

CREATE OR REPLACE FUNCTION respool._choose_node_victims(p_pool_id uuid, p_request respool.requests, p_policy_id uuid,
                                                        p_mode text, OUT node_id uuid, OUT victims uuid[])
LANGUAGE plpgsql STABLE AS $$
DECLARE
    me respool.policies := (SELECT p FROM respool.policies p WHERE p.id = p_policy_id);
    over jsonb;
    nd record;
    m record;
    best_count integer;  -- the best set so far (respool._keep_smaller_set)
    best_top integer;
    best_name text;
    v_moving boolean := respool._moving(p_pool_id, p_request.id);
BEGIN
    -- A need the devices of a shared key decide (a slice, or whole devices of a shared key):
    -- its victims are priced on one device (respool._choose_device_victims).
    IF respool._pool_shares(p_pool_id) AND EXISTS (
           SELECT FROM respool._device_places(p_pool_id, p_request.resources) p WHERE p.slice OR p.memory > 0) THEN
        SELECT c.node_id, c.victims INTO node_id, victims
          FROM respool._choose_device_victims(p_pool_id, p_request, p_policy_id, p_mode) c;
        RETURN;
    END IF;
    SELECT coalesce(jsonb_object_agg(u.policy_id || '/' || u.key, u.used - u.leaving - u.reserved), '{}')
      INTO over
      FROM respool._usage(p_pool_id) u
     WHERE u.policy_id IS NOT NULL AND p_request.resources ? u.key;
    -- Every active matching node that could ever hold the request (room_ever), with what it lacks
    -- now (need - room_settled: victims in their grace period gone, units earmarked there for
    -- others taken; respool._node_places) and its eligible victims in victim order, read set-based.
    FOR nd IN
        WITH deficits AS MATERIALIZED (
            SELECT p.node_id AS id, p.node_name AS name,
                   jsonb_object_agg(p.key, p.need - p.room_settled) FILTER (WHERE p.capacity IS NOT NULL AND p.need > 0) AS deficit
              FROM respool._node_places(p_pool_id, p_request.resources, p_request.id, v_moving) p
             WHERE p.state = 'active' AND respool._node_matches(p.node_name, p.labels, p_request.node_selector)
             GROUP BY p.node_id, p.node_name
            HAVING bool_and(respool._fits_room(p.need, p.room_ever)) AND bool_or(p.capacity IS NOT NULL AND p.need > 0)
        ), units AS MATERIALIZED (
            -- eligible victims placed on candidate nodes, a gang one unit holding what its
            -- members hold on that node
            SELECT u.node_id, u.id, u.policy_id, u.priority, u.resources AS held, u.allocated_at
              FROM respool._node_victim_units(p_pool_id, ARRAY(SELECT id FROM deficits)) u
             WHERE respool._may_preempt(p_mode, p_policy_id, p_request.preemptible,
                                        respool._rank(me.priority, me.priority_lane), me.priority_lane,
                                        p_request.preemption_group, u.policy_id, u.rank, u.lane, u.preemption_group)
        ), held_on_node AS MATERIALIZED (
            SELECT u.node_id, h.key, sum(h.value::bigint) AS total, max(h.value::bigint) AS most
              FROM units u CROSS JOIN LATERAL jsonb_each_text(u.held) h
             GROUP BY u.node_id, h.key
        ), pricing AS MATERIALIZED (
            -- per node with units missing: whether all its eligible victims cover them, and a
            -- lower bound on how many victims that takes (per missing key, the units missing
            -- over the most one victim holds, rounded up)
            SELECT d.id, bool_and(coalesce(hn.total, 0) >= x.value::bigint) AS coverable,
                   max(ceil(x.value::numeric / nullif(hn.most, 0)))::integer AS at_least
              FROM deficits d
             CROSS JOIN LATERAL jsonb_each_text(d.deficit) x
              LEFT JOIN held_on_node hn ON hn.node_id = d.id AND hn.key = x.key
             WHERE x.value::bigint > 0
             GROUP BY d.id
        )
        SELECT d.id, d.name, d.deficit, pr.coverable, pr.at_least, min(u.priority) AS lowest,
               array_agg(u.id ORDER BY (u.policy_id = p_policy_id) DESC, u.priority, u.allocated_at DESC, u.id DESC)
                   FILTER (WHERE u.id IS NOT NULL) AS ids,
               array_agg(u.policy_id ORDER BY (u.policy_id = p_policy_id) DESC, u.priority, u.allocated_at DESC, u.id DESC)
                   FILTER (WHERE u.id IS NOT NULL) AS policies,
               array_agg(u.held ORDER BY (u.policy_id = p_policy_id) DESC, u.priority, u.allocated_at DESC, u.id DESC)
                   FILTER (WHERE u.id IS NOT NULL) AS held,
               array_agg(u.priority ORDER BY (u.policy_id = p_policy_id) DESC, u.priority, u.allocated_at DESC, u.id DESC)
                   FILTER (WHERE u.id IS NOT NULL) AS prios
          FROM deficits d LEFT JOIN pricing pr ON pr.id = d.id LEFT JOIN units u ON u.node_id = d.id
         GROUP BY d.id, d.name, d.deficit, pr.coverable, pr.at_least
         -- nodes that fit already first, then by the lower bound: the walk can stop early
         ORDER BY pr.at_least IS NOT NULL, pr.at_least, d.name
    LOOP
        IF NOT respool._any_over(nd.deficit) THEN
            node_id := nd.id;
            victims := '{}';
            RETURN;  -- fits this node already: nothing to preempt
        END IF;
        CONTINUE WHEN nd.ids IS NULL OR NOT nd.coverable;  -- even all its eligible victims fall short
        -- A node's set is at least (at_least victims, top priority >= its lowest, its name): once
        -- that cannot beat the best set, skip the node; nodes come by at_least, so once at_least
        -- passes the best count no later node can win.
        EXIT WHEN best_count IS NOT NULL AND nd.at_least > best_count;
        CONTINUE WHEN best_count IS NOT NULL AND (nd.at_least, nd.lowest, nd.name) >= (best_count, best_top, best_name);
        m := respool._minimal_victims(nd.ids, nd.policies, nd.held, nd.deficit, over, p_policy_id);
        CONTINUE WHEN NOT m.covered;
        SELECT b.node_id, b.victims, b.best_count, b.best_top, b.best_name
          INTO node_id, victims, best_count, best_top, best_name
          FROM respool._keep_smaller_set(nd.id, nd.name, m.victims, nd.ids, nd.prios,
                                         node_id, victims, best_count, best_top, best_name) b;
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._choose_node_victims(uuid, respool.requests, uuid, text) IS
    'Node-aware victim choice in a pool with nodes (docs/placement.md): for each active node matching the request''s selector that could ever hold it (respool._node_places), the minimal set (respool._minimal_victims, the eligibility rule respool._may_preempt) among the allocations placed on it that makes the request fit there; takes the node whose set is smallest (fewest victims, then the lowest top victim priority, then the node''s name). victims {} (with that node) when it fits a node already, NULL when no node can be made to fit. Read-only.';

CREATE OR REPLACE FUNCTION respool._device_victim_held(p_node_id uuid, p_key text, p_device text, p_holder uuid,
                                                       p_ids uuid[], p_policies uuid[], p_held jsonb[], p_over jsonb,
                                                       OUT held jsonb[], OUT over jsonb)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    u record;
    v_whole integer;
BEGIN
    -- What each victim unit (a request, or a gang's members) holds of one device, as pseudo keys
    -- beside its node units: ~memory, ~share (its slices there), ~whole (1: it holds the device
    -- whole); and each unit's policy borrowing on them (above its share on the slice keys, or on
    -- the whole key), for respool._minimal_victims.
    held := p_held;
    over := p_over;
    FOR i IN 1..coalesce(cardinality(p_ids), 0) LOOP
        SELECT coalesce(sum(ds.memory_mb), 0)::bigint AS mem, coalesce(sum(coalesce(ds.share, 0)), 0)::bigint AS share
          INTO u
          FROM respool.device_slices ds JOIN respool.requests q ON q.id = ds.request_id
         WHERE ds.node_id = p_node_id AND ds.key = p_key AND ds.device = p_device AND q.status = 'allocated'
           AND (q.id = p_ids[i] OR q.gang_id = (SELECT g.gang_id FROM respool.requests g WHERE g.id = p_ids[i]));
        v_whole := CASE WHEN p_holder IS NOT NULL AND (p_holder = p_ids[i]
                                 OR (SELECT q.gang_id FROM respool.requests q WHERE q.id = p_holder)
                                    = (SELECT g.gang_id FROM respool.requests g WHERE g.id = p_ids[i]))
                        THEN 1 ELSE 0 END;
        held[i] := (held[i] - ARRAY['~memory', '~share', '~whole'])
                   || jsonb_build_object('~memory', u.mem, '~share', u.share, '~whole', v_whole);
        over := over || jsonb_build_object(
            p_policies[i] || '/~memory', greatest(coalesce((p_over ->> (p_policies[i] || '/' || p_key || '_memory_mb'))::bigint, 0),
                                                  coalesce((p_over ->> (p_policies[i] || '/' || p_key))::bigint, 0)),
            p_policies[i] || '/~share', greatest(coalesce((p_over ->> (p_policies[i] || '/' || p_key || '_share'))::bigint, 0),
                                                 coalesce((p_over ->> (p_policies[i] || '/' || p_key))::bigint, 0)),
            p_policies[i] || '/~whole', coalesce((p_over ->> (p_policies[i] || '/' || p_key))::bigint, 0));
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._device_victim_held(uuid, text, text, uuid, uuid[], uuid[], jsonb[], jsonb) IS
    'For a slice''s victim choice on one device (respool._choose_device_victims): each victim unit''s held map with pseudo keys of that device (~memory, ~share: its slices there; ~whole: 1 when it holds the device whole), and the policies'' borrowing on them (the most above the share of the slice keys or the whole key). Read-only.';

CREATE OR REPLACE FUNCTION respool._whole_device_victims(p_pool_id uuid, p_need jsonb, p_node_id uuid, p_key text,
                                                         p_wanted bigint, p_moving boolean, p_ids uuid[])
RETURNS uuid[] LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_short bigint;
    v_forced uuid[] := '{}';
    u record;
BEGIN
    -- Whole devices of a shared key need untouched devices: the ones short (settled rooms:
    -- victims in their grace period gone) are freed whole, the devices with the fewest holders
    -- first (list order on ties), each only when every holder is an eligible unit (p_ids).
    SELECT p_wanted - count(*) FILTER (WHERE respool._fits_room(p.need_memory, p.room_memory_settled)
                                         AND respool._fits_room(p.need_share, p.room_share_settled))
      INTO v_short
      FROM respool._device_places(p_pool_id, p_need, p_moving) p
     WHERE p.node_id = p_node_id AND p.key = p_key AND NOT p.slice;
    FOR u IN SELECT p.device, array_agg(DISTINCT h.unit) AS holders
               FROM respool._device_places(p_pool_id, p_need, p_moving) p
              CROSS JOIN LATERAL (
                     SELECT coalesce((SELECT m2.id FROM respool.requests m2
                                       WHERE m2.gang_id = q.gang_id AND m2.status = 'allocated'
                                       ORDER BY m2.id LIMIT 1), q.id) AS unit
                       FROM respool.requests q
                      WHERE q.status = 'allocated'
                        AND (q.id = p.holder_id OR q.id IN (SELECT ds.request_id FROM respool.device_slices ds
                                                             WHERE ds.node_id = p.node_id AND ds.key = p.key
                                                               AND ds.device = p.device))) h
              WHERE p.node_id = p_node_id AND p.key = p_key AND NOT p.slice
                AND NOT (respool._fits_room(p.need_memory, p.room_memory_settled)
                         AND respool._fits_room(p.need_share, p.room_share_settled))
              GROUP BY p.device, p.position
              ORDER BY count(DISTINCT h.unit), p.position LOOP
        EXIT WHEN v_short <= 0;
        CONTINUE WHEN NOT u.holders <@ p_ids;  -- a holder that may not be preempted
        v_forced := array(SELECT DISTINCT x FROM unnest(v_forced || u.holders) x);
        v_short := v_short - 1;
    END LOOP;
    RETURN CASE WHEN v_short <= 0 THEN v_forced END;
END $$;
COMMENT ON FUNCTION respool._whole_device_victims(uuid, jsonb, uuid, text, bigint, boolean, uuid[]) IS
    'The victim units that free enough untouched devices of key p_key on one node for p_wanted whole devices (respool._device_places, settled rooms): the devices with the fewest holders first, each only when all its holders are in p_ids. {} when enough are untouched already, NULL when they cannot be freed. Read-only.';

CREATE OR REPLACE FUNCTION respool._choose_device_victims(p_pool_id uuid, p_request respool.requests, p_policy_id uuid,
                                                          p_mode text, OUT node_id uuid, OUT victims uuid[])
LANGUAGE plpgsql STABLE AS $$
DECLARE
    me respool.policies := (SELECT p FROM respool.policies p WHERE p.id = p_policy_id);
    v_moving boolean := respool._moving(p_pool_id, p_request.id);
    over jsonb;
    nd record;
    dv record;
    v_hheld jsonb[];
    v_hover jsonb;
    v_devices boolean;
    v_ids uuid[];
    v_policies uuid[];
    v_held jsonb[];
    v_prios integer[];
    v_deficit jsonb;
    v_forced uuid[];
    v_set uuid[];
    m record;
    best_count integer;  -- the best set so far (respool._keep_smaller_set)
    best_top integer;
    best_name text;
BEGIN
    -- Per active matching node that could ever hold the need: its counters' deficit
    -- (respool._node_places) and, for a slice, one device's (respool._device_places) as pseudo
    -- keys of one deficit map for respool._minimal_victims; whole devices: the devices freed
    -- first (respool._whole_device_victims), then the minimal set for the rest. The smallest set
    -- wins (fewest victims, lowest top priority, node name), as on nodes.
    SELECT coalesce(jsonb_object_agg(u2.policy_id || '/' || u2.key, u2.used - u2.leaving - u2.reserved), '{}')
      INTO over FROM respool._usage(p_pool_id) u2 WHERE u2.policy_id IS NOT NULL;
    FOR nd IN
        SELECT p.node_id AS id, p.node_name AS name,
               coalesce(jsonb_object_agg(p.key, p.need - p.room_settled)
                        FILTER (WHERE p.capacity IS NOT NULL AND p.need > 0 AND p.need > p.room_settled), '{}') AS deficit
          FROM respool._node_places(p_pool_id, p_request.resources, p_request.id, v_moving) p
         WHERE p.state = 'active' AND respool._node_matches(p.node_name, p.labels, p_request.node_selector)
         GROUP BY p.node_id, p.node_name
        HAVING bool_and(respool._fits_room(p.need, p.room_ever))
         ORDER BY p.node_name
    LOOP
        CONTINUE WHEN NOT respool._could_hold(nd.id, p_request.resources);
        v_devices := false;
        -- the eligible victim units on the node, in victim order, with what they hold there
        SELECT coalesce(array_agg(x.id ORDER BY (x.policy_id = p_policy_id) DESC, x.priority, x.allocated_at DESC, x.id DESC), '{}'),
               array_agg(x.policy_id ORDER BY (x.policy_id = p_policy_id) DESC, x.priority, x.allocated_at DESC, x.id DESC),
               array_agg(x.resources ORDER BY (x.policy_id = p_policy_id) DESC, x.priority, x.allocated_at DESC, x.id DESC),
               array_agg(x.priority ORDER BY (x.policy_id = p_policy_id) DESC, x.priority, x.allocated_at DESC, x.id DESC)
          INTO v_ids, v_policies, v_held, v_prios
          FROM respool._node_victim_units(p_pool_id, ARRAY[nd.id]) x
         WHERE respool._may_preempt(p_mode, p_policy_id, p_request.preemptible,
                                    respool._rank(me.priority, me.priority_lane), me.priority_lane,
                                    p_request.preemption_group, x.policy_id, x.rank, x.lane, x.preemption_group);
        -- each device a slice could use, one at a time; whole devices: the key's devices at
        -- once; a node none of whose devices is shared: its counters alone (the last row)
        FOR dv IN SELECT d.* FROM (
                      SELECT p.key, p.device, p.slice, p.wanted, p.need_memory, p.need_share, p.memory,
                             p.held AND NOT p.holder_leaving AS whole_held, p.holder_id,
                             p.room_memory_settled, p.room_share_settled, p.position, 0 AS last
                        FROM respool._device_places(p_pool_id, p_request.resources, v_moving) p
                       WHERE p.node_id = nd.id AND p.fits_ever AND (p.slice OR p.memory > 0)
                      UNION ALL
                      SELECT NULL, NULL, false, 0, 0, 0, 0, false, NULL, 0, 0, 0, 1) d
                   ORDER BY d.last, d.slice DESC, d.position LOOP
            EXIT WHEN dv.last = 1 AND v_devices;  -- priced on its devices
            v_devices := dv.last = 0;
            v_deficit := nd.deficit;
            v_forced := '{}';
            IF dv.last = 1 THEN
                v_hheld := v_held;
                v_hover := over;
            ELSIF dv.slice THEN
                v_deficit := v_deficit || jsonb_build_object(
                    '~memory', dv.need_memory - CASE WHEN dv.whole_held THEN dv.memory ELSE dv.room_memory_settled END,
                    '~share', dv.need_share - CASE WHEN dv.whole_held THEN 100 ELSE dv.room_share_settled END,
                    '~whole', CASE WHEN dv.whole_held THEN 1 ELSE 0 END);
                SELECT x.held, x.over INTO v_hheld, v_hover
                  FROM respool._device_victim_held(nd.id, dv.key, dv.device, dv.holder_id, v_ids, v_policies, v_held, over) x;
            ELSE
                v_forced := respool._whole_device_victims(p_pool_id, p_request.resources, nd.id, dv.key, dv.wanted,
                                                          v_moving, v_ids);
                EXIT WHEN v_forced IS NULL;
                FOR i IN 1..cardinality(v_ids) LOOP
                    CONTINUE WHEN NOT v_ids[i] = ANY (v_forced);
                    v_deficit := respool._take_units(v_deficit, v_held[i], 1);
                END LOOP;
                v_hheld := v_held;
                v_hover := over;
            END IF;
            v_set := v_forced;
            IF respool._any_over(v_deficit) THEN
                SELECT mv.victims, mv.covered INTO m
                  FROM respool._minimal_victims(
                           array(SELECT v_ids[i] FROM generate_subscripts(v_ids, 1) i WHERE NOT v_ids[i] = ANY (v_forced)),
                           array(SELECT v_policies[i] FROM generate_subscripts(v_ids, 1) i WHERE NOT v_ids[i] = ANY (v_forced)),
                           array(SELECT v_hheld[i] FROM generate_subscripts(v_ids, 1) i WHERE NOT v_ids[i] = ANY (v_forced)),
                           v_deficit, v_hover, p_policy_id) mv;
                CONTINUE WHEN NOT m.covered;
                v_set := v_forced || m.victims;
            END IF;
            SELECT b.node_id, b.victims, b.best_count, b.best_top, b.best_name
              INTO node_id, victims, best_count, best_top, best_name
              FROM respool._keep_smaller_set(nd.id, nd.name, v_set, v_ids, v_prios,
                                             node_id, victims, best_count, best_top, best_name) b;
            IF best_count = 0 THEN
                RETURN;  -- fits this node already (victims {}): nothing to preempt
            END IF;
            EXIT WHEN NOT dv.slice;  -- whole devices: the key's devices were priced together
        END LOOP;
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._choose_device_victims(uuid, respool.requests, uuid, text) IS
    'Victim choice for a need the devices of a shared key decide (docs/placement.md, "Sharing a GPU"), per active matching node that could ever hold it: a slice priced on each device whose offer holds it (respool._device_victim_held), whole devices by respool._whole_device_victims; the eligible units are respool._may_preempt''s, the set respool._minimal_victims''. The smallest set wins (fewest victims, lowest top priority, node name). {} when it fits a node already, NULL when nothing can. Read-only.';
