-- Pools: CRUD with their validations (docs/api.md), and what every pool or policy change does
-- after it: revalidate the pool's queue, drop requests on a forced delete, grant what fits.
-- Every change locks the pool row first.

CREATE OR REPLACE FUNCTION respool.pool_json(p_id uuid)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', p.id, 'name', p.name, 'description', p.description, 'queueing', p.queueing,
        'preemption_grace_seconds', p.preemption_grace_seconds,
        'starvation_seconds', p.starvation_seconds, 'ordering', p.ordering, 'placement', p.placement,
        'slice_overuse', p.slice_overuse,
        'nodes', (SELECT count(*) FROM respool.nodes WHERE pool_id = p.id),
        -- rate keys (docs/rates.md) under rates; their usage is the sum of the charges inside the window
        'capacity', coalesce((SELECT jsonb_object_agg(pr.key, pr.capacity) FROM respool.pool_resources pr
                               WHERE pr.pool_id = p.id AND pr.capacity IS NOT NULL
                                 AND NOT EXISTS (SELECT FROM respool.pool_rates r
                                                  WHERE r.pool_id = p.id AND r.key = pr.key)), '{}'),
        'usage', coalesce((SELECT jsonb_object_agg(pr.key, CASE WHEN r.key IS NULL THEN pr.used
                                                                 ELSE respool._rate_used(p.id, pr.key, NULL, now()) END)
                             FROM respool.pool_resources pr
                             LEFT JOIN respool.pool_rates r ON r.pool_id = p.id AND r.key = pr.key
                            WHERE pr.pool_id = p.id AND (pr.capacity IS NOT NULL OR pr.used > 0)), '{}'),
        'rates', respool._rates_json(p.id, now()),
        'queued', (SELECT count(*) FROM respool.queue_entries WHERE pool_id = p.id),
        'created_at', p.created_at, 'updated_at', p.updated_at)
      FROM respool.pools p WHERE p.id = p_id
$$;
COMMENT ON FUNCTION respool.pool_json(uuid) IS 'A pool as the API shows it: settings (queueing, grace, starvation guard, ordering, placement, slice_overuse), capacity (derived from its nodes when it has any; rate keys apart, under rates), usage (allocated per key; a rate key''s: inside its window now), rates, queued count and how many nodes back it.';

CREATE OR REPLACE FUNCTION respool.get_pool(p_ref text)
RETURNS jsonb LANGUAGE sql STABLE AS $$ SELECT respool.pool_json(respool.resolve_pool(p_ref)) $$;
COMMENT ON FUNCTION respool.get_pool(text) IS 'One pool by ref (RP404 / RP400 ambiguous).';

CREATE OR REPLACE FUNCTION respool.list_pools()
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(respool.pool_json(id) ORDER BY name), '[]') FROM respool.pools
$$;
COMMENT ON FUNCTION respool.list_pools() IS 'Every pool, by name.';

CREATE OR REPLACE FUNCTION respool._pool_settings(p_description text, p_queueing text, p_grace integer,
                                                  p_starvation integer DEFAULT NULL, p_ordering text DEFAULT NULL,
                                                  p_placement text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM respool._check_one_of('placement', p_placement, 'pack', 'spread');
    IF p_starvation IS NOT NULL AND p_starvation NOT BETWEEN 0 AND respool._max_seconds() THEN
        PERFORM respool._fail('RP400', 'starvation_seconds',
                              format('starvation_seconds must be between 0 and %s (or null for off)', respool._max_seconds()));
    END IF;
    PERFORM respool._check_one_of('ordering', p_ordering, 'fifo', 'fair');
    IF p_description IS NOT NULL AND length(p_description) > respool._max_description() THEN
        PERFORM respool._fail('RP400', 'description',
                              format('description must be at most %s characters', respool._max_description()));
    END IF;
    PERFORM respool._check_one_of('queueing', p_queueing, 'best_effort', 'strict');
    IF p_grace IS NOT NULL AND p_grace NOT BETWEEN 0 AND respool._max_grace_seconds() THEN
        PERFORM respool._fail('RP400', 'preemption_grace_seconds', 'preemption_grace_seconds must be between 0 and ' || respool._max_grace_seconds());
    END IF;
END $$;
COMMENT ON FUNCTION respool._pool_settings(text, text, integer, integer, text, text) IS 'Validates the scalar pool fields (RP400 naming the field).';

-- respool._check_reserved_fits(pool_id, p_now): sql/functions/053_policy_windows.sql (shares in force
-- over time).

CREATE OR REPLACE FUNCTION respool._revalidate_queue(p_pool_id uuid, p_policy_id uuid, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    e record;
    r respool.requests;
    rejected integer := 0;
BEGIN
    FOR e IN SELECT request_id, policy_id, resources, preemptible, node_selector FROM respool.queue_entries
              WHERE pool_id = p_pool_id AND (p_policy_id IS NULL OR policy_id = p_policy_id) LOOP
        -- Decide on the unlocked row (resources never change; the pool lock holds capacity and
        -- policies still) and lock only what leaves this queue: a locked queued request would be
        -- skipped by a concurrent allocation pass of its other candidate pools.
        SELECT * INTO r FROM respool.requests WHERE id = e.request_id AND status = 'queued';
        CONTINUE WHEN NOT FOUND
                   -- the entry's resources: a gang's entry holds its members' sum (docs/scheduling.md, gangs)
                   OR (respool._rejection(e.resources, e.preemptible, p_pool_id, e.policy_id,
                                          e.node_selector, e.request_id)).reason IS NULL;
        SELECT * INTO r FROM respool.requests WHERE id = e.request_id AND status = 'queued' FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        IF (SELECT count(*) FROM respool.queue_entries WHERE request_id = r.id) = 1 THEN
            PERFORM respool._reject_unfittable(r.id, p_now);
            rejected := rejected + 1;
        ELSE
            DELETE FROM respool.queue_entries WHERE pool_id = p_pool_id AND request_id = r.id;
        END IF;
    END LOOP;
    RETURN rejected;
END $$;
COMMENT ON FUNCTION respool._revalidate_queue(uuid, uuid, timestamptz) IS 'After a capacity, node or policy change: drops the pool from queued requests that can never fit it any more (their node selector included: no_fitting_node) and rejects those left with no candidate.';

CREATE OR REPLACE FUNCTION respool._drop_requests(p_pool_id uuid, p_policy_id uuid, p_reason text, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid;
    dropped integer := 0;
    v_message text := CASE p_reason WHEN 'pool_deleted' THEN 'its pool was deleted'
                                    ELSE 'its subject policy was deleted' END;
BEGIN
    FOR v_id IN SELECT id FROM respool.requests
                 WHERE pool_id = p_pool_id AND status IN ('allocated', 'preempting')
                   AND (p_policy_id IS NULL OR policy_id = p_policy_id)
                 ORDER BY id FOR UPDATE LOOP
        CONTINUE WHEN (SELECT status FROM respool.requests WHERE id = v_id) NOT IN ('allocated', 'preempting');
        PERFORM respool._unplace(v_id);
        PERFORM respool._set_status(v_id, 'cancelled', p_reason, v_message, p_now);
        dropped := dropped + 1 + respool._gang_follow(v_id, 'cancelled', p_reason, 'cancelled', p_now);
    END LOOP;
    FOR v_id IN SELECT request_id FROM respool.queue_entries
                 WHERE pool_id = p_pool_id AND (p_policy_id IS NULL OR policy_id = p_policy_id)
                 ORDER BY request_id LOOP
        PERFORM 1 FROM respool.requests WHERE id = v_id FOR UPDATE;
        IF (SELECT count(*) FROM respool.queue_entries WHERE request_id = v_id) = 1 THEN
            DELETE FROM respool.queue_entries WHERE request_id = v_id;
            PERFORM respool._set_status(v_id, 'cancelled', p_reason, v_message, p_now);
            dropped := dropped + 1 + respool._gang_follow(v_id, 'cancelled', p_reason, 'cancelled', p_now);
        ELSE
            DELETE FROM respool.queue_entries WHERE pool_id = p_pool_id AND request_id = v_id;
        END IF;
    END LOOP;
    RETURN dropped;
END $$;
COMMENT ON FUNCTION respool._drop_requests(uuid, uuid, text, timestamptz) IS 'Force delete: cancels the pool''s (or one policy''s) holding requests and queued requests that have no other candidate pool; others just leave this queue.';

CREATE OR REPLACE FUNCTION respool._clear_for_delete(p_kind text, p_reason text, p_label text,
                                                     p_pool_id uuid, p_policy_id uuid, p_force boolean,
                                                     p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_held bigint;
    v_queued bigint;
BEGIN
    SELECT count(*) INTO v_held FROM respool.requests
     WHERE pool_id = p_pool_id AND (p_policy_id IS NULL OR policy_id = p_policy_id)
       AND status IN ('allocated', 'preempting');
    SELECT count(*) INTO v_queued FROM respool.queue_entries
     WHERE pool_id = p_pool_id AND (p_policy_id IS NULL OR policy_id = p_policy_id);
    IF v_held + v_queued > 0 AND NOT coalesce(p_force, false) THEN
        PERFORM respool._fail('RP409', 'force', format(
            '%s %s has %s allocated and %s queued requests; delete with force to cancel them',
            p_kind, p_label, v_held, v_queued));
    END IF;
    PERFORM respool._drop_requests(p_pool_id, p_policy_id, p_reason, p_now);
END $$;
COMMENT ON FUNCTION respool._clear_for_delete(text, text, text, uuid, uuid, boolean, timestamptz) IS 'Before deleting a pool (p_policy_id NULL) or one policy of it, pool locked: RP409 naming the p_kind and p_label while it has allocated or queued requests, unless p_force, which cancels them with p_reason (pool_deleted, policy_deleted).';

CREATE OR REPLACE FUNCTION respool._settle_pool(p_pool_id uuid, p_policy_id uuid, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM respool._revalidate_queue(p_pool_id, p_policy_id, p_now);
    PERFORM respool.allocate_pool(p_pool_id, p_now);
    PERFORM respool._pool_changed(p_pool_id);
END $$;
COMMENT ON FUNCTION respool._settle_pool(uuid, uuid, timestamptz) IS 'After a pool (p_policy_id NULL) or policy update, pool locked: rejects queued requests that can never fit, grants what fits now, and wakes the reconcilers, which enforce a shrunk capacity or a lowered limit.';

CREATE OR REPLACE FUNCTION respool.create_pool(p_name text, p_capacity jsonb DEFAULT '{}',
                                               p_description text DEFAULT '',
                                               p_queueing text DEFAULT 'best_effort',
                                               p_preemption_grace_seconds integer DEFAULT 0,
                                               p_now timestamptz DEFAULT now(),
                                               p_starvation_seconds integer DEFAULT 300,
                                               p_ordering text DEFAULT 'fifo',
                                               p_placement text DEFAULT 'pack',
                                               p_rates jsonb DEFAULT NULL,
                                               p_slice_overuse text DEFAULT 'report')
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid;
    v_capacity jsonb := respool._resource_map(p_capacity, 'capacity');
BEGIN
    IF p_name IS NULL OR p_name !~ respool._pool_name_pattern() THEN
        PERFORM respool._fail('RP400', 'name', 'name must match ' || respool._pool_name_pattern());
    END IF;
    -- docs/api.md: a name must not shadow an id (a UUID, or an existing pool's id prefix).
    IF p_name ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN
        PERFORM respool._fail('RP400', 'name', format('name %s is a UUID; a pool name must not look like an id', p_name));
    END IF;
    IF p_name ~ '^[0-9a-f-]{4,36}$'
       AND EXISTS (SELECT FROM respool.pools WHERE id::text LIKE p_name || '%') THEN
        PERFORM respool._fail('RP409', 'name', format('name %s is a prefix of an existing pool''s id; it would shadow that id', p_name));
    END IF;
    PERFORM respool._pool_settings(p_description, p_queueing, p_preemption_grace_seconds,
                                   p_starvation_seconds, p_ordering, p_placement);
    PERFORM respool._check_one_of('slice_overuse', p_slice_overuse, 'report', 'terminate');
    BEGIN
        INSERT INTO respool.pools (name, description, queueing, preemption_grace_seconds, starvation_seconds,
                                   ordering, placement, slice_overuse, created_at, updated_at)
        VALUES (p_name, coalesce(p_description, ''), coalesce(p_queueing, 'best_effort'),
                coalesce(p_preemption_grace_seconds, 0), p_starvation_seconds, coalesce(p_ordering, 'fifo'),
                coalesce(p_placement, 'pack'), coalesce(p_slice_overuse, 'report'), p_now, p_now)
        RETURNING id INTO v_id;
    EXCEPTION WHEN unique_violation THEN
        PERFORM respool._fail('RP409', 'name', format('pool %s already exists', p_name));
    END;
    INSERT INTO respool.pool_resources (pool_id, key, capacity)
    SELECT v_id, key, value::bigint FROM jsonb_each_text(v_capacity);
    PERFORM respool._set_rates(v_id, p_rates, v_capacity, p_now);  -- rate keys (039_rates.sql)
    RETURN respool.pool_json(v_id);
END $$;
COMMENT ON FUNCTION respool.create_pool(text, jsonb, text, text, integer, timestamptz, integer, text, text, jsonb, text) IS
    'Creates a pool (RP400 on bad fields or a UUID name, RP409 on a taken name or a name that is an existing pool''s id prefix); zero capacities are dropped; p_starvation_seconds NULL turns the starvation guard off; p_placement (pack, spread) chooses nodes once nodes back it (docs/placement.md); p_rates declares rate keys (respool._set_rates); p_slice_overuse (report, terminate) is what use above a slice of a shared device does (respool._report_usage).';

CREATE OR REPLACE FUNCTION respool.update_pool(p_ref text, p_capacity jsonb DEFAULT NULL,
                                               p_description text DEFAULT NULL,
                                               p_queueing text DEFAULT NULL,
                                               p_preemption_grace_seconds integer DEFAULT NULL,
                                               p_now timestamptz DEFAULT now(),
                                               p_starvation_seconds integer DEFAULT NULL,
                                               p_starvation_off boolean DEFAULT false,
                                               p_ordering text DEFAULT NULL,
                                               p_placement text DEFAULT NULL,
                                               p_rates jsonb DEFAULT NULL,
                                               p_slice_overuse text DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid := respool.resolve_pool(p_ref);
    v_changes jsonb := respool._resource_map(p_capacity, 'capacity', true);
    k text;
    n bigint;
    v_refusal text;
BEGIN
    PERFORM respool._pool_settings(p_description, p_queueing, p_preemption_grace_seconds,
                                   p_starvation_seconds, p_ordering, p_placement);
    PERFORM respool._check_one_of('slice_overuse', p_slice_overuse, 'report', 'terminate');
    PERFORM respool._lock_pools(ARRAY[v_id]);
    IF v_changes <> '{}' AND EXISTS (SELECT FROM respool.nodes WHERE pool_id = v_id) THEN
        -- docs/placement.md: the capacity of a pool with nodes is the sum over its nodes.
        PERFORM respool._fail('RP409', 'capacity', format(
            'pool %s is backed by nodes: change its nodes (its capacity is the sum of theirs)',
            (SELECT name FROM respool.pools WHERE id = v_id)));
    END IF;
    PERFORM respool._set_rates(v_id, p_rates, v_changes, p_now);  -- rate keys (039_rates.sql)
    FOR k, n IN SELECT key, value::bigint FROM jsonb_each_text(v_changes) LOOP
        INSERT INTO respool.pool_resources (pool_id, key, capacity)
        VALUES (v_id, k, nullif(n, 0))
        ON CONFLICT (pool_id, key) DO UPDATE SET capacity = excluded.capacity;
    END LOOP;
    DELETE FROM respool.pool_resources WHERE pool_id = v_id AND capacity IS NULL AND used = 0;
    BEGIN
        PERFORM respool._check_reserved_fits(v_id, p_now);
    EXCEPTION WHEN SQLSTATE 'RP409' THEN
        -- The same refusal, with what to do about it (the policies are named by the message).
        GET STACKED DIAGNOSTICS v_refusal = MESSAGE_TEXT;
        PERFORM respool._fail('RP409', 'capacity', v_refusal || format(
            '; detach or shrink the policy first (respool pool detach-policy %s SUBJECT, or attach-policy '
            'with a smaller reserved share), then change the capacity',
            (SELECT name FROM respool.pools WHERE id = v_id)));
    END;
    UPDATE respool.pools
       SET description = coalesce(p_description, description),
           queueing = coalesce(p_queueing, queueing),
           preemption_grace_seconds = coalesce(p_preemption_grace_seconds, preemption_grace_seconds),
           starvation_seconds = CASE WHEN coalesce(p_starvation_off, false) THEN NULL
                                     ELSE coalesce(p_starvation_seconds, starvation_seconds) END,
           ordering = coalesce(p_ordering, ordering),
           placement = coalesce(p_placement, placement),
           slice_overuse = coalesce(p_slice_overuse, slice_overuse),
           updated_at = p_now
     WHERE id = v_id;
    PERFORM respool._settle_pool(v_id, NULL, p_now);
    RETURN respool.pool_json(v_id);
END $$;
COMMENT ON FUNCTION respool.update_pool(text, jsonb, text, text, integer, timestamptz, integer, boolean, text, text, jsonb, text) IS
    'Updates a pool: capacity merges (0 removes a key), rates merge (null removes one), p_slice_overuse applies from the next crossing of a slice, RP409 if reserved shares would exceed it (naming the policies and saying to detach or shrink them first) or the pool is backed by nodes (its capacity is theirs); queued requests that can never fit are rejected and what fits is granted, in one transaction. Usage above a shrunk capacity is left to the reconciler. NULL arguments keep a field; p_starvation_off turns the starvation guard off.';

CREATE OR REPLACE FUNCTION respool.delete_pool(p_ref text, p_force boolean DEFAULT false,
                                               p_now timestamptz DEFAULT now())
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid := respool.resolve_pool(p_ref);
BEGIN
    PERFORM respool._lock_pools(ARRAY[v_id]);
    PERFORM respool._clear_for_delete('pool', 'pool_deleted', p_ref, v_id, NULL, p_force, p_now);
    DELETE FROM respool.policies WHERE pool_id = v_id;
    DELETE FROM respool.pools WHERE id = v_id;
END $$;
COMMENT ON FUNCTION respool.delete_pool(text, boolean, timestamptz) IS 'Deletes a pool and its policies; RP409 while it has queued or allocated requests unless p_force, which cancels them (reason pool_deleted). Terminal requests keep the pool name.';
