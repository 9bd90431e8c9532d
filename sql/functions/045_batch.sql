-- Batch create (SPEC §11.5): many requests in one transaction, each exactly as a single create.

CREATE OR REPLACE FUNCTION respool._batch_member_int(p_value jsonb, p_field text)
RETURNS integer LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_value IS NULL OR p_value = 'null'::jsonb THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_value) <> 'number' OR p_value::numeric <> trunc(p_value::numeric)
       OR p_value::numeric NOT BETWEEN -respool._int32_max() - 1 AND respool._int32_max() THEN
        PERFORM respool._fail('RP400', p_field, format('%s must be an integer', p_field));
    END IF;
    RETURN p_value::integer;
END $$;
COMMENT ON FUNCTION respool._batch_member_int(jsonb, text) IS
    'One integer field of a batch member: NULL for absent or null, RP400 naming the field for anything but a 32-bit JSON integer (the range checks are create_request''s).';

CREATE OR REPLACE FUNCTION respool._batch_member_check(p_member jsonb)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
    v jsonb;
BEGIN
    IF p_member IS NULL OR jsonb_typeof(p_member) <> 'object' THEN
        PERFORM respool._fail('RP400', '', 'a member must be a JSON object (a request create body)');
    END IF;
    FOR k, v IN SELECT * FROM jsonb_each(p_member) LOOP
        CASE k
            WHEN 'subject' THEN
                IF jsonb_typeof(v) <> 'string' THEN
                    PERFORM respool._fail('RP400', k, 'subject must be a string');
                END IF;
            WHEN 'pool', 'idempotency_key' THEN
                IF jsonb_typeof(v) NOT IN ('string', 'null') THEN
                    PERFORM respool._fail('RP400', k, format('%s must be a string or null', k));
                END IF;
            WHEN 'resources', 'settings', 'labels' THEN
                IF jsonb_typeof(v) NOT IN ('object', 'null') THEN
                    PERFORM respool._fail('RP400', k, format('%s must be an object or null', k));
                END IF;
            WHEN 'preemptible' THEN
                IF jsonb_typeof(v) <> 'boolean' THEN
                    PERFORM respool._fail('RP400', k, 'preemptible must be true or false');
                END IF;
            WHEN 'max_retries', 'lease_seconds', 'max_seconds' THEN
                PERFORM respool._batch_member_int(v, k);
            ELSE
                PERFORM respool._fail('RP400', left(k, 70), format('unknown field %L', left(k, 70)));
        END CASE;
    END LOOP;
    IF NOT p_member ? 'subject' THEN
        PERFORM respool._fail('RP400', 'subject', 'subject is required');
    END IF;
END $$;
COMMENT ON FUNCTION respool._batch_member_check(jsonb) IS
    'The JSON shape of one batch member (the fields and types of a single create body); RP400 naming the field. Values are validated by create_request itself.';

CREATE OR REPLACE FUNCTION respool._gang_member_check(p_first jsonb, p_member jsonb, p_first_pool uuid)
RETURNS void LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_member ->> 'subject' IS DISTINCT FROM p_first ->> 'subject' THEN
        PERFORM respool._fail('RP400', 'subject', format(
            'every member of a gang (all_or_nothing) names the same subject: member 0 names %s', p_first ->> 'subject'));
    END IF;
    IF (CASE WHEN p_member ->> 'pool' IS NOT NULL THEN respool.resolve_pool(p_member ->> 'pool') END)
       IS DISTINCT FROM p_first_pool THEN
        PERFORM respool._fail('RP400', 'pool', format(
            'every member of a gang (all_or_nothing) resolves to the same candidate pools: member 0 names pool %s',
            coalesce(p_first ->> 'pool', 'none')));
    END IF;
    IF coalesce((p_member ->> 'preemptible')::boolean, true) IS DISTINCT FROM coalesce((p_first ->> 'preemptible')::boolean, true) THEN
        PERFORM respool._fail('RP400', 'preemptible',
            'every member of a gang (all_or_nothing) has the same preemptible flag as member 0');
    END IF;
    IF coalesce(respool._batch_member_int(p_member -> 'max_retries', 'max_retries'), 0)
       IS DISTINCT FROM coalesce(respool._batch_member_int(p_first -> 'max_retries', 'max_retries'), 0) THEN
        PERFORM respool._fail('RP400', 'max_retries',
            'every member of a gang (all_or_nothing) has the same max_retries as member 0 (the gang is requeued whole)');
    END IF;
END $$;
COMMENT ON FUNCTION respool._gang_member_check(jsonb, jsonb, uuid) IS
    'SPEC §11.6: a gang member (a batch member body) names the subject of member 0, a pool that resolves to member 0''s (or none when member 0 names none), and member 0''s preemptible and max_retries; RP400 naming the field otherwise (RP404/RP400 for a bad pool ref).';

CREATE OR REPLACE FUNCTION respool.create_requests(
    p_members jsonb,
    p_all_or_nothing boolean DEFAULT false,
    p_default_lease_seconds integer DEFAULT NULL,
    p_now timestamptz DEFAULT now())
RETURNS TABLE (member integer, created boolean, request jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
    v_at integer := 0;
    m jsonb;
    v_state text;
    v_message text;
    v_column text;
    v_gang uuid;       -- [SPEC §11.6] all_or_nothing: the members' gang
    v_pool uuid;
    v_ids uuid[] := '{}';
    v_created boolean[] := '{}';
    c record;
BEGIN
    IF p_members IS NULL OR jsonb_typeof(p_members) <> 'array' THEN
        PERFORM respool._fail('RP400', 'members', 'members must be an array of request create bodies');
    END IF;
    v_count := jsonb_array_length(p_members);
    IF v_count NOT BETWEEN 1 AND respool._max_batch() THEN
        PERFORM respool._fail('RP400', 'members', format('a batch has 1 to %s members, got %s', respool._max_batch(), v_count));
    END IF;
    IF p_default_lease_seconds IS NOT NULL AND p_default_lease_seconds NOT BETWEEN 1 AND respool._max_seconds() THEN
        PERFORM respool._fail('RP400', 'default_lease_seconds', 'default_lease_seconds must be between 1 and ' || respool._max_seconds());
    END IF;

    BEGIN
        -- Shapes first, so a malformed member refuses the batch before any work.
        FOR i IN 0 .. v_count - 1 LOOP
            v_at := i;  -- (a FOR variable is not visible in the handler below)
            PERFORM respool._batch_member_check(p_members -> i);
        END LOOP;
        -- Every pool any member's subject may use, locked up front in id order: each member's
        -- create_request then locks a subset it already holds, so members that name different
        -- pools never take pool locks out of the global order (no deadlock with other writers).
        PERFORM respool._lock_pools(array(
            SELECT DISTINCT p.pool_id FROM respool.policies p
             WHERE p.subject IN (SELECT x ->> 'subject' FROM jsonb_array_elements(p_members) x)));
        IF coalesce(p_all_or_nothing, false) THEN
            -- A gang is one request in many parts: one subject, one pool (or none named, so the
            -- same candidates), one preemptible flag and one retry budget for all.
            m := p_members -> 0;
            v_pool := CASE WHEN m ->> 'pool' IS NOT NULL THEN respool.resolve_pool(m ->> 'pool') END;
            FOR i IN 1 .. v_count - 1 LOOP
                v_at := i;
                PERFORM respool._gang_member_check(m, p_members -> i, v_pool);
            END LOOP;
            v_gang := gen_random_uuid();
        END IF;
        FOR i IN 0 .. v_count - 1 LOOP
            v_at := i;
            m := p_members -> i;
            -- Member i is queued i microseconds after member 0: queue time then keeps member
            -- order among members that are otherwise alike (ids are random).
            SELECT * INTO c
                  FROM respool.create_request(
                           p_subject => m ->> 'subject',
                           p_pool => m ->> 'pool',
                           p_resources => CASE WHEN m -> 'resources' = 'null'::jsonb THEN NULL ELSE m -> 'resources' END,
                           p_settings => CASE WHEN m -> 'settings' = 'null'::jsonb THEN NULL ELSE m -> 'settings' END,
                           p_preemptible => coalesce((m ->> 'preemptible')::boolean, true),
                           p_max_retries => coalesce(respool._batch_member_int(m -> 'max_retries', 'max_retries'), 0),
                           p_lease_seconds => CASE WHEN m ? 'lease_seconds'
                                                   THEN respool._batch_member_int(m -> 'lease_seconds', 'lease_seconds')
                                                   ELSE p_default_lease_seconds END,
                           p_idempotency_key => m ->> 'idempotency_key',
                           p_labels => m -> 'labels',
                           p_max_seconds => respool._batch_member_int(m -> 'max_seconds', 'max_seconds'),
                           p_now => p_now + make_interval(secs => i / 1000000.0),
                           p_gang_id => v_gang,
                           p_answer => false);
            v_ids := v_ids || (c.request ->> 'id')::uuid;
            v_created := v_created || c.created;
            IF v_gang IS NOT NULL THEN
                -- An idempotent retry of a gang answers that gang: every member a replay of it.
                IF c.created IS DISTINCT FROM v_created[1]
                   OR (NOT c.created AND (c.request ->> 'gang_id') IS DISTINCT FROM
                                         (SELECT gang_id::text FROM respool.requests WHERE id = v_ids[1])) THEN
                    PERFORM respool._fail('RP422', 'idempotency_key', format(
                        'idempotency_key %L is used by request %s, which is not a member of the gang the other members make',
                        m ->> 'idempotency_key', c.request ->> 'id'));
                END IF;
            END IF;
        END LOOP;
        IF v_gang IS NOT NULL THEN
            v_at := 0;
            IF v_created[1] THEN
                PERFORM respool._gang_start(v_gang, p_now);
            ELSIF (c.request ->> 'gang_id') IS NULL
                  OR (SELECT count(*) FROM respool.requests WHERE gang_id = (c.request ->> 'gang_id')::uuid) <> v_count THEN
                PERFORM respool._fail('RP422', 'idempotency_key',
                    'these idempotency keys were used by requests that do not make up one gang of these members');
            END IF;
        END IF;
        -- Every member as it stands once the batch is done, its document built with the others'
        -- (positions and ETAs once per pool, respool.request_docs).
        RETURN QUERY SELECT (x.n - 1)::integer, v_created[x.n], d.doc::jsonb
                       FROM unnest(v_ids) WITH ORDINALITY x(id, n)
                       JOIN respool.request_docs(v_ids) d ON d.id = x.id
                      ORDER BY x.n;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT, v_column = COLUMN_NAME;
        IF v_state NOT IN ('RP400', 'RP404', 'RP409', 'RP422') THEN
            RAISE;
        END IF;
        -- The whole batch is refused (everything above is rolled back); the error names the member.
        RAISE EXCEPTION '%', format('members[%s]: %s', v_at, v_message)
            USING ERRCODE = v_state,
                  COLUMN = format('members[%s]', v_at) || CASE WHEN coalesce(v_column, '') = '' THEN '' ELSE '.' || v_column END;
    END;
END $$;
COMMENT ON FUNCTION respool.create_requests(jsonb, boolean, integer, timestamptz) IS
    'Batch create (SPEC §11.5): 1 to 1000 members, each a create body, in one transaction, each through create_request exactly as a single create (validation, rejection, idempotency key, grant where it fits) in member order, member i queued i microseconds after member 0 so queue order follows member order. A member without lease_seconds gets p_default_lease_seconds. Any member error (malformed, unknown pool, key reused with another body) refuses the whole batch, creating nothing: the same SQLSTATE, the field as members[i].<field>. Each member''s answer is its state once the whole batch is done. With p_all_or_nothing the members are a gang (SPEC §11.6): same subject, pool, preemptible and max_retries (RP400 naming members[i].<field>), one gang_id, rejected together, granted together in one pool or not at all; a retry whose idempotency keys name exactly the members of one gang answers that gang (RP422 otherwise). Returns one row per member, in member order.';
