-- The request document: one request as the API shows it (status, position, blocker, ETA).

DROP FUNCTION IF EXISTS respool._request_json(uuid, jsonb);

CREATE OR REPLACE FUNCTION respool._placement_doc(p_request_id uuid)
RETURNS json LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- PL/pgSQL, not SQL: a SQL function with a FROM clause is not inlined, and before
    -- PostgreSQL 18 its body is planned again on every call (every answer of a holding request).
    RETURN respool._placement_json(p_request_id)::json;  -- (NULL without a placement: one probe)
END $$;
COMMENT ON FUNCTION respool._placement_doc(uuid) IS 'Where a holding request is placed (docs/placement.md): respool._placement_json, {"node", "labels", "devices", "slices", "isolation"}; NULL when it has no placement (a pool without nodes, or not holding). Read-only.';

CREATE OR REPLACE FUNCTION respool._job_doc(r respool.requests)
RETURNS json LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- never the env values, only their names
    RETURN json_build_object(
        'command', r.command, 'workdir', r.workdir, 'name', r.job_name,
        'env_keys', (SELECT coalesce(json_agg(k ORDER BY k), '[]') FROM jsonb_object_keys(r.job_env) k),
        'array_index', r.array_index,
        'claimed', CASE WHEN r.claimed_attempt IS NOT NULL THEN json_build_object(
            'node', (SELECT n.name FROM respool.nodes n WHERE n.id = r.claimed_node_id),
            'attempt', r.claimed_attempt, 'at', r.claimed_at) END);
END $$;
COMMENT ON FUNCTION respool._job_doc(respool.requests) IS
    'The job part of a request''s document (docs/jobs.md): command, workdir, name, the names of its env (never the values), array_index and its claim. Read-only.';

CREATE OR REPLACE FUNCTION respool._request_doc(r respool.requests, p_position bigint, p_message text,
                                                p_eta jsonb)
RETURNS json LANGUAGE sql STABLE AS $$
    -- SQL with no sub-select: inlined into the statement that builds the document (a PL/pgSQL
    -- function, or a SQL one that is not inlined, costs a call per document).
    -- json, not jsonb: built as text in one go (a page of 1,000 is aggregated with json_agg and
    -- sent as it is; jsonb took three times as long to build and print).
    SELECT json_build_object(
        'id', r.id, 'subject', r.subject, 'pool', r.pool_name, 'pool_id', r.pool_id,
        'policy_id', r.policy_id, 'resources', r.resources, 'preemptible', r.preemptible,
        'priority', r.priority, 'status', r.status, 'reason', r.reason, 'message', coalesce(p_message, ''),
        'queue_position', p_position, 'attempt', r.attempt, 'max_retries', r.max_retries,
        'lease_seconds', r.lease_seconds, 'lease_expires_at', r.lease_expires_at,
        'preempt_deadline', r.preempt_deadline, 'idempotency_key', r.idempotency_key,
        'labels', r.labels, 'version', r.version, 'created_at', r.created_at,
        'updated_at', r.updated_at, 'allocated_at', r.allocated_at, 'finished_at', r.finished_at,
        'max_seconds', r.max_seconds, 'run_deadline', r.run_deadline, 'eta', p_eta, 'gang_id', r.gang_id,
        'node_selector', r.node_selector, 'preemption_group', r.preemption_group,
        'placement', CASE WHEN r.status IN ('allocated', 'preempting') THEN respool._placement_doc(r.id) END,
        -- where it ran last, once it no longer holds units (docs/placement.md, "Where a request ran")
        'last_placement', CASE WHEN r.status NOT IN ('allocated', 'preempting') THEN r.last_placement END,
        'job', CASE WHEN r.command IS NOT NULL THEN respool._job_doc(r) END,  -- a job (docs/jobs.md)
        'exit_code', r.exit_code)
$$;
COMMENT ON FUNCTION respool._request_doc(respool.requests, bigint, text, jsonb) IS 'The one JSON shape of a request as the API shows it, from its row, its placement (respool._placement_doc, while it holds units; after, last_placement, where it held units the last time) and the computed queue position, message (NULL: empty) and ETA: shared by the one-request read (as jsonb) and the page read (json_agg), so both give the same document.';

CREATE OR REPLACE FUNCTION respool._request_json(p_id uuid)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    r respool.requests;
    q respool.requests;
    v_position bigint;
    v_message text;
    v_pools integer;
    v_eta jsonb;
BEGIN
    SELECT * INTO r FROM respool.requests WHERE id = p_id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_message := r.message;
    IF r.status = 'queued' THEN
        -- gangs (docs/scheduling.md): a gang member waits as its gang: the entries of the gang's stand-in.
        q := CASE WHEN r.gang_id IS NULL THEN r ELSE respool._queued_as(r.id) END;
        -- One request on its own: positions by counting what is ahead (_queue_position), the ETA
        -- simulation stopped at it. respool._queued_details gives the same for a page at once.
        SELECT count(*) INTO v_pools FROM respool.queue_entries WHERE request_id = q.id;
        SELECT min(o.position),
               string_agg(CASE WHEN v_pools > 1 THEN pl.name || ': ' ELSE '' END
                          || CASE WHEN q.earmark_pool_id = e.pool_id
                                  THEN 'preempted units are being released for it'
                                  ELSE coalesce(respool._blocker(e.resources, e.preemptible, e.pool_id, e.policy_id),
                                                respool._node_blocker(e.resources, e.pool_id,
                                                                      CASE WHEN r.gang_id IS NULL THEN e.node_selector END),
                                                CASE WHEN respool._earmark_blocks(q, e.pool_id)
                                                     THEN 'waiting: freed units are earmarked for a request that preempted others'
                                                     -- starvation guard (docs/scheduling.md): the starvation guard holds it back
                                                     ELSE coalesce(respool._held_back(e.pool_id, q, now()),
                                                                   'fits, waiting for its turn') END) END
                          || CASE WHEN o.position > 1 THEN format('; %s ahead', o.position - 1) ELSE '' END,
                          ' | ' ORDER BY p.priority DESC, pl.name)
          INTO v_position, v_message
          FROM respool.queue_entries e
          JOIN respool.pools pl ON pl.id = e.pool_id
          JOIN respool.policies p ON p.id = e.policy_id
         CROSS JOIN LATERAL (SELECT respool._queue_position(e.pool_id, q.id) AS position OFFSET 0) o
         WHERE e.request_id = q.id;
        IF v_position <= respool._eta_depth() THEN  -- further back: no estimate (respool._eta_depth)
            v_eta := respool._request_eta(q.id, now());  -- docs/scheduling.md, ETA
        END IF;
        IF r.gang_id IS NOT NULL THEN
            v_message := format('gang %s: ', r.gang_id)
                         || coalesce(v_message, 'waiting until every member has given its units back');
        END IF;
    END IF;
    RETURN respool._request_doc(r, v_position, v_message, v_eta)::jsonb;
END $$;
COMMENT ON FUNCTION respool._request_json(uuid) IS 'A request as the API shows it; for a queued one, its best queue position, what blocks it (or the starvation hold) and its ETA, computed now for this request alone (for a gang member: its gang''s, docs/scheduling.md, gangs).';

CREATE OR REPLACE FUNCTION respool.request_json(p_id uuid)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT respool._request_json(p_id)
$$;
COMMENT ON FUNCTION respool.request_json(uuid) IS 'A request as the API shows it; for a queued one, its best queue position, what blocks it (or the starvation hold) and its ETA, computed now.';

CREATE OR REPLACE FUNCTION respool.get_request(p_id uuid)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    doc jsonb := respool.request_json(p_id);
BEGIN
    IF doc IS NULL THEN
        PERFORM respool._fail('RP404', 'id', format('request %s not found', p_id));
    END IF;
    RETURN doc;
END $$;
COMMENT ON FUNCTION respool.get_request(uuid) IS 'One request (RP404 when unknown).';
