-- Subject policies: CRUD with their validations (docs/api.md). Every change locks the policy's
-- pool row first, then settles the pool (respool._settle_pool, 050_pools.sql).

CREATE OR REPLACE FUNCTION respool.policy_json(p_id uuid)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', p.id, 'subject', p.subject, 'pool', pl.name, 'pool_id', pl.id, 'priority', p.priority,
        'description', p.description,
        'reserved', coalesce((SELECT jsonb_object_agg(key, reserved) FROM respool.policy_resources
                               WHERE policy_id = p.id AND reserved > 0), '{}'),
        'limit', coalesce((SELECT jsonb_object_agg(key, "limit") FROM respool.policy_resources
                            WHERE policy_id = p.id AND "limit" IS NOT NULL), '{}'),
        'usage', coalesce((SELECT jsonb_object_agg(key, used) FROM respool.policy_resources
                            WHERE policy_id = p.id AND used > 0), '{}'),
        'borrowed', coalesce((SELECT jsonb_object_agg(r.key, r.used - r.reserved)
                                FROM respool.policy_resources r
                                LEFT JOIN respool.pool_resources c ON c.pool_id = p.pool_id AND c.key = r.key
                               WHERE r.policy_id = p.id AND r.used > r.reserved
                                 AND respool._effective_capacity(r.key, c.capacity) IS NOT NULL), '{}'),
        'created_at', p.created_at, 'updated_at', p.updated_at)
      FROM respool.policies p JOIN respool.pools pl ON pl.id = p.pool_id
     WHERE p.id = p_id
$$;
COMMENT ON FUNCTION respool.policy_json(uuid) IS 'A policy as the API shows it, with usage and borrowed units (usage above reserved on tracked keys).';

CREATE OR REPLACE FUNCTION respool.get_policy(p_ref text)
RETURNS jsonb LANGUAGE sql STABLE AS $$ SELECT respool.policy_json(respool.resolve_policy(p_ref)) $$;
COMMENT ON FUNCTION respool.get_policy(text) IS 'One policy by id or unique id prefix.';

CREATE OR REPLACE FUNCTION respool.list_policies(p_pool text DEFAULT NULL, p_subject text DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_pool_id uuid;
BEGIN
    IF p_pool IS NOT NULL THEN
        v_pool_id := respool.resolve_pool(p_pool);
    END IF;
    RETURN coalesce((SELECT jsonb_agg(respool.policy_json(p.id) ORDER BY pl.name, p.subject)
                       FROM respool.policies p JOIN respool.pools pl ON pl.id = p.pool_id
                      WHERE (v_pool_id IS NULL OR p.pool_id = v_pool_id)
                        AND (p_subject IS NULL OR p.subject = p_subject)), '[]');
END $$;
COMMENT ON FUNCTION respool.list_policies(text, text) IS 'Policies, optionally of one pool and/or subject, by pool name then subject.';

CREATE OR REPLACE FUNCTION respool._apply_policy_maps(p_policy_id uuid, p_pool_id uuid, p_reserved jsonb,
                                                      p_limit jsonb)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    k text;
    n bigint;
    v record;
BEGIN
    -- reserved <= limit is checked on the merged result before anything is written: the
    -- reserved_within_limit CHECK would otherwise fire first, as a 500 instead of RP400.
    SELECT x.key, x.reserved, x."limit" INTO v
      FROM (SELECT k2.key,
                   coalesce((p_reserved ->> k2.key)::bigint, pr.reserved, 0) AS reserved,
                   CASE WHEN p_limit ? k2.key THEN nullif((p_limit ->> k2.key)::bigint, 0)
                        ELSE pr."limit" END AS "limit"
              FROM (SELECT jsonb_object_keys(p_reserved) AS key
                    UNION SELECT jsonb_object_keys(p_limit)) k2
              LEFT JOIN respool.policy_resources pr ON pr.policy_id = p_policy_id AND pr.key = k2.key) x
     WHERE x."limit" < x.reserved
     ORDER BY x.key LIMIT 1;
    IF FOUND THEN
        PERFORM respool._fail('RP400', 'reserved.' || v.key, format(
            'reserved.%s (%s) must not exceed limit.%s (%s)', v.key, v.reserved, v.key, v."limit"));
    END IF;
    FOR k, n IN SELECT key, value::bigint FROM jsonb_each_text(p_reserved) LOOP
        INSERT INTO respool.policy_resources AS pr (policy_id, key, reserved) VALUES (p_policy_id, k, 0)
        ON CONFLICT (policy_id, key) DO NOTHING;
        SELECT * INTO v FROM respool.policy_resources WHERE policy_id = p_policy_id AND key = k;
        IF n > 0 AND NOT EXISTS (SELECT FROM respool.pool_resources
                                  WHERE pool_id = p_pool_id AND key = k AND capacity IS NOT NULL) THEN
            PERFORM respool._fail('RP400', 'reserved.' || k, format(
                'reserved.%s: the pool does not track %s (only tracked keys can be reserved)', k, k));
        END IF;
        IF n < v.np_used THEN
            PERFORM respool._fail('RP409', 'reserved.' || k, format(
                'reserved.%s cannot go below %s: non-preemptible requests of this subject hold that much', k, v.np_used));
        END IF;
        UPDATE respool.policy_resources SET reserved = n, configured = n WHERE policy_id = p_policy_id AND key = k;
    END LOOP;
    FOR k, n IN SELECT key, value::bigint FROM jsonb_each_text(p_limit) LOOP
        INSERT INTO respool.policy_resources (policy_id, key, "limit") VALUES (p_policy_id, k, nullif(n, 0))
        ON CONFLICT (policy_id, key) DO UPDATE SET "limit" = excluded."limit";
    END LOOP;
    DELETE FROM respool.policy_resources
     WHERE policy_id = p_policy_id AND reserved = 0 AND "limit" IS NULL AND used = 0;
    PERFORM respool._check_reserved_fits(p_pool_id);
END $$;
COMMENT ON FUNCTION respool._apply_policy_maps(uuid, uuid, jsonb, jsonb) IS
    'Merges reserved/limit maps into a policy (0 removes a key) and enforces the policy rules (docs/api.md): reserved keys tracked, reserved <= limit (RP400), reserved >= non-preemptible usage and reserved sums <= capacity (RP409).';

CREATE OR REPLACE FUNCTION respool.create_policy(p_subject text, p_pool text, p_priority integer DEFAULT 0,
                                                 p_reserved jsonb DEFAULT '{}', p_limit jsonb DEFAULT '{}',
                                                 p_description text DEFAULT '',
                                                 p_now timestamptz DEFAULT now())
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_pool_id uuid;
    v_id uuid;
    v_reserved jsonb := respool._resource_map(p_reserved, 'reserved');
    v_limit jsonb := respool._resource_map(p_limit, 'limit');
BEGIN
    IF p_subject IS NULL OR p_subject !~ respool._subject_pattern() THEN
        PERFORM respool._fail('RP400', 'subject', 'subject must match ' || respool._subject_pattern());
    END IF;
    IF p_pool IS NULL THEN
        PERFORM respool._fail('RP400', 'pool', 'pool is required');
    END IF;
    PERFORM respool._pool_settings(p_description, NULL, NULL);
    v_pool_id := respool.resolve_pool(p_pool);
    PERFORM respool._lock_pools(ARRAY[v_pool_id]);
    BEGIN
        INSERT INTO respool.policies (subject, pool_id, priority, description, created_at, updated_at)
        VALUES (p_subject, v_pool_id, coalesce(p_priority, 0), coalesce(p_description, ''), p_now, p_now)
        RETURNING id INTO v_id;
    EXCEPTION WHEN unique_violation THEN
        PERFORM respool._fail('RP409', 'subject', format('subject %s already has a policy on pool %s', p_subject, p_pool));
    END;
    PERFORM respool._apply_policy_maps(v_id, v_pool_id, v_reserved, v_limit);
    RETURN respool.policy_json(v_id);
END $$;
COMMENT ON FUNCTION respool.create_policy(text, text, integer, jsonb, jsonb, text, timestamptz) IS
    'Binds a subject to a pool; RP409 when the (subject, pool) pair exists or reserved shares would exceed capacity.';

CREATE OR REPLACE FUNCTION respool.update_policy(p_ref text, p_priority integer DEFAULT NULL,
                                                 p_reserved jsonb DEFAULT NULL, p_limit jsonb DEFAULT NULL,
                                                 p_description text DEFAULT NULL,
                                                 p_now timestamptz DEFAULT now())
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid := respool.resolve_policy(p_ref);
    v_pool_id uuid;
    v_reserved jsonb := respool._resource_map(p_reserved, 'reserved', true);
    v_limit jsonb := respool._resource_map(p_limit, 'limit', true);
BEGIN
    PERFORM respool._pool_settings(p_description, NULL, NULL);
    SELECT pool_id INTO v_pool_id FROM respool.policies WHERE id = v_id;
    PERFORM respool._lock_pools(ARRAY[v_pool_id]);
    PERFORM 1 FROM respool.policies WHERE id = v_id FOR UPDATE;
    PERFORM respool._apply_policy_maps(v_id, v_pool_id, v_reserved, v_limit);
    UPDATE respool.policies
       SET priority = coalesce(p_priority, priority), description = coalesce(p_description, description),
           updated_at = p_now
     WHERE id = v_id;
    PERFORM respool._settle_pool(v_pool_id, v_id, p_now);
    RETURN respool.policy_json(v_id);
END $$;
COMMENT ON FUNCTION respool.update_policy(text, integer, jsonb, jsonb, text, timestamptz) IS
    'Updates a policy (maps merge, 0 removes a key); queued requests that can no longer fit are rejected and what now fits is granted. Usage above a lowered limit is left to the reconciler.';

CREATE OR REPLACE FUNCTION respool.delete_policy(p_ref text, p_force boolean DEFAULT false,
                                                 p_now timestamptz DEFAULT now())
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid := respool.resolve_policy(p_ref);
    v_pool_id uuid;
BEGIN
    SELECT pool_id INTO v_pool_id FROM respool.policies WHERE id = v_id;
    PERFORM respool._lock_pools(ARRAY[v_pool_id]);
    PERFORM respool._clear_for_delete('policy', 'policy_deleted', v_id::text, v_pool_id, v_id, p_force, p_now);
    DELETE FROM respool.policies WHERE id = v_id;
    PERFORM respool.allocate_pool(v_pool_id, p_now);
END $$;
COMMENT ON FUNCTION respool.delete_policy(text, boolean, timestamptz) IS
    'Deletes a policy; RP409 while its subject has queued or allocated requests through it unless p_force, which cancels them (reason policy_deleted).';
