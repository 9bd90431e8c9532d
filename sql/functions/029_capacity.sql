-- The capacity model (docs/engine.md, "The capacity model"): where units can go, and how many of
-- a need fit there. Every fit decision of the engine reads these functions; no other file spells
-- the key rule or the comparison of a need with what is free.
--
--   a place      holds units: the pool as a whole and, in a pool with nodes, each node. Per key a
--                place has a capacity, a use, units leaving (held by victims in their grace
--                period, which count as gone) and units earmarked (kept for the requests those
--                victims were preempted for, which count as taken);
--   the key rule a key a place has no capacity for is unbounded when it is soft, and has
--                capacity 0 otherwise (respool._effective_capacity);
--   a room       what a need may take of one key of a place (respool._room): capacity - use - what
--                others hold on to; an unbounded key's counter still stops at respool._max_total();
--   fit, count   need <= room (respool._fits_room) and the largest k with k * need <= room, by
--                division (respool._how_many).
--
-- The place relation is one row per place and key with every figure above: respool._pool_place
-- (the pool as a whole), respool._node_places (each node of a pool) and respool._device_places
-- (each device a need may use: shared devices sliced by memory and share, docs/placement.md). Node choice, slots, victim choice, rejections, blockers,
-- the starvation guard and the ETA read it. Both are LANGUAGE sql and inlined into the callers'
-- queries: no call per place or per row, and the units moving (respool._moving_units) are read
-- once per call, only by callers that ask for them. Simulations that place several needs in turn
-- (a gang's arrangement, the ETA walk) take and give device rooms through respool._devices_take
-- and respool._devices_give, which place a need on a node's shared devices as a grant does.

CREATE OR REPLACE FUNCTION respool._effective_capacity(p_key text, p_capacity bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_capacity IS NOT NULL THEN p_capacity
                WHEN respool._is_soft_key(p_key) THEN NULL
                ELSE 0 END
$$;
COMMENT ON FUNCTION respool._effective_capacity(text, bigint) IS
    'THE key rule of every place (pool or node): its capacity of a key, NULL meaning unbounded. A key the place has no capacity for is unbounded when soft (respool._is_soft_key), capacity 0 otherwise. Inlined (SQL).';

CREATE OR REPLACE FUNCTION respool._room(p_capacity bigint, p_used bigint, p_taken bigint DEFAULT 0)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_capacity IS NULL THEN respool._max_total() - p_used
                ELSE p_capacity - p_used - p_taken END
$$;
COMMENT ON FUNCTION respool._room(bigint, bigint, bigint) IS
    'The room of one key under a bound (an effective capacity, a limit, a reserved share): bound - used - taken (units held for others; may be negative after a shrink). A NULL bound is unbounded, but a counter stops at respool._max_total() so that no sum overflows. Inlined (SQL).';

CREATE OR REPLACE FUNCTION respool._fits_room(p_need bigint, p_room bigint)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_need <= p_room
$$;
COMMENT ON FUNCTION respool._fits_room(bigint, bigint) IS
    'THE fit comparison: a need of one key fits a room (respool._room) when need <= room, i.e. used + need <= bound. A need of 0 fits any room but a negative one (a limit already passed binds every key). Inlined (SQL).';

CREATE OR REPLACE FUNCTION respool._how_many(p_need bigint, p_room bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_need > 0 THEN greatest(p_room, 0) / p_need
                WHEN p_room >= 0 THEN NULL
                ELSE 0 END
$$;
COMMENT ON FUNCTION respool._how_many(bigint, bigint) IS
    'THE count: the largest k with respool._fits_room(k * need, room), by division; NULL when every k fits (a need of 0 in a room not below 0). The least over keys and bounds is how many requests of one shape fit together. Inlined (SQL).';

CREATE OR REPLACE FUNCTION respool._fits_room(p_need jsonb, p_room jsonb)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    -- (PL/pgSQL: it runs once per shape of a pass; its plan is cached per session)
    RETURN NOT EXISTS (
        SELECT FROM jsonb_each_text(p_need) x
         WHERE NOT respool._fits_room(x.value::bigint,
                                      coalesce((p_room ->> x.key)::bigint,
                                               respool._room(respool._effective_capacity(x.key, NULL), 0))));
END $$;
COMMENT ON FUNCTION respool._fits_room(jsonb, jsonb) IS
    'respool._fits_room over maps: every key of the need {key: units} fits the room map of one place {key: room} (respool._free_units, or a simulation of it); a key the map lacks has the room the key rule gives a place without that key (soft: unbounded, else 0).';

CREATE OR REPLACE FUNCTION respool._earmarked(p_pool_id uuid, p_except uuid DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- (PL/pgSQL: a SQL function with a subquery is not inlined, and would be planned per call;
    -- callers ask it once, before the query that reads respool._pool_place or respool._node_places)
    RETURN EXISTS (SELECT FROM respool.requests b
                    WHERE b.earmark_pool_id = p_pool_id AND b.status = 'queued' AND b.id IS DISTINCT FROM p_except);
END $$;
COMMENT ON FUNCTION respool._earmarked(uuid, uuid) IS
    'True when some queued request other than p_except holds an earmark in the pool (docs/preemption.md): only then do rooms net of earmarks differ from free units (respool._pool_place, respool._node_places with p_moving). One probe of requests_earmark_idx.';

CREATE OR REPLACE FUNCTION respool._moving(p_pool_id uuid, p_except uuid DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT FROM respool.requests v WHERE v.pool_id = p_pool_id AND v.status = 'preempting')
        OR EXISTS (SELECT FROM respool.requests b
                    WHERE b.earmark_pool_id = p_pool_id AND b.status = 'queued' AND b.id IS DISTINCT FROM p_except);
END $$;
COMMENT ON FUNCTION respool._moving(uuid, uuid) IS
    'True when units move in the pool: a victim is in its grace period, or a queued request other than p_except holds an earmark (respool._earmarked). Only then do room_settled and the leaving and earmarked units differ from the counters. Two index probes.';

CREATE OR REPLACE FUNCTION respool._moving_units(p_pool_id uuid, p_level text, p_except uuid)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- (one statement per level, each planned once per session)
    IF p_level = 'pool' THEN
        -- the pool: its victims in their grace period, and the queue entries of its earmark
        -- holders (a gang's entry holds its members' sum, docs/scheduling.md)
        RETURN (SELECT coalesce(jsonb_object_agg('/' || g.key, jsonb_build_array(g.leaving, g.earmarked)), '{}') FROM (
            SELECT u.key, sum(u.leaving) AS leaving, sum(u.earmarked) AS earmarked
              FROM (SELECT x.key, x.value::bigint AS leaving, 0::bigint AS earmarked
                      FROM respool.requests v CROSS JOIN LATERAL jsonb_each_text(v.resources) x
                     WHERE v.pool_id = p_pool_id AND v.status = 'preempting'
                    UNION ALL
                    SELECT x.key, 0, x.value::bigint
                      FROM respool.requests b
                      JOIN respool.queue_entries e ON e.request_id = b.id AND e.pool_id = p_pool_id
                     CROSS JOIN LATERAL jsonb_each_text(e.resources) x
                     WHERE b.earmark_pool_id = p_pool_id AND b.status = 'queued' AND b.id IS DISTINCT FROM p_except) u
             GROUP BY u.key) g);
    END IF;
    -- a node: what its victims in their grace period hold there, and the needs of the requests
    -- earmarked on it
    RETURN (SELECT coalesce(jsonb_object_agg(g.place || '/' || g.key, jsonb_build_array(g.leaving, g.earmarked)), '{}') FROM (
        SELECT u.place, u.key, sum(u.leaving) AS leaving, sum(u.earmarked) AS earmarked
          FROM (SELECT pl.node_id::text AS place, x.key, x.value::bigint AS leaving, 0::bigint AS earmarked
                  FROM respool.requests v JOIN respool.placements pl ON pl.request_id = v.id
                 CROSS JOIN LATERAL jsonb_each_text(pl.resources) x
                 WHERE v.pool_id = p_pool_id AND v.status = 'preempting'
                UNION ALL
                SELECT b.earmark_node_id::text, x.key, 0, x.value::bigint
                  FROM respool.requests b CROSS JOIN LATERAL jsonb_each_text(b.resources) x
                 WHERE b.earmark_pool_id = p_pool_id AND b.status = 'queued'
                   AND b.earmark_node_id IS NOT NULL AND b.id IS DISTINCT FROM p_except) u
         GROUP BY u.place, u.key) g);
END $$;
COMMENT ON FUNCTION respool._moving_units(uuid, text, uuid) IS
    'The units moving in a pool''s places (p_level pool or node), read once per respool._pool_place / respool._node_places call that asks for them: {"<node id, empty for the pool>/<key>": [leaving, earmarked]}, leaving: held by victims in their grace period; earmarked: the needs of queued requests other than p_except holding an earmark there. Read-only.';

CREATE OR REPLACE FUNCTION respool._pool_place(p_pool_id uuid, p_need jsonb, p_except uuid DEFAULT NULL,
                                               p_moving boolean DEFAULT false)
RETURNS TABLE (key text, need bigint, capacity bigint, used bigint, leaving bigint, earmarked bigint,
               free bigint, room bigint, room_settled bigint, room_ever bigint)
LANGUAGE sql STABLE AS $$
    -- (the moving units: one respool._moving_units per call, and only with p_moving)
    SELECT k.key, k.value::bigint, c.capacity, c.used, m.leaving, m.earmarked,
           respool._room(c.capacity, c.used),
           respool._room(c.capacity, c.used, greatest(0, m.earmarked - m.leaving)),
           respool._room(c.capacity, c.used, m.earmarked - m.leaving),
           respool._room(c.capacity, 0)
      FROM jsonb_each_text(p_need) k
      LEFT JOIN respool.pool_resources pr ON pr.pool_id = p_pool_id AND pr.key = k.key
     CROSS JOIN LATERAL (SELECT respool._effective_capacity(k.key, pr.capacity) AS capacity,
                                coalesce(pr.used, 0) AS used) c
     CROSS JOIN LATERAL (
            SELECT CASE WHEN p_moving THEN coalesce(((SELECT respool._moving_units(p_pool_id, 'pool', p_except))
                                                     -> ('/' || k.key) ->> 0)::bigint, 0) ELSE 0 END AS leaving,
                   CASE WHEN p_moving THEN coalesce(((SELECT respool._moving_units(p_pool_id, 'pool', p_except))
                                                     -> ('/' || k.key) ->> 1)::bigint, 0) ELSE 0 END AS earmarked) m
$$;
COMMENT ON FUNCTION respool._pool_place(uuid, jsonb, uuid, boolean) IS
    'THE pool place: per key of p_need, the need, the capacity (key rule), used and, with p_moving, units leaving and earmarked for others than p_except; rooms: free (now), room (now, net of earmarks), room_settled (victims gone, earmarks taken), room_ever (empty). Inlined (SQL).';

CREATE OR REPLACE FUNCTION respool._node_places(p_pool_id uuid, p_need jsonb, p_except uuid DEFAULT NULL,
                                                p_moving boolean DEFAULT false)
RETURNS TABLE (node_id uuid, node_name text, state text, labels jsonb, agent text, key text, need bigint,
               capacity bigint, used bigint, devices bigint, leaving bigint, earmarked bigint,
               free bigint, room bigint, room_settled bigint, room_ever bigint)
LANGUAGE sql STABLE AS $$
    -- (a key the node lacks gets its row too: the key rule gives it its capacity; a rate key of
    -- the pool is the pool place's alone, no node bounds it: docs/rates.md)
    SELECT n.id, n.name, n.state, n.labels, n.agent, k.key, k.value::bigint, c.capacity, c.used,
           coalesce(nr.devices, 0), m.leaving, m.earmarked,
           respool._room(c.capacity, c.used),
           respool._room(c.capacity, c.used, greatest(0, m.earmarked - m.leaving)),
           respool._room(c.capacity, c.used, m.earmarked - m.leaving),
           respool._room(c.capacity, 0)
      FROM respool.nodes n
     CROSS JOIN (SELECT x.key, x.value, rk.key IS NOT NULL AS rate FROM jsonb_each_text(p_need) x
                   LEFT JOIN respool.pool_rates rk ON rk.pool_id = p_pool_id AND rk.key = x.key) k
      LEFT JOIN respool.node_resources nr ON nr.node_id = n.id AND nr.key = k.key
     CROSS JOIN LATERAL (SELECT CASE WHEN NOT k.rate THEN respool._effective_capacity(k.key, nr.capacity) END AS capacity,
                                coalesce(nr.used, 0) AS used) c
     CROSS JOIN LATERAL (
            SELECT CASE WHEN p_moving THEN coalesce(((SELECT respool._moving_units(p_pool_id, 'node', p_except))
                                                     -> (n.id::text || '/' || k.key) ->> 0)::bigint, 0) ELSE 0 END AS leaving,
                   CASE WHEN p_moving THEN coalesce(((SELECT respool._moving_units(p_pool_id, 'node', p_except))
                                                     -> (n.id::text || '/' || k.key) ->> 1)::bigint, 0) ELSE 0 END AS earmarked) m
     WHERE n.pool_id = p_pool_id
$$;
COMMENT ON FUNCTION respool._node_places(uuid, jsonb, uuid, boolean) IS
    'THE node places of a pool: per node (any state; name, labels, state, agent) and key of p_need, the need, the capacity (key rule: a soft key it lacks unbounded, another 0; a rate key of the pool unbounded), used, devices and, with p_moving, units leaving and earmarked there for others than p_except; the rooms of respool._pool_place. Inlined (SQL).';

-- Devices shared by slices (docs/placement.md, "Sharing a GPU") are the third level of place: a
-- device of a node, with a memory offer and a compute share of 100. A slice needs memory and
-- share on one device; a whole device needs all of both (need = capacity, so _fits_room means
-- "untouched"); a device held whole has no room left (-1). A device that is not shared is the
-- same place with an offer of 0: a whole device fits it when nobody holds it.

CREATE OR REPLACE FUNCTION respool._pool_shares(p_pool_id uuid)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- (a probe of the partial index node_resources_sharing_idx, empty unless some node shares)
    RETURN EXISTS (SELECT FROM respool.node_resources nr JOIN respool.nodes n ON n.id = nr.node_id
                    WHERE nr.sharing IS NOT NULL AND n.pool_id = p_pool_id);
END $$;
COMMENT ON FUNCTION respool._pool_shares(uuid) IS
    'True when some node of the pool shares a device key: only then does the device level of the place relation (respool._device_places) decide anything the node counters do not. Read-only.';

CREATE OR REPLACE FUNCTION respool._slice_needs(p_need jsonb)
RETURNS TABLE (key text, memory_mb bigint, share bigint)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    -- <K>_memory_mb (with <K>_share) asks a slice of one device of key K
    SELECT left(x.key, -length('_memory_mb')), x.value::bigint, (p_need ->> (left(x.key, -length('_memory_mb')) || '_share'))::bigint
      FROM jsonb_each_text(p_need) x
     WHERE x.key ~ '^[a-z][a-z0-9_]*_memory_mb$'
$$;
COMMENT ON FUNCTION respool._slice_needs(jsonb) IS
    'The slices a need asks: per key <K>_memory_mb of the need, the device key K, the memory (MiB) and the share (<K>_share, NULL when not asked). Whether K is shared is the node''s (respool._device_places). Inlined (SQL).';

CREATE OR REPLACE FUNCTION respool._device_rank(p_spread boolean, p_left bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_spread THEN -p_left ELSE p_left END
$$;
COMMENT ON FUNCTION respool._device_rank(boolean, bigint) IS
    'THE placement order of a slice among the devices that fit it, lowest first: pack takes the device left with the least memory once placed, p_spread the most (ties: list order, the caller''s). Inlined (SQL).';

CREATE OR REPLACE FUNCTION respool._device_places(p_pool_id uuid, p_need jsonb, p_moving boolean DEFAULT false,
                                                  p_node_id uuid DEFAULT NULL)
RETURNS TABLE (node_id uuid, node_name text, state text, labels jsonb, agent text, key text, device text,
               "position" integer, sharing text, slice boolean, wanted bigint, need_memory bigint, need_share bigint,
               memory bigint, share bigint, memory_used bigint, share_used bigint, held boolean,
               room_memory bigint, room_share bigint, fits boolean, fits_ever boolean,
               holder_id uuid, leaving_memory bigint, leaving_share bigint, holder_leaving boolean,
               room_memory_settled bigint, room_share_settled bigint)
LANGUAGE sql STABLE AS $$
    -- One row per device a need may use: of a key it asks whole devices of (wanted: how many),
    -- or of a shared key it asks a slice of (wanted: 1). With p_moving, what victims in their
    -- grace period hold there (their slices, or the device whole) counts as gone in the settled
    -- rooms, as the node places do.
    SELECT n.id, n.name, n.state, n.labels, n.agent, d.key, d.device, d.position, nr.sharing, w.slice, w.wanted,
           c.need_memory, c.need_share, c.memory, c.share, d.memory_used, d.share_used, d.holder_id IS NOT NULL,
           r.room_memory, r.room_share,
           respool._fits_room(c.need_memory, r.room_memory) AND respool._fits_room(c.need_share, r.room_share),
           respool._fits_room(c.need_memory, respool._room(c.memory, 0))
               AND respool._fits_room(c.need_share, respool._room(c.share, 0)),
           d.holder_id, m.leaving_memory, m.leaving_share, m.holder_leaving,
           CASE WHEN d.holder_id IS NULL OR m.holder_leaving
                THEN respool._room(c.memory, d.memory_used - m.leaving_memory) ELSE -1 END,
           CASE WHEN d.holder_id IS NULL OR m.holder_leaving
                THEN respool._room(c.share, d.share_used - m.leaving_share) ELSE -1 END
      FROM (SELECT x.key, false AS slice, x.value::bigint AS wanted, NULL::bigint AS memory, NULL::bigint AS share
              FROM jsonb_each_text(p_need) x
            UNION ALL
            SELECT s.key, true, 1, s.memory_mb, s.share FROM respool._slice_needs(p_need) s) w
      JOIN respool.nodes n ON n.pool_id = p_pool_id
      JOIN respool.node_resources nr ON nr.node_id = n.id AND nr.key = w.key AND nr.devices > 0
      JOIN respool.node_devices d ON d.node_id = n.id AND d.key = w.key
     CROSS JOIN LATERAL (
            SELECT CASE WHEN w.slice THEN w.memory ELSE coalesce(d.memory_mb, 0) END AS need_memory,
                   CASE WHEN w.slice THEN coalesce(w.share, 0) WHEN d.memory_mb IS NOT NULL THEN 100 ELSE 0 END AS need_share,
                   coalesce(d.memory_mb, 0) AS memory,
                   CASE WHEN d.memory_mb IS NOT NULL THEN 100 ELSE 0 END::bigint AS share) c
     CROSS JOIN LATERAL (
            SELECT CASE WHEN d.holder_id IS NULL THEN respool._room(c.memory, d.memory_used) ELSE -1 END AS room_memory,
                   CASE WHEN d.holder_id IS NULL THEN respool._room(c.share, d.share_used) ELSE -1 END AS room_share) r
     CROSS JOIN LATERAL (
            SELECT CASE WHEN p_moving AND d.memory_used > 0 THEN coalesce((
                        SELECT sum(ds.memory_mb) FROM respool.device_slices ds JOIN respool.requests v ON v.id = ds.request_id
                         WHERE ds.node_id = d.node_id AND ds.key = d.key AND ds.device = d.device
                           AND v.status = 'preempting'), 0)::bigint ELSE 0 END AS leaving_memory,
                   CASE WHEN p_moving AND d.share_used > 0 THEN coalesce((
                        SELECT sum(coalesce(ds.share, 0)) FROM respool.device_slices ds JOIN respool.requests v ON v.id = ds.request_id
                         WHERE ds.node_id = d.node_id AND ds.key = d.key AND ds.device = d.device
                           AND v.status = 'preempting'), 0)::bigint ELSE 0 END AS leaving_share,
                   p_moving AND d.holder_id IS NOT NULL
                   AND EXISTS (SELECT FROM respool.requests v WHERE v.id = d.holder_id AND v.status = 'preempting')
                       AS holder_leaving) m
     WHERE (NOT w.slice OR nr.sharing IS NOT NULL) AND (p_node_id IS NULL OR n.id = p_node_id)
$$;
COMMENT ON FUNCTION respool._device_places(uuid, jsonb, boolean, uuid) IS
    'THE device places of a pool: one row per device of its nodes (any state; with the node''s attributes; only node p_node_id''s when given) that p_need may use: of a key it asks whole devices of (wanted: how many) or of a shared key it asks a slice of (<K>_memory_mb, <K>_share; wanted 1). need: the slice, or a whole device''s offer and 100 (0 and 0 when not shared); use, holder; rooms now (held whole: -1), fits (now) and fits_ever (empty); with p_moving, what victims in their grace period hold there and the settled rooms (them gone). Inlined (SQL).';

CREATE OR REPLACE FUNCTION respool._device_fit(p_pool_id uuid, p_need jsonb, p_spread boolean, p_node_id uuid DEFAULT NULL)
RETURNS TABLE (node_id uuid, fits boolean, fits_ever boolean, best_left bigint, slots bigint, whole_left bigint)
LANGUAGE sql STABLE AS $$
    -- Per node and key: enough fitting devices (a slice: one; whole: as many as wanted); the
    -- slice's device the placement order takes (pack: least memory left, spread: most), the
    -- untouched devices whole ones leave, and how many needs alike the devices hold
    -- (respool._how_many per device for a slice).
    -- (every output column has its declared type, casts included: a result that needs a
    -- coercion keeps PostgreSQL from inlining the function, which then is planned at every call)
    SELECT g.node_id, bool_and(g.ok), bool_and(g.ok_ever),
           CASE WHEN p_spread THEN max(g.best_left) ELSE min(g.best_left) END, min(g.slots)::bigint,
           sum(g.whole_left)::bigint
      FROM (SELECT p.node_id, p.key, p.slice,
                   count(*) FILTER (WHERE p.fits) >= max(p.wanted) AS ok,
                   count(*) FILTER (WHERE p.fits_ever) >= max(p.wanted) AS ok_ever,
                   CASE WHEN p.slice THEN
                       CASE WHEN p_spread THEN max(p.room_memory - p.need_memory) FILTER (WHERE p.fits)
                            ELSE min(p.room_memory - p.need_memory) FILTER (WHERE p.fits) END END AS best_left,
                   CASE WHEN NOT p.slice THEN count(*) FILTER (WHERE p.fits) - max(p.wanted) END AS whole_left,
                   CASE WHEN p.slice
                        THEN coalesce(sum(least(respool._how_many(p.need_memory, p.room_memory),
                                                respool._how_many(p.need_share, p.room_share))) FILTER (WHERE p.fits), 0)
                        ELSE count(*) FILTER (WHERE p.fits) / greatest(max(p.wanted), 1) END AS slots
              FROM respool._device_places(p_pool_id, p_need, false, p_node_id) p
             GROUP BY p.node_id, p.key, p.slice) g
     GROUP BY g.node_id
$$;
COMMENT ON FUNCTION respool._device_fit(uuid, jsonb, boolean, uuid) IS
    'The device level of the node rule, per node of the pool (only p_node_id when given) with a device p_need may use (respool._device_places): fits (every key it asks whole devices of has that many fitting devices, every slice a device with room), fits_ever (the same on empty devices), best_left (a slice''s device in the placement order: pack the least memory left once placed, p_spread the most), whole_left (the untouched devices whole ones leave) and slots (how many needs alike its devices hold now). A node without such a device has no row: its counters decide. Inlined (SQL).';

CREATE OR REPLACE FUNCTION respool._device_fit_map(p_pool_id uuid, p_need jsonb, p_spread boolean DEFAULT false)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- (one statement, planned once per session; NULL when no node of the pool shares, the common
    -- case: then the node counters decide alone)
    IF NOT respool._pool_shares(p_pool_id) THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT coalesce(jsonb_object_agg(f.node_id, jsonb_build_array(f.fits, f.fits_ever, f.best_left, f.slots,
                                                                          f.whole_left)), '{}')
              FROM respool._device_fit(p_pool_id, p_need, p_spread) f);
END $$;
COMMENT ON FUNCTION respool._device_fit_map(uuid, jsonb, boolean) IS
    'respool._device_fit as a map {node id: [fits, fits_ever, best_left, slots, whole_left]} that node queries look up, read once per call; NULL when no node of the pool shares a device key (the device level then decides nothing the node counters do not). Read-only.';

CREATE OR REPLACE FUNCTION respool._devices_take(p_bin integer, p_need jsonb, p_spread boolean, p_dev_bin integer[],
                                                 p_dev_key text[], p_offer bigint[], INOUT p_mem bigint[],
                                                 INOUT p_share bigint[], OUT taken jsonb)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    w record;
    s record;
    best integer;
    n bigint;
BEGIN
    -- As respool._place_on_node puts a request on a node: whole devices of a key the node shares
    -- on untouched devices in list order, then each slice on the device the placement order
    -- takes (respool._device_rank, then list order).
    taken := '[]';
    FOR w IN SELECT x.key, x.value::bigint AS n FROM jsonb_each_text(p_need) x
              WHERE x.value::bigint > 0
                AND EXISTS (SELECT FROM generate_subscripts(p_dev_bin, 1) j WHERE p_dev_bin[j] = p_bin AND p_dev_key[j] = x.key) LOOP
        n := 0;
        FOR j IN 1..cardinality(p_dev_bin) LOOP
            CONTINUE WHEN n = w.n OR p_dev_bin[j] <> p_bin OR p_dev_key[j] <> w.key
                OR NOT (respool._fits_room(p_offer[j], p_mem[j]) AND respool._fits_room(100, p_share[j]));
            taken := taken || jsonb_build_array(jsonb_build_array(j, p_mem[j] + 1, p_share[j] + 1));
            p_mem[j] := -1;  -- held whole
            p_share[j] := -1;
            n := n + 1;
        END LOOP;
        IF n < w.n THEN
            taken := NULL;
            RETURN;
        END IF;
    END LOOP;
    FOR s IN SELECT x.key, x.memory_mb, coalesce(x.share, 0) AS share FROM respool._slice_needs(p_need) x ORDER BY x.key LOOP
        best := NULL;
        FOR j IN 1..cardinality(p_dev_bin) LOOP
            CONTINUE WHEN p_dev_bin[j] <> p_bin OR p_dev_key[j] <> s.key
                OR NOT (respool._fits_room(s.memory_mb, p_mem[j]) AND respool._fits_room(s.share, p_share[j]));
            IF best IS NULL OR respool._device_rank(p_spread, p_mem[j] - s.memory_mb)
                               < respool._device_rank(p_spread, p_mem[best] - s.memory_mb) THEN
                best := j;
            END IF;
        END LOOP;
        IF best IS NULL THEN
            taken := NULL;
            RETURN;
        END IF;
        p_mem[best] := p_mem[best] - s.memory_mb;
        p_share[best] := p_share[best] - s.share;
        taken := taken || jsonb_build_array(jsonb_build_array(best, s.memory_mb, s.share));
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._devices_take(integer, jsonb, boolean, integer[], text[], bigint[], bigint[], bigint[]) IS
    'A simulation of placing need p_need on node (bin) p_bin over shared devices given as arrays (node bin, key, offer, memory room, share room; a device held whole has rooms -1), as placing does: the rooms after, and taken, what to give back when it ends ([[device index, memory, share], ...]); taken NULL when the devices cannot take it (rooms then partly changed: discard them). A key the node does not share is left to its counters.';

CREATE OR REPLACE FUNCTION respool._devices_give(p_taken jsonb, INOUT p_mem bigint[], INOUT p_share bigint[])
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    t jsonb;
BEGIN
    FOR t IN SELECT jsonb_array_elements(coalesce(p_taken, '[]')) LOOP
        p_mem[(t ->> 0)::integer] := p_mem[(t ->> 0)::integer] + (t ->> 1)::bigint;
        p_share[(t ->> 0)::integer] := p_share[(t ->> 0)::integer] + (t ->> 2)::bigint;
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._devices_give(jsonb, bigint[], bigint[]) IS
    'The counterpart of respool._devices_take: gives what it took (p_taken) back to the simulated device rooms.';

CREATE OR REPLACE FUNCTION respool._whole_device_extra(p_node_id uuid, p_counts jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- n whole devices of a shared key K take n offers of memory and n * 100 of share (PL/pgSQL:
    -- its plan is kept per session; as a SQL function it was planned at every grant)
    RETURN (SELECT coalesce(jsonb_object_agg(x.key, x.n), '{}') FROM (
        SELECT nr.key || '_memory_mb' AS key, (c.value::bigint * (nr.device_memory_mb - nr.reserved_memory_mb)) AS n
          FROM jsonb_each_text(p_counts) c JOIN respool.node_resources nr ON nr.node_id = p_node_id AND nr.key = c.key
         WHERE nr.sharing IS NOT NULL AND c.value::bigint > 0
        UNION ALL
        SELECT nr.key || '_share', c.value::bigint * 100
          FROM jsonb_each_text(p_counts) c JOIN respool.node_resources nr ON nr.node_id = p_node_id AND nr.key = c.key
         WHERE nr.sharing IS NOT NULL AND c.value::bigint > 0) x);
END $$;
COMMENT ON FUNCTION respool._whole_device_extra(uuid, jsonb) IS
    'What whole devices {key: count} of a node take of its slice counters beyond the request''s own keys: per shared key K, <K>_memory_mb (count times the offer) and <K>_share (count times 100), so that the node''s and the pool''s counters of a shared key stay exact. {} for keys that are not shared.';

CREATE OR REPLACE FUNCTION respool._place_keys(p_pool_id uuid, p_level text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- (one statement per level: a CASE over both would be planned anew at each call)
    IF p_level = 'pool' THEN
        RETURN (SELECT coalesce(jsonb_object_agg(r.key, 0), '{}') FROM respool.pool_resources r WHERE r.pool_id = p_pool_id);
    END IF;
    RETURN (SELECT coalesce(jsonb_object_agg(k.key, 0), '{}')
              FROM (SELECT DISTINCT r.key FROM respool.node_resources r
                      JOIN respool.nodes n ON n.id = r.node_id WHERE n.pool_id = p_pool_id) k);
END $$;
COMMENT ON FUNCTION respool._place_keys(uuid, text) IS
    'Every key the places of a level count, as a need map {key: 0} for respool._pool_place / respool._node_places: the pool''s counters (p_level pool), or the keys any node of the pool lists (node). Read-only.';

CREATE OR REPLACE FUNCTION respool._could_hold(p_node_id uuid, p_need jsonb)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_pool uuid;
BEGIN
    -- One node's place, empty: the columns respool._node_places gives it (capacity by the key
    -- rule, room_ever), read by two index probes of the node's counters instead of a pass over
    -- the pool's nodes, as callers ask it node by node and stop at the first that could. On a
    -- node that shares a device key, its devices too: a slice needs one device whose offer
    -- holds it (respool._device_fit, fits_ever).
    IF EXISTS (SELECT FROM respool.node_resources nr WHERE nr.node_id = p_node_id AND nr.sharing IS NOT NULL) THEN
        -- (the pool id in a variable: a sub-select as an argument keeps _device_fit from being inlined)
        v_pool := (SELECT n.pool_id FROM respool.nodes n WHERE n.id = p_node_id);
        IF EXISTS (SELECT FROM respool._device_fit(v_pool, p_need, false, p_node_id) f
                    WHERE f.node_id = p_node_id AND NOT f.fits_ever) THEN
            RETURN false;
        END IF;
    END IF;
    RETURN NOT EXISTS (SELECT FROM jsonb_each_text(p_need) x
                         LEFT JOIN respool.node_resources nr ON nr.node_id = p_node_id AND nr.key = x.key
                        WHERE NOT respool._fits_room(x.value::bigint,
                                                     respool._room(respool._effective_capacity(x.key, nr.capacity), 0))
                          AND NOT EXISTS (SELECT FROM respool.pool_rates rk JOIN respool.nodes n ON n.pool_id = rk.pool_id
                                           WHERE n.id = p_node_id AND rk.key = x.key));
END $$;
COMMENT ON FUNCTION respool._could_hold(uuid, jsonb) IS
    'True when node p_node_id, empty, could hold every key of p_need at once (room_ever of respool._node_places: the key rule decides a key it lacks, a rate key of its pool is unbounded; on a node that shares, fits_ever of respool._device_fit: a slice needs a device whose offer holds it): whatever its state and use now. Read-only.';

CREATE OR REPLACE FUNCTION respool._free_units(p_pool_id uuid)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- (the pool place's free room of its bounded keys, read straight from its counters: a pass
    -- asks it after every grant)
    RETURN (SELECT coalesce(jsonb_object_agg(pr.key, respool._room(pr.capacity, pr.used)), '{}')
              FROM respool.pool_resources pr WHERE pr.pool_id = p_pool_id AND pr.capacity IS NOT NULL);
END $$;
COMMENT ON FUNCTION respool._free_units(uuid) IS
    'The pool place''s free units now per key with a capacity (the free column of respool._pool_place: capacity - used, negative after a shrink), the room map of respool._fits_room(jsonb, jsonb). Read-only.';

-- Thin wrappers kept for callers in other files (docs/engine.md lists them): the room maps they
-- test are the pool's (respool._free_units) or a policy's rooms.

CREATE OR REPLACE FUNCTION respool._fits_room_unbounded(p_need jsonb, p_room jsonb)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT respool._fits_room(p_need, p_room)
$$;
COMMENT ON FUNCTION respool._fits_room_unbounded(jsonb, jsonb) IS
    'respool._fits_room(jsonb, jsonb) under its former name (a key the room map lacks: the key rule, so a soft key is unbounded).';

CREATE OR REPLACE FUNCTION respool._fits_every_room(p_need jsonb, p_room jsonb)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN NOT EXISTS (SELECT FROM jsonb_each_text(coalesce(p_room, '{}')) m
                        WHERE NOT respool._fits_room(coalesce((p_need ->> m.key)::bigint, 0), m.value::bigint));
END $$;
COMMENT ON FUNCTION respool._fits_every_room(jsonb, jsonb) IS
    'A policy''s limits (not a place): true when the need fits the room under every limit of the map {key: room}, a key the need lacks needing 0, so a limit already passed blocks everything. A key the map lacks is unlimited.';

CREATE OR REPLACE FUNCTION respool._fits_room_zero(p_need jsonb, p_room jsonb)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN NOT EXISTS (SELECT FROM jsonb_each_text(p_need) x
                        WHERE NOT respool._fits_room(x.value::bigint, coalesce((p_room ->> x.key)::bigint, 0)));
END $$;
COMMENT ON FUNCTION respool._fits_room_zero(jsonb, jsonb) IS
    'True when every key of the need fits the room map {key: room}, a key the map lacks having room 0: a policy''s reserved share for non-preemptible work (no share), and backfill rule (a) in a pool as a whole (an untracked key leaves the head no room).';
