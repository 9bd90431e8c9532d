-- Creating requests: one create body, as a JSON document, from the HTTP edge to the engine.
-- respool._create_body, which every create calls, is the one place on the server that checks the
-- body's fields and types and fills its defaults. One route then makes requests from checked
-- bodies, one or many (respool._create_members, 045_create_members.sql): respool.create_request
-- is a batch of one; respool.create_requests makes a batch all or nothing (or a gang), and
-- respool.create_requests_each refuses a member alone and answers a row per member. Where a
-- batch's set-based checks refuse, the members are checked one by one to name the refused one.
-- What-if takes the same document.
-- See docs/api.md ("One create body, one path", "Batch create").

DROP FUNCTION IF EXISTS respool.create_request(text, text, jsonb, jsonb, boolean, integer, integer, text, jsonb,
                                               timestamptz, integer, uuid, boolean);
DROP FUNCTION IF EXISTS respool.what_if_request(text, text, jsonb, jsonb, boolean, integer, integer, text, jsonb,
                                                integer, timestamptz);
DROP FUNCTION IF EXISTS respool._batch_member_check(jsonb);
DROP FUNCTION IF EXISTS respool._batch_member_int(jsonb, text);

CREATE OR REPLACE FUNCTION respool._labels(p_labels jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_count bigint;
    v_bad text;
BEGIN
    IF respool._absent_object(p_labels, 'labels', 'labels must be an object of string: string') THEN
        RETURN '{}';
    END IF;
    -- One pass over the entries: how many, and the first bad one.
    SELECT count(*), min(x.key) FILTER (WHERE jsonb_typeof(x.value) <> 'string' OR length(x.key) NOT BETWEEN 1 AND 128
                                              OR length(x.value #>> '{}') > 1024)
      INTO v_count, v_bad FROM jsonb_each(p_labels) x;
    IF v_count > respool._max_keys() THEN
        PERFORM respool._fail('RP400', 'labels', 'labels has more than ' || respool._max_keys() || ' entries');
    END IF;
    IF v_bad IS NOT NULL THEN
        PERFORM respool._fail('RP400', 'labels.' || left(v_bad, 70),
            'labels must map names of 1-128 chars to strings of at most 1024 chars');
    END IF;
    RETURN p_labels;
END $$;
COMMENT ON FUNCTION respool._labels(jsonb) IS 'Validates labels: at most 64 string entries, bounded lengths.';

CREATE OR REPLACE FUNCTION respool._body_int(p_value jsonb, p_field text, p_low integer, p_high integer,
                                             p_message text)
RETURNS integer LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_value IS NULL OR p_value = 'null'::jsonb THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_value) <> 'number' OR p_value::numeric <> trunc(p_value::numeric)
       OR p_value::numeric NOT BETWEEN p_low AND p_high THEN
        PERFORM respool._fail('RP400', p_field, p_message);
    END IF;
    RETURN p_value::integer;
END $$;
COMMENT ON FUNCTION respool._body_int(jsonb, text, integer, integer, text) IS
    'One integer field of a create body: NULL for absent or JSON null, the integer when it is a JSON integer between p_low and p_high, RP400 naming p_field with p_message otherwise.';

CREATE OR REPLACE FUNCTION respool._create_body(p_body jsonb, p_default_lease_seconds integer)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_unknown jsonb;
BEGIN
    IF p_body IS NULL OR jsonb_typeof(p_body) <> 'object' THEN
        PERFORM respool._fail('RP400', '', 'a create body must be a JSON object');
    END IF;
    v_unknown := p_body - ARRAY['subject', 'pool', 'resources', 'settings', 'preemptible', 'max_retries',
                                'max_seconds', 'lease_seconds', 'idempotency_key', 'labels', 'node_selector',
                                'preemption_group', 'job'];
    IF v_unknown <> '{}' THEN
        PERFORM respool._fail('RP400', left(k, 70), format('unknown field %L', left(k, 70)))
           FROM (SELECT min(k) AS k FROM jsonb_object_keys(v_unknown) k) first;
    END IF;
    IF NOT p_body ? 'subject' THEN
        PERFORM respool._fail('RP400', 'subject', 'subject is required');
    END IF;
    IF jsonb_typeof(p_body -> 'subject') <> 'string'
       OR (p_body ->> 'subject') !~ respool._subject_pattern() THEN
        PERFORM respool._fail('RP400', 'subject', 'subject must match ' || respool._subject_pattern());
    END IF;
    -- Fields of one JSON type or null, in the order they are checked. The contents of resources,
    -- settings and labels: respool.build_resources and respool._labels check them, naming the key.
    PERFORM respool._fail('RP400', first.field, first.message)
       FROM (SELECT f.field, f.message
               FROM (VALUES (1, 'pool', 'string', 'pool must be a string or null'),
                            (2, 'resources', 'object', 'resources must be an object or null'),
                            (3, 'settings', 'object', 'settings must be an object or null'),
                            (4, 'labels', 'object', 'labels must be an object or null'),
                            (5, 'node_selector', 'object', 'node_selector must be an object of label: value, or null'))
                    f(i, field, type, message)
              WHERE jsonb_typeof(p_body -> f.field) NOT IN (f.type, 'null')
              ORDER BY f.i LIMIT 1) first;
    IF jsonb_typeof(p_body -> 'idempotency_key') NOT IN ('string', 'null')
       OR length(p_body ->> 'idempotency_key') NOT BETWEEN 1 AND respool._max_key_length() THEN
        PERFORM respool._fail('RP400', 'idempotency_key',
                              format('idempotency_key must have 1 to %s characters', respool._max_key_length()));
    END IF;
    IF jsonb_typeof(p_body -> 'preemption_group') NOT IN ('string', 'null')
       OR (p_body ->> 'preemption_group') !~ respool._group_pattern() THEN
        PERFORM respool._fail('RP400', 'preemption_group',
                              'preemption_group must be 1 to 128 printable characters, or null');
    END IF;
    IF jsonb_typeof(p_body -> 'preemptible') <> 'boolean' THEN
        PERFORM respool._fail('RP400', 'preemptible', 'preemptible must be true or false');
    END IF;
    IF p_body ? 'max_retries' AND (p_body -> 'max_retries' = 'null' OR respool._body_int(
           p_body -> 'max_retries', 'max_retries', 0, respool._max_retries(),
           'max_retries must be an integer between 0 and ' || respool._max_retries()) IS NULL) THEN
        PERFORM respool._fail('RP400', 'max_retries', 'max_retries must be an integer between 0 and ' || respool._max_retries());
    END IF;
    IF p_body ? 'lease_seconds' THEN
        PERFORM respool._body_int(p_body -> 'lease_seconds', 'lease_seconds', 1, respool._max_seconds(),
                                  format('lease_seconds must be between 1 and %s (or null for no lease)', respool._max_seconds()));
    END IF;
    IF p_body ? 'max_seconds' THEN
        PERFORM respool._body_int(p_body -> 'max_seconds', 'max_seconds', 1, respool._max_seconds(),
                                  format('max_seconds must be between 1 and %s (or null for no cap)', respool._max_seconds()));
    END IF;
    PERFORM respool._job_check(p_body -> 'job');  -- a job (docs/jobs.md)
    -- The server's defaults, in this one place: absent lease_seconds is the server's default
    -- lease (explicit null: no lease).
    RETURN jsonb_build_object('preemptible', true, 'max_retries', 0, 'lease_seconds', p_default_lease_seconds)
           || p_body;
END $$;
COMMENT ON FUNCTION respool._create_body(jsonb, integer) IS
    'The one check of a create body''s fields and types (the fields of the wire type RequestCreate: subject, pool, resources, settings, preemptible, max_retries, max_seconds, lease_seconds, idempotency_key, labels, node_selector, preemption_group; RP400 naming the field, also for an unknown one) and the one place its defaults are filled: preemptible true, max_retries 0, lease_seconds p_default_lease_seconds when absent. Values inside resources, settings, labels and node_selector are checked where they are converted.';

CREATE OR REPLACE FUNCTION respool._request_body(p_pool_ref text, p_resources jsonb, p_preemptible boolean,
                                                 p_max_retries integer, p_lease_seconds integer, p_labels jsonb,
                                                 p_max_seconds integer, p_selector jsonb, p_group text)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('pool', p_pool_ref, 'resources', p_resources, 'preemptible', p_preemptible,
                              'max_retries', p_max_retries, 'lease_seconds', p_lease_seconds, 'labels', p_labels)
           || CASE WHEN p_max_seconds IS NOT NULL THEN jsonb_build_object('max_seconds', p_max_seconds) ELSE '{}' END
           || CASE WHEN p_selector <> '{}' THEN jsonb_build_object('node_selector', p_selector) ELSE '{}' END
           || CASE WHEN p_group IS NOT NULL THEN jsonb_build_object('preemption_group', p_group) ELSE '{}' END
$$;
COMMENT ON FUNCTION respool._request_body(text, jsonb, boolean, integer, integer, jsonb, integer, jsonb, text) IS
    'The body a request stores (request_body) and an idempotent retry must repeat, from its converted fields; max_seconds, node_selector and preemption_group only when set, so bodies stored before they existed still compare equal. Inlined (SQL).';

CREATE OR REPLACE FUNCTION respool.create_request(
    p_body jsonb,
    p_default_lease_seconds integer DEFAULT NULL,
    p_now timestamptz DEFAULT now(),
    p_gang_id uuid DEFAULT NULL,
    p_answer boolean DEFAULT true,
    OUT created boolean,
    OUT request jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    -- A batch of one, through the one create route (respool._create_members).
    c := respool._create_members(ARRAY[respool._create_body(p_body, p_default_lease_seconds)], p_now, p_gang_id, false);
    IF c.codes[1] IS NOT NULL THEN
        PERFORM respool._fail(c.codes[1], 'idempotency_key', c.messages[1]);
    END IF;
    created := c.created[1];
    request := CASE WHEN p_answer OR NOT created THEN respool.request_json(c.ids[1])
                    ELSE jsonb_build_object('id', c.ids[1]) END;
END $$;
COMMENT ON FUNCTION respool.create_request(jsonb, integer, timestamptz, uuid, boolean) IS
    'Creates (or replays, by idempotency key: RP422 on another body) one request from its create body, the fields of POST /v1/requests (docs/api.md), checked by respool._create_body (absent lease_seconds: p_default_lease_seconds) and made by respool._create_members as a batch of one: stored rejected or queued under its candidate pools'' locks, then granted at once where it fits (docs/engine.md, Functions). p_gang_id: a gang member, left to respool._gang_start. p_answer false: answers {"id"} only. Returns created (false for a replay) and the document.';

CREATE OR REPLACE FUNCTION respool._checked_bodies(p_members jsonb, p_default_lease_seconds integer)
RETURNS jsonb[] LANGUAGE sql STABLE AS $$
    SELECT array_agg(c.body ORDER BY m.n)
      FROM jsonb_array_elements(p_members) WITH ORDINALITY m(b, n)
      JOIN (SELECT d.b, respool._create_body(d.b, p_default_lease_seconds) AS body
              FROM (SELECT DISTINCT b FROM jsonb_array_elements(p_members) b) d) c ON c.b = m.b
$$;
COMMENT ON FUNCTION respool._checked_bodies(jsonb, integer) IS
    'The members of a batch checked and completed by respool._create_body, each distinct body once, in member order. RP400 naming the field of a bad one (which member: respool._member_refusals finds out).';

CREATE OR REPLACE FUNCTION respool._claim_keys(p_bodies jsonb[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- Only when a body names a key: a create without one takes no lock here.
    IF cardinality(p_bodies) = 1 AND p_bodies[1] ->> 'idempotency_key' IS NULL THEN
        RETURN;  -- (one member: no query)
    END IF;
    IF EXISTS (SELECT FROM unnest(p_bodies) b WHERE b ->> 'idempotency_key' IS NOT NULL) THEN
        PERFORM pg_advisory_xact_lock(k)
           FROM (SELECT DISTINCT hashtextextended((b ->> 'subject') || E'\n' || (b ->> 'idempotency_key'), 0) AS k
                   FROM unnest(p_bodies) b WHERE b ->> 'idempotency_key' IS NOT NULL ORDER BY 1) keys;
    END IF;
END $$;
COMMENT ON FUNCTION respool._claim_keys(jsonb[]) IS
    'Claims the idempotency keys of checked create bodies for this transaction in one global order (a transaction advisory lock per subject and key, in lock-key order), before any request is inserted: two creates or batches naming the same keys in another order wait for each other instead of each holding a key the other needs (a deadlock when no pool lock orders them).';

CREATE OR REPLACE FUNCTION respool._batch_pools(p_bodies jsonb[])
RETURNS uuid[] LANGUAGE sql STABLE AS $$
    -- Per member: its subject's pools, only those its pool ref may name when it names one (a
    -- name, or every id the ref is a prefix of: a superset of what respool.resolve_pool finds).
    SELECT coalesce(array_agg(DISTINCT s.pool_id), '{}')
      FROM (SELECT DISTINCT b ->> 'subject' AS subject, b ->> 'pool' AS ref FROM unnest(p_bodies) b) m
     CROSS JOIN LATERAL respool._subject_policies(m.subject) s
      JOIN respool.pools pl ON pl.id = s.pool_id
     WHERE m.ref IS NULL OR pl.name = m.ref
        OR (m.ref ~* '^[0-9a-f-]{4,36}$' AND pl.id::text LIKE lower(m.ref) || '%')
$$;
COMMENT ON FUNCTION respool._batch_pools(jsonb[]) IS
    'The pools a batch of checked create bodies may lock: for each member the pools of its subject that it may be created in (all of them without a pool ref; with one, those the ref may name). A batch locks them all in id order up front, so each member then locks a subset it holds already, and batches naming different pools of the same subjects do not wait for each other.';

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
    IF p_member -> 'preemptible' IS DISTINCT FROM p_first -> 'preemptible' THEN
        PERFORM respool._fail('RP400', 'preemptible',
            'every member of a gang (all_or_nothing) has the same preemptible flag as member 0');
    END IF;
    IF respool.build_node_selector(p_member -> 'node_selector', nullif(p_member -> 'settings', 'null'))
       IS DISTINCT FROM respool.build_node_selector(p_first -> 'node_selector', nullif(p_first -> 'settings', 'null')) THEN
        PERFORM respool._fail('RP400', 'node_selector',
            'every member of a gang (all_or_nothing) has the node selector of member 0 (with settings gpu_type/gpu_class)');
    END IF;
    IF p_member ->> 'preemption_group' IS DISTINCT FROM p_first ->> 'preemption_group' THEN
        PERFORM respool._fail('RP400', 'preemption_group',
            'every member of a gang (all_or_nothing) has the preemption_group of member 0');
    END IF;
    IF (p_member ->> 'max_retries')::integer IS DISTINCT FROM (p_first ->> 'max_retries')::integer THEN
        PERFORM respool._fail('RP400', 'max_retries',
            'every member of a gang (all_or_nothing) has the same max_retries as member 0 (the gang is requeued whole)');
    END IF;
END $$;
COMMENT ON FUNCTION respool._gang_member_check(jsonb, jsonb, uuid) IS
    'A gang member (a body respool._create_body completed) names the subject of member 0, a pool that resolves to member 0''s (or none when member 0 names none), and member 0''s preemptible, node selector, preemption_group and max_retries; RP400 naming the field otherwise (RP404/RP400 for a bad pool ref). See docs/scheduling.md (gangs).';

CREATE OR REPLACE FUNCTION respool._batch_count(p_members jsonb, p_default_lease_seconds integer)
RETURNS integer LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_count integer;
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
    RETURN v_count;
END $$;
COMMENT ON FUNCTION respool._batch_count(jsonb, integer) IS
    'The member count of a batch: p_members a JSON array of 1 to respool._max_batch() bodies and p_default_lease_seconds null or a valid lease, else RP400 naming members or default_lease_seconds.';

CREATE OR REPLACE FUNCTION respool._member_refusals(p_members jsonb, p_default_lease_seconds integer,
                                                    OUT bodies jsonb[], OUT codes text[], OUT fields text[],
                                                    OUT messages text[], OUT phases integer[])
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer := jsonb_array_length(p_members);
    v_seen text[] := '{}';  -- subject and key of the members that pass, in member order
    v_key text;
    v_phase integer;
    v_state text;
    v_message text;
    v_column text;
    b jsonb;
BEGIN
    bodies := array_fill(NULL::jsonb, ARRAY[v_count]);
    codes := array_fill(NULL::text, ARRAY[v_count]);
    fields := codes;
    messages := codes;
    phases := array_fill(NULL::integer, ARRAY[v_count]);
    -- Phase 1, every member first: the body's fields and types. Phase 2, in member order: its
    -- values and, unless its key replays (stored, or named by a member before it that passes),
    -- the pool it names. Each check in a subtransaction of its own: only after a refusal.
    FOR v_phase IN 1 .. 2 LOOP
        FOR i IN 1 .. v_count LOOP
            CONTINUE WHEN codes[i] IS NOT NULL;
            BEGIN
                IF v_phase = 1 THEN
                    bodies[i] := respool._create_body(p_members -> (i - 1), p_default_lease_seconds);
                ELSE
                    b := bodies[i];
                    v_key := (b ->> 'subject') || E'\n' || (b ->> 'idempotency_key');
                    PERFORM respool._member_values(ARRAY[b]);
                    IF b ->> 'pool' IS NOT NULL
                       AND (v_key IS NULL OR NOT (v_key = ANY (v_seen)
                                                  OR EXISTS (SELECT FROM respool.requests r
                                                              WHERE r.subject = b ->> 'subject'
                                                                AND r.idempotency_key = b ->> 'idempotency_key'))) THEN
                        PERFORM respool.resolve_pool(b ->> 'pool');
                    END IF;
                    IF v_key IS NOT NULL THEN
                        v_seen := v_seen || v_key;
                    END IF;
                END IF;
            EXCEPTION WHEN SQLSTATE 'RP400' OR SQLSTATE 'RP404' OR SQLSTATE 'RP409' OR SQLSTATE 'RP422' THEN
                GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT, v_column = COLUMN_NAME;
                codes[i] := v_state;
                fields[i] := nullif(v_column, '');
                messages[i] := v_message;
                phases[i] := v_phase;
            END;
        END LOOP;
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._member_refusals(jsonb, integer) IS
    'After a batch''s set-based checks refused (nothing kept): which members their own create refuses before anything is stored, each as that create would see it: the body''s fields and types (phase 1, every member first), then in member order its values and the pool it names unless its key replays a stored request or a member before it (phase 2). Per member: its checked body (NULL when its body check refused), the SQLSTATE, field and message, and the phase.';

CREATE OR REPLACE FUNCTION respool._route_refusal(p_gang boolean, p_bodies jsonb[], p_ids uuid[], p_created boolean[],
                                                  p_codes text[], p_messages text[],
                                                  OUT at integer, OUT code text, OUT field text, OUT message text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_gang uuid := (SELECT gang_id FROM respool.requests WHERE p_gang AND id = p_ids[1]);
BEGIN
    IF NOT p_gang THEN
        -- The first refused member, if any (one pass over the codes, not one lookup per member).
        SELECT u.n - 1, 'RP422', 'idempotency_key', u.message INTO at, code, field, message
          FROM unnest(p_codes, p_messages) WITH ORDINALITY u(code, message, n)
         WHERE u.code IS NOT NULL ORDER BY u.n LIMIT 1;
        RETURN;
    END IF;
    FOR i IN 1 .. coalesce(cardinality(p_ids), 0) LOOP
        at := i - 1;
        code := 'RP422';
        field := 'idempotency_key';
        message := p_messages[i];
        EXIT WHEN p_codes[i] IS NOT NULL;
        -- An idempotent retry of a gang answers that gang: every member a replay of it.
        message := format('idempotency_key %L is used by request %s, which is not a member of the gang the other members make',
                          p_bodies[i] ->> 'idempotency_key', p_ids[i]);
        EXIT WHEN p_gang AND (p_created[i] IS DISTINCT FROM p_created[1]
                              OR (NOT p_created[i] AND (SELECT gang_id FROM respool.requests WHERE id = p_ids[i])
                                                       IS DISTINCT FROM v_gang));
        at := NULL;
    END LOOP;
    IF at IS NULL AND p_gang AND NOT p_created[1]
       AND (v_gang IS NULL OR (SELECT count(*) FROM respool.requests WHERE gang_id = v_gang) <> cardinality(p_ids)) THEN
        at := 0;
        code := 'RP422';
        field := 'idempotency_key';
        message := 'these idempotency keys were used by requests that do not make up one gang of these members';
    END IF;
    IF at IS NULL THEN
        code := NULL;
        field := NULL;
        message := NULL;
    END IF;
END $$;
COMMENT ON FUNCTION respool._route_refusal(boolean, jsonb[], uuid[], boolean[], text[], text[]) IS
    'The first member (from 0) of a batch the create route made (its ids, created flags and RP422 refusals) that its own create refuses: a replay on another body or, for a gang (p_gang), a member that is not a replay of the same gang as the others (RP422, field idempotency_key); NULLs when none.';

CREATE OR REPLACE FUNCTION respool._batch_refusal(p_members jsonb, p_default_lease_seconds integer, p_now timestamptz,
                                                  p_gang_id uuid, OUT at integer, OUT code text, OUT field text,
                                                  OUT message text, OUT ids uuid[], OUT created boolean[])
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    c record;
    v_count integer := jsonb_array_length(p_members);
    v_first integer;
    v_pool uuid;
BEGIN
    SELECT * INTO r FROM respool._member_refusals(p_members, p_default_lease_seconds);
    SELECT min(i) INTO v_first FROM generate_subscripts(r.phases, 1) i WHERE r.phases[i] = 1;
    IF v_first IS NULL AND p_gang_id IS NOT NULL THEN
        -- A gang is one request in many parts: checked against member 0 before any member is made.
        FOR i IN 1 .. v_count - 1 LOOP
            BEGIN
                v_pool := CASE WHEN r.bodies[1] ->> 'pool' IS NOT NULL THEN respool.resolve_pool(r.bodies[1] ->> 'pool') END;
                PERFORM respool._gang_member_check(r.bodies[1], r.bodies[i + 1], v_pool);
            EXCEPTION WHEN SQLSTATE 'RP400' OR SQLSTATE 'RP404' THEN
                GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, message = MESSAGE_TEXT, field = COLUMN_NAME;
                at := i;
                field := nullif(field, '');
                RETURN;
            END;
        END LOOP;
    END IF;
    at := NULL;
    SELECT coalesce(v_first, min(i), v_count + 1) INTO v_first FROM generate_subscripts(r.phases, 1) i WHERE r.phases[i] = 2;
    IF v_first > 1 THEN
        -- The members before the first refused one, made: a replay refused among them comes first.
        SELECT * INTO c FROM respool._create_members(r.bodies[1:v_first - 1], p_now, p_gang_id, v_count > 1);
        SELECT * INTO at, code, field, message FROM respool._route_refusal(p_gang_id IS NOT NULL, r.bodies[1:v_first - 1],
                                                                           c.ids, c.created, c.codes, c.messages);
        ids := c.ids;
        created := c.created;
    END IF;
    IF at IS NULL AND v_first <= v_count THEN
        at := v_first - 1;
        code := r.codes[v_first];
        field := r.fields[v_first];
        message := r.messages[v_first];
    END IF;
END $$;
COMMENT ON FUNCTION respool._batch_refusal(jsonb, integer, timestamptz, uuid) IS
    'For an all or nothing batch whose set-based attempt was refused (nothing kept): the first member (from 0) its own create refuses in member order, with the SQLSTATE, field and message (body checks of every member first, then a gang''s member checks, then each member''s values, pool and key), after making the members before it (the caller raises). at NULL: none refused; ids and created then answer for every member.';

CREATE OR REPLACE FUNCTION respool.create_requests(
    p_members jsonb,
    p_all_or_nothing boolean DEFAULT false,
    p_default_lease_seconds integer DEFAULT NULL,
    p_now timestamptz DEFAULT now(),
    p_distinct_nodes boolean DEFAULT false)
RETURNS TABLE (member integer, created boolean, request jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
    v_gang uuid := CASE WHEN coalesce(p_all_or_nothing, false) THEN gen_random_uuid() END;  -- the members' gang
    v_bodies jsonb[];
    v_pool uuid;
    c record;  -- what the create route made: ids, created, refusals
    f record;  -- the first refused member
BEGIN
    v_count := respool._batch_count(p_members, p_default_lease_seconds);
    IF coalesce(p_distinct_nodes, false) AND v_gang IS NULL THEN
        PERFORM respool._fail('RP400', 'distinct_nodes',
            'distinct_nodes places the members of a gang on different nodes: it needs all_or_nothing true');
    END IF;
    BEGIN
        v_bodies := respool._checked_bodies(p_members, p_default_lease_seconds);
        IF v_gang IS NOT NULL THEN
            -- A gang is one request in many parts: one subject, one pool (or none named, so the
            -- same candidates), one preemptible flag and one retry budget for all.
            v_pool := CASE WHEN v_bodies[1] ->> 'pool' IS NOT NULL THEN respool.resolve_pool(v_bodies[1] ->> 'pool') END;
            PERFORM respool._gang_member_check(v_bodies[1], b, v_pool) FROM unnest(v_bodies[2:]) b;
        END IF;
        SELECT * INTO c FROM respool._create_members(v_bodies, p_now, v_gang, v_count > 1);
        SELECT * INTO f FROM respool._route_refusal(v_gang IS NOT NULL, v_bodies, c.ids, c.created, c.codes, c.messages);
    EXCEPTION WHEN SQLSTATE 'RP400' OR SQLSTATE 'RP404' OR SQLSTATE 'RP409' OR SQLSTATE 'RP422' THEN
        -- Refused (nothing of it kept): which member, in the state its own create would see.
        SELECT * INTO f FROM respool._batch_refusal(p_members, p_default_lease_seconds, p_now, v_gang);
        c := f;
    END;
    IF f.at IS NOT NULL THEN
        -- The whole batch is refused (the caller's transaction fails); the error names the member.
        RAISE EXCEPTION '%', format('members[%s]: %s', f.at, f.message)
            USING ERRCODE = f.code,
                  COLUMN = format('members[%s]', f.at) || CASE WHEN coalesce(f.field, '') = '' THEN '' ELSE '.' || f.field END;
    END IF;
    IF v_gang IS NOT NULL AND c.created[1] THEN
        IF p_distinct_nodes THEN
            UPDATE respool.requests SET distinct_nodes = true WHERE gang_id = v_gang;
        END IF;
        PERFORM respool._gang_start(v_gang, p_now);
    END IF;
    -- Every member as it stands once the batch is done, its document built with the others'
    -- (positions and ETAs once per pool, respool.request_docs).
    RETURN QUERY SELECT (x.n - 1)::integer, c.created[x.n], d.doc::jsonb
                   FROM unnest(c.ids) WITH ORDINALITY x(id, n)
                   JOIN respool.request_docs(c.ids) d ON d.id = x.id
                  ORDER BY x.n;
END $$;
COMMENT ON FUNCTION respool.create_requests(jsonb, boolean, integer, timestamptz, boolean) IS
    'Batch create (docs/api.md "Batch create"; docs/engine.md "How a batch is made"): 1 to 1000 create bodies in one transaction, through the one create route (respool._create_members), leaving what creating each in member order would, member i queued i µs after member 0. Any member refused refuses the batch: the same SQLSTATE, naming members[i].<field>. p_all_or_nothing: the members are a gang (docs/scheduling.md; p_distinct_nodes: each on its own node). One row per member, in member order, as it stands once the batch is done.';

CREATE OR REPLACE FUNCTION respool.create_requests_each(
    p_members jsonb,
    p_default_lease_seconds integer DEFAULT NULL,
    p_now timestamptz DEFAULT now())
RETURNS TABLE (member integer, created boolean, request jsonb,
               error_code text, error_field text, error_message text)
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer := respool._batch_count(p_members, p_default_lease_seconds);
    c record;      -- what the create route made
    r record;      -- the members refused before anything is stored
    v_ok integer[];
BEGIN
    BEGIN
        SELECT * INTO c FROM respool._create_members(respool._checked_bodies(p_members, p_default_lease_seconds),
                                                     p_now, NULL, v_count > 1);
        RETURN QUERY
        SELECT (x.n - 1)::integer, CASE WHEN c.codes[x.n] IS NULL THEN c.created[x.n] END, d.doc::jsonb, c.codes[x.n],
               CASE WHEN c.codes[x.n] IS NOT NULL THEN 'idempotency_key' END, c.messages[x.n]
          FROM unnest(c.ids) WITH ORDINALITY x(id, n)
          LEFT JOIN respool.request_docs(c.ids) d ON d.id = x.id AND c.codes[x.n] IS NULL
         ORDER BY x.n;
        RETURN;
    EXCEPTION WHEN SQLSTATE 'RP400' OR SQLSTATE 'RP404' OR SQLSTATE 'RP409' OR SQLSTATE 'RP422' THEN
        NULL;  -- refused members (nothing of it kept): found member by member below
    END;
    SELECT * INTO r FROM respool._member_refusals(p_members, p_default_lease_seconds);
    v_ok := ARRAY(SELECT i FROM generate_subscripts(r.bodies, 1) i WHERE r.codes[i] IS NULL ORDER BY i);
    -- The others made together, each at its own queue instant (member i: i µs after member 0).
    SELECT NULL::uuid[] AS ids, NULL::boolean[] AS created, NULL::text[] AS codes, NULL::text[] AS messages INTO c;
    IF cardinality(v_ok) > 0 THEN
        SELECT * INTO c FROM respool._create_members(ARRAY(SELECT r.bodies[i] FROM unnest(v_ok) i), p_now, NULL,
                                                     v_count > 1, ARRAY(SELECT i - 1 FROM unnest(v_ok) i));
    END IF;
    RETURN QUERY
    SELECT (x.n - 1)::integer, CASE WHEN c.codes[k.k] IS NULL THEN c.created[k.k] END, d.doc::jsonb,
           coalesce(r.codes[x.n], c.codes[k.k]),
           CASE WHEN r.codes[x.n] IS NOT NULL THEN r.fields[x.n] WHEN c.codes[k.k] IS NOT NULL THEN 'idempotency_key' END,
           coalesce(r.messages[x.n], c.messages[k.k])
      FROM generate_subscripts(r.codes, 1) x(n)
      LEFT JOIN unnest(v_ok) WITH ORDINALITY k(n, k) ON k.n = x.n
      LEFT JOIN respool.request_docs(c.ids) d ON d.id = c.ids[k.k] AND c.codes[k.k] IS NULL
     ORDER BY x.n;
END $$;
COMMENT ON FUNCTION respool.create_requests_each(jsonb, integer, timestamptz) IS
    'Creates (or replays) each of 1 to 1000 create bodies in one transaction, in member order, exactly as its own respool.create_request would right after the members before it (the one create route, respool._create_members). One row per member: created and its document once all are done, or the SQLSTATE (RP400/RP404/RP409/RP422), field and message its single create raises, that member changing nothing. Any other error fails the call. See docs/engine.md ("How a batch reports each member").';

CREATE OR REPLACE FUNCTION respool.what_if_request(
    p_body jsonb,
    p_default_lease_seconds integer DEFAULT NULL,
    p_now timestamptz DEFAULT now())
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_request jsonb;
    v_victims jsonb := '[]';
    v_last_event bigint;
    v_pool uuid;
    c record;
BEGIN
    BEGIN
        SELECT * INTO c FROM respool.create_request(p_body, p_default_lease_seconds, p_now);
        v_request := c.request;
        IF c.created AND v_request ->> 'status' = 'queued' THEN
            -- The reconciler's next pass over each of its candidate pools: who would it preempt
            -- for this request? (Its pools are locked by the create already.)
            v_last_event := coalesce((SELECT max(id) FROM respool.events), 0);
            FOR v_pool IN SELECT e.pool_id FROM respool.queue_entries e
                           WHERE e.request_id = (v_request ->> 'id')::uuid ORDER BY e.pool_id LOOP
                CONTINUE WHEN NOT EXISTS (SELECT FROM respool.requests
                                           WHERE id = (v_request ->> 'id')::uuid AND status = 'queued');
                PERFORM respool.reconcile_pool(v_pool, p_now);
            END LOOP;
            SELECT coalesce(jsonb_agg(jsonb_build_object('id', r.id, 'subject', r.subject, 'pool', r.pool_name,
                                                         'resources', r.resources)
                                      ORDER BY ev.id), '[]')
              INTO v_victims
              FROM respool.events ev JOIN respool.requests r ON r.id = ev.request_id
             WHERE ev.id > v_last_event AND ev.to_status IN ('preempting', 'preempted')
               AND ev.cause_request_id = (v_request ->> 'id')::uuid;
        END IF;
        RAISE EXCEPTION 'what-if: roll back' USING ERRCODE = 'RP299';
    EXCEPTION WHEN SQLSTATE 'RP299' THEN
        NULL;  -- rolled back: nothing of it remains
    END;
    RETURN v_request || jsonb_build_object('would_preempt', v_victims);
END $$;
COMMENT ON FUNCTION respool.what_if_request(jsonb, integer, timestamptz) IS
    'What-if (docs/scheduling.md): what respool.create_request would answer now for the same create body (status, pool, queue position, message, reason, eta) plus would_preempt, the allocations (id, subject, pool, resources) the reconciler''s next pass would preempt for it (their events'' cause_request_id); computed by the real create and reconcile in a rolled-back subtransaction: no row, event or NOTIFY remains. Input errors raise as for a create.';
