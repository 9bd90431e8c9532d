-- Nodes (docs/placement.md): machines that back a pool. CRUD with their validations, cordon and
-- drain, and what every node change does to its pool: the pool's capacity is derived (per key,
-- the sum over its nodes in any state), holders of a removed node or device are preempted at
-- once, the reserved shares must still fit, and the pool's queue settles.
--
-- Lock order: pool rows in id order (respool._lock_pools, FOR NO KEY UPDATE) before node rows,
-- the order of every engine function, so a node change never deadlocks with a grant.

-- --- validation (pure) -------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION respool._body_fields(p_body jsonb, p_allowed text[], p_what text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
BEGIN
    IF p_body IS NULL OR jsonb_typeof(p_body) <> 'object' THEN
        PERFORM respool._fail('RP400', NULL, format('%s must be a JSON object', p_what));
    END IF;
    SELECT x INTO k FROM jsonb_object_keys(p_body) x WHERE x <> ALL (p_allowed) ORDER BY x LIMIT 1;
    IF FOUND THEN
        PERFORM respool._fail('RP400', left(k, 70), format('%s: unknown field %L (known: %s)',
                              p_what, left(k, 70), array_to_string(p_allowed, ', ')));
    END IF;
END $$;
COMMENT ON FUNCTION respool._body_fields(jsonb, text[], text) IS
    'RP400 unless p_body is a JSON object whose fields are all in p_allowed (naming the first unknown one).';

CREATE OR REPLACE FUNCTION respool._node_labels(p_labels jsonb, p_allow_null boolean)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF jsonb_typeof(p_labels) = 'object' AND p_labels ? 'node' THEN
        PERFORM respool._fail('RP400', 'labels.node',
            'labels: node is a built-in label (the node''s name) and cannot be set');
    END IF;
    RETURN respool._label_map(p_labels, 'labels', p_allow_null);
END $$;
COMMENT ON FUNCTION respool._node_labels(jsonb, boolean) IS
    'Validates a node''s label map (respool._label_map, field labels); the built-in label node is refused; p_allow_null lets a null value through (an update removing the label).';

CREATE OR REPLACE FUNCTION respool._node_devices(p_devices jsonb, p_allow_null boolean)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
    v jsonb;
    d jsonb;
BEGIN
    IF respool._absent_map(p_devices, 'devices', 'devices must be an object of key: [device id, ...]') THEN
        RETURN '{}';
    END IF;
    FOR k, v IN SELECT * FROM jsonb_each(p_devices) ORDER BY 1 LOOP
        CONTINUE WHEN p_allow_null AND jsonb_typeof(v) = 'null';
        IF jsonb_typeof(v) <> 'array' OR jsonb_array_length(v) = 0 THEN
            PERFORM respool._fail('RP400', 'devices.' || k, format(
                'devices.%s must be a non-empty list of device ids%s', k,
                CASE WHEN p_allow_null THEN ' (null makes its units anonymous)' ELSE '' END));
        END IF;
        FOR d IN SELECT * FROM jsonb_array_elements(v) LOOP
            IF jsonb_typeof(d) <> 'string' OR (d #>> '{}') = '' OR length(d #>> '{}') > respool._max_device_id() THEN
                PERFORM respool._fail('RP400', 'devices.' || k, format(
                    'devices.%s: every device id must be a string of 1 to %s characters', k, respool._max_device_id()));
            END IF;
        END LOOP;
        IF (SELECT count(DISTINCT x) FROM jsonb_array_elements_text(v) x) < jsonb_array_length(v) THEN
            PERFORM respool._fail('RP400', 'devices.' || k, format(
                'devices.%s: device ids must be distinct, %s is listed twice', k,
                (SELECT x FROM jsonb_array_elements_text(v) x GROUP BY x HAVING count(*) > 1 ORDER BY x LIMIT 1)));
        END IF;
    END LOOP;
    RETURN p_devices;
END $$;
COMMENT ON FUNCTION respool._node_devices(jsonb, boolean) IS
    'Validates a node''s device map {key: [distinct non-empty ids of at most 128 characters]}; p_allow_null lets a null list through (an update making the key''s units anonymous). RP400 naming devices.<key>.';

CREATE OR REPLACE FUNCTION respool._node_state(p_state jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_state IS NULL OR jsonb_typeof(p_state) <> 'string'
       OR (p_state #>> '{}') NOT IN ('active', 'cordoned', 'draining') THEN
        PERFORM respool._fail('RP400', 'state', 'state must be active, cordoned or draining');
    END IF;
    RETURN p_state #>> '{}';
END $$;
COMMENT ON FUNCTION respool._node_state(jsonb) IS 'Validates a node state (active, cordoned, draining); RP400 naming state.';

CREATE OR REPLACE FUNCTION respool._node_pool_ref(p_pool jsonb)
RETURNS uuid LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_pool IS NULL OR jsonb_typeof(p_pool) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_pool) <> 'string' THEN
        PERFORM respool._fail('RP400', 'pool', 'pool must be a pool ref (name, id or id prefix) or null');
    END IF;
    RETURN respool.resolve_pool(p_pool #>> '{}');
END $$;
COMMENT ON FUNCTION respool._node_pool_ref(jsonb) IS 'The pool id of a node''s pool field (a ref, resolved as everywhere; null: no pool).';

CREATE OR REPLACE FUNCTION respool._node_target(p_old_capacity jsonb, p_old_devices jsonb,
                                                p_capacity_changes jsonb, p_device_changes jsonb,
                                                OUT capacity jsonb, OUT devices jsonb)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
    v jsonb;
    n bigint;
BEGIN
    -- Merge: capacity 0 removes a key; a device list replaces the key's list, null removes it.
    capacity := coalesce(p_old_capacity, '{}');
    devices := coalesce(p_old_devices, '{}');
    FOR k, n IN SELECT key, value::bigint FROM jsonb_each_text(p_capacity_changes) LOOP
        capacity := CASE WHEN n = 0 THEN capacity - k ELSE capacity || jsonb_build_object(k, n) END;
    END LOOP;
    FOR k, v IN SELECT * FROM jsonb_each(p_device_changes) LOOP
        devices := CASE WHEN jsonb_typeof(v) = 'null' THEN devices - k ELSE devices || jsonb_build_object(k, v) END;
    END LOOP;
    -- A listed key has as many units as ids: capacity may leave it out, or must agree.
    FOR k, v IN SELECT * FROM jsonb_each(p_device_changes) WHERE jsonb_typeof(value) = 'array' LOOP
        IF p_capacity_changes ? k AND (p_capacity_changes ->> k)::bigint <> jsonb_array_length(v) THEN
            PERFORM respool._fail('RP400', 'devices.' || k, format(
                'devices.%s lists %s ids but capacity.%s is %s: a listed key has one unit per device (leave capacity.%s out)',
                k, jsonb_array_length(v), k, p_capacity_changes ->> k, k));
        END IF;
        capacity := capacity || jsonb_build_object(k, jsonb_array_length(v));
    END LOOP;
    FOR k, n IN SELECT key, value::bigint FROM jsonb_each_text(p_capacity_changes)
                 WHERE NOT p_device_changes ? key AND devices ? key LOOP
        IF n = 0 THEN
            devices := devices - k;  -- the key goes, and its devices with it
        ELSIF n <> jsonb_array_length(devices -> k) THEN
            PERFORM respool._fail('RP400', 'devices.' || k, format(
                'capacity.%s is %s but devices.%s lists %s ids: give the new devices.%s list (or null for anonymous units)',
                k, n, k, jsonb_array_length(devices -> k), k));
        END IF;
    END LOOP;
    IF (SELECT count(*) FROM jsonb_object_keys(capacity)) > respool._max_keys() THEN
        PERFORM respool._fail('RP400', 'capacity', format('capacity has more than %s keys', respool._max_keys()));
    END IF;
END $$;
COMMENT ON FUNCTION respool._node_target(jsonb, jsonb, jsonb, jsonb) IS
    'A node''s capacity and device lists after an update: capacity merges (0 removes a key and its devices), a device list replaces the key''s list (null: anonymous units) and sets its capacity to its length. RP400 naming devices.<key> when a list and a capacity disagree.';

CREATE OR REPLACE FUNCTION respool._node_sharing_map(p_map jsonb, p_field text, p_allow_null boolean)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
    v jsonb;
BEGIN
    -- sharing {key: mode}, device_memory_mb {key: MiB > 0}, reserved_memory_mb {key: MiB >= 0}
    IF respool._absent_map(p_map, p_field, format('%s must be an object keyed by a device key', p_field)) THEN
        RETURN '{}';
    END IF;
    FOR k, v IN SELECT * FROM jsonb_each(p_map) ORDER BY 1 LOOP
        CONTINUE WHEN p_allow_null AND jsonb_typeof(v) = 'null';
        IF p_field = 'sharing' THEN
            IF jsonb_typeof(v) IS DISTINCT FROM 'string' OR (v #>> '{}') NOT IN ('mps', 'time-slicing') THEN
                PERFORM respool._fail('RP400', 'sharing.' || k, format(
                    'sharing.%s must be mps or time-slicing%s', k,
                    CASE WHEN p_allow_null THEN ' (null: whole devices only)' ELSE '' END));
            END IF;
        ELSE
            PERFORM respool._amount(v, p_field || '.' || k, p_field = 'device_memory_mb');
        END IF;
    END LOOP;
    RETURN p_map;
END $$;
COMMENT ON FUNCTION respool._node_sharing_map(jsonb, text, boolean) IS
    'Validates one of a node''s sharing maps (docs/placement.md, "Sharing a GPU"), p_field: sharing {key: mps | time-slicing}, device_memory_mb {key: MiB, positive} or reserved_memory_mb {key: MiB}; p_allow_null lets a null value through (an update removing the key). RP400 naming <field>.<key>.';

CREATE OR REPLACE FUNCTION respool._node_sharing_body(p_body jsonb, p_allow_null boolean)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object(
        'sharing', respool._node_sharing_map(p_body -> 'sharing', 'sharing', p_allow_null),
        'device_memory_mb', respool._node_sharing_map(p_body -> 'device_memory_mb', 'device_memory_mb', p_allow_null),
        'reserved_memory_mb', respool._node_sharing_map(p_body -> 'reserved_memory_mb', 'reserved_memory_mb', p_allow_null))
$$;
COMMENT ON FUNCTION respool._node_sharing_body(jsonb, boolean) IS
    'The three sharing maps of a node body, each validated (respool._node_sharing_map; p_allow_null: an update, where null removes a key).';

CREATE OR REPLACE FUNCTION respool._node_sharing_target(p_old jsonb, p_changes jsonb, p_devices jsonb,
                                                        p_capacity_changes jsonb,
                                                        OUT sharing jsonb, OUT capacity_changes jsonb)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    f text;
    k text;
    v jsonb;
    maps jsonb := coalesce(p_old, '{}');
    n bigint;
    v_offer bigint;
BEGIN
    -- p_old / the result: {"sharing": {...}, "device_memory_mb": {...}, "reserved_memory_mb": {...}};
    -- p_changes: the same maps from a body (null values remove a key), merged per key. A key whose
    -- device list goes with its key (p_devices lacks it and so does the capacity) loses its
    -- sharing fields with it.
    FOREACH f IN ARRAY ARRAY['sharing', 'device_memory_mb', 'reserved_memory_mb'] LOOP
        maps := jsonb_set(maps, ARRAY[f], coalesce(maps -> f, '{}'));
        FOR k, v IN SELECT * FROM jsonb_each(coalesce(p_changes -> f, '{}')) LOOP
            maps := jsonb_set(maps, ARRAY[f], CASE WHEN jsonb_typeof(v) = 'null' THEN (maps -> f) - k
                                                    ELSE (maps -> f) || jsonb_build_object(k, v) END);
        END LOOP;
        FOR k IN SELECT x FROM jsonb_object_keys(maps -> f) x WHERE NOT p_devices ? x
                   AND NOT coalesce(p_changes -> f, '{}') ? x LOOP
            maps := jsonb_set(maps, ARRAY[f], (maps -> f) - k);
        END LOOP;
    END LOOP;
    maps := jsonb_set(maps, '{reserved_memory_mb}',
                      (SELECT coalesce(jsonb_object_agg(key, value), '{}') FROM jsonb_each(maps -> 'reserved_memory_mb')
                        WHERE value <> '0'::jsonb));
    FOR k IN SELECT x FROM jsonb_object_keys(maps -> 'sharing') x ORDER BY 1 LOOP
        IF NOT p_devices ? k THEN
            PERFORM respool._fail('RP400', 'sharing.' || k, format(
                'sharing.%s: only a key with a device list (devices.%s) can be shared', k, k));
        END IF;
        IF length(k) > 63 - length('_memory_mb') THEN
            PERFORM respool._fail('RP400', 'sharing.' || k, format(
                'sharing.%s: the key is too long for its slice keys %s_memory_mb and %s_share', k, k, k));
        END IF;
        IF NOT maps -> 'device_memory_mb' ? k THEN
            PERFORM respool._fail('RP400', 'device_memory_mb.' || k, format(
                'device_memory_mb.%s is required: a shared device offers its memory (MiB) to slices', k));
        END IF;
    END LOOP;
    FOR k IN SELECT x FROM jsonb_object_keys(maps -> 'device_memory_mb') x ORDER BY 1 LOOP
        IF NOT p_devices ? k THEN
            PERFORM respool._fail('RP400', 'device_memory_mb.' || k, format(
                'device_memory_mb.%s: only a key with a device list (devices.%s) has a device memory', k, k));
        END IF;
    END LOOP;
    FOR k, n IN SELECT key, value::bigint FROM jsonb_each_text(maps -> 'reserved_memory_mb') ORDER BY 1 LOOP
        IF NOT maps -> 'device_memory_mb' ? k OR n >= (maps -> 'device_memory_mb' ->> k)::bigint THEN
            PERFORM respool._fail('RP400', 'reserved_memory_mb.' || k, format(
                'reserved_memory_mb.%s must be below device_memory_mb.%s (%s)', k, k,
                coalesce(maps -> 'device_memory_mb' ->> k, 'not set')));
        END IF;
    END LOOP;
    sharing := maps;
    -- The slice counters of a shared key are derived: a body may repeat them (an exported node),
    -- with the derived amount only.
    capacity_changes := coalesce(p_capacity_changes, '{}');
    FOR k IN SELECT x FROM jsonb_object_keys(maps -> 'sharing') x ORDER BY 1 LOOP
        v_offer := (maps -> 'device_memory_mb' ->> k)::bigint - coalesce((maps -> 'reserved_memory_mb' ->> k)::bigint, 0);
        IF jsonb_array_length(p_devices -> k)::numeric * v_offer > respool._max_amount() THEN
            PERFORM respool._fail('RP400', 'device_memory_mb.' || k, format(
                'device_memory_mb.%s: %s devices offering %s MiB each would pass the largest capacity %s',
                k, jsonb_array_length(p_devices -> k), v_offer, respool._max_amount()));
        END IF;
        FOR f, n IN VALUES (k || '_memory_mb', jsonb_array_length(p_devices -> k) * v_offer),
                           (k || '_share', jsonb_array_length(p_devices -> k) * 100) LOOP
            IF capacity_changes ? f AND (capacity_changes ->> f)::bigint <> n THEN
                PERFORM respool._fail('RP400', 'capacity.' || f, format(
                    'capacity.%s is derived from the shared devices of %s (%s): leave it out', f, k, n));
            END IF;
            capacity_changes := capacity_changes - f;
        END LOOP;
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._node_sharing_target(jsonb, jsonb, jsonb, jsonb) IS
    'A node''s sharing fields after a create or update (docs/placement.md, "Sharing a GPU"): p_old merged with p_changes per key (null removes), given the node''s device lists after the change. RP400 naming the field: a shared key needs a device list and device_memory_mb, device_memory_mb needs a device list, reserved_memory_mb is below device_memory_mb. capacity_changes: p_capacity_changes without the derived slice counters (<K>_memory_mb, <K>_share of a shared K), which a body may only repeat with their derived amount.';

CREATE OR REPLACE FUNCTION respool._node_derived(p_devices jsonb, p_sharing jsonb)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    -- {"<K>_memory_mb": devices * offer, "<K>_share": devices * 100} per shared key K
    SELECT coalesce(jsonb_object_agg(x.key, x.n), '{}') FROM (
        SELECT s.key || '_memory_mb' AS key,
               jsonb_array_length(p_devices -> s.key)
               * ((p_sharing -> 'device_memory_mb' ->> s.key)::bigint
                  - coalesce((p_sharing -> 'reserved_memory_mb' ->> s.key)::bigint, 0)) AS n
          FROM jsonb_object_keys(coalesce(p_sharing -> 'sharing', '{}')) s(key)
        UNION ALL
        SELECT s.key || '_share', jsonb_array_length(p_devices -> s.key) * 100
          FROM jsonb_object_keys(coalesce(p_sharing -> 'sharing', '{}')) s(key)) x
$$;
COMMENT ON FUNCTION respool._node_derived(jsonb, jsonb) IS
    'The derived slice counters of a node: per shared device key K, <K>_memory_mb (its devices'' offers summed) and <K>_share (100 per device).';

CREATE OR REPLACE FUNCTION respool._node_sharing_now(p_node_id uuid)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'sharing', coalesce(jsonb_object_agg(nr.key, nr.sharing ORDER BY nr.key) FILTER (WHERE nr.sharing IS NOT NULL), '{}'),
        'device_memory_mb', coalesce(jsonb_object_agg(nr.key, nr.device_memory_mb ORDER BY nr.key)
                                     FILTER (WHERE nr.device_memory_mb IS NOT NULL), '{}'),
        'reserved_memory_mb', coalesce(jsonb_object_agg(nr.key, nr.reserved_memory_mb ORDER BY nr.key)
                                       FILTER (WHERE nr.reserved_memory_mb > 0), '{}'))
      FROM respool.node_resources nr WHERE nr.node_id = p_node_id
$$;
COMMENT ON FUNCTION respool._node_sharing_now(uuid) IS
    'A node''s sharing fields as stored: {"sharing": {...}, "device_memory_mb": {...}, "reserved_memory_mb": {...}} (a reserve of 0 left out).';

-- --- reading ---------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION respool.node_json(p_id uuid)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', n.id, 'name', n.name, 'pool', (SELECT name FROM respool.pools WHERE id = n.pool_id),
        'labels', n.labels,
        'capacity', coalesce((SELECT jsonb_object_agg(key, capacity ORDER BY key) FROM respool.node_resources
                               WHERE node_id = n.id), '{}'),
        'devices', coalesce((SELECT jsonb_object_agg(key, ids ORDER BY key)
                               FROM (SELECT key, jsonb_agg(device ORDER BY position) AS ids
                                       FROM respool.node_devices WHERE node_id = n.id GROUP BY key) d), '{}'),
        'state', n.state,
        -- shared devices (docs/placement.md, "Sharing a GPU")
        'sharing', sh -> 'sharing', 'device_memory_mb', sh -> 'device_memory_mb',
        'reserved_memory_mb', sh -> 'reserved_memory_mb',
        'usage', coalesce((SELECT jsonb_object_agg(key, used ORDER BY key) FROM respool.node_resources
                            WHERE node_id = n.id), '{}'),
        'allocations', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'request_id', r.id, 'subject', r.subject, 'status', r.status,
                       'resources', pl.resources,
                       'devices', coalesce((SELECT jsonb_object_agg(key, ids ORDER BY key)
                                              FROM (SELECT key, jsonb_agg(device ORDER BY position) AS ids
                                                      FROM respool.node_devices
                                                     WHERE node_id = n.id AND holder_id = r.id GROUP BY key) h), '{}')
                                   || coalesce((SELECT jsonb_object_agg(ds.key, jsonb_build_array(ds.device))
                                                  FROM respool.device_slices ds WHERE ds.request_id = r.id), '{}'),
                       'slices', coalesce((SELECT jsonb_object_agg(ds.key, jsonb_build_object(ds.device,
                                                      jsonb_strip_nulls(jsonb_build_object('memory_mb', ds.memory_mb,
                                                                                           'share', ds.share))))
                                             FROM respool.device_slices ds WHERE ds.request_id = r.id), '{}'))
                   ORDER BY r.id)
              FROM respool.placements pl JOIN respool.requests r ON r.id = pl.request_id
             WHERE pl.node_id = n.id), '[]'),
        'created_at', n.created_at, 'updated_at', n.updated_at,
        'agent', n.agent, 'agent_seen_at', n.agent_seen_at)  -- docs/jobs.md
      FROM respool.nodes n CROSS JOIN LATERAL (SELECT respool._node_sharing_now(n.id) AS sh) s
     WHERE n.id = p_id
$$;
COMMENT ON FUNCTION respool.node_json(uuid) IS
    'A node as the API shows it: pool name (null: in no pool), labels, capacity (with the derived slice counters of shared keys), devices per key in list order, state, its sharing fields (sharing, device_memory_mb, reserved_memory_mb; {} when none), usage (allocated units per key) and its allocations (request, subject, status, the units charged on the node, the devices it holds and its slices).';

CREATE OR REPLACE FUNCTION respool._node_id(p_name text)
RETURNS uuid LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_id uuid := (SELECT id FROM respool.nodes WHERE name = p_name);
BEGIN
    IF v_id IS NULL THEN
        PERFORM respool._fail('RP404', 'name', format('node %L not found', p_name));
    END IF;
    RETURN v_id;
END $$;
COMMENT ON FUNCTION respool._node_id(text) IS 'A node''s id by name; RP404 when there is none.';

CREATE OR REPLACE FUNCTION respool.get_node(p_name text)
RETURNS jsonb LANGUAGE sql STABLE AS $$ SELECT respool.node_json(respool._node_id(p_name)) $$;
COMMENT ON FUNCTION respool.get_node(text) IS 'One node by name (RP404 when there is none).';

CREATE OR REPLACE FUNCTION respool.list_nodes(p_pool text DEFAULT NULL, p_selector jsonb DEFAULT '{}')
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_pool_id uuid;
    v_selector jsonb := coalesce(p_selector, '{}');
BEGIN
    IF p_pool IS NOT NULL THEN
        v_pool_id := respool.resolve_pool(p_pool);
    END IF;
    IF jsonb_typeof(v_selector) <> 'object'
       OR EXISTS (SELECT FROM jsonb_each(v_selector) s WHERE jsonb_typeof(s.value) <> 'string') THEN
        PERFORM respool._fail('RP400', 'selector', 'selector must be an object of label: string');
    END IF;
    RETURN coalesce((SELECT jsonb_agg(respool.node_json(n.id) ORDER BY n.name)
                       FROM respool.nodes n
                      WHERE (p_pool IS NULL OR n.pool_id = v_pool_id)
                        AND NOT EXISTS (SELECT FROM jsonb_each_text(v_selector) s
                                         WHERE s.value IS DISTINCT FROM
                                               CASE WHEN s.key = 'node' THEN n.name ELSE n.labels ->> s.key END)),
                    '[]');
END $$;
COMMENT ON FUNCTION respool.list_nodes(text, jsonb) IS
    'Nodes by name, of one pool (a ref) or all; p_selector {label: value}: every pair must match the node''s labels, the built-in label node matching its name.';

-- --- what a node change does to its pool --------------------------------------------------------

CREATE OR REPLACE FUNCTION respool._derive_pool_capacity(p_pool_id uuid)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v record;
    v_keys jsonb;
BEGIN
    SELECT nr.key, sum(nr.capacity) AS total INTO v
      FROM respool.node_resources nr JOIN respool.nodes n ON n.id = nr.node_id
     WHERE n.pool_id = p_pool_id
     GROUP BY nr.key HAVING sum(nr.capacity) > respool._max_amount()
     ORDER BY nr.key LIMIT 1;
    IF FOUND THEN
        PERFORM respool._fail('RP409', 'capacity', format(
            '%s: the nodes of pool %s would give it %s units, more than the largest capacity %s',
            v.key, (SELECT name FROM respool.pools WHERE id = p_pool_id), v.total, respool._max_amount()));
    END IF;
    -- The pool place is the sum of its node places (respool._node_places) over every key a node
    -- lists; a key some node leaves unbounded (the key rule: a soft key it does not list) is
    -- unbounded on the pool too.
    v_keys := respool._place_keys(p_pool_id, 'node');
    WITH s AS (SELECT p.key, sum(p.capacity)::bigint AS total
                 FROM respool._node_places(p_pool_id, v_keys) p
                GROUP BY p.key HAVING bool_and(p.capacity IS NOT NULL)),
    gone AS (UPDATE respool.pool_resources pr SET capacity = NULL
              WHERE pr.pool_id = p_pool_id AND pr.capacity IS NOT NULL
                AND NOT EXISTS (SELECT FROM s WHERE s.key = pr.key)
                AND NOT respool._is_rate_key(p_pool_id, pr.key))  -- (the pool's own: docs/rates.md)
    INSERT INTO respool.pool_resources (pool_id, key, capacity)
    SELECT p_pool_id, s.key, s.total FROM s
    ON CONFLICT (pool_id, key) DO UPDATE SET capacity = excluded.capacity
     WHERE respool.pool_resources.capacity IS DISTINCT FROM excluded.capacity;
    DELETE FROM respool.pool_resources WHERE pool_id = p_pool_id AND capacity IS NULL AND used = 0;
END $$;
COMMENT ON FUNCTION respool._derive_pool_capacity(uuid) IS
    'Sets a pool''s capacity from its nodes (its rate keys apart: no node tracks them): per key, the sum over its nodes in any state (a soft key only when every node lists it: a node that does not leaves it unbounded); a key no node provides any more loses its capacity (its used counter stays while holders remain). RP409 when a sum would pass respool._max_amount(). The caller holds the pool lock.';

CREATE OR REPLACE FUNCTION respool._node_evict(p_request_id uuid, p_reason text, p_message text, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
    m uuid;
    n integer := 1;
BEGIN
    -- The caller holds the pool lock; only a heartbeat can hold this row, briefly: wait for it.
    SELECT * INTO r FROM respool.requests WHERE id = p_request_id FOR UPDATE;
    IF NOT FOUND OR r.status NOT IN ('allocated', 'preempting') THEN
        RETURN 0;
    END IF;
    -- At once, whatever the pool's grace and whether it is preemptible: its units are gone.
    PERFORM respool._unplace(p_request_id);
    PERFORM respool._after_preemption(p_request_id, p_reason, p_message, p_now);
    IF r.gang_id IS NULL THEN
        RETURN n;
    END IF;
    IF r.preemptible THEN
        RETURN n + respool._gang_follow(p_request_id, 'preempted', p_reason, 'preempted; ' || p_message, p_now);
    END IF;
    -- A non-preemptible gang cannot go through respool._preempt_member: its other holding members
    -- give their units back at once too (docs/scheduling.md, gangs: all or none).
    FOR m IN SELECT id FROM respool.requests
              WHERE gang_id = r.gang_id AND id <> p_request_id AND status IN ('allocated', 'preempting')
              ORDER BY id FOR UPDATE LOOP
        PERFORM respool._unplace(m);
        PERFORM respool._after_preemption(m, p_reason,
                                          format('gang %s: member %s was preempted; %s', r.gang_id, p_request_id, p_message),
                                          p_now);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;
COMMENT ON FUNCTION respool._node_evict(uuid, text, text, timestamptz) IS
    'Preempts one holder of a node at once, without grace and preemptible or not (its node or device is going): gives its units back, marks it preempted (requeued while retries are left) with p_reason, and its gang follows. Returns how many requests were preempted (0 when it no longer holds units). The caller holds the pool lock.';

CREATE OR REPLACE FUNCTION respool._node_evict_all(p_node_id uuid, p_reason text, p_message text, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid;
    n integer := 0;
BEGIN
    FOR v_id IN SELECT request_id FROM respool.placements WHERE node_id = p_node_id ORDER BY request_id LOOP
        n := n + respool._node_evict(v_id, p_reason, p_message, p_now);
    END LOOP;
    RETURN n;
END $$;
COMMENT ON FUNCTION respool._node_evict_all(uuid, text, text, timestamptz) IS
    'Preempts every holder placed on a node at once (respool._node_evict); returns how many requests were preempted.';

CREATE OR REPLACE FUNCTION respool._node_holders(p_node_id uuid)
RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT count(*)::integer FROM respool.placements WHERE node_id = p_node_id
$$;
COMMENT ON FUNCTION respool._node_holders(uuid) IS 'How many allocations are placed on a node.';

CREATE OR REPLACE FUNCTION respool._check_node_join(p_pool_id uuid, p_node_name text)
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_pool text := (SELECT name FROM respool.pools WHERE id = p_pool_id);
    v_held bigint;
    v_reserving text;
BEGIN
    IF EXISTS (SELECT FROM respool.nodes WHERE pool_id = p_pool_id) THEN
        RETURN;
    END IF;
    -- (a rate key's capacity is its amount per window, the pool's own: docs/rates.md)
    IF EXISTS (SELECT FROM respool.pool_resources pr WHERE pr.pool_id = p_pool_id AND pr.capacity IS NOT NULL
                  AND NOT respool._is_rate_key(p_pool_id, pr.key)) THEN
        -- Reserved shares need the capacity: they have to go first, and the message says so.
        SELECT string_agg(format('%s reserves %s', x.subject, x.units), ', ' ORDER BY x.subject) INTO v_reserving
          FROM (SELECT p.subject, string_agg(format('%s %s', pr.key, pr.configured), ', ' ORDER BY pr.key) AS units
                  FROM respool.policies p JOIN respool.policy_resources pr ON pr.policy_id = p.id
                 WHERE p.pool_id = p_pool_id AND pr.configured > 0
                 GROUP BY p.subject) x;
        PERFORM respool._fail('RP409', 'pool', format(
            'pool %s has a capacity set by hand (%s); a pool backed by nodes takes its capacity from them: '
            'remove the pool''s capacity first (set each key to 0) or use a pool created without capacity',
            v_pool, (SELECT string_agg(format('%s: %s', key, capacity), ', ' ORDER BY key)
                       FROM respool.pool_resources WHERE pool_id = p_pool_id AND capacity IS NOT NULL
                        AND NOT respool._is_rate_key(p_pool_id, key)))
            || CASE WHEN v_reserving IS NULL THEN '' ELSE format(
            '; its policies reserve units (%s): detach or shrink the policy first (respool pool detach-policy %s '
            'SUBJECT, or attach-policy with its reserved keys at 0), then set the capacity to 0, add the nodes '
            'and reserve again', v_reserving, v_pool) END);
    END IF;
    SELECT count(*) INTO v_held FROM respool.requests
     WHERE pool_id = p_pool_id AND status IN ('allocated', 'preempting');
    IF v_held > 0 THEN
        PERFORM respool._fail('RP409', 'pool', format(
            'pool %s has %s allocations that are on no node; node %s can join it once they have ended',
            v_pool, v_held, p_node_name));
    END IF;
END $$;
COMMENT ON FUNCTION respool._check_node_join(uuid, text) IS
    'Before the first node joins a pool: RP409 (naming the fix) while the pool has a capacity set by hand (rate keys apart) (naming the policies whose reserved shares must be detached or shrunk first) or allocations placed on no node.';

CREATE OR REPLACE FUNCTION respool._settle_node_pools(p_pool_ids uuid[], p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid;
BEGIN
    FOR v_id IN SELECT DISTINCT x FROM unnest(p_pool_ids) x WHERE x IS NOT NULL ORDER BY x LOOP
        PERFORM respool._derive_pool_capacity(v_id);
        PERFORM respool._check_reserved_fits(v_id, p_now);
    END LOOP;
    FOR v_id IN SELECT DISTINCT x FROM unnest(p_pool_ids) x WHERE x IS NOT NULL ORDER BY x LOOP
        UPDATE respool.pools SET updated_at = p_now WHERE id = v_id;
        -- An earmark on a node that left, shrank or changed goes now (docs/placement.md)
        PERFORM respool._drop_stale_earmarks(v_id, p_now);
        PERFORM respool._settle_pool(v_id, NULL, p_now);
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._settle_node_pools(uuid[], timestamptz) IS
    'After a node joined, left or changed (pools locked): derives each pool''s capacity from its nodes, RP409 naming the policies when reserved shares no longer fit, drops the earmarks the change made stale (respool._drop_stale_earmarks: a node gone, moved, shrunk below the need), then settles each pool (rejects queued requests that can never fit, grants what fits now, wakes the reconcilers).';

CREATE OR REPLACE FUNCTION respool._lock_node(p_name text, p_also_pool uuid, OUT node respool.nodes)
LANGUAGE plpgsql AS $$
DECLARE
    v_locked uuid[] := '{}';
BEGIN
    -- Pools first (id order), then the node row; a node moved meanwhile means one more pool to lock.
    LOOP
        SELECT * INTO node FROM respool.nodes WHERE name = p_name;
        IF NOT FOUND THEN
            PERFORM respool._fail('RP404', 'name', format('node %L not found', p_name));
        END IF;
        IF node.pool_id IS NOT NULL AND node.pool_id <> ALL (v_locked)
           OR p_also_pool IS NOT NULL AND p_also_pool <> ALL (v_locked) THEN
            v_locked := array(SELECT DISTINCT x FROM unnest(v_locked || node.pool_id || p_also_pool) x WHERE x IS NOT NULL);
            PERFORM respool._lock_pools(v_locked);
        END IF;
        SELECT * INTO node FROM respool.nodes WHERE name = p_name FOR UPDATE;
        IF NOT FOUND THEN
            PERFORM respool._fail('RP404', 'name', format('node %L not found', p_name));
        END IF;
        EXIT WHEN node.pool_id IS NULL OR node.pool_id = ANY (v_locked);
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._lock_node(text, uuid) IS
    'Locks a node by name after the pool rows it is in and p_also_pool (where it goes), in id order; RP404 when there is no such node.';

-- --- changes -------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION respool._node_drop_extras(p_node_id uuid)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    pl record;
BEGIN
    -- The memory and share charged for whole shared devices (placements.extra) leave the pool's
    -- and the node's counters; respool._node_charge_extras charges them again from the node as
    -- it is then.
    FOR pl IN SELECT p.request_id, p.extra, r.pool_id FROM respool.placements p JOIN respool.requests r ON r.id = p.request_id
               WHERE p.node_id = p_node_id AND p.extra <> '{}' ORDER BY p.request_id LOOP
        PERFORM respool._move_pool_units(pl.pool_id, pl.extra, -1);
        UPDATE respool.node_resources nr SET used = nr.used - x.value::bigint
          FROM jsonb_each_text(pl.extra) x WHERE nr.node_id = p_node_id AND nr.key = x.key;
        UPDATE respool.placements SET resources = resources - array(SELECT jsonb_object_keys(pl.extra)), extra = '{}'
         WHERE request_id = pl.request_id;
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._node_drop_extras(uuid) IS
    'Before a node''s resources are rewritten: takes the memory and share charged for whole shared devices (placements.extra) off the pool''s and the node''s counters and out of the placements. respool._node_charge_extras charges them again.';

CREATE OR REPLACE FUNCTION respool._node_charge_extras(p_node_id uuid)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    pl record;
    v_extra jsonb;
BEGIN
    FOR pl IN SELECT p.request_id, r.pool_id,
                     (SELECT jsonb_object_agg(d.key, d.n) FROM (
                          SELECT nd.key, count(*) AS n FROM respool.node_devices nd
                           WHERE nd.node_id = p_node_id AND nd.holder_id = p.request_id GROUP BY nd.key) d) AS held
                FROM respool.placements p JOIN respool.requests r ON r.id = p.request_id
               WHERE p.node_id = p_node_id AND p.extra = '{}' ORDER BY p.request_id LOOP
        v_extra := respool._whole_device_extra(p_node_id, coalesce(pl.held, '{}'));
        CONTINUE WHEN v_extra = '{}';
        PERFORM respool._move_pool_units(pl.pool_id, v_extra, 1, false);
        UPDATE respool.node_resources nr SET used = nr.used + x.value::bigint
          FROM jsonb_each_text(v_extra) x WHERE nr.node_id = p_node_id AND nr.key = x.key;
        UPDATE respool.placements SET resources = resources || v_extra, extra = v_extra WHERE request_id = pl.request_id;
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._node_charge_extras(uuid) IS
    'Charges each whole holder of a shared device of a node that has no such charge yet its devices'' memory and share (respool._whole_device_extra) on the pool''s and the node''s counters and in its placement (extra). After respool._node_drop_extras and a rewrite, the counters are exact again.';

CREATE OR REPLACE FUNCTION respool._write_node_resources(p_node respool.nodes, p_capacity jsonb, p_devices jsonb,
                                                         p_device_changes jsonb, p_now timestamptz,
                                                         p_sharing jsonb DEFAULT '{}')
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    k text;
    v_holders jsonb;
    v_slices jsonb;
    v_id uuid;
    v_need bigint;
    v_free text[];
    v_new_keys text[];
    v_derived jsonb := respool._node_derived(p_devices, p_sharing);
    v_from jsonb;
BEGIN
    -- Shared keys (docs/placement.md, "Sharing a GPU"): their slice counters are keys of the node
    -- like the others, derived from the devices' offers. The memory and share charged for whole
    -- shared devices are taken off first and charged again once the node is written.
    PERFORM respool._node_drop_extras(p_node.id);
    p_capacity := p_capacity || v_derived;
    v_from := (SELECT coalesce(jsonb_object_agg(s.key || x.suffix, s.key), '{}')
                 FROM jsonb_object_keys(coalesce(p_sharing -> 'sharing', '{}')) s(key)
                CROSS JOIN (VALUES ('_memory_mb'), ('_share')) x(suffix));
    -- Keys that go (their devices go with them: ON DELETE CASCADE). Their holders were preempted
    -- already (hard keys) or the key is a soft one: its units are no longer charged on the node.
    UPDATE respool.placements
       SET resources = resources - array(SELECT nr.key FROM respool.node_resources nr
                                          WHERE nr.node_id = p_node.id AND NOT p_capacity ? nr.key)
     WHERE node_id = p_node.id;
    DELETE FROM respool.node_resources WHERE node_id = p_node.id AND NOT p_capacity ? key;
    v_new_keys := array(SELECT c.key FROM jsonb_object_keys(p_capacity) c(key)
                         WHERE NOT EXISTS (SELECT FROM respool.node_resources nr
                                            WHERE nr.node_id = p_node.id AND nr.key = c.key));
    -- Keys that stay or come: capacity and the count of named devices in one statement (CHECK).
    INSERT INTO respool.node_resources (node_id, key, capacity, devices, sharing, device_memory_mb,
                                        reserved_memory_mb, derived_from)
    SELECT p_node.id, c.key, c.value::bigint, coalesce(jsonb_array_length(p_devices -> c.key), 0),
           p_sharing -> 'sharing' ->> c.key, (p_sharing -> 'device_memory_mb' ->> c.key)::bigint,
           coalesce((p_sharing -> 'reserved_memory_mb' ->> c.key)::bigint, 0), v_from ->> c.key
      FROM jsonb_each_text(p_capacity) c
    ON CONFLICT (node_id, key) DO UPDATE
       SET capacity = excluded.capacity, devices = excluded.devices, sharing = excluded.sharing,
           device_memory_mb = excluded.device_memory_mb, reserved_memory_mb = excluded.reserved_memory_mb,
           derived_from = excluded.derived_from;
    -- A key the node starts tracking charges what its holders already hold of it.
    FOR k IN SELECT c.key FROM unnest(v_new_keys) c(key)
              WHERE EXISTS (SELECT FROM respool.placements pl JOIN respool.requests r ON r.id = pl.request_id
                             WHERE pl.node_id = p_node.id AND NOT pl.resources ? c.key AND r.resources ? c.key) LOOP
        UPDATE respool.placements pl SET resources = pl.resources || jsonb_build_object(k, (r.resources ->> k)::bigint)
          FROM respool.requests r
         WHERE r.id = pl.request_id AND pl.node_id = p_node.id AND r.resources ? k AND NOT pl.resources ? k;
        UPDATE respool.node_resources SET used = used + (
                   SELECT coalesce(sum((pl.resources ->> k)::bigint), 0) FROM respool.placements pl
                    WHERE pl.node_id = p_node.id AND pl.resources ? k)
         WHERE node_id = p_node.id AND key = k;
    END LOOP;
    -- Device lists: kept devices keep their holder, positions follow the new list order.
    DELETE FROM respool.node_devices d WHERE d.node_id = p_node.id AND NOT p_devices ? d.key;
    FOR k IN SELECT key FROM jsonb_object_keys(p_device_changes) key WHERE p_devices ? key LOOP
        SELECT coalesce(jsonb_object_agg(device, holder_id) FILTER (WHERE holder_id IS NOT NULL), '{}'),
               coalesce(jsonb_object_agg(device, jsonb_build_array(memory_used, share_used))
                            FILTER (WHERE memory_used > 0 OR share_used > 0), '{}')
          INTO v_holders, v_slices
          FROM respool.node_devices WHERE node_id = p_node.id AND key = k;
        DELETE FROM respool.node_devices WHERE node_id = p_node.id AND key = k;
        -- (a kept device keeps its holder and its slices' counters; its offer is set below)
        INSERT INTO respool.node_devices (node_id, key, device, position, holder_id, memory_mb, memory_used, share_used)
        SELECT p_node.id, k, d.id, d.n - 1, (v_holders ->> d.id)::uuid,
               CASE WHEN p_sharing -> 'sharing' ? k
                    THEN (p_sharing -> 'device_memory_mb' ->> k)::bigint
                         - coalesce((p_sharing -> 'reserved_memory_mb' ->> k)::bigint, 0) END,
               coalesce((v_slices -> d.id ->> 0)::bigint, 0), coalesce((v_slices -> d.id ->> 1)::integer, 0)
          FROM jsonb_array_elements_text(p_devices -> k) WITH ORDINALITY d(id, n);
        -- Holders of units that had no device ids (anonymous until now) take the first free ones.
        -- With as many ids as units held, all of them do; with fewer (the node was over its
        -- capacity, a shrink not enforced yet), those the victim order takes last go first:
        -- non-preemptible, then allocated before leaving victims, highest priority, earliest.
        FOR v_id, v_need IN
            SELECT pl.request_id, (pl.resources ->> k)::bigint
                   - (SELECT count(*) FROM respool.node_devices h
                       WHERE h.node_id = p_node.id AND h.key = k AND h.holder_id = pl.request_id)
              FROM respool.placements pl JOIN respool.requests r ON r.id = pl.request_id
             WHERE pl.node_id = p_node.id AND coalesce((pl.resources ->> k)::bigint, 0) > 0
             ORDER BY r.preemptible, r.status = 'preempting', r.priority DESC, r.allocated_at, pl.request_id LOOP
            CONTINUE WHEN v_need <= 0;
            v_free := array(SELECT device FROM respool.node_devices
                             WHERE node_id = p_node.id AND key = k AND holder_id IS NULL
                             ORDER BY position LIMIT v_need);
            IF cardinality(v_free) < v_need THEN
                PERFORM respool._node_evict(v_id, 'capacity_shrink', format(
                    'node %s: too few free %s devices for its units once the devices were named', p_node.name, k), p_now);
            ELSE
                UPDATE respool.node_devices SET holder_id = v_id
                 WHERE node_id = p_node.id AND key = k AND device = ANY (v_free);
            END IF;
        END LOOP;
    END LOOP;
    -- Each device's offer: its key's memory less what it keeps back, while the key is shared
    -- (the slices that no longer fit were preempted first: respool._node_preempt_removed).
    UPDATE respool.node_devices d
       SET memory_mb = CASE WHEN nr.sharing IS NOT NULL THEN nr.device_memory_mb - nr.reserved_memory_mb END
      FROM respool.node_resources nr
     WHERE d.node_id = p_node.id AND nr.node_id = d.node_id AND nr.key = d.key
       AND d.memory_mb IS DISTINCT FROM CASE WHEN nr.sharing IS NOT NULL THEN nr.device_memory_mb - nr.reserved_memory_mb END;
    PERFORM respool._node_charge_extras(p_node.id);
END $$;
COMMENT ON FUNCTION respool._write_node_resources(respool.nodes, jsonb, jsonb, jsonb, timestamptz, jsonb) IS
    'Writes a node''s capacity, device lists (p_device_changes: keys whose list was given) and sharing fields (p_sharing; the derived slice counters with them): removed keys go, a key it starts tracking charges its holders'' units, kept devices keep their holder, slices and positions; holders of units on newly named keys take free ids (preempted when too few); shared devices get their offer, whole shared holders are charged again (respool._node_charge_extras). The caller preempted what no longer fits.';

CREATE OR REPLACE FUNCTION respool._node_preempt_removed(p_node respool.nodes, p_capacity jsonb, p_devices jsonb,
                                                         p_now timestamptz, p_sharing jsonb DEFAULT '{}')
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v record;
    w record;
    n integer := 0;
    v_offer bigint;
BEGIN
    -- Slices (docs/placement.md, "Sharing a GPU"): of a device that goes, or of a key no longer
    -- shared, at once; on a device whose offer shrinks below its slices, in victim order (lowest
    -- priority, then most recently allocated) until the rest fit the new offer.
    FOR v IN SELECT ds.request_id, min(format('%s %s', ds.key, ds.device)) AS what,
                    bool_or(NOT coalesce(p_sharing -> 'sharing', '{}') ? ds.key) AS unshared
               FROM respool.device_slices ds
              WHERE ds.node_id = p_node.id
                AND (NOT coalesce(p_devices -> ds.key, '[]') ? ds.device OR NOT coalesce(p_sharing -> 'sharing', '{}') ? ds.key)
              GROUP BY ds.request_id ORDER BY ds.request_id LOOP
        n := n + respool._node_evict(v.request_id, 'capacity_shrink',
                                     format('node %s: device %s %s', p_node.name, v.what,
                                            CASE WHEN v.unshared THEN 'is no longer shared' ELSE 'was removed' END), p_now);
    END LOOP;
    FOR v IN SELECT d.key, d.device, d.memory_used, d.share_used FROM respool.node_devices d
              WHERE d.node_id = p_node.id AND d.memory_used > 0 ORDER BY d.key, d.position LOOP
        v_offer := (p_sharing -> 'device_memory_mb' ->> v.key)::bigint
                   - coalesce((p_sharing -> 'reserved_memory_mb' ->> v.key)::bigint, 0);
        -- (the slices fit the new offer: the capacity model's comparison, respool._fits_room)
        CONTINUE WHEN v_offer IS NULL OR respool._fits_room(v.memory_used, v_offer);
        FOR w IN SELECT ds.request_id
                   FROM respool.device_slices ds JOIN respool.requests r ON r.id = ds.request_id
                  WHERE ds.node_id = p_node.id AND ds.key = v.key AND ds.device = v.device
                  ORDER BY r.preemptible DESC, r.priority, r.allocated_at DESC, r.id DESC LOOP
            EXIT WHEN respool._fits_room((SELECT memory_used FROM respool.node_devices
                                          WHERE node_id = p_node.id AND key = v.key AND device = v.device), v_offer);
            n := n + respool._node_evict(w.request_id, 'capacity_shrink',
                                         format('node %s: the memory of device %s %s shrank to %s MiB', p_node.name,
                                                v.key, v.device, v_offer), p_now);
        END LOOP;
    END LOOP;
    -- Holders of a device id that goes: always, at once (docs/placement.md, "Node changes").
    -- A key whose list goes while the key stays (devices null: anonymous units, its capacity
    -- kept or set) loses no unit: its holders keep their units, which are anonymous now (a
    -- capacity below their usage is a shrink, left to the reconciler).
    FOR v IN SELECT d.holder_id, min(format('%s %s', d.key, d.device)) AS what
               FROM respool.node_devices d
              WHERE d.node_id = p_node.id AND d.holder_id IS NOT NULL
                AND (p_devices ? d.key OR NOT p_capacity ? d.key)
                AND NOT coalesce(p_devices -> d.key, '[]') ? d.device
              GROUP BY d.holder_id ORDER BY d.holder_id LOOP
        n := n + respool._node_evict(v.holder_id, 'capacity_shrink',
                                     format('node %s: device %s was removed', p_node.name, v.what), p_now);
    END LOOP;
    -- Holders of a key the node no longer provides that is not soft: the key rule
    -- (respool._effective_capacity) gives it capacity 0 on that node.
    FOR v IN SELECT pl.request_id, min(nr.key) AS key
               FROM respool.placements pl JOIN respool.node_resources nr ON nr.node_id = pl.node_id
              WHERE pl.node_id = p_node.id AND NOT p_capacity ? nr.key AND respool._effective_capacity(nr.key, NULL) = 0
                AND coalesce((pl.resources ->> nr.key)::bigint, 0) > 0
              GROUP BY pl.request_id ORDER BY pl.request_id LOOP
        n := n + respool._node_evict(v.request_id, 'capacity_shrink',
                                     format('node %s no longer provides %s', p_node.name, v.key), p_now);
    END LOOP;
    RETURN n;
END $$;
COMMENT ON FUNCTION respool._node_preempt_removed(respool.nodes, jsonb, jsonb, timestamptz, jsonb) IS
    'Before a node''s new capacity, devices and sharing fields (p_sharing) are written: preempts at once (reason capacity_shrink) the slices of a device that goes or of a key no longer shared, slices of a device whose offer shrinks below them (victim order, until the rest fit), the holders of every device id that goes from a list (or with its key) and of every non-soft key the node stops providing. A key whose devices become anonymous (list null, key kept) preempts nobody: no unit went away. A shrink of anonymous units is left to the reconciler (minimal victim set on that node).';

CREATE OR REPLACE FUNCTION respool.create_node(p_body jsonb, p_now timestamptz DEFAULT now())
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_name text;
    v_labels jsonb;
    v_target record;
    v_state text;
    v_pool_id uuid;
    v_node respool.nodes;
    v_capacity jsonb;
    v_zero text;
    v_share record;
BEGIN
    PERFORM respool._body_fields(p_body, ARRAY['name', 'pool', 'labels', 'capacity', 'devices', 'state', 'sharing',
                                               'device_memory_mb', 'reserved_memory_mb'], 'node');
    v_name := p_body ->> 'name';
    IF jsonb_typeof(p_body -> 'name') IS DISTINCT FROM 'string' OR v_name !~ respool._pool_name_pattern() THEN
        PERFORM respool._fail('RP400', 'name', 'name must match ' || respool._pool_name_pattern());
    END IF;
    v_labels := respool._node_labels(p_body -> 'labels', false);
    -- A new node lists the keys it has, each with a positive amount (on update 0 removes a key).
    v_capacity := respool._resource_map(p_body -> 'capacity', 'capacity', true);
    v_zero := (SELECT min(key) FROM jsonb_each_text(v_capacity) WHERE value::bigint = 0);
    IF v_zero IS NOT NULL THEN
        PERFORM respool._fail('RP400', 'capacity.' || v_zero, format(
            'capacity.%s must be a positive amount: leave out a key the node does not have', v_zero));
    END IF;
    SELECT * INTO v_target FROM respool._node_target('{}', '{}', v_capacity,
                                                     respool._node_devices(p_body -> 'devices', false));
    SELECT * INTO v_share FROM respool._node_sharing_target('{}', respool._node_sharing_body(p_body, false),
                                                            v_target.devices, v_capacity);
    v_state := CASE WHEN p_body ? 'state' THEN respool._node_state(p_body -> 'state') ELSE 'active' END;
    v_pool_id := respool._node_pool_ref(p_body -> 'pool');
    PERFORM respool._lock_pools(ARRAY[v_pool_id]);
    IF v_pool_id IS NOT NULL THEN
        PERFORM respool._check_node_join(v_pool_id, v_name);
        PERFORM respool._check_node_rate_keys(v_pool_id, v_capacity, p_body -> 'devices');
    END IF;
    BEGIN
        INSERT INTO respool.nodes (name, pool_id, labels, state, created_at, updated_at)
        VALUES (v_name, v_pool_id, v_labels, v_state, p_now, p_now)
        RETURNING * INTO v_node;
    EXCEPTION WHEN unique_violation THEN
        PERFORM respool._fail('RP409', 'name', format('node %s already exists', v_name));
    END;
    PERFORM respool._write_node_resources(v_node, v_target.capacity, v_target.devices, v_target.devices, p_now,
                                          v_share.sharing);
    PERFORM respool._settle_node_pools(ARRAY[v_pool_id], p_now);
    RETURN respool.node_json(v_node.id);
END $$;
COMMENT ON FUNCTION respool.create_node(jsonb, timestamptz) IS
    'Registers a node from a NodeCreate body (name, pool, labels, capacity, devices, state): RP400 naming the field on bad input (a capacity of 0: capacity.<key>), RP409 on a taken name, on a pool with a capacity set by hand, or when the pool''s reserved shares would not fit. In a pool, the pool''s capacity becomes the sum over its nodes and its queue settles (grants what now fits).';

CREATE OR REPLACE FUNCTION respool.update_node(p_name text, p_body jsonb, p_force boolean DEFAULT false,
                                               p_now timestamptz DEFAULT now())
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_labels jsonb;
    v_capacity jsonb;
    v_devices jsonb;
    v_state text;
    v_moves boolean;
    v_pool_id uuid;
    v_old_pool_id uuid;
    v_node respool.nodes;
    v_target record;
    v_held integer;
    v_reason text := 'node_removed';
    v_share_body jsonb;
    v_share record;
    k text;
    v jsonb;
BEGIN
    PERFORM respool._body_fields(p_body, ARRAY['pool', 'labels', 'capacity', 'devices', 'state', 'sharing',
                                               'device_memory_mb', 'reserved_memory_mb'], 'node update');
    v_share_body := respool._node_sharing_body(p_body, true);
    v_labels := respool._node_labels(p_body -> 'labels', true);
    v_capacity := respool._resource_map(p_body -> 'capacity', 'capacity', true);
    v_devices := respool._node_devices(p_body -> 'devices', true);
    IF p_body ? 'state' THEN
        v_state := respool._node_state(p_body -> 'state');
    END IF;
    v_moves := p_body ? 'pool';
    IF v_moves THEN
        v_pool_id := respool._node_pool_ref(p_body -> 'pool');
    END IF;
    v_node := respool._lock_node(p_name, v_pool_id);
    v_old_pool_id := v_node.pool_id;
    v_moves := v_moves AND v_pool_id IS DISTINCT FROM v_node.pool_id;
    IF NOT v_moves THEN
        v_pool_id := v_node.pool_id;
    END IF;
    SELECT * INTO v_target FROM respool._node_target(
        (SELECT coalesce(jsonb_object_agg(key, capacity), '{}') FROM respool.node_resources
          WHERE node_id = v_node.id AND derived_from IS NULL),
        (SELECT coalesce(jsonb_object_agg(key, ids), '{}')
           FROM (SELECT key, jsonb_agg(device ORDER BY position) AS ids FROM respool.node_devices
                  WHERE node_id = v_node.id GROUP BY key) d),
        v_capacity, v_devices);
    SELECT * INTO v_share FROM respool._node_sharing_target(respool._node_sharing_now(v_node.id), v_share_body,
                                                            v_target.devices, v_capacity);
    FOR k, v IN SELECT * FROM jsonb_each(v_labels) LOOP
        v_node.labels := CASE WHEN jsonb_typeof(v) = 'null' THEN v_node.labels - k
                              ELSE v_node.labels || jsonb_build_object(k, v) END;
    END LOOP;
    IF (SELECT count(*) FROM jsonb_object_keys(v_node.labels)) > respool._max_keys() THEN
        PERFORM respool._fail('RP400', 'labels', format('labels would have more than %s keys', respool._max_keys()));
    END IF;
    IF v_pool_id IS NOT NULL THEN
        PERFORM respool._check_node_rate_keys(v_pool_id, CASE WHEN v_moves THEN v_target.capacity ELSE v_capacity END,
                                              CASE WHEN v_moves THEN v_target.devices ELSE v_devices END);
    END IF;
    IF v_moves THEN
        -- Leaving its pool: refused while it holds allocations, unless forced (then preempted at once).
        IF v_node.pool_id IS NOT NULL THEN
            v_held := respool._node_holders(v_node.id);
            IF v_held > 0 AND NOT coalesce(p_force, false) THEN
                PERFORM respool._fail('RP409', 'force', format(
                    'node %s holds %s allocations in pool %s; move it with force to preempt them',
                    v_node.name, v_held, (SELECT name FROM respool.pools WHERE id = v_node.pool_id)));
            END IF;
            PERFORM respool._node_evict_all(v_node.id, v_reason, format(
                'node %s was moved out of pool %s', v_node.name,
                (SELECT name FROM respool.pools WHERE id = v_node.pool_id)), p_now);
        END IF;
        IF v_pool_id IS NOT NULL THEN
            PERFORM respool._check_node_join(v_pool_id, v_node.name);
        END IF;
    ELSE
        PERFORM respool._node_preempt_removed(v_node,
                                              v_target.capacity || respool._node_derived(v_target.devices, v_share.sharing),
                                              v_target.devices, p_now, v_share.sharing);
    END IF;
    UPDATE respool.nodes
       SET pool_id = v_pool_id, labels = v_node.labels, state = coalesce(v_state, state), updated_at = p_now
     WHERE id = v_node.id
    RETURNING * INTO v_node;
    PERFORM respool._write_node_resources(v_node, v_target.capacity, v_target.devices, v_devices, p_now, v_share.sharing);
    PERFORM respool._settle_node_pools(ARRAY[v_old_pool_id, v_pool_id], p_now);
    RETURN respool.node_json(v_node.id);
END $$;
COMMENT ON FUNCTION respool.update_node(text, jsonb, boolean, timestamptz) IS
    'Updates a node from a NodeUpdate body: labels merge (null removes one), capacity merges (0 removes a key), a device list replaces the key''s list (null: anonymous units), pool moves it (null: out of any pool), state. Moving it out of its pool is RP409 while it holds allocations unless p_force, which preempts them at once (reason node_removed); holders of removed device ids or keys are preempted at once (capacity_shrink); a shrink of anonymous units is left to the reconciler. The pools concerned get their derived capacity, RP409 when reserved shares no longer fit, and settle.';

CREATE OR REPLACE FUNCTION respool.delete_node(p_name text, p_force boolean DEFAULT false,
                                               p_now timestamptz DEFAULT now())
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_node respool.nodes := respool._lock_node(p_name, NULL);
    v_held integer := respool._node_holders(v_node.id);
    v_pool text := (SELECT name FROM respool.pools WHERE id = v_node.pool_id);
    v_reason text := 'node_removed';
BEGIN
    IF v_held > 0 AND NOT coalesce(p_force, false) THEN
        PERFORM respool._fail('RP409', 'force', format(
            'node %s holds %s allocations in pool %s; delete with force to preempt them', v_node.name, v_held, v_pool));
    END IF;
    PERFORM respool._node_evict_all(v_node.id, v_reason,
                                    format('node %s was removed from pool %s', v_node.name, v_pool), p_now);
    DELETE FROM respool.nodes WHERE id = v_node.id;
    PERFORM respool._settle_node_pools(ARRAY[v_node.pool_id], p_now);
END $$;
COMMENT ON FUNCTION respool.delete_node(text, boolean, timestamptz) IS
    'Deletes a node: RP409 while it holds allocations unless p_force, which preempts them at once (reason node_removed); its pool''s capacity is derived again (RP409 when reserved shares no longer fit) and the pool settles (queued requests that can no longer fit anywhere are rejected).';

CREATE OR REPLACE FUNCTION respool.set_node_state(p_name text, p_state text, p_now timestamptz DEFAULT now())
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_state text := respool._node_state(to_jsonb(p_state));
    v_node respool.nodes := respool._lock_node(p_name, NULL);
BEGIN
    UPDATE respool.nodes SET state = v_state, updated_at = p_now WHERE id = v_node.id;
    IF v_node.pool_id IS NOT NULL AND v_state IS DISTINCT FROM v_node.state THEN
        -- active: grants what now fits; draining: wakes the reconcilers, which preempt the node's
        -- preemptible holders (docs/placement.md, "Cordon and drain"). An earmark on a node that
        -- is no longer active goes: its request reclaims on another node.
        PERFORM respool._drop_stale_earmarks(v_node.pool_id, p_now);
        PERFORM respool._settle_pool(v_node.pool_id, NULL, p_now);
    END IF;
    RETURN respool.node_json(v_node.id);
END $$;
COMMENT ON FUNCTION respool.set_node_state(text, text, timestamptz) IS
    'cordon (cordoned: no new grants, holders keep their units), drain (draining: the reconciler preempts its preemptible holders) or uncordon (active: grants what now fits); an earmark on a node that stops being active is dropped in the same transaction (respool._drop_stale_earmarks). RP400 on another state, RP404 on an unknown node.';
