-- Creating a request (with idempotency): validation, candidate pools, the stored request and its
-- first grant attempt (respool._grant_at_once / respool._try_new, 035_queueing.sql).

CREATE OR REPLACE FUNCTION respool._labels(p_labels jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_bad text;
BEGIN
    IF respool._absent_object(p_labels, 'labels', 'labels must be an object of string: string') THEN
        RETURN '{}';
    END IF;
    IF (SELECT count(*) FROM jsonb_object_keys(p_labels)) > respool._max_keys() THEN
        PERFORM respool._fail('RP400', 'labels', 'labels has more than 64 entries');
    END IF;
    SELECT x.key INTO v_bad FROM jsonb_each(p_labels) x
     WHERE jsonb_typeof(x.value) <> 'string' OR length(x.key) NOT BETWEEN 1 AND 128
        OR length(x.value #>> '{}') > 1024
     LIMIT 1;
    IF FOUND THEN
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

CREATE OR REPLACE FUNCTION respool.create_request(
    p_subject text,
    p_pool text DEFAULT NULL,
    p_resources jsonb DEFAULT NULL,
    p_settings jsonb DEFAULT NULL,
    p_preemptible boolean DEFAULT true,
    p_max_retries integer DEFAULT 0,
    p_lease_seconds integer DEFAULT NULL,
    p_idempotency_key text DEFAULT NULL,
    p_labels jsonb DEFAULT NULL,
    p_now timestamptz DEFAULT now(),
    p_max_seconds integer DEFAULT NULL,
    p_gang_id uuid DEFAULT NULL,
    p_answer boolean DEFAULT true,
    OUT created boolean,
    OUT request jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    v_resources jsonb;
    v_labels jsonb;
    v_body jsonb;
    v_pool_id uuid;
    v_all uuid[];
    v_ok uuid[] := '{}';
    v_first_reason text;
    v_messages text[] := '{}';
    v_names text[] := '{}';
    r respool.requests;
    c record;
BEGIN
    IF p_subject IS NULL OR p_subject !~ respool._subject_pattern() THEN
        PERFORM respool._fail('RP400', 'subject', 'subject must match ' || respool._subject_pattern());
    END IF;
    IF p_max_retries IS NULL OR p_max_retries NOT BETWEEN 0 AND respool._max_retries() THEN
        PERFORM respool._fail('RP400', 'max_retries', 'max_retries must be an integer between 0 and ' || respool._max_retries());
    END IF;
    IF p_lease_seconds IS NOT NULL AND p_lease_seconds NOT BETWEEN 1 AND respool._max_seconds() THEN
        PERFORM respool._fail('RP400', 'lease_seconds', format('lease_seconds must be between 1 and %s (or null for no lease)', respool._max_seconds()));
    END IF;
    IF p_max_seconds IS NOT NULL AND p_max_seconds NOT BETWEEN 1 AND respool._max_seconds() THEN
        PERFORM respool._fail('RP400', 'max_seconds', format('max_seconds must be between 1 and %s (or null for no cap)', respool._max_seconds()));
    END IF;
    IF p_idempotency_key IS NOT NULL AND length(p_idempotency_key) NOT BETWEEN 1 AND 200 THEN
        PERFORM respool._fail('RP400', 'idempotency_key', 'idempotency_key must have 1 to 200 characters');
    END IF;
    v_resources := respool.build_resources(p_resources, p_settings);
    v_labels := respool._labels(p_labels);
    v_body := jsonb_build_object('pool', p_pool, 'resources', v_resources, 'preemptible', coalesce(p_preemptible, true),
                                 'max_retries', p_max_retries, 'lease_seconds', p_lease_seconds, 'labels', v_labels)
              -- max_seconds only when set, so bodies stored before it existed still compare equal
              || CASE WHEN p_max_seconds IS NOT NULL THEN jsonb_build_object('max_seconds', p_max_seconds)
                      ELSE '{}' END;

    IF p_idempotency_key IS NOT NULL THEN
        SELECT * INTO r FROM respool.requests WHERE subject = p_subject AND idempotency_key = p_idempotency_key;
        IF FOUND THEN
            created := false;
            request := respool._replay(r, v_body);
            RETURN;
        END IF;
    END IF;

    IF p_pool IS NOT NULL THEN
        v_pool_id := respool.resolve_pool(p_pool);
    END IF;
    SELECT array_agg(pool_id ORDER BY pool_id) INTO v_all
      FROM respool.policies WHERE subject = p_subject AND (v_pool_id IS NULL OR pool_id = v_pool_id);
    v_all := coalesce(v_all, '{}');
    -- Validate under the pool locks, so a concurrent capacity or policy change cannot slip between.
    PERFORM respool._lock_pools(v_all);
    FOR c IN SELECT * FROM respool._candidate_rejections(p_subject, v_all, v_resources, coalesce(p_preemptible, true)) LOOP
        v_names := v_names || c.pool_name;
        IF c.reason IS NULL THEN
            v_ok := v_ok || c.pool_id;
        ELSE
            v_first_reason := coalesce(v_first_reason, c.reason);
            v_messages := v_messages || c.message;
        END IF;
    END LOOP;
    IF cardinality(v_names) = 0 THEN
        v_first_reason := 'no_policy';
        v_messages := ARRAY[CASE WHEN p_pool IS NULL
                                 THEN format('subject %s has no policy on any pool', p_subject)
                                 ELSE format('subject %s has no policy on pool %s', p_subject, p_pool) END];
    END IF;

    INSERT INTO respool.requests (subject, pool_ref, pool_id, pool_name, candidate_pool_ids, resources,
                                  preemptible, priority, status, reason, message, max_retries, lease_seconds,
                                  max_seconds, idempotency_key, request_body, labels, queued_at, created_at, updated_at,
                                  finished_at, gang_id)
    VALUES (p_subject, p_pool,
            CASE WHEN cardinality(v_all) = 1 THEN v_all[1] ELSE v_pool_id END,
            CASE WHEN cardinality(v_names) = 1 THEN v_names[1]
                 WHEN v_pool_id IS NOT NULL THEN (SELECT name FROM respool.pools WHERE id = v_pool_id) END,
            v_ok, v_resources, coalesce(p_preemptible, true),
            coalesce((SELECT max(priority) FROM respool.policies
                       WHERE subject = p_subject AND pool_id = ANY (v_all)), 0),
            CASE WHEN cardinality(v_ok) = 0 THEN 'rejected' ELSE 'queued' END,
            CASE WHEN cardinality(v_ok) = 0 THEN v_first_reason END,
            CASE WHEN cardinality(v_ok) = 0 THEN array_to_string(v_messages, '; ') ELSE '' END,
            p_max_retries, p_lease_seconds, p_max_seconds, p_idempotency_key, v_body, v_labels, p_now, p_now, p_now,
            CASE WHEN cardinality(v_ok) = 0 THEN p_now END, p_gang_id)
    ON CONFLICT ON CONSTRAINT idempotency DO NOTHING
    RETURNING * INTO r;
    IF NOT FOUND THEN
        -- A concurrent create with the same key committed first; ON CONFLICT waited for it.
        SELECT * INTO r FROM respool.requests WHERE subject = p_subject AND idempotency_key = p_idempotency_key;
        created := false;
        request := respool._replay(r, v_body);
        RETURN;
    END IF;
    -- Until this call answers, nobody knows the request: its own changes are not notified.
    PERFORM set_config('respool.unannounced', r.id::text, true);
    PERFORM respool._record_event(r, NULL, p_now);

    -- [SPEC §11.6] a gang member waits for its gang (respool._gang_start queues and grants it).
    IF r.status = 'queued' AND p_gang_id IS NULL AND NOT respool._grant_at_once(r, p_now) THEN
        -- Its queue entries: one per candidate that the checks above admitted (v_ok), under
        -- the same pool locks (what respool._enqueue would find, without checking again).
        INSERT INTO respool.queue_entries (pool_id, request_id, policy_id, queued_at, resources, preemptible)
        SELECT p.pool_id, r.id, p.id, r.queued_at, r.resources, r.preemptible
          FROM respool.policies p WHERE p.subject = r.subject AND p.pool_id = ANY (v_ok);
        PERFORM respool._try_new(r.id, p_now);
    END IF;
    PERFORM set_config('respool.unannounced', '', true);
    created := true;
    request := CASE WHEN p_answer THEN respool.request_json(r.id) ELSE jsonb_build_object('id', r.id) END;
END $$;
COMMENT ON FUNCTION respool.create_request(text, text, jsonb, jsonb, boolean, integer, integer, text, jsonb, timestamptz, integer, uuid, boolean) IS
    'Creates a request in one transaction: validates and converts input, claims the idempotency key (the same request on a retry, RP422 on another body), resolves candidate pools, stores a rejection or queues it, then tries to grant it at once in candidate order (unless a best_effort pool holds for a starving head, SPEC §11.1). The request''s own status changes in this call are recorded as events but not notified (nobody can wait for it yet; the answer carries them). With p_gang_id the request is stored as a member of that gang, without queue entries and without a grant: respool._gang_start decides for the whole gang (SPEC §11.6). p_answer false: a new request answers {"id"} only (a batch builds its members'' documents at once).';
