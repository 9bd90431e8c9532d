-- Status changes: the one path by which a request changes status, its event row and NOTIFYs.

CREATE OR REPLACE FUNCTION respool._is_terminal(p_status text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_status IN ('released', 'rejected', 'cancelled', 'expired', 'preempted')
$$;
COMMENT ON FUNCTION respool._is_terminal(text) IS 'Statuses a request never leaves (preempted once no retry requeued it).';

CREATE OR REPLACE FUNCTION respool._record_event(p_request respool.requests, p_from text, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO respool.events (request_id, at, from_status, to_status, reason, attempt, message)
    VALUES (p_request.id, p_now, p_from, p_request.status, p_request.reason, p_request.attempt, p_request.message);
    PERFORM pg_notify('respool_request', json_build_object(
        'id', p_request.id, 'status', p_request.status, 'version', p_request.version,
        'pool', p_request.pool_name, 'subject', p_request.subject, 'from', p_from,
        'reason', p_request.reason, 'attempt', p_request.attempt)::text);
END $$;
COMMENT ON FUNCTION respool._record_event(respool.requests, text, timestamptz) IS
    'Appends the event row and queues the NOTIFY (delivered at commit) for one status change.';

CREATE OR REPLACE FUNCTION respool._pool_changed(p_pool_id uuid)
RETURNS void LANGUAGE sql AS $$
    SELECT pg_notify('respool_pool', p_pool_id::text)
$$;
COMMENT ON FUNCTION respool._pool_changed(uuid) IS
    'Wakes the reconcilers (after commit) for a pool whose state may call for preemption: a new queued request, a capacity or policy change.';

CREATE OR REPLACE FUNCTION respool._set_status(p_id uuid, p_to text, p_reason text, p_message text, p_now timestamptz)
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
           preempt_deadline = CASE WHEN p_to = 'preempting' THEN preempt_deadline END
     WHERE id = p_id
    RETURNING * INTO r;
    PERFORM respool._record_event(r, v_from, p_now);
    RETURN r;
END $$;
COMMENT ON FUNCTION respool._set_status(uuid, text, text, text, timestamptz) IS
    'The only way a request changes status: bumps version, stamps finished_at, drops an earmark when it leaves the queue and a grace deadline when it leaves preempting, writes the event, notifies.';
