-- Terminate (docs/preemption.md, "Terminate"): an admin ends a request, as a preemption would,
-- and it is never requeued. The rules are in the COMMENT of respool.terminate_request. The same
-- machinery ends a holder whose pool terminates slice overuse (reason over_slice,
-- respool._report_usage: docs/placement.md, "Sharing a GPU").

CREATE OR REPLACE FUNCTION respool._terminate_member(p_id uuid, p_message text, p_now timestamptz,
                                                     p_reason text DEFAULT 'terminated')
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
    v_grace integer;
BEGIN
    -- As respool._preempt_member, also for a non-preemptible allocation (a forced terminate).
    SELECT * INTO r FROM respool.requests WHERE id = p_id FOR UPDATE;
    SELECT preemption_grace_seconds INTO v_grace FROM respool.pools WHERE id = r.pool_id;
    IF v_grace > 0 THEN
        UPDATE respool.requests SET preempt_deadline = p_now + make_interval(secs => v_grace)
         WHERE id = p_id;
        IF p_reason = 'over_slice' THEN
            PERFORM respool._set_status(p_id, 'preempting', 'over_slice',
                                        p_message || format('; release within %s s', v_grace), p_now);
        ELSE
            PERFORM respool._set_status(p_id, 'preempting', 'terminated',
                                        p_message || format('; release within %s s', v_grace), p_now);
        END IF;
        RETURN 'preempting';
    END IF;
    PERFORM respool._unplace(p_id);
    IF p_reason = 'over_slice' THEN
        RETURN (respool._after_preemption(p_id, 'over_slice', p_message, p_now)).status;
    END IF;
    RETURN (respool._after_preemption(p_id, 'terminated', p_message, p_now)).status;
END $$;
COMMENT ON FUNCTION respool._terminate_member(uuid, text, timestamptz, text) IS 'Terminates one allocated request of a pool the caller has locked (preemptible or not) with p_reason (terminated, or over_slice): with the pool''s grace period it goes to preempting (deadline now + grace) and keeps its units until release or deadline; without, its units are freed and it becomes preempted (never requeued: respool._after_preemption). The caller grants the pool''s queue. Returns the new status.';

CREATE OR REPLACE FUNCTION respool._terminate_holding(p_id uuid, p_reason text, p_message text,
                                                      p_follower text, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
    m record;
BEGIN
    SELECT * INTO r FROM respool.requests WHERE id = p_id;
    -- The whole gang goes, as for a preemption (members hold units in one pool, locked by the caller).
    FOR m IN SELECT q.id FROM respool.requests q
              WHERE (q.id = p_id OR q.gang_id = r.gang_id) AND q.status = 'allocated'
              ORDER BY q.id FOR UPDATE LOOP
        PERFORM respool._terminate_member(m.id, CASE WHEN m.id = p_id THEN p_message ELSE p_follower END,
                                          p_now, p_reason);
    END LOOP;
    PERFORM respool.allocate_pool(r.pool_id, p_now);
END $$;
COMMENT ON FUNCTION respool._terminate_holding(uuid, text, text, text, timestamptz) IS 'Ends an allocated request whose pool and row the caller has locked, with its whole gang (members get p_follower as message), as respool._terminate_member does with p_reason; then grants the pool''s queue in the same transaction.';

CREATE OR REPLACE FUNCTION respool.terminate_request(p_id uuid, p_force boolean DEFAULT false,
                                                    p_reason text DEFAULT '',
                                                    p_now timestamptz DEFAULT now())
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
    v_message text;
    v_follower text;
    v_pools uuid[];
    v_pool uuid;
    m record;
BEGIN
    -- An event and a NOTIFY per status change. Grace 0, or p_force on a preempting request: preempted
    -- at once, its units freed and the pool's queue granted in the same transaction; gang members
    -- in their grace period go too, those already queued again are cancelled. Locks the pools
    -- first, then the request.
    IF length(p_reason) > respool._max_description() THEN
        PERFORM respool._fail('RP400', 'reason', format('reason: at most %s characters, got %s',
                                                         respool._max_description(), length(p_reason)));
    END IF;
    r := respool._lock_request(p_id, NULL);  -- the pools first (id order), then the request
    v_message := 'terminated by an admin' || CASE WHEN coalesce(p_reason, '') <> '' THEN ': ' || p_reason ELSE '' END;
    v_follower := format('gang %s: member %s was %s', r.gang_id, p_id, v_message);
    IF r.status = 'queued' THEN
        -- gangs (docs/scheduling.md): the rest of the gang is cancelled along with it.
        PERFORM respool._leave_queue(p_id, 'cancelled', 'terminated', v_message, p_now);
    ELSIF r.status = 'allocated' THEN
        IF NOT r.preemptible AND NOT coalesce(p_force, false) THEN
            PERFORM respool._fail('RP409', 'force', format(
                'request %s is not preemptible: terminate it with force', p_id));
        END IF;
        PERFORM respool._terminate_holding(p_id, 'terminated', v_message, v_follower, p_now);
    ELSIF r.status = 'preempting' AND coalesce(p_force, false) THEN
        -- Preempted at once: the units of the request and of its gang members still in their
        -- grace period are freed; members already queued again (after an earlier preemption)
        -- are cancelled; then the pools grant.
        FOR m IN SELECT q.id FROM respool.requests q
                  WHERE (q.id = p_id OR q.gang_id = r.gang_id) AND q.status = 'preempting'
                  ORDER BY q.id FOR UPDATE LOOP
            PERFORM respool._unplace(m.id);
            PERFORM respool._after_preemption(m.id, 'terminated',
                                              CASE WHEN m.id = p_id THEN v_message ELSE v_follower END, p_now);
        END LOOP;
        v_pools := respool._unqueue(p_id) || r.pool_id;
        PERFORM respool._gang_follow(p_id, 'cancelled', 'terminated', v_message, p_now);
        FOR v_pool IN SELECT DISTINCT x FROM unnest(v_pools) x WHERE x IS NOT NULL ORDER BY x LOOP
            PERFORM respool.allocate_pool(v_pool, p_now);
        END LOOP;
    END IF;
    -- Terminal, or preempting without force (already leaving): unchanged.
    RETURN respool.request_json(p_id);
END $$;
COMMENT ON FUNCTION respool.terminate_request(uuid, boolean, text, timestamptz) IS 'An admin ends a request (docs/preemption.md, "Terminate"): reason terminated, message "terminated by an admin: <p_reason>", never requeued. Allocated: preempted with the pool''s grace period, its gang with it; not preemptible: RP409 (field force) unless p_force. Preempting: with p_force preempted at once (with its gang), else unchanged. Queued: cancelled with its gang. Terminal: unchanged. RP404 unknown id, RP400 (field reason) over 2000 characters. Returns the request''s JSON.';
