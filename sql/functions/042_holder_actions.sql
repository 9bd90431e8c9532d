-- What a request's holder does to it: release, cancel, delete; and the one way a request leaves
-- the queue or gives its units back (respool._leave_queue, respool._end_holding).

CREATE OR REPLACE FUNCTION respool._lock_request(p_id uuid, p_attempt integer)
RETURNS respool.requests LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
    v_pools uuid[];
BEGIN
    SELECT candidate_pool_ids || pool_id INTO v_pools FROM respool.requests WHERE id = p_id;
    IF NOT FOUND THEN
        PERFORM respool._fail('RP404', 'id', format('request %s not found', p_id));
    END IF;
    PERFORM respool._lock_pools(v_pools);
    SELECT * INTO r FROM respool.requests WHERE id = p_id FOR UPDATE;
    IF p_attempt IS NOT NULL AND p_attempt <> r.attempt THEN
        PERFORM respool._fail('RP409', 'attempt', format(
            'stale attempt %s: request %s is on attempt %s', p_attempt, p_id, r.attempt));
    END IF;
    RETURN r;
END $$;
COMMENT ON FUNCTION respool._lock_request(uuid, integer) IS 'Locks a request''s candidate pools (id order) and then the request; RP404 if unknown, RP409 when p_attempt is stale (fencing).';

CREATE OR REPLACE FUNCTION respool._leave_queue(p_id uuid, p_to text, p_reason text, p_message text, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_pools uuid[];
    v_held uuid[];
    v_pool uuid;
BEGIN
    v_pools := respool._unqueue(p_id);
    -- gangs (docs/scheduling.md): members of its gang still holding units (in a grace period, before the gang
    -- is requeued) give them back when they follow: their pool is granted below (docs/admission.md).
    v_held := ARRAY(SELECT DISTINCT m.pool_id FROM respool.requests m
                     WHERE m.gang_id = (SELECT gang_id FROM respool.requests WHERE id = p_id)
                       AND m.id <> p_id AND m.status IN ('allocated', 'preempting'));
    PERFORM respool._set_status(p_id, p_to, p_reason, p_message, p_now);
    PERFORM respool._gang_follow(p_id, p_to, p_reason, p_to, p_now);  -- gangs: docs/scheduling.md
    -- In a strict pool the request may have been the head that blocked everyone else; in a
    -- best_effort pool with the starvation guard, the head the pool held units for (docs/scheduling.md, starvation guard).
    FOR v_pool IN SELECT id FROM respool.pools
                   WHERE (id = ANY (v_pools) AND (queueing = 'strict' OR starvation_seconds IS NOT NULL))
                      OR id = ANY (v_held)
                   ORDER BY id LOOP
        PERFORM respool.allocate_pool(v_pool, p_now);
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._leave_queue(uuid, text, text, text, timestamptz) IS 'Takes a locked queued request (and the rest of its gang, docs/scheduling.md, gangs) out of every queue with a terminal status, then lets strict queues behind it move (and best_effort queues whose starvation hold it may have been), and grants in the pool where members of its gang gave units back.';

CREATE OR REPLACE FUNCTION respool._queues_left(p_pool_ids uuid[], p_now timestamptz)
RETURNS void LANGUAGE plpgsql
-- (the passes it starts are planned as every pass is, whatever its caller, _grant_many, sets)
SET plan_cache_mode = auto AS $$
DECLARE
    v_pool respool.pools;
BEGIN
    FOR v_pool IN SELECT * FROM respool.pools
                   WHERE id = ANY (p_pool_ids) AND (queueing = 'strict' OR starvation_seconds IS NOT NULL)
                   ORDER BY id LOOP
        -- Never wait for a pool lock here (the caller holds others, out of id order), and never
        -- start a second pass of a pool whose pass is under way (it meets the entry gone).
        IF v_pool.queueing = 'strict'
           AND position(v_pool.id::text IN coalesce(current_setting('respool.passing', true), '')) = 0 THEN
            PERFORM 1 FROM respool.pools WHERE id = v_pool.id FOR NO KEY UPDATE SKIP LOCKED;
            IF FOUND THEN
                PERFORM respool.allocate_pool(v_pool.id, p_now);
                CONTINUE;
            END IF;
        END IF;
        PERFORM respool._pool_changed(v_pool.id);  -- the reconcilers pass it
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._queues_left(uuid[], timestamptz) IS
    'After requests granted in one pool left the queues of p_pool_ids (their other candidates): a strict one of them, where they may have been the head that blocked the rest, is passed now when its lock is free (respool.allocate_pool; never waited for: no deadlock), else, and for a best_effort one with the starvation guard (they may have been its held-for head), the reconcilers are woken (respool._pool_changed).';

CREATE OR REPLACE FUNCTION respool._unqueue(p_id uuid)
RETURNS uuid[] LANGUAGE plpgsql AS $$
DECLARE
    v_pools uuid[];
BEGIN
    WITH gone AS (
        DELETE FROM respool.queue_entries e
         WHERE e.request_id = p_id
            OR e.request_id IN (SELECT m.id FROM respool.requests m JOIN respool.requests r ON r.gang_id = m.gang_id
                                 WHERE r.id = p_id)
        RETURNING e.pool_id)
    SELECT array_agg(DISTINCT pool_id) INTO v_pools FROM gone;
    RETURN coalesce(v_pools, '{}');
END $$;
COMMENT ON FUNCTION respool._unqueue(uuid) IS 'Removes the queue entries of a request, and of its gang (whose one entry per pool may be another member''s); returns the pools it waited in.';

CREATE OR REPLACE FUNCTION respool._end_holding(p_id uuid, p_to text, p_reason text, p_message text, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    r record;
    v_ran jsonb;
BEGIN
    SELECT status, reason, message, pool_id INTO r FROM respool.requests WHERE id = p_id;
    IF r.status = 'preempting' AND p_to <> 'cancelled' THEN
        PERFORM respool._unplace(p_id);
        PERFORM respool._after_preemption(p_id, r.reason, r.message, p_now);
    ELSE
        -- (where it ran is written with the status: one row version, not two)
        v_ran := respool._unplace(p_id, p_record => false);
        PERFORM respool._set_status(p_id, p_to, p_reason, p_message, p_now, v_ran);
        IF p_to = 'cancelled' OR (p_to = 'expired' AND r.status = 'allocated') THEN
            PERFORM respool._gang_follow(p_id, p_to, p_reason, p_to, p_now);  -- gangs: docs/scheduling.md
        END IF;
    END IF;
    PERFORM respool.allocate_pool(r.pool_id, p_now);
END $$;
COMMENT ON FUNCTION respool._end_holding(uuid, text, text, text, timestamptz) IS 'Frees a locked allocated/preempting request, sets its final status (a preempting one becomes preempted; a cancelled or expired gang member takes the rest of its gang along, docs/scheduling.md, gangs), and grants what now fits in its pool.';

CREATE OR REPLACE FUNCTION respool._end_locked(p_id uuid, p_status text, p_reason text, p_message text,
                                               p_queued_reason text, p_queued_message text, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_status text := (SELECT status FROM respool.requests WHERE id = p_id);
BEGIN
    IF v_status IN ('allocated', 'preempting') THEN
        PERFORM respool._end_holding(p_id, p_status, p_reason, p_message, p_now);
    ELSIF v_status = 'queued' THEN
        PERFORM respool._leave_queue(p_id, 'cancelled', p_queued_reason, p_queued_message, p_now);
    END IF;
END $$;
COMMENT ON FUNCTION respool._end_locked(uuid, text, text, text, text, text, timestamptz) IS 'Release and cancel in one place, for a request the caller has locked with its pools (respool._lock_request): holding, it ends as p_status (preempting -> preempted) with its units freed and what fits granted; queued, it becomes cancelled with p_queued_reason; terminal, it is unchanged. Reads the status itself, so a caller ending several requests sees what the earlier ones did (a gang member that followed its gang).';

CREATE OR REPLACE FUNCTION respool._end_request(p_id uuid, p_attempt integer, p_status text,
                                                p_reason text, p_message text,
                                                p_queued_reason text, p_queued_message text,
                                                p_now timestamptz)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    PERFORM respool._lock_request(p_id, p_attempt);
    PERFORM respool._end_locked(p_id, p_status, p_reason, p_message, p_queued_reason, p_queued_message, p_now);
    RETURN respool.request_json(p_id);
END $$;
COMMENT ON FUNCTION respool._end_request(uuid, integer, text, text, text, text, text, timestamptz) IS 'Release and cancel of one request: locked with its pools and attempt-fenced (respool._lock_request: RP404, RP409), then ended by respool._end_locked. Returns the request''s JSON.';

CREATE OR REPLACE FUNCTION respool.release_request(p_id uuid, p_attempt integer DEFAULT NULL,
                                                   p_now timestamptz DEFAULT now(), p_used jsonb DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    IF p_used IS NULL OR p_used = 'null'::jsonb THEN
        RETURN respool._end_request(p_id, p_attempt, 'released', NULL, '',
                                    'released_while_queued', 'released before it was allocated', p_now);
    END IF;
    -- Rate keys (docs/rates.md): the charges are settled first, so a refund is granted below.
    PERFORM respool._lock_request(p_id, p_attempt);
    PERFORM respool._settle(p_id, p_used, p_now);
    PERFORM respool._end_locked(p_id, 'released', NULL, '', 'released_while_queued',
                                'released before it was allocated', p_now);
    RETURN respool.request_json(p_id);
END $$;
COMMENT ON FUNCTION respool.release_request(uuid, integer, timestamptz, jsonb) IS
    'allocated -> released (preempting -> preempted), queued -> cancelled, terminal unchanged; frees units and grants what fits in the same transaction. p_used {rate key: units} settles the request''s charges first (respool._settle: RP400/RP409 and nothing changes).';

CREATE OR REPLACE FUNCTION respool._queues_of_one_shape(p_pool_ids uuid[])
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- Two probes of the shape index per pool with waiters: its first and last entry in shape order.
    RETURN NOT EXISTS (
        SELECT FROM unnest(p_pool_ids) p(id)
         CROSS JOIN LATERAL (SELECT e.policy_id, e.preemptible, e.resources, e.node_selector
                               FROM respool.queue_entries e WHERE e.pool_id = p.id
                              ORDER BY e.policy_id, e.preemptible, e.resources, e.node_selector LIMIT 1) lo
         CROSS JOIN LATERAL (SELECT e.policy_id, e.preemptible, e.resources, e.node_selector
                               FROM respool.queue_entries e WHERE e.pool_id = p.id
                              ORDER BY e.policy_id DESC, e.preemptible DESC, e.resources DESC, e.node_selector DESC
                              LIMIT 1) hi
         WHERE ROW(lo.policy_id, lo.preemptible, lo.resources, lo.node_selector)
               IS DISTINCT FROM ROW(hi.policy_id, hi.preemptible, hi.resources, hi.node_selector)
            OR respool._pool_has_rates(p.id)
            OR EXISTS (SELECT FROM respool.requests r WHERE r.earmark_pool_id = p.id));
END $$;
COMMENT ON FUNCTION respool._queues_of_one_shape(uuid[]) IS
    'True when every pool of p_pool_ids has nobody waiting, or only entries of one policy and one shape (resources, preemptible, selector), no rate key and no earmark. A pass after several releases then grants what a pass after each would: the same requests in the same order, since each fits exactly when the one before it did. Read-only.';

DROP FUNCTION IF EXISTS respool.release_requests(uuid[], integer[], timestamptz);
CREATE OR REPLACE FUNCTION respool.release_requests(p_ids uuid[], p_attempts integer[] DEFAULT NULL,
                                                    p_now timestamptz DEFAULT now(), p_used jsonb[] DEFAULT NULL)
RETURNS TABLE (member integer, request jsonb, error_code text, error_field text, error_message text)
LANGUAGE plpgsql AS $$
DECLARE
    v_status text[] := '{}';
    v_field text[] := '{}';     -- a settlement's refusal (rate keys, docs/rates.md): its field
    v_message text[] := '{}';   -- and message
    v_code text;
    v_f text;
    v_m text;
    r respool.requests;
    v_pools uuid[];
    v_ended respool.requests[];
BEGIN
    IF p_ids IS NULL OR cardinality(p_ids) NOT BETWEEN 1 AND respool._max_batch() THEN
        PERFORM respool._fail('RP400', 'ids', format('1 to %s request ids', respool._max_batch()));
    END IF;
    IF p_attempts IS NOT NULL AND cardinality(p_attempts) <> cardinality(p_ids) THEN
        PERFORM respool._fail('RP400', 'attempts', 'one attempt (or null) per request id');
    END IF;
    IF p_used IS NOT NULL AND cardinality(p_used) <> cardinality(p_ids) THEN
        PERFORM respool._fail('RP400', 'used', 'one used map (or null) per request id');
    END IF;
    -- Every pool any of them holds or waits in, in id order, then the rows in id order: the
    -- order respool._lock_request takes for one, so this cannot deadlock with other writers.
    PERFORM respool._lock_pools(ARRAY(SELECT DISTINCT x FROM respool.requests q
                                        CROSS JOIN LATERAL unnest(q.candidate_pool_ids || q.pool_id) x
                                       WHERE q.id = ANY (p_ids) AND x IS NOT NULL));
    PERFORM 1 FROM respool.requests WHERE id = ANY (p_ids) ORDER BY id FOR UPDATE;
    -- The common case set-based: distinct requests, each allocated (no gang, no job) at its
    -- attempt, in pools without nodes whose queues are empty or of one shape
    -- (respool._queues_of_one_shape), no settlement refused. Ending one then changes nothing
    -- another's end depends on (each settles only its own charges, and one pass grants from
    -- the queue what a pass after each end would), so the whole batch leaves what the members
    -- one by one would: settled, their units back (one guarded return per pool and policy),
    -- released in one statement with their events and notifications, each pool passed once.
    SELECT array_agg(DISTINCT q.pool_id) INTO v_pools FROM respool.requests q WHERE q.id = ANY (p_ids);
    IF (SELECT count(*) FROM unnest(p_ids, p_attempts) x(id, attempt)
          JOIN respool.requests q ON q.id = x.id
         WHERE q.status = 'allocated' AND q.gang_id IS NULL AND q.command IS NULL AND q.pool_id IS NOT NULL
           AND (x.attempt IS NULL OR x.attempt = q.attempt)) = cardinality(p_ids)
       AND (SELECT count(DISTINCT x) FROM unnest(p_ids) x) = cardinality(p_ids)
       AND NOT EXISTS (SELECT FROM respool.nodes n WHERE n.pool_id = ANY (v_pools))
       AND respool._queues_of_one_shape(v_pools)
       AND (p_used IS NULL OR NOT EXISTS (SELECT FROM respool._settle_refusals(p_ids, p_used))) THEN
        IF p_used IS NOT NULL AND NOT respool._settle_many(p_ids, p_used, p_now) THEN
            FOR i IN 1 .. cardinality(p_ids) LOOP
                PERFORM respool._settle(p_ids[i], p_used[i], p_now, p_checked => true);
            END LOOP;
        END IF;
        -- (units of rate keys come back with time, not here: respool._unplace)
        PERFORM respool._move_units(g.pool_id, g.policy_id, g.units, g.np, -1)
           FROM (SELECT q.pool_id, q.policy_id,
                        respool._sum_units(array_agg(respool._without_rates(q.pool_id, q.resources))) AS units,
                        respool._sum_units(array_agg(respool._without_rates(q.pool_id, q.np_charge))) AS np
                   FROM respool.requests q WHERE q.id = ANY (p_ids)
                  GROUP BY q.pool_id, q.policy_id ORDER BY q.pool_id, q.policy_id) g;
        -- The status change respool._set_status makes, for all of them.
        WITH ended AS (
            UPDATE respool.requests
               SET status = 'released', reason = NULL, message = '', version = version + 1, updated_at = p_now,
                   finished_at = p_now, earmark_pool_id = NULL, earmark_node_id = NULL, preempt_deadline = NULL,
                   lease_expires_at = NULL, run_deadline = NULL, np_charge = '{}'
             WHERE id = ANY (p_ids)
            RETURNING *)
        SELECT array_agg(e::respool.requests ORDER BY x.n) INTO v_ended
          FROM ended e JOIN unnest(p_ids) WITH ORDINALITY x(id, n) ON x.id = e.id;
        PERFORM respool._record_events(v_ended, 'allocated', p_now);
        PERFORM respool.allocate_pool(x, p_now) FROM unnest(v_pools) x ORDER BY x;
        RETURN QUERY
        SELECT (x.n - 1)::integer, d.doc::jsonb, NULL::text, NULL::text, NULL::text
          FROM unnest(p_ids) WITH ORDINALITY x(id, n)
          LEFT JOIN respool.request_docs(p_ids) d ON d.id = x.id
         ORDER BY x.n;
        RETURN;
    END IF;
    -- In request order, each exactly as respool.release_request would end it after the ones
    -- before it; an unknown id or a stale attempt is that member's error and changes nothing.
    FOR i IN 1 .. cardinality(p_ids) LOOP
        SELECT * INTO r FROM respool.requests WHERE id = p_ids[i];
        IF NOT FOUND THEN
            v_status := v_status || 'RP404'::text;
        ELSIF p_attempts[i] IS NOT NULL AND p_attempts[i] <> r.attempt THEN
            v_status := v_status || 'RP409'::text;
        ELSE
            -- (a refused settlement of rate keys is this member's error and changes nothing)
            SELECT x.code, x.field, x.message INTO v_code, v_f, v_m FROM respool._settle_refusal(p_ids[i], p_used[i]) x;
            IF v_code IS NULL THEN
                PERFORM respool._settle(p_ids[i], p_used[i], p_now, p_checked => true);
                PERFORM respool._end_locked(p_ids[i], 'released', NULL, '',
                                            'released_while_queued', 'released before it was allocated', p_now);
            END IF;
            v_status := v_status || v_code;
            v_field[i] := v_f;
            v_message[i] := v_m;
        END IF;
    END LOOP;
    RETURN QUERY
    SELECT (x.n - 1)::integer, d.doc::jsonb, v_status[x.n],
           coalesce(v_field[x.n], CASE v_status[x.n] WHEN 'RP404' THEN 'id' WHEN 'RP409' THEN 'attempt' END),
           coalesce(v_message[x.n],
                    CASE v_status[x.n] WHEN 'RP404' THEN format('request %s not found', x.id)
                                       WHEN 'RP409' THEN format('stale attempt %s: request %s is on attempt %s',
                                                                p_attempts[x.n], x.id, q.attempt) END)
      FROM unnest(p_ids) WITH ORDINALITY x(id, n)
      LEFT JOIN respool.requests q ON q.id = x.id
      LEFT JOIN respool.request_docs(ARRAY(SELECT DISTINCT y FROM unnest(p_ids) y)) d
             ON d.id = x.id AND v_status[x.n] IS NULL
     ORDER BY x.n;
END $$;
COMMENT ON FUNCTION respool.release_requests(uuid[], integer[], timestamptz, jsonb[]) IS
    'Several releases in one transaction (the API coalesces concurrent release calls, docs/api.md): member i ends as respool.release_request(p_ids[i], p_attempts[i], p_used[i]) would right after members before it. Pools, then rows, locked up front in id order. Distinct allocated requests (no gang, no job) in pools without nodes or waiters, no settlement refused, end set-based, as one by one would. One row per member, in order: its document, or the error its own call would raise (RP404 id, RP409 attempt, a refused settlement), that member changing nothing.';

CREATE OR REPLACE FUNCTION respool.cancel_request(p_id uuid, p_attempt integer DEFAULT NULL,
                                                  p_now timestamptz DEFAULT now())
RETURNS jsonb LANGUAGE sql AS $$
    SELECT respool._end_request(p_id, p_attempt, 'cancelled', 'cancelled', 'cancelled by the client',
                                'cancelled', 'cancelled by the client', p_now)
$$;
COMMENT ON FUNCTION respool.cancel_request(uuid, integer, timestamptz) IS 'queued/allocated/preempting -> cancelled (units freed, the queue moves); terminal unchanged.';

CREATE OR REPLACE FUNCTION respool.delete_request(p_id uuid)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_status text;
BEGIN
    SELECT status INTO v_status FROM respool.requests WHERE id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM respool._fail('RP404', 'id', format('request %s not found', p_id));
    ELSIF NOT respool._is_terminal(v_status) THEN
        PERFORM respool._fail('RP409', 'status', format('request %s is %s; only terminal requests can be deleted', p_id, v_status));
    END IF;
    DELETE FROM respool.requests WHERE id = p_id;
END $$;
COMMENT ON FUNCTION respool.delete_request(uuid) IS 'Deletes a terminal request; its events stay (docs/api.md, append-only; only retention removes them); RP409 while it is queued or holds units.';
