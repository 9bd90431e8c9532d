-- Creating requests: one create body, as a JSON document, from the HTTP edge to the engine.
-- One function creates a request from that document, alone or as a batch member:
-- respool.create_request (respool.create_requests makes a batch set-based, respool._create_set
-- in 045_create_set.sql, with the outcome of calling it per member in member order, and calls it
-- per member where that cannot be decided set-based; respool.create_requests_each does the same
-- but refuses a member alone and answers a row per member); respool._create_body, which all call,
-- is the one place on the server that checks the body's fields and types and fills its defaults.
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

CREATE OR REPLACE FUNCTION respool._replay(p_existing respool.requests, p_body jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_existing.request_body IS DISTINCT FROM p_body THEN
        PERFORM respool._fail('RP422', 'idempotency_key', format(
            'idempotency_key %L was already used by request %s with a different body',
            p_existing.idempotency_key, p_existing.id));
    END IF;
    RETURN respool.request_json(p_existing.id);
END $$;
COMMENT ON FUNCTION respool._replay(respool.requests, jsonb) IS
    'An idempotent retry: the existing request when the body matches, RP422 otherwise.';

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
    IF jsonb_typeof(p_body -> 'pool') NOT IN ('string', 'null') THEN
        PERFORM respool._fail('RP400', 'pool', 'pool must be a string or null');
    END IF;
    IF jsonb_typeof(p_body -> 'idempotency_key') NOT IN ('string', 'null')
       OR length(p_body ->> 'idempotency_key') NOT BETWEEN 1 AND respool._max_key_length() THEN
        PERFORM respool._fail('RP400', 'idempotency_key',
                              format('idempotency_key must have 1 to %s characters', respool._max_key_length()));
    END IF;
    -- The contents of resources, settings and labels: respool.build_resources and
    -- respool._labels check them, naming the key.
    IF jsonb_typeof(p_body -> 'resources') NOT IN ('object', 'null') THEN
        PERFORM respool._fail('RP400', 'resources', 'resources must be an object or null');
    END IF;
    IF jsonb_typeof(p_body -> 'settings') NOT IN ('object', 'null') THEN
        PERFORM respool._fail('RP400', 'settings', 'settings must be an object or null');
    END IF;
    IF jsonb_typeof(p_body -> 'labels') NOT IN ('object', 'null') THEN
        PERFORM respool._fail('RP400', 'labels', 'labels must be an object or null');
    END IF;
    IF jsonb_typeof(p_body -> 'node_selector') NOT IN ('object', 'null') THEN
        PERFORM respool._fail('RP400', 'node_selector', 'node_selector must be an object of label: value, or null');
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

CREATE OR REPLACE FUNCTION respool._create_checked(
    p_checked jsonb,
    p_now timestamptz,
    p_gang_id uuid,
    p_answer boolean,
    OUT created boolean,
    OUT request jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    v_in jsonb := p_checked;
    v_subject text := v_in ->> 'subject';
    v_pool_ref text := v_in ->> 'pool';
    v_preemptible boolean := (v_in ->> 'preemptible')::boolean;
    v_max_retries integer := (v_in ->> 'max_retries')::integer;
    v_lease_seconds integer := (v_in ->> 'lease_seconds')::integer;
    v_max_seconds integer := (v_in ->> 'max_seconds')::integer;
    v_key text := v_in ->> 'idempotency_key';
    v_group text := v_in ->> 'preemption_group';
    v_resources jsonb; v_labels jsonb; v_selector jsonb; v_body jsonb;
    v_pool_id uuid;
    v_all uuid[];
    v_ok uuid[] := '{}';
    v_first_reason text;
    v_messages text[] := '{}';
    v_names text[] := '{}';
    v_first_policy uuid;  -- the first candidate's policy: the highest priority among them
    v_at_pool uuid;       -- the first admitted candidate, where a grant at once is tried
    v_at_policy uuid;
    r respool.requests;
    c record;
BEGIN
    v_resources := respool.build_resources(nullif(v_in -> 'resources', 'null'), nullif(v_in -> 'settings', 'null'));
    v_labels := respool._labels(v_in -> 'labels');
    v_selector := respool.build_node_selector(v_in -> 'node_selector', nullif(v_in -> 'settings', 'null'));
    v_body := respool._request_body(v_pool_ref, v_resources, v_preemptible, v_max_retries, v_lease_seconds, v_labels,
                                    v_max_seconds, v_selector, v_group);
    IF v_key IS NOT NULL THEN
        PERFORM respool._claim_keys(ARRAY[v_in]);  -- (a batch claimed them all already, in order)
        SELECT * INTO r FROM respool.requests WHERE subject = v_subject AND idempotency_key = v_key;
        IF FOUND THEN
            created := false;
            request := respool._replay(r, v_body);
            RETURN;
        END IF;
    END IF;

    IF v_pool_ref IS NOT NULL THEN
        v_pool_id := respool.resolve_pool(v_pool_ref);
    END IF;
    SELECT array_agg(s.pool_id ORDER BY s.pool_id) INTO v_all
      FROM respool._subject_policies(v_subject) s WHERE v_pool_id IS NULL OR s.pool_id = v_pool_id;
    v_all := coalesce(v_all, '{}');
    -- Validate under the pool locks, so a concurrent capacity or policy change cannot slip between.
    PERFORM respool._lock_pools(v_all);
    FOR c IN SELECT * FROM respool._candidate_rejections(v_subject, v_all, v_resources, v_preemptible, v_selector) LOOP
        v_first_policy := coalesce(v_first_policy, c.policy_id);
        v_names := v_names || c.pool_name;
        IF c.reason IS NULL THEN
            v_ok := v_ok || c.pool_id;
            v_at_pool := coalesce(v_at_pool, c.pool_id);
            v_at_policy := coalesce(v_at_policy, c.policy_id);
        ELSE
            v_first_reason := coalesce(v_first_reason, c.reason);
            v_messages := v_messages || c.message;
        END IF;
    END LOOP;
    IF cardinality(v_names) = 0 THEN
        v_first_reason := 'no_policy';
        v_messages := ARRAY[CASE WHEN v_pool_ref IS NULL
                                 THEN format('subject %s has no policy on any pool', v_subject)
                                 ELSE format('subject %s has no policy on pool %s', v_subject, v_pool_ref) END];
    END IF;

    INSERT INTO respool.requests (subject, pool_ref, pool_id, pool_name, candidate_pool_ids, resources,
                                  preemptible, priority, status, reason, message, max_retries, lease_seconds,
                                  max_seconds, idempotency_key, request_body, labels, queued_at, created_at, updated_at,
                                  finished_at, gang_id, node_selector, preemption_group)
    VALUES (v_subject, v_pool_ref,
            CASE WHEN cardinality(v_all) = 1 THEN v_all[1] ELSE v_pool_id END,
            CASE WHEN cardinality(v_names) = 1 THEN v_names[1]
                 WHEN v_pool_id IS NOT NULL THEN (SELECT name FROM respool.pools WHERE id = v_pool_id) END,
            v_ok, v_resources, v_preemptible,
            coalesce((SELECT p.priority FROM respool.policies p WHERE p.id = v_first_policy), 0),
            CASE WHEN cardinality(v_ok) = 0 THEN 'rejected' ELSE 'queued' END,
            CASE WHEN cardinality(v_ok) = 0 THEN v_first_reason END,
            CASE WHEN cardinality(v_ok) = 0 THEN array_to_string(v_messages, '; ') ELSE '' END,
            v_max_retries, v_lease_seconds, v_max_seconds, v_key, v_body, v_labels, p_now, p_now, p_now,
            CASE WHEN cardinality(v_ok) = 0 THEN p_now END, p_gang_id, v_selector, v_group)
    ON CONFLICT ON CONSTRAINT idempotency DO NOTHING
    RETURNING * INTO r;
    IF NOT FOUND THEN
        -- A concurrent create with the same key committed first; ON CONFLICT waited for it.
        SELECT * INTO r FROM respool.requests WHERE subject = v_subject AND idempotency_key = v_key;
        created := false;
        request := respool._replay(r, v_body);
        RETURN;
    END IF;
    -- Until this call answers, nobody knows the request: its own changes are not notified.
    PERFORM set_config('respool.unannounced', r.id::text, true);
    PERFORM respool._record_event(r, NULL, p_now);
    PERFORM respool._job_store(r.id, v_in -> 'job');  -- before any grant (docs/jobs.md)

    -- Granted at once where nobody queues in its first admitted candidate; a gang member waits for its gang.
    IF r.status = 'queued' AND p_gang_id IS NULL
       AND (v_at_pool IS NULL OR EXISTS (SELECT FROM respool.queue_entries WHERE pool_id = v_at_pool)
            OR respool._try_grant(r.id, v_at_pool, v_at_policy, p_now, r) <> 'granted') THEN
        -- Its queue entries: one per candidate that the checks above admitted (v_ok), under
        -- the same pool locks (what respool._enqueue would find, without checking again).
        INSERT INTO respool.queue_entries (pool_id, request_id, policy_id, queued_at, resources, preemptible,
                                           node_selector)
        SELECT s.pool_id, r.id, s.policy_id, r.queued_at, r.resources, r.preemptible, r.node_selector
          FROM respool._subject_policies(r.subject) s WHERE s.pool_id = ANY (v_ok);
        PERFORM respool._try_new(r.id, p_now);
    END IF;
    PERFORM set_config('respool.unannounced', '', true);
    created := true;
    request := CASE WHEN p_answer THEN respool.request_json(r.id) ELSE jsonb_build_object('id', r.id) END;
END $$;
COMMENT ON FUNCTION respool._create_checked(jsonb, timestamptz, uuid, boolean) IS
    'respool.create_request after its body check: p_checked is a body respool._create_body has checked and completed (a batch checks every member first and hands each over here, so no member is checked twice). Everything else create_request says holds here.';

CREATE OR REPLACE FUNCTION respool.create_request(
    p_body jsonb,
    p_default_lease_seconds integer DEFAULT NULL,
    p_now timestamptz DEFAULT now(),
    p_gang_id uuid DEFAULT NULL,
    p_answer boolean DEFAULT true,
    OUT created boolean,
    OUT request jsonb)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT c.created, c.request INTO created, request
      FROM respool._create_checked(respool._create_body(p_body, p_default_lease_seconds), p_now, p_gang_id,
                                   p_answer) c;
END $$;
COMMENT ON FUNCTION respool.create_request(jsonb, integer, timestamptz, uuid, boolean) IS
    'Creates (or replays, by idempotency key: RP422 on another body) one request from its create body, the fields of POST /v1/requests (docs/api.md), checked by respool._create_body (absent lease_seconds: p_default_lease_seconds) and made by respool._create_checked, as every batch member is: stored rejected or queued under its candidate pools'' locks, then granted at once where it fits (docs/engine.md, Functions). p_gang_id: a gang member, left to respool._gang_start. p_answer false: answers {"id"} only. Returns created (false for a replay) and the document.';

CREATE OR REPLACE FUNCTION respool._claim_keys(p_bodies jsonb[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- Only when a body names a key: a create without one takes no lock here.
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

CREATE OR REPLACE FUNCTION respool._try_create_set(p_members jsonb, p_default_lease_seconds integer,
                                                   p_now timestamptz, p_lock_subject_pools boolean,
                                                   OUT ids uuid[], OUT created boolean[])
LANGUAGE plpgsql AS $$
DECLARE
    v_state text;
BEGIN
    SELECT array_agg(s.request_id ORDER BY s.member), array_agg(s.created ORDER BY s.member)
      INTO ids, created
      FROM respool._create_set(p_members, p_default_lease_seconds, p_now, p_lock_subject_pools) s;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE;
    -- (42501: a role without the TEMPORARY privilege its work tables need.)
    IF v_state NOT IN ('RP298', 'RP400', 'RP404', 'RP409', 'RP422', '42501') THEN
        RAISE;
    END IF;
    ids := NULL;
    created := NULL;
END $$;
COMMENT ON FUNCTION respool._try_create_set(jsonb, integer, timestamptz, boolean) IS
    'respool._create_set in a subtransaction (docs/engine.md, "How a batch is made"): the members'' request ids and created flags in member order, or both NULL, nothing kept, where it gives way (RP298, a refused member, no TEMPORARY privilege); the caller then creates the members one by one. Any other error is raised.';

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
    v_at integer := 0;
    v_bodies jsonb[] := '{}';
    m jsonb;
    v_state text;
    v_message text;
    v_column text;
    v_gang uuid;       -- all_or_nothing: the members' gang
    v_pool uuid;
    v_ids uuid[] := '{}';
    v_created boolean[] := '{}';
    c record;
BEGIN
    v_count := respool._batch_count(p_members, p_default_lease_seconds);
    IF coalesce(p_distinct_nodes, false) AND NOT coalesce(p_all_or_nothing, false) THEN
        PERFORM respool._fail('RP400', 'distinct_nodes',
            'distinct_nodes places the members of a gang on different nodes: it needs all_or_nothing true');
    END IF;

    IF NOT coalesce(p_all_or_nothing, false) THEN
        -- Set-based first; where it gives way (nothing of it kept), the members are created one
        -- by one below, which also names the first refused member.
        SELECT s.ids, s.created INTO v_ids, v_created
          FROM respool._try_create_set(p_members, p_default_lease_seconds, p_now, v_count > 1) s;
        IF v_ids IS NOT NULL THEN
            RETURN QUERY SELECT (x.n - 1)::integer, v_created[x.n], d.doc::jsonb
                           FROM unnest(v_ids) WITH ORDINALITY x(id, n)
                           JOIN respool.request_docs(v_ids) d ON d.id = x.id
                          ORDER BY x.n;
            RETURN;
        END IF;
        v_ids := '{}';
        v_created := '{}';
    END IF;
    BEGIN
        -- Every body checked and completed first, so a malformed member refuses the batch
        -- before any work.
        FOR i IN 0 .. v_count - 1 LOOP
            v_at := i;  -- (a FOR variable is not visible in the handler below)
            v_bodies := v_bodies || respool._create_body(p_members -> i, p_default_lease_seconds);
        END LOOP;
        PERFORM respool._claim_keys(v_bodies);
        IF v_count > 1 THEN
            -- Every pool any member may be created in, locked up front in id order: each member
            -- then locks a subset it already holds, so members that name different pools never
            -- take pool locks out of the global order (no deadlock with other writers).
            PERFORM respool._lock_pools(respool._batch_pools(v_bodies));
        END IF;
        IF coalesce(p_all_or_nothing, false) THEN
            -- A gang is one request in many parts: one subject, one pool (or none named, so the
            -- same candidates), one preemptible flag and one retry budget for all.
            m := v_bodies[1];
            v_pool := CASE WHEN m ->> 'pool' IS NOT NULL THEN respool.resolve_pool(m ->> 'pool') END;
            FOR i IN 1 .. v_count - 1 LOOP
                v_at := i;
                PERFORM respool._gang_member_check(m, v_bodies[i + 1], v_pool);
            END LOOP;
            v_gang := gen_random_uuid();
        END IF;
        FOR i IN 0 .. v_count - 1 LOOP
            v_at := i;
            -- Member i is queued i microseconds after member 0: queue time then keeps member
            -- order among members that are otherwise alike (ids are random).
            SELECT * INTO c FROM respool._create_checked(v_bodies[i + 1],
                                                          p_now + make_interval(secs => i / 1000000.0), v_gang, false);
            v_ids := v_ids || (c.request ->> 'id')::uuid;
            v_created := v_created || c.created;
            IF v_gang IS NOT NULL THEN
                -- An idempotent retry of a gang answers that gang: every member a replay of it.
                IF c.created IS DISTINCT FROM v_created[1]
                   OR (NOT c.created AND (c.request ->> 'gang_id') IS DISTINCT FROM
                                         (SELECT gang_id::text FROM respool.requests WHERE id = v_ids[1])) THEN
                    PERFORM respool._fail('RP422', 'idempotency_key', format(
                        'idempotency_key %L is used by request %s, which is not a member of the gang the other members make',
                        v_bodies[i + 1] ->> 'idempotency_key', c.request ->> 'id'));
                END IF;
            END IF;
        END LOOP;
        IF v_gang IS NOT NULL THEN
            v_at := 0;
            IF v_created[1] THEN
                IF p_distinct_nodes THEN
                    UPDATE respool.requests SET distinct_nodes = true WHERE gang_id = v_gang;
                END IF;
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
COMMENT ON FUNCTION respool.create_requests(jsonb, boolean, integer, timestamptz, boolean) IS
    'Batch create (docs/api.md "Batch create"; docs/engine.md "How a batch is made"): 1 to 1000 create bodies in one transaction, each as its own respool.create_request in member order, member i queued i µs after member 0; set-based where respool._try_create_set can, else member by member. Any member error refuses the batch: the same SQLSTATE, naming members[i].<field>. p_all_or_nothing: the members are a gang (docs/scheduling.md; p_distinct_nodes: each on its own node). One row per member, in member order, as it stands once the batch is done.';

CREATE OR REPLACE FUNCTION respool.create_requests_each(
    p_members jsonb,
    p_default_lease_seconds integer DEFAULT NULL,
    p_now timestamptz DEFAULT now())
RETURNS TABLE (member integer, created boolean, request jsonb,
               error_code text, error_field text, error_message text)
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer := respool._batch_count(p_members, p_default_lease_seconds);
    v_ids uuid[];
    v_created boolean[];
    v_bodies jsonb[] := '{}';
    v_codes text[] := '{}';     -- per member: the SQLSTATE of its refusal, or NULL
    v_fields text[] := '{}';
    v_messages text[] := '{}';
    v_state text;
    v_message text;
    v_column text;
    v_from integer := 1;        -- the run of members [v_from, v_to) tried in one subtransaction
    v_to integer;
    v_at integer;
    c record;
BEGIN
    SELECT s.ids, s.created INTO v_ids, v_created
      FROM respool._try_create_set(p_members, p_default_lease_seconds, p_now, v_count > 1) s;
    IF v_ids IS NULL THEN
        v_ids := array_fill(NULL::uuid, ARRAY[v_count]);
        v_created := array_fill(NULL::boolean, ARRAY[v_count]);
        FOR i IN 1 .. v_count LOOP
            BEGIN
                v_bodies[i] := respool._create_body(p_members -> (i - 1), p_default_lease_seconds);
            EXCEPTION WHEN SQLSTATE 'RP400' OR SQLSTATE 'RP404' OR SQLSTATE 'RP409' OR SQLSTATE 'RP422' THEN
                GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT,
                                        v_column = COLUMN_NAME;
                v_codes[i] := v_state;
                v_messages[i] := v_message;
                v_fields[i] := v_column;
            END;
        END LOOP;
        -- Keys and pools of the checked members taken up front, in their global orders, as a
        -- batch does (respool.create_requests).
        PERFORM respool._claim_keys(array_remove(v_bodies, NULL));
        IF v_count > 1 THEN
            PERFORM respool._lock_pools(respool._batch_pools(array_remove(v_bodies, NULL)));
        END IF;
        -- Runs of members, each in one subtransaction. A run stopped by a refused member is
        -- rolled back and run again up to it, then that member is tried first in a run of its
        -- own: refused there, right after the members kept, it gets its single create's error
        -- (named in the state it sees, ids included) and changes nothing; the rest go on after it.
        v_to := v_count + 1;
        WHILE v_from <= v_count LOOP
            BEGIN
                FOR i IN v_from .. v_to - 1 LOOP
                    CONTINUE WHEN v_codes[i] IS NOT NULL;
                    v_at := i;
                    -- Member i queued i - 1 microseconds after member 0, as in a batch.
                    SELECT * INTO c FROM respool._create_checked(
                        v_bodies[i], p_now + make_interval(secs => (i - 1) / 1000000.0), NULL, false);
                    v_ids[i] := (c.request ->> 'id')::uuid;
                    v_created[i] := c.created;
                END LOOP;
                v_from := v_to;
                v_to := v_count + 1;
            EXCEPTION WHEN SQLSTATE 'RP400' OR SQLSTATE 'RP404' OR SQLSTATE 'RP409' OR SQLSTATE 'RP422' THEN
                GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT,
                                        v_column = COLUMN_NAME;
                FOR i IN v_from .. v_to - 1 LOOP
                    v_ids[i] := NULL;
                    v_created[i] := NULL;
                END LOOP;
                IF v_at = v_from THEN
                    v_codes[v_at] := v_state;
                    v_messages[v_at] := v_message;
                    v_fields[v_at] := v_column;
                    v_from := v_at + 1;
                    v_to := v_count + 1;
                ELSE
                    v_to := v_at;
                END IF;
            END;
        END LOOP;
    END IF;
    RETURN QUERY
    SELECT (x.n - 1)::integer, v_created[x.n], d.doc::jsonb,
           v_codes[x.n], nullif(v_fields[x.n], ''), v_messages[x.n]
      FROM unnest(v_ids) WITH ORDINALITY x(id, n)
      LEFT JOIN respool.request_docs(array_remove(v_ids, NULL)) d ON d.id = x.id
     ORDER BY x.n;
END $$;
COMMENT ON FUNCTION respool.create_requests_each(jsonb, integer, timestamptz) IS
    'Creates (or replays) each of 1 to 1000 create bodies in one transaction, in member order, exactly as its own respool.create_request would right after the members before it. One row per member: created and its document once all are done, or the SQLSTATE (RP400/RP404/RP409/RP422), field and message its single create raises, that member changing nothing. Any other error fails the call. See docs/engine.md ("How a batch reports each member").';

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
