-- Subject policies: CRUD with their validations (docs/api.md). Every change locks the policy's
-- pool row first, then settles the pool (respool._settle_pool, 050_pools.sql).

CREATE OR REPLACE FUNCTION respool.policy_json(p_id uuid)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', p.id, 'subject', p.subject, 'pool', pl.name, 'pool_id', pl.id, 'priority', p.priority,
        'description', p.description,
        -- the share as set; in force (policy_resources.reserved) only while the policy is active
        'reserved', coalesce((SELECT jsonb_object_agg(key, configured) FROM respool.policy_resources
                               WHERE policy_id = p.id AND configured > 0), '{}'),
        'limit', coalesce((SELECT jsonb_object_agg(key, "limit") FROM respool.policy_resources
                            WHERE policy_id = p.id AND "limit" IS NOT NULL), '{}'),
        -- (a rate key's: the charges inside its window now, docs/rates.md)
        'usage', coalesce((SELECT jsonb_object_agg(u.key, CASE WHEN rk.key IS NULL THEN u.used
                                                                ELSE respool._rate_used(p.pool_id, u.key, p.id, now()) END)
                             FROM respool.policy_resources u
                             LEFT JOIN respool.pool_rates rk ON rk.pool_id = p.pool_id AND rk.key = u.key
                            WHERE u.policy_id = p.id AND u.used > 0), '{}'),
        -- usage above the share in force now: outside its windows, everything it holds
        'borrowed', coalesce((SELECT jsonb_object_agg(r.key, r.used - r.reserved)
                                FROM respool.policy_resources r
                                LEFT JOIN respool.pool_resources c ON c.pool_id = p.pool_id AND c.key = r.key
                               WHERE r.policy_id = p.id AND r.used > r.reserved
                                 AND respool._effective_capacity(r.key, c.capacity) IS NOT NULL), '{}'),
        'created_at', p.created_at, 'updated_at', p.updated_at,
        'priority_lane', p.priority_lane, 'windows', p.windows, 'active', p.active,
        'next_change', p.next_change,
        'covers', CASE WHEN p.is_pattern THEN
            coalesce((SELECT jsonb_agg(c.subject ORDER BY c.subject)
                        FROM (SELECT r.subject FROM respool.requests r
                               WHERE r.policy_id = p.id AND r.status IN ('allocated', 'preempting')
                              UNION
                              SELECT r.subject FROM respool.queue_entries e
                                JOIN respool.requests r ON r.id = e.request_id
                               WHERE e.policy_id = p.id AND r.status = 'queued') c), '[]')
            ELSE '[]' END)
      FROM respool.policies p JOIN respool.pools pl ON pl.id = p.pool_id
     WHERE p.id = p_id
$$;
COMMENT ON FUNCTION respool.policy_json(uuid) IS 'A policy as the API shows it: reserved is the share as set (configured), borrowed the usage above the share in force now on tracked keys (all of it outside the policy''s windows); windows (normalized, null: always active), active, next_change (null: never flips), priority_lane, and covers: for a pattern subject, the sorted subjects queued, allocated or preempting through it now ([] for an exact subject).';

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
COMMENT ON FUNCTION respool.list_policies(text, text) IS 'Policies, optionally of one pool and/or subject, by pool name then subject. p_subject matches the policy''s subject text exactly: a pattern policy is found by its pattern (team-vision:*), not by a subject it covers.';

CREATE OR REPLACE FUNCTION respool._apply_policy_maps(p_policy_id uuid, p_pool_id uuid, p_reserved jsonb,
                                                      p_limit jsonb, p_now timestamptz DEFAULT now())
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
                   coalesce((p_reserved ->> k2.key)::bigint, pr.configured, 0) AS reserved,
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
        UPDATE respool.policy_resources
           SET configured = n,
               reserved = CASE WHEN (SELECT active FROM respool.policies WHERE id = p_policy_id) THEN n ELSE 0 END
         WHERE policy_id = p_policy_id AND key = k;
    END LOOP;
    FOR k, n IN SELECT key, value::bigint FROM jsonb_each_text(p_limit) LOOP
        INSERT INTO respool.policy_resources (policy_id, key, "limit") VALUES (p_policy_id, k, nullif(n, 0))
        ON CONFLICT (policy_id, key) DO UPDATE SET "limit" = excluded."limit";
    END LOOP;
    -- the share in force: what was set while the policy is active, nothing outside its windows
    UPDATE respool.policy_resources pr
       SET reserved = CASE WHEN p.active THEN pr.configured ELSE 0 END
      FROM respool.policies p
     WHERE p.id = p_policy_id AND pr.policy_id = p.id
       AND pr.reserved IS DISTINCT FROM CASE WHEN p.active THEN pr.configured ELSE 0 END;
    DELETE FROM respool.policy_resources
     WHERE policy_id = p_policy_id AND configured = 0 AND "limit" IS NULL AND used = 0;
    PERFORM respool._check_reserved_fits(p_pool_id, p_now);
END $$;
COMMENT ON FUNCTION respool._apply_policy_maps(uuid, uuid, jsonb, jsonb, timestamptz) IS 'Merges reserved/limit maps into a policy (0 removes a key; reserved is the configured share) and enforces the policy rules (docs/api.md): reserved keys tracked, reserved <= limit (RP400), reserved >= non-preemptible usage and reserved sums <= capacity at every instant from p_now (RP409). Sets the share in force from the policy''s active flag (set it first).';

CREATE OR REPLACE FUNCTION respool.create_policy(p_subject text, p_pool text, p_priority integer DEFAULT 0,
                                                 p_reserved jsonb DEFAULT '{}', p_limit jsonb DEFAULT '{}',
                                                 p_description text DEFAULT '',
                                                 p_now timestamptz DEFAULT now(),
                                                 p_priority_lane boolean DEFAULT false,
                                                 p_windows jsonb DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_pool_id uuid;
    v_id uuid;
    v_reserved jsonb := respool._resource_map(p_reserved, 'reserved');
    v_limit jsonb := respool._resource_map(p_limit, 'limit');
    v_windows jsonb;
    v_state record;
    v_constraint text;
BEGIN
    IF p_subject IS NULL OR p_subject !~ respool._policy_subject_pattern() THEN
        PERFORM respool._fail('RP400', 'subject', 'subject must match ' || respool._policy_subject_pattern()
                              || ' (a subject, or a pattern with * for a team''s subjects)');
    END IF;
    IF p_pool IS NULL THEN
        PERFORM respool._fail('RP400', 'pool', 'pool is required');
    END IF;
    PERFORM respool._pool_settings(p_description, NULL, NULL);
    v_windows := respool._windows(p_windows);
    v_state := respool._window_state(v_windows, p_now);
    v_pool_id := respool.resolve_pool(p_pool);
    PERFORM respool._lock_pools(ARRAY[v_pool_id]);
    BEGIN
        INSERT INTO respool.policies (subject, pool_id, priority, description, created_at, updated_at,
                                      priority_lane, windows, active, next_change)
        VALUES (p_subject, v_pool_id, coalesce(p_priority, 0), coalesce(p_description, ''), p_now, p_now,
                coalesce(p_priority_lane, false), v_windows, v_state.active, v_state.next_change)
        RETURNING id INTO v_id;
    EXCEPTION WHEN unique_violation THEN
        GET STACKED DIAGNOSTICS v_constraint = CONSTRAINT_NAME;
        IF v_constraint = 'policies_pattern_prefix_idx' THEN
            -- docs/preemption.md, "Team quotas": a subject both patterns match would have two policies
            PERFORM respool._fail('RP409', 'subject', format(
                'pattern %s would tie with pattern %s on pool %s: both have the literal prefix %s (the text before the first *)',
                p_subject,
                (SELECT subject FROM respool.policies
                  WHERE pool_id = v_pool_id AND is_pattern AND literal_prefix = split_part(p_subject, '*', 1)),
                p_pool, quote_literal(split_part(p_subject, '*', 1))));
        END IF;
        PERFORM respool._fail('RP409', 'subject', format('subject %s already has a policy on pool %s', p_subject, p_pool));
    END;
    PERFORM respool._apply_policy_maps(v_id, v_pool_id, v_reserved, v_limit, p_now);
    IF v_state.next_change IS NOT NULL THEN
        PERFORM respool._pool_changed(v_pool_id);  -- the reconcilers learn when its next boundary is
    END IF;
    RETURN respool.policy_json(v_id);
END $$;
COMMENT ON FUNCTION respool.create_policy(text, text, integer, jsonb, jsonb, text, timestamptz, boolean, jsonb) IS 'Binds a subject, or a pattern with * (a team quota), to a pool, with its priority lane flag and windows (respool._windows; active and next_change computed at p_now). RP400 naming the field on bad input; RP409 when the (subject, pool) pair exists, when another pattern of the pool has the same literal prefix (naming it), or when reserved shares in force at one instant would exceed capacity.';

CREATE OR REPLACE FUNCTION respool.update_policy(p_ref text, p_priority integer DEFAULT NULL,
                                                 p_reserved jsonb DEFAULT NULL, p_limit jsonb DEFAULT NULL,
                                                 p_description text DEFAULT NULL,
                                                 p_now timestamptz DEFAULT now(),
                                                 p_priority_lane boolean DEFAULT NULL,
                                                 p_windows jsonb DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid := respool.resolve_policy(p_ref);
    v_pool_id uuid;
    v_reserved jsonb := respool._resource_map(p_reserved, 'reserved', true);
    v_limit jsonb := respool._resource_map(p_limit, 'limit', true);
    v_windows jsonb := respool._windows(p_windows);  -- SQL NULL: keep; JSON null: always active
    v_state record;
BEGIN
    PERFORM respool._pool_settings(p_description, NULL, NULL);
    SELECT pool_id INTO v_pool_id FROM respool.policies WHERE id = v_id;
    PERFORM respool._lock_pools(ARRAY[v_pool_id]);
    PERFORM 1 FROM respool.policies WHERE id = v_id FOR UPDATE;
    IF p_windows IS NOT NULL THEN
        v_state := respool._window_state(v_windows, p_now);
        UPDATE respool.policies SET windows = v_windows, active = v_state.active, next_change = v_state.next_change
         WHERE id = v_id;
    END IF;
    PERFORM respool._apply_policy_maps(v_id, v_pool_id, v_reserved, v_limit, p_now);
    UPDATE respool.policies
       SET priority = coalesce(p_priority, priority), description = coalesce(p_description, description),
           priority_lane = coalesce(p_priority_lane, priority_lane), updated_at = p_now
     WHERE id = v_id;
    PERFORM respool._settle_pool(v_pool_id, v_id, p_now);
    RETURN respool.policy_json(v_id);
END $$;
COMMENT ON FUNCTION respool.update_policy(text, integer, jsonb, jsonb, text, timestamptz, boolean, jsonb) IS 'Updates a policy (maps merge, 0 removes a key; p_windows: SQL NULL keeps the windows, JSON null removes them, a list replaces them, active and next_change computed at p_now); queued requests that can no longer fit are rejected and what now fits is granted. Usage above a lowered limit, or above a share no longer in force, is left to the reconciler.';

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
COMMENT ON FUNCTION respool.delete_policy(text, boolean, timestamptz) IS 'Deletes a policy; RP409 while its subject has queued or allocated requests through it unless p_force, which cancels them (reason policy_deleted).';
