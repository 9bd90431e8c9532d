-- Reads of requests: filtered lists and a request's event history.

CREATE OR REPLACE FUNCTION respool.list_requests(p_pool text DEFAULT NULL, p_subject text DEFAULT NULL,
                                                 p_status text DEFAULT NULL, p_limit integer DEFAULT 100,
                                                 p_before_created timestamptz DEFAULT NULL,
                                                 p_before_id uuid DEFAULT NULL,
                                                 p_subject_like text[] DEFAULT NULL,
                                                 p_gang_id uuid DEFAULT NULL)
RETURNS json LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_pool_id uuid;
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND respool._max_batch() THEN
        PERFORM respool._fail('RP400', 'limit', 'limit must be between 1 and ' || respool._max_batch());
    END IF;
    -- 'live' stands for queued, allocated and preempting together (what `request list` shows by default).
    IF p_status IS NOT NULL AND p_status NOT IN ('queued', 'allocated', 'preempting', 'released', 'preempted',
                                                 'expired', 'cancelled', 'rejected', 'live') THEN
        PERFORM respool._fail('RP400', 'status', format('unknown status %L', p_status));
    END IF;
    IF p_pool IS NOT NULL THEN
        v_pool_id := respool.resolve_pool(p_pool);
    END IF;
    -- Positions, messages and ETAs for the whole page at once (respool.request_docs: each
    -- involved pool computed once, each shape's blocker once), the same answers as
    -- respool.request_json gives one request at a time.
    RETURN coalesce((
        WITH page AS MATERIALIZED (
               SELECT r.id, r.created_at FROM respool.requests r
                 WHERE (v_pool_id IS NULL OR r.pool_id = v_pool_id OR v_pool_id = ANY (r.candidate_pool_ids))
                   AND (p_subject IS NULL OR r.subject = p_subject)
                   AND (p_status IS NULL OR r.status = ANY (CASE WHEN p_status = 'live'
                                                                   THEN ARRAY['queued', 'allocated', 'preempting']
                                                                   ELSE ARRAY[p_status] END))
                   AND (p_subject_like IS NULL OR r.subject LIKE ANY (p_subject_like))
                   AND (p_gang_id IS NULL OR r.gang_id = p_gang_id)
                   AND (p_before_created IS NULL OR (r.created_at, r.id) < (p_before_created, p_before_id))
                 ORDER BY r.created_at DESC, r.id DESC
                 LIMIT p_limit)
        SELECT json_agg(d.doc ORDER BY q.created_at DESC, q.id DESC)
          FROM page q JOIN respool.request_docs(ARRAY(SELECT id FROM page)) d ON d.id = q.id), '[]'::json);
END $$;
COMMENT ON FUNCTION respool.list_requests(text, text, text, integer, timestamptz, uuid, text[], uuid) IS 'Requests newest first, filtered (p_status ''live'': queued, allocated and preempting; p_gang_id: the members of one gang, docs/scheduling.md, gangs), keyset-paged by (created_at, id), as one json array of _request_doc documents (the same as request_json gives each); p_subject_like scopes a client token.';

CREATE OR REPLACE FUNCTION respool.list_request_events(p_id uuid)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM respool.requests WHERE id = p_id) THEN
        PERFORM respool._fail('RP404', 'id', format('request %s not found', p_id));
    END IF;
    RETURN coalesce((SELECT jsonb_agg(jsonb_build_object('from', from_status, 'to', to_status, 'reason', reason,
                                                         'attempt', attempt, 'message', message, 'at', at,
                                                         'placement', placement,
                                                         'cause_request_id', cause_request_id,
                                                         'cause_subject', cause_subject)
                                      ORDER BY id)
                       FROM respool.events WHERE request_id = p_id), '[]'::jsonb);
END $$;
COMMENT ON FUNCTION respool.list_request_events(uuid) IS 'A request''s history in order (from, to, reason, attempt, message, at; placement: on a grant in a pool with nodes, its node and devices; cause_request_id and cause_subject: the request the change happened for, null when none).';
