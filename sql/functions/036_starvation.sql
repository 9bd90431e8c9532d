-- Starvation guard with EASY backfill (docs/scheduling.md).
-- A best_effort pool whose queue head has waited starvation_seconds holds free units for it: a
-- request behind the head is granted only if it leaves the head's units free, or if its
-- max_seconds ends before the head's shadow time (the earliest time the head fits when every
-- capped allocation ends at its deadline and no other ends).

CREATE OR REPLACE FUNCTION respool._shadow(p_pool_id uuid, p_need jsonb, p_now timestamptz)
RETURNS timestamptz LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_free jsonb := respool._free_units(p_pool_id);
    a record;
BEGIN
    IF respool._fits_room(p_need, v_free) THEN
        RETURN p_now;
    END IF;
    FOR a IN SELECT resources, run_deadline FROM respool.requests
              WHERE pool_id = p_pool_id AND status = 'allocated' AND run_deadline IS NOT NULL
              ORDER BY run_deadline, id LOOP
        v_free := respool._take_units(v_free, a.resources, -1);
        IF respool._fits_room(p_need, v_free) THEN
            RETURN greatest(a.run_deadline, p_now);
        END IF;
    END LOOP;
    RETURN NULL;
END $$;
COMMENT ON FUNCTION respool._shadow(uuid, jsonb, timestamptz) IS
    'The shadow time of a need {key: units} in a pool: now when it fits the free units, else the earliest run_deadline at which it would fit if every allocation with max_seconds ended at its deadline and no other ended; NULL when never. Read-only.';

CREATE OR REPLACE FUNCTION respool._hold_for(p_pool_id uuid, p_head_id uuid, p_head_resources jsonb,
                                             p_head_queued_at timestamptz, p_starvation integer,
                                             p_now timestamptz)
RETURNS respool.pool_hold LANGUAGE plpgsql STABLE AS $$
DECLARE
    h respool.pool_hold;
    none respool.pool_hold;
    v_head respool.requests;
BEGIN
    IF p_head_id IS NULL OR p_starvation IS NULL OR p_now - p_head_queued_at < make_interval(secs => p_starvation)
       OR (SELECT queueing FROM respool.pools WHERE id = p_pool_id) <> 'best_effort' THEN
        RETURN h;  -- all NULL: no hold
    END IF;
    h.head_id := p_head_id;
    h.pool_id := p_pool_id;
    IF respool._pool_has_nodes(p_pool_id) THEN
        -- With nodes, only the active nodes that match the head and could hold it (a member of
        -- it, for a gang) are held; none, or a gang no arrangement of nodes can hold: no hold.
        SELECT * INTO v_head FROM respool.requests WHERE id = p_head_id;
        h.nodes := ARRAY(SELECT n.id FROM respool.nodes n
                          WHERE n.pool_id = p_pool_id AND n.state = 'active'
                            AND respool._node_matches(n.name, n.labels, v_head.node_selector)
                            AND EXISTS (SELECT FROM respool.requests m
                                         WHERE (m.id = p_head_id OR (v_head.gang_id IS NOT NULL
                                                                     AND m.gang_id = v_head.gang_id AND m.status = 'queued'))
                                           AND respool._could_hold(n.id, m.resources))
                          ORDER BY n.id);
        IF cardinality(h.nodes) = 0
           OR (v_head.gang_id IS NOT NULL
               AND (respool._gang_arrangement(p_pool_id,
                        ARRAY(SELECT m.resources FROM respool.requests m
                               WHERE m.gang_id = v_head.gang_id AND m.status = 'queued' ORDER BY m.queued_at, m.id),
                        v_head.node_selector, v_head.distinct_nodes, false)).placeable = false) THEN
            RETURN none;
        END IF;
    END IF;
    SELECT coalesce(jsonb_object_agg(x.key, x.value::bigint), '{}') INTO h.need
      FROM jsonb_each_text(p_head_resources) x
      JOIN respool.pool_resources pr ON pr.pool_id = p_pool_id AND pr.key = x.key AND pr.capacity IS NOT NULL
     WHERE x.value::bigint > 0;
    h.shadow := respool._shadow(p_pool_id, h.need, p_now);
    h.waited_seconds := floor(extract(epoch FROM p_now - p_head_queued_at))::bigint;
    RETURN h;
END $$;
COMMENT ON FUNCTION respool._hold_for(uuid, uuid, jsonb, timestamptz, integer, timestamptz) IS
    'The hold of a best_effort pool for its head when the head has waited at least starvation_seconds (NULL fields otherwise, and in strict pools or with the guard off): its need on tracked keys and its shadow time; in a pool with nodes also the active nodes that match the head and could hold it (no hold when there is none, or for a gang no arrangement of the nodes can hold). Read-only.';

CREATE OR REPLACE FUNCTION respool._pool_hold(p_pool_id uuid, p_now timestamptz)
RETURNS respool.pool_hold LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    g record;
BEGIN
    SELECT q.request_id, q.resources, q.queued_at INTO g
      FROM respool._queue_groups(p_pool_id) q
     ORDER BY q.rank DESC, q.in_share DESC, q.share, q.queued_at, q.request_id
     LIMIT 1;
    RETURN respool._hold_for(p_pool_id, g.request_id, g.resources, g.queued_at,
                             (SELECT starvation_seconds FROM respool.pools WHERE id = p_pool_id), p_now);
END $$;
COMMENT ON FUNCTION respool._pool_hold(uuid, timestamptz) IS
    'The hold of a pool now, for the first request of its queue order (docs/scheduling.md); NULL fields when the pool holds for nobody. Read-only; O(queue shapes).';

DROP FUNCTION IF EXISTS respool._leaves_head_room(respool.pool_hold, jsonb, jsonb);
CREATE OR REPLACE FUNCTION respool._leaves_head_room(p_hold respool.pool_hold, p_resources jsonb, p_free jsonb,
                                                     p_selector jsonb DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_need jsonb;
BEGIN
    IF p_hold.nodes IS NOT NULL THEN
        -- In a pool with nodes only the held nodes' free units count (docs/placement.md): a
        -- request whose selector matches none of them costs the head nothing; otherwise it is
        -- counted as taking from them, wherever it lands.
        IF p_selector IS NOT NULL AND p_selector <> '{}'
           AND NOT EXISTS (SELECT FROM respool.nodes n
                            WHERE n.id = ANY (p_hold.nodes) AND respool._node_matches(n.name, n.labels, p_selector)) THEN
            RETURN true;
        END IF;
        -- (a key no held node bounds is left out: the key rule gives it its room below)
        SELECT coalesce(jsonb_object_agg(s.key, s.free), '{}') INTO p_free
          FROM (SELECT p.key, sum(p.free) FILTER (WHERE p.capacity IS NOT NULL) AS free
                  FROM respool._node_places(p_hold.pool_id, p_hold.need) p
                 WHERE p.node_id = ANY (p_hold.nodes) GROUP BY p.key) s
         WHERE s.free IS NOT NULL;
    END IF;
    -- Rule (a): for every key the head needs that this request takes, the free units left after
    -- granting it still cover the head's need (a key it does not take costs the head nothing).
    -- A key absent from the free map: on the held nodes the key rule decides; in the pool as a
    -- whole (an untracked key) it leaves no room.
    v_need := (SELECT coalesce(jsonb_object_agg(n.key, n.value), '{}') FROM jsonb_each(p_hold.need) n
                WHERE coalesce((p_resources ->> n.key)::bigint, 0) > 0);
    p_free := respool._take_units(p_free, p_resources, 1);
    RETURN CASE WHEN p_hold.nodes IS NOT NULL THEN respool._fits_room(v_need, p_free)
                ELSE respool._fits_room_zero(v_need, p_free) END;
END $$;
COMMENT ON FUNCTION respool._leaves_head_room(respool.pool_hold, jsonb, jsonb, jsonb) IS
    'Backfill rule (a) (docs/scheduling.md): granting p_resources (node selector p_selector, NULL: any node) out of the free units p_free leaves the held-for head''s need covered on every key both need. In a pool with nodes only the held nodes count (docs/placement.md): true for a selector matching none of them, else the held nodes'' free units (respool._node_places) stand for p_free. Read-only.';

CREATE OR REPLACE FUNCTION respool._ends_before_shadow(p_hold respool.pool_hold, p_max_seconds integer,
                                                       p_now timestamptz)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN p_max_seconds IS NOT NULL AND p_hold.shadow IS NOT NULL
       AND p_now + make_interval(secs => p_max_seconds) <= p_hold.shadow;
END $$;
COMMENT ON FUNCTION respool._ends_before_shadow(respool.pool_hold, integer, timestamptz) IS
    'Backfill rule (b) (docs/scheduling.md): a request with max_seconds granted now ends by the head''s shadow time.';

CREATE OR REPLACE FUNCTION respool._next_backfill(p_pool_id uuid, p_policy_id uuid, p_preemptible boolean,
                                                  p_resources jsonb, p_selector jsonb,
                                                  p_from_at timestamptz, p_from_id uuid,
                                                  p_shadow timestamptz, p_now timestamptz,
                                                  OUT queued_at timestamptz, OUT request_id uuid)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_shadow IS NULL THEN
        RETURN;  -- no shadow time: nobody backfills under rule (b)
    END IF;
    SELECT e.queued_at, e.request_id INTO queued_at, request_id
      FROM respool.queue_entries e JOIN respool.requests r ON r.id = e.request_id
     WHERE e.pool_id = p_pool_id AND e.policy_id = p_policy_id
       AND e.preemptible = p_preemptible AND e.resources = p_resources AND e.node_selector = p_selector
       AND (e.queued_at, e.request_id) >= (p_from_at, p_from_id)
       AND p_now + make_interval(secs => CASE WHEN r.gang_id IS NULL THEN r.max_seconds  -- a gang: as one request (docs/scheduling.md)
                                              ELSE (respool._queued_as(r.id)).max_seconds END) <= p_shadow
     ORDER BY e.queued_at, e.request_id LIMIT 1;
END $$;
COMMENT ON FUNCTION respool._next_backfill(uuid, uuid, boolean, jsonb, jsonb, timestamptz, uuid, timestamptz, timestamptz) IS
    'The first entry of one queue shape, at or after (p_from_at, p_from_id), whose max_seconds ends by p_shadow (backfill rule (b)); NULLs when none.';

CREATE OR REPLACE FUNCTION respool._held_back(p_pool_id uuid, p_request respool.requests, p_now timestamptz,
                                              p_hold respool.pool_hold DEFAULT NULL)
RETURNS text LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    h respool.pool_hold := coalesce(p_hold, respool._pool_hold(p_pool_id, p_now));
BEGIN
    IF h.head_id IS NULL OR h.head_id = p_request.id
       OR respool._leaves_head_room(h, p_request.resources, respool._free_units(p_pool_id), p_request.node_selector)
       OR respool._ends_before_shadow(h, p_request.max_seconds, p_now) THEN
        RETURN NULL;
    END IF;
    -- (not naming the head: the reader may not read its subject; respool.queue shows held_for)
    RETURN format('held: pool reserves %s for an earlier request (waiting %s s)',
                  (SELECT string_agg(k, ', ' ORDER BY k) FROM jsonb_object_keys(h.need) k),
                  h.waited_seconds);
END $$;
COMMENT ON FUNCTION respool._held_back(uuid, respool.requests, timestamptz, respool.pool_hold) IS
    'NULL when the starvation guard lets a queued request be granted in a pool now (no hold, it is the head, rule (a) or (b), docs/scheduling.md); else the sentence saying what the pool holds and how long its head waited (never naming the head, another subject''s request maybe). Read-only.';
