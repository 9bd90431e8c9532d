-- Status changes: the one path by which a request changes status, its event row and NOTIFYs.

CREATE OR REPLACE FUNCTION respool._is_terminal(p_status text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_status IN ('released', 'rejected', 'cancelled', 'expired', 'preempted')
$$;
COMMENT ON FUNCTION respool._is_terminal(text) IS 'Statuses a request never leaves (preempted once no retry requeued it).';

CREATE OR REPLACE FUNCTION respool._record_events(p_requests respool.requests[], p_from text, p_now timestamptz)
RETURNS void LANGUAGE plpgsql
-- (one plan for its two statements, whatever the array: a custom plan for every call cost more
-- than the insert it plans; docs/benchmarks.md)
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_quiet text[] := string_to_array(nullif(current_setting('respool.unannounced', true), ''), ',');
    -- The request these changes happen for (a preemption's beneficiary: respool._preempt_for,
    -- 071_reconcile.sql), recorded as data with each event; empty: none.
    v_cause uuid := nullif(current_setting('respool.cause', true), '')::uuid;
BEGIN
    -- Set-based: one INSERT for every row (in array order, so event ids follow it) and one
    -- notification per request, however many changed together (a large grant).
    INSERT INTO respool.events (request_id, at, from_status, to_status, reason, attempt, message, placement,
                                cause_request_id, cause_subject)
    -- (at the row's own instant when it is later: a batch member granted at its queue time)
    SELECT r.id, greatest(p_now, r.updated_at), p_from, r.status, r.reason, r.attempt, r.message,
           -- a grant in a pool with nodes records where it was placed (docs/placement.md); the
           -- join keeps the document's build to the placed ones (none in a pool without nodes)
           CASE WHEN pl.request_id IS NOT NULL THEN respool._placement_doc(r.id)::jsonb END,
           c.id, CASE WHEN c.id IS NOT NULL THEN (SELECT subject FROM respool.requests WHERE id = c.id) END
      FROM unnest(p_requests) WITH ORDINALITY AS r
      LEFT JOIN respool.placements pl ON pl.request_id = r.id AND r.status = 'allocated'
      -- A victim leaving its grace period (released, or its deadline passed) ends the same
      -- preemption: its event names the request its preempting event named.
     -- (OFFSET 0: computed once per row, not copied into each column that uses it)
     CROSS JOIN LATERAL (
            SELECT coalesce(v_cause, CASE WHEN p_from = 'preempting' THEN (
                       SELECT pe.cause_request_id FROM respool.events pe
                        WHERE pe.request_id = r.id AND pe.to_status = 'preempting'
                        ORDER BY pe.id DESC LIMIT 1) END) AS id OFFSET 0) c
     ORDER BY r.ordinality;
    -- No notification for the requests a create_request call or a batch is making
    -- (respool.unannounced, their ids separated by commas):
    -- nobody can wait for it before that call answers, and a notifying commit takes a
    -- database-wide lock (docs/benchmarks.md). Its caller answers with the request's state.
    IF cardinality(p_requests) = 1 AND p_requests[1].id::text = ANY (v_quiet) THEN
        RETURN;  -- (the one request a create is making: no query)
    END IF;
    PERFORM pg_notify('respool_request', json_build_object(
                'id', r.id, 'status', r.status, 'version', r.version, 'pool', r.pool_name,
                'subject', r.subject, 'from', p_from, 'reason', r.reason, 'attempt', r.attempt)::text)
       FROM unnest(p_requests) r
      WHERE v_quiet IS NULL OR r.id::text <> ALL (v_quiet);
END $$;
COMMENT ON FUNCTION respool._record_events(respool.requests[], text, timestamptz) IS 'Appends the event rows (in array order; an event into allocated carries the grant''s placement, placed before this is called) and queues the NOTIFYs (delivered at commit) for requests that changed from p_from to their current status together; each event records the request it happened for (respool.cause, set by respool._preempt_for, or for a victim leaving its grace period the one its preempting event named: cause_request_id and its subject); no NOTIFY for the requests that the current create_request call or batch is making (respool.unannounced: their ids, comma-separated).';

CREATE OR REPLACE FUNCTION respool._record_event(p_request respool.requests, p_from text, p_now timestamptz)
RETURNS void LANGUAGE sql AS $$
    SELECT respool._record_events(ARRAY[p_request], p_from, p_now)
$$;
COMMENT ON FUNCTION respool._record_event(respool.requests, text, timestamptz) IS 'Appends the event row and queues the NOTIFY (delivered at commit) for one status change.';

CREATE OR REPLACE FUNCTION respool._pool_changed(p_pool_id uuid)
RETURNS void LANGUAGE sql AS $$
    SELECT pg_notify('respool_pool', p_pool_id::text)
$$;
COMMENT ON FUNCTION respool._pool_changed(uuid) IS 'Wakes the reconcilers (after commit) for a pool whose state may call for preemption: a new queued request, a capacity or policy change.';

CREATE OR REPLACE FUNCTION respool._set_status(p_id uuid, p_to text, p_reason text, p_message text, p_now timestamptz,
                                               p_last_placement jsonb DEFAULT NULL)
RETURNS respool.requests LANGUAGE plpgsql AS $$
DECLARE
    v_from text;
    r respool.requests;
BEGIN
    SELECT status INTO v_from FROM respool.requests WHERE id = p_id;
    UPDATE respool.requests
       SET status = p_to, reason = p_reason, message = coalesce(p_message, ''),
           version = version + 1, updated_at = p_now,
           finished_at = CASE WHEN respool._is_terminal(p_to) THEN p_now END,
           earmark_pool_id = CASE WHEN p_to = 'queued' THEN earmark_pool_id END,
           earmark_node_id = CASE WHEN p_to = 'queued' THEN earmark_node_id END,
           preempt_deadline = CASE WHEN p_to = 'preempting' THEN preempt_deadline END,
           preempt_note = CASE WHEN p_to = 'preempting' THEN preempt_note END,
           -- Leaving the holding statuses: respool._unplace has given the units back; the lease,
           -- runtime cap and non-preemptible charge go in this same row version.
           lease_expires_at = CASE WHEN p_to IN ('allocated', 'preempting') THEN lease_expires_at END,
           run_deadline = CASE WHEN p_to IN ('allocated', 'preempting') THEN run_deadline END,
           np_charge = CASE WHEN p_to IN ('allocated', 'preempting') THEN np_charge ELSE '{}' END,
           last_placement = coalesce(p_last_placement, last_placement)
     WHERE id = p_id
    RETURNING * INTO r;
    PERFORM respool._record_event(r, v_from, p_now);
    RETURN r;
END $$;
COMMENT ON FUNCTION respool._set_status(uuid, text, text, text, timestamptz, jsonb) IS 'The way a request changes status (a grant does the same in respool._grant_many, set-based): bumps version, stamps finished_at, drops an earmark when it leaves the queue, a grace deadline and its note when it leaves preempting, and the lease, runtime cap and non-preemptible charge when it stops holding units; p_last_placement (not NULL): where it ran, from respool._unplace, in the same row version; writes the event, notifies.';
