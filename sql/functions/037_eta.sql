-- ETA of a queued request (docs/scheduling.md, ETA): a small simulation of the pool from its recorded hold
-- times. Every holder ends after the q-quantile of its remaining hold given its age so far (a
-- survival estimate: the recorded holds longer than its age, or a tail that grows with its age
-- once fewer than respool._eta_min_holds() of them are longer; capped by its max_seconds and
-- grace deadlines); the requests ahead are granted in queue order as units free up, each holding
-- for the q-quantile hold time (so simulated grants end in grant order: two sorted streams to
-- merge, O(holders + queue)); the request's estimated wait is the simulated time at which its own
-- units are free. Run for q = 0.5 and q = 0.9. Units are arrays over the pool's tracked keys. A
-- pool with fewer than respool._eta_min_holds() recorded holds gives no estimate (no p90 from a
-- handful of samples). Only the first respool._eta_depth() requests of a queue get an estimate,
-- so reading a queued request stays cheap whatever the queue length.

CREATE OR REPLACE FUNCTION respool._quantile(p_sorted double precision[], p_q double precision)
RETURNS double precision LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_sorted[greatest(1, ceil(p_q * cardinality(p_sorted))::integer)]
$$;
COMMENT ON FUNCTION respool._quantile(double precision[], double precision) IS
    'The q-quantile (nearest rank) of an ascending array; NULL for an empty one.';

CREATE OR REPLACE FUNCTION respool._quantile_above(p_sorted double precision[], p_age double precision,
                                                   p_q double precision)
RETURNS double precision LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    -- The elements above p_age are a suffix of the ascending array: found by binary search
    -- (width_bucket counts the elements <= p_age), not by filtering and sorting it per holder.
    -- One expression without FROM, so that the planner inlines it (it runs per holder).
    SELECT CASE WHEN cardinality(p_sorted) > width_bucket(p_age, p_sorted)
                THEN p_sorted[width_bucket(p_age, p_sorted)
                              + greatest(1, ceil(p_q * (cardinality(p_sorted)
                                                        - width_bucket(p_age, p_sorted)))::integer)]
                     - p_age END
$$;
COMMENT ON FUNCTION respool._quantile_above(double precision[], double precision, double precision) IS
    'The q-quantile (nearest rank) of {d - p_age : d in p_sorted, d > p_age} for an ascending array without NULLs, i.e. _quantile over that set, in O(log n); NULL when no element exceeds p_age.';

CREATE OR REPLACE FUNCTION respool._eta_min_holds()
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 10 $$;
COMMENT ON FUNCTION respool._eta_min_holds() IS
    'The fewest recorded holds an ETA is drawn from (docs/scheduling.md, ETA): a pool with fewer gives eta null (no p50 or p90 from a handful of samples), and a holder outliving all but fewer than this many recorded holds gets the age-proportional tail of respool._remaining_hold.';

CREATE OR REPLACE FUNCTION respool._remaining_hold(p_sorted double precision[], p_age double precision,
                                                   p_q double precision)
RETURNS double precision LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    -- One expression without FROM, so that the planner inlines it (it runs per holder).
    -- cardinality - width_bucket: the recorded holds longer than the age (a suffix).
    SELECT CASE WHEN cardinality(p_sorted) - width_bucket(p_age, p_sorted) >= respool._eta_min_holds()
                THEN respool._quantile_above(p_sorted, p_age, p_q)
                -- The tail: P(hold > t | hold > age) = age / t (a Pareto tail of shape 1: having
                -- held for a, a holder is as likely to hold another a as not), so the remaining
                -- time's q-quantile is age * (1 / (1 - q) - 1): the age at q = 0.5, 9 times it at
                -- q = 0.9. Never below what the few longer recorded holds say.
                ELSE greatest(respool._quantile_above(p_sorted, p_age, p_q), 0,
                              p_age * (1 / (1 - p_q) - 1)) END
$$;
COMMENT ON FUNCTION respool._remaining_hold(double precision[], double precision, double precision) IS
    'Survival estimate of a holder''s remaining hold (docs/scheduling.md, ETA), for 0 < p_q < 1 and an ascending array of recorded holds without NULLs: with at least respool._eta_min_holds() recorded holds longer than p_age, the q-quantile of their excess over p_age (respool._quantile_above); with fewer, a tail that grows with the age, p_age * (1 / (1 - p_q) - 1) (the age itself at the median), or what those few say if that is longer. Never NULL, never negative; non-decreasing in p_age once no recorded hold is longer.';

CREATE OR REPLACE FUNCTION respool._hold_history(p_pool_id uuid)
RETURNS double precision[] LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(d ORDER BY d), '{}') FROM (
        SELECT extract(epoch FROM r.finished_at - r.allocated_at)::double precision AS d
          FROM respool.requests r
         WHERE r.pool_id = p_pool_id AND r.finished_at IS NOT NULL AND r.allocated_at IS NOT NULL
           AND r.status IN ('released', 'preempted', 'expired')
         ORDER BY r.finished_at DESC
         LIMIT 500) h
$$;
COMMENT ON FUNCTION respool._hold_history(uuid) IS
    'The pool''s most recent 500 hold times in seconds (released, preempted or expired allocations), ascending. Read-only.';

CREATE OR REPLACE FUNCTION respool._eta_depth()
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 100 $$;
COMMENT ON FUNCTION respool._eta_depth() IS
    'How deep in a queue an ETA is estimated (docs/scheduling.md, ETA): requests further back get eta null, so a read of a queued request stays O(shapes + this), not O(queue).';

CREATE OR REPLACE FUNCTION respool._eta_devices(p_pool_id uuid, p_nodes uuid[], OUT dev_ids text[], OUT dev_bin integer[],
                                                OUT dev_key text[], OUT offer bigint[], OUT mem bigint[], OUT share bigint[])
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- The shared devices of the active nodes (bins p_nodes), with their rooms now (the device
    -- places of one whole device of each shared key), for the device level of the ETA walk.
    IF NOT respool._pool_shares(p_pool_id) THEN
        RETURN;
    END IF;
    SELECT array_agg(p.node_id::text || '/' || p.key || '/' || p.device ORDER BY b.i, p.key, p.position),
           array_agg(b.i::integer ORDER BY b.i, p.key, p.position), array_agg(p.key ORDER BY b.i, p.key, p.position),
           array_agg(p.memory ORDER BY b.i, p.key, p.position), array_agg(p.room_memory ORDER BY b.i, p.key, p.position),
           array_agg(p.room_share ORDER BY b.i, p.key, p.position)
      INTO dev_ids, dev_bin, dev_key, offer, mem, share
      FROM respool._device_places(p_pool_id, (SELECT jsonb_object_agg(DISTINCT nr.key, 1) FROM respool.node_resources nr
                                                JOIN respool.nodes n ON n.id = nr.node_id
                                               WHERE n.pool_id = p_pool_id AND nr.sharing IS NOT NULL)) p
      JOIN unnest(p_nodes) WITH ORDINALITY b(node_id, i) ON b.node_id = p.node_id
     WHERE p.sharing IS NOT NULL;
END $$;
COMMENT ON FUNCTION respool._eta_devices(uuid, uuid[]) IS
    'The shared devices of a pool''s nodes p_nodes (the bins of the ETA walk) as arrays for respool._devices_take: identities node/key/device, bin, key, offer, memory and share rooms now (held whole: -1), in bin, key and list order; all NULL when no node of the pool shares. Read-only.';

CREATE OR REPLACE FUNCTION respool._eta_device_frees(p_request_id uuid, p_dev_ids text[])
RETURNS jsonb LANGUAGE sql STABLE AS $$
    -- its slices, and the shared devices it holds whole (room -1 back to the offer)
    SELECT coalesce(jsonb_agg(jsonb_build_array(f.j, f.memory, f.share)), '[]') FROM (
        SELECT array_position(p_dev_ids, ds.node_id::text || '/' || ds.key || '/' || ds.device) AS j,
               ds.memory_mb AS memory, coalesce(ds.share, 0) AS share
          FROM respool.device_slices ds WHERE ds.request_id = p_request_id AND p_dev_ids IS NOT NULL
        UNION ALL
        SELECT array_position(p_dev_ids, d.node_id::text || '/' || d.key || '/' || d.device), coalesce(d.memory_mb, 0) + 1, 101
          FROM respool.node_devices d WHERE d.holder_id = p_request_id AND p_dev_ids IS NOT NULL) f
     WHERE f.j IS NOT NULL
$$;
COMMENT ON FUNCTION respool._eta_device_frees(uuid, text[]) IS
    'What a holder gives back to the shared devices p_dev_ids (respool._eta_devices) when it ends, in the form respool._devices_give takes: its slices, and each device it holds whole (rooms -1 back to the offer and 100). Inlined (SQL).';

CREATE OR REPLACE FUNCTION respool._eta_holders(p_pool_id uuid, p_now timestamptz, p_hist double precision[],
                                                p_q double precision, p_keys text[], p_nodes uuid[],
                                                p_dev_ids text[], OUT h_end double precision[], OUT h_bin integer[],
                                                OUT h_units bigint[], OUT h_frees jsonb[])
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- Each holder ends at the quantile of its remaining hold given its age (the recorded holds
    -- longer than its age, or the tail that grows with it), capped by its max_seconds and grace
    -- deadlines. In a pool with nodes a holder frees its units on its node (holders of nodes
    -- that take no grants do not count).
    SELECT coalesce(array_agg(x.rem ORDER BY x.rem, x.id) FILTER (WHERE u.k = 1), '{}'),  -- one per holder
           coalesce(array_agg(x.bin ORDER BY x.rem, x.id) FILTER (WHERE u.k = 1), '{}'),
           coalesce(array_agg(u.n ORDER BY x.rem, x.id, u.k), '{}'),
           coalesce(array_agg(x.frees ORDER BY x.rem, x.id) FILTER (WHERE u.k = 1), '{}')
      INTO h_end, h_bin, h_units, h_frees
      FROM (SELECT r.id, coalesce(pl.resources, r.resources) AS resources,
                   CASE WHEN p_nodes = '{}' THEN 1 ELSE array_position(p_nodes, pl.node_id) END AS bin,
                   greatest(least(respool._remaining_hold(p_hist, a.age, p_q),
                             extract(epoch FROM r.run_deadline - p_now),
                             extract(epoch FROM r.preempt_deadline - p_now)), 0) AS rem,
                   CASE WHEN p_dev_ids IS NOT NULL THEN respool._eta_device_frees(r.id, p_dev_ids) END AS frees
              FROM respool.requests r
              LEFT JOIN respool.placements pl ON pl.request_id = r.id
             CROSS JOIN LATERAL (SELECT extract(epoch FROM p_now - r.allocated_at)::double precision AS age) a
             WHERE r.pool_id = p_pool_id AND r.status IN ('allocated', 'preempting')) x
     CROSS JOIN LATERAL (SELECT k, coalesce((x.resources ->> p_keys[k])::bigint, 0) AS n
                           FROM generate_series(1, greatest(cardinality(p_keys), 1)) k) u
     WHERE x.bin IS NOT NULL;
END $$;
COMMENT ON FUNCTION respool._eta_holders(uuid, timestamptz, double precision[], double precision, text[], uuid[], text[]) IS
    'The holders of a pool in the ETA simulation at quantile p_q (docs/scheduling.md, ETA): each one''s simulated end in seconds from p_now (ascending; respool._remaining_hold, capped by its max_seconds and grace deadlines), its bin (1 without nodes, else its node''s index in p_nodes; holders on other nodes left out), its units of p_keys (flattened) and what it gives back to the shared devices p_dev_ids (respool._eta_device_frees). Read-only.';

CREATE OR REPLACE FUNCTION respool._eta_walk(p_free bigint[], p_nk integer, p_nb integer,
                                             h_end double precision[], h_bin integer[], h_units bigint[],
                                             e_id uuid[], e_units bigint[], e_ok boolean[],
                                             p_hold double precision, p_until uuid,
                                             p_dev_bin integer[], p_dev_key text[], p_offer bigint[], p_mem bigint[],
                                             p_share bigint[], h_frees jsonb[], e_needs jsonb[], p_spread boolean)
RETURNS double precision[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_mem bigint[] := p_mem;           -- the shared devices' rooms (respool._eta_devices)
    v_share bigint[] := p_share;
    g_taken jsonb[] := '{}';           -- what each simulated grant took of them
    dv record;
    v_free bigint[] := p_free; -- flattened nk per bin
    g_end double precision[] := '{}';  -- simulated grants: end times, non-decreasing (FIFO)
    g_idx integer[] := '{}';           -- and the queue entry each one is
    g_bin integer[] := '{}';           -- and its bin
    v_out double precision[] := array_fill(NULL::double precision, ARRAY[cardinality(e_id)]);
    t double precision := 0;
    hp integer := 1;
    gp integer := 1;
    fit integer;
    nk integer := p_nk;
    nb integer := p_nb;
BEGIN
    <<entries>>
    FOR i IN 1..cardinality(e_id) LOOP
        CONTINUE WHEN NOT (true = ANY (e_ok[(i - 1) * nb + 1 : i * nb]));  -- (no bin it may use)
        LOOP
            fit := NULL;
            FOR b IN 1..nb LOOP
                CONTINUE WHEN NOT e_ok[(i - 1) * nb + b];
                fit := b;
                FOR j IN 1..nk LOOP  -- every key the entry needs fits the bin's room
                    IF e_units[(i - 1) * nk + j] > 0
                       AND NOT respool._fits_room(e_units[(i - 1) * nk + j], v_free[(b - 1) * nk + j]) THEN
                        fit := NULL;
                        EXIT;
                    END IF;
                END LOOP;
                IF fit IS NOT NULL AND v_mem IS NOT NULL THEN  -- and the devices of a node that shares
                    dv := respool._devices_take(b, e_needs[i], p_spread, p_dev_bin, p_dev_key, p_offer, v_mem, v_share);
                    fit := CASE WHEN dv.taken IS NOT NULL THEN b END;
                END IF;
                EXIT WHEN fit IS NOT NULL;
            END LOOP;
            EXIT WHEN fit IS NOT NULL;
            -- Free the next unit-holder to end: a real holder or a simulated grant.
            IF hp <= cardinality(h_end) AND (gp > cardinality(g_end) OR h_end[hp] <= g_end[gp]) THEN
                t := greatest(t, h_end[hp]);
                FOR j IN 1..nk LOOP
                    v_free[(h_bin[hp] - 1) * nk + j] := v_free[(h_bin[hp] - 1) * nk + j] + h_units[(hp - 1) * nk + j];
                END LOOP;
                IF v_mem IS NOT NULL THEN
                    SELECT * INTO v_mem, v_share FROM respool._devices_give(h_frees[hp], v_mem, v_share);
                END IF;
                hp := hp + 1;
            ELSIF gp <= cardinality(g_end) THEN
                t := greatest(t, g_end[gp]);
                FOR j IN 1..nk LOOP
                    v_free[(g_bin[gp] - 1) * nk + j] := v_free[(g_bin[gp] - 1) * nk + j]
                                                        + e_units[(g_idx[gp] - 1) * nk + j];
                END LOOP;
                IF v_mem IS NOT NULL THEN
                    SELECT * INTO v_mem, v_share FROM respool._devices_give(g_taken[gp], v_mem, v_share);
                END IF;
                gp := gp + 1;
            ELSE
                EXIT entries;  -- nothing left to free: the rest cannot fit as the pool stands
            END IF;
        END LOOP;
        v_out[i] := t;
        EXIT entries WHEN e_id[i] = p_until;
        FOR j IN 1..nk LOOP
            v_free[(fit - 1) * nk + j] := v_free[(fit - 1) * nk + j] - e_units[(i - 1) * nk + j];
        END LOOP;
        g_end := g_end || (t + p_hold);
        g_idx := g_idx || i;
        g_bin := g_bin || fit;
        IF v_mem IS NOT NULL THEN
            v_mem := dv.p_mem;
            v_share := dv.p_share;
            g_taken := array_append(g_taken, dv.taken);
        END IF;
    END LOOP;
    RETURN v_out;
END $$;
COMMENT ON FUNCTION respool._eta_walk(bigint[], integer, integer, double precision[], integer[], bigint[], uuid[], bigint[], boolean[], double precision, uuid, integer[], text[], bigint[], bigint[], bigint[], jsonb[], jsonb[], boolean) IS
    'The queue walk of the ETA simulation (docs/scheduling.md, ETA): from the free units per bin (p_free, flattened p_nk per bin), the holders'' ends (respool._eta_holders) and the queue entries in order (units flattened p_nk, allowed bins flattened p_nb), each entry is granted at the first time a bin it may use has room (in a pool that shares, and its devices p_dev_*: respool._devices_take) and holds for p_hold. Returns each entry''s simulated start (seconds), NULL for entries never reached (after p_until, or past one that cannot fit as the pool stands).';

CREATE OR REPLACE FUNCTION respool._eta_pool(p_pool_id uuid, p_now timestamptz, p_until uuid DEFAULT NULL)
RETURNS TABLE (request_id uuid, p50_seconds bigint, p90_seconds bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_hist double precision[] := respool._hold_history(p_pool_id);
    v_keys text[];
    v_need jsonb;       -- the keys, as a need map
    nk integer;
    -- bins: where units live. One bin, the pool, in a pool without nodes; one per active node in
    -- a pool with nodes (docs/placement.md), a request fitting one node.
    v_nodes uuid[];
    nb integer;
    -- queue: ids and units in queue order, flattened nk per entry; e_ok: which bins each entry
    -- may use, flattened nb per entry
    e_id uuid[];
    e_units bigint[];
    e_ok boolean[];
    v_free0 bigint[];
    e_needs jsonb[];    -- each entry's resources, for the device level
    d record;           -- shared devices (respool._eta_devices)
    v_spread boolean;
    h record;
    out50 double precision[];
    out90 double precision[];
BEGIN
    IF respool._pool_has_rates(p_pool_id) THEN  -- rate keys: an exact answer, 039_rates.sql
        RETURN QUERY SELECT * FROM respool._rate_eta_pool(p_pool_id, p_now, p_until);
        RETURN;
    END IF;
    IF cardinality(v_hist) < respool._eta_min_holds() THEN
        RETURN;  -- too few recorded holds: no estimate
    END IF;
    -- Bins are places (respool._pool_place, respool._node_places): the pool place, or one per active node, with their
    -- free units of the pool's bounded keys (the key rule deciding a key a node lacks).
    v_need := respool._place_keys(p_pool_id, 'pool');
    SELECT coalesce(array_agg(p.key ORDER BY p.key), '{}'), coalesce(array_agg(p.free ORDER BY p.key), '{}')
      INTO v_keys, v_free0
      FROM respool._pool_place(p_pool_id, v_need) p WHERE p.capacity IS NOT NULL;
    nk := cardinality(v_keys);
    v_nodes := ARRAY(SELECT n.id FROM respool.nodes n WHERE n.pool_id = p_pool_id AND n.state = 'active'
                      ORDER BY n.name);
    IF respool._pool_has_nodes(p_pool_id) THEN
        nb := cardinality(v_nodes);
        v_need := (SELECT coalesce(jsonb_object_agg(k, 0), '{}') FROM unnest(v_keys) k);
        SELECT coalesce(array_agg(p.free ORDER BY p.node_name, p.key), '{}') INTO v_free0
          FROM respool._node_places(p_pool_id, v_need) p
         WHERE p.state = 'active';
    ELSE
        nb := 1;
    END IF;
    SELECT array_agg(o.request_id ORDER BY o.position) FILTER (WHERE u.k = 1),  -- one per entry
           array_agg(u.n ORDER BY o.position, u.k),
           array_agg(r.resources ORDER BY o.position) FILTER (WHERE u.k = 1)
      INTO e_id, e_units, e_needs
      FROM respool._queue_top(p_pool_id, respool._eta_depth()) o
      -- the entry's resources: a gang's entry holds its members' sum (docs/scheduling.md, gangs)
      JOIN respool.queue_entries r ON r.pool_id = p_pool_id AND r.request_id = o.request_id
     CROSS JOIN LATERAL (SELECT k, coalesce((r.resources ->> v_keys[k])::bigint, 0) AS n
                           FROM generate_series(1, greatest(nk, 1)) k) u;
    IF e_id IS NULL OR nb = 0 THEN
        RETURN;
    END IF;
    IF v_nodes = '{}' THEN
        e_ok := array_fill(true, ARRAY[cardinality(e_id)]);
    ELSE
        -- The nodes an entry may use: those matching its selector. A gang, placed member by member,
        -- gets no estimate in a pool with nodes (and takes no units in the simulation).
        SELECT array_agg(respool._node_matches(n.name, n.labels, e.node_selector) AND g.gang_id IS NULL
                         ORDER BY x.i, nb_i.b)
          INTO e_ok
          FROM unnest(e_id) WITH ORDINALITY x(id, i)
          JOIN respool.queue_entries e ON e.pool_id = p_pool_id AND e.request_id = x.id
          JOIN respool.requests g ON g.id = x.id
         CROSS JOIN generate_subscripts(v_nodes, 1) nb_i(b)
          JOIN respool.nodes n ON n.id = v_nodes[nb_i.b];
    END IF;
    -- The simulation at the median, then at the 90th percentile of the recorded holds; in a
    -- pool that shares, with its shared devices' rooms too.
    d := respool._eta_devices(p_pool_id, v_nodes);
    SELECT placement = 'spread' INTO v_spread FROM respool.pools WHERE id = p_pool_id;
    h := respool._eta_holders(p_pool_id, p_now, v_hist, 0.5, v_keys, v_nodes, d.dev_ids);
    out50 := respool._eta_walk(v_free0, nk, nb, h.h_end, h.h_bin, h.h_units, e_id, e_units, e_ok,
                               respool._quantile(v_hist, 0.5), p_until,
                               d.dev_bin, d.dev_key, d.offer, d.mem, d.share, h.h_frees, e_needs, v_spread);
    h := respool._eta_holders(p_pool_id, p_now, v_hist, 0.9, v_keys, v_nodes, d.dev_ids);
    out90 := respool._eta_walk(v_free0, nk, nb, h.h_end, h.h_bin, h.h_units, e_id, e_units, e_ok,
                               respool._quantile(v_hist, 0.9), p_until,
                               d.dev_bin, d.dev_key, d.offer, d.mem, d.share, h.h_frees, e_needs, v_spread);
    FOR i IN 1..cardinality(e_id) LOOP
        CONTINUE WHEN out50[i] IS NULL OR out90[i] IS NULL;
        request_id := e_id[i];
        p50_seconds := ceil(out50[i])::bigint;
        p90_seconds := ceil(greatest(out50[i], out90[i]))::bigint;
        RETURN NEXT;
        EXIT WHEN e_id[i] = p_until;
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._eta_pool(uuid, timestamptz, uuid) IS
    'The ETA of the first respool._eta_depth() requests of a pool''s queue (or up to p_until; docs/scheduling.md, ETA): per queued request, the simulated seconds from p_now until its units are free, at the median (p50) and 90th percentile (p90) of the pool''s recorded holds. In a pool with nodes units live per active node (and on its shared devices, a slice on one device) and a gang gets no estimate. No rows while the pool has fewer than respool._eta_min_holds() recorded holds. Read-only; O(holders + shapes * depth * nodes).';

CREATE OR REPLACE FUNCTION respool._eta(p_pool_id uuid, p_request_id uuid, p_now timestamptz)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT jsonb_build_object('p50_seconds', e.p50_seconds, 'p90_seconds', e.p90_seconds)
              FROM respool._eta_pool(p_pool_id, p_now, p_request_id) e
             WHERE e.request_id = p_request_id);
END $$;
COMMENT ON FUNCTION respool._eta(uuid, uuid, timestamptz) IS
    'docs/scheduling.md, ETA: {p50_seconds, p90_seconds} estimated wait of a queued request in one pool (respool._eta_pool up to it), or NULL with fewer than respool._eta_min_holds() recorded holds (or when it cannot fit as the pool stands). Read-only.';

CREATE OR REPLACE FUNCTION respool._request_eta(p_request_id uuid, p_now timestamptz)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- Queued in several candidate pools: the soonest estimate. OFFSET 0 keeps the subquery
    -- apart, so each pool's simulation runs once (flattened, the WHERE and both ORDER BY keys
    -- each called _eta again: four simulations per pool).
    RETURN (SELECT eta FROM (SELECT respool._eta(e.pool_id, p_request_id, p_now) AS eta
                               FROM respool.queue_entries e WHERE e.request_id = p_request_id
                             OFFSET 0) x
             WHERE eta IS NOT NULL
             ORDER BY (eta ->> 'p50_seconds')::bigint, (eta ->> 'p90_seconds')::bigint
             LIMIT 1);
END $$;
COMMENT ON FUNCTION respool._request_eta(uuid, timestamptz) IS
    'The ETA of a queued request: the soonest over its candidate pools'' estimates (one simulation per pool); NULL with too few recorded holds (respool._eta_min_holds()). Read-only.';
