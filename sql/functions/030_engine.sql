-- The allocation engine: status changes, admission, grant/free, queue order, allocate_pool.
-- Locking order everywhere: pool rows (id order) -> policy rows -> request rows.
-- Queued requests are picked with FOR UPDATE SKIP LOCKED; capacity is read only from the
-- counter rows of the locked pool, never inferred from skipped rows.

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
        'pool', p_request.pool_name)::text);
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

CREATE OR REPLACE FUNCTION respool._blocker(p_resources jsonb, p_preemptible boolean, p_pool_id uuid, p_policy_id uuid)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT msg FROM (
        SELECT k.key,
               CASE
                 WHEN c.cap IS NOT NULL AND k.need > 0 AND c.pool_used + k.need > c.cap THEN
                     format('waiting for %s: pool %s/%s used, needs %s', k.key, c.pool_used, c.cap, k.need)
                 WHEN pol."limit" IS NOT NULL AND c.subject_used + k.need > pol."limit" THEN
                     format('waiting for %s: subject limit reached, %s/%s used, needs %s',
                            k.key, c.subject_used, pol."limit", k.need)
                 WHEN NOT p_preemptible AND c.cap IS NOT NULL AND k.need > 0
                      AND coalesce(pol.np_used, 0) + k.need > coalesce(pol.reserved, 0) THEN
                     format('waiting for %s: reserved share for non-preemptible work %s/%s used, needs %s',
                            k.key, coalesce(pol.np_used, 0), coalesce(pol.reserved, 0), k.need)
               END AS msg
          FROM (SELECT x.key, x.value::bigint AS need FROM jsonb_each_text(p_resources) x
                UNION ALL
                SELECT l.key, 0 FROM respool.policy_resources l
                 WHERE l.policy_id = p_policy_id AND l."limit" IS NOT NULL AND NOT p_resources ? l.key) k
          LEFT JOIN respool.pool_resources pr ON pr.pool_id = p_pool_id AND pr.key = k.key
          LEFT JOIN respool.policy_resources pol ON pol.policy_id = p_policy_id AND pol.key = k.key
         CROSS JOIN LATERAL (SELECT respool._effective_capacity(k.key, pr.capacity) AS cap,
                                    coalesce(pr.used, 0) AS pool_used,
                                    coalesce(pol.used, 0) AS subject_used) c
    ) checks
    WHERE msg IS NOT NULL
    ORDER BY key
    LIMIT 1
$$;
COMMENT ON FUNCTION respool._blocker(jsonb, boolean, uuid, uuid) IS
    'Admission rules 1-3 of SPEC §4 against the current counters: NULL when admissible, else what blocks it.';

CREATE OR REPLACE FUNCTION respool._earmark_blocks(p_request respool.requests, p_pool_id uuid)
RETURNS boolean LANGUAGE sql STABLE AS $$
    -- Once every victim in its grace period has left (their units gone) and every earmarked
    -- request has its units, would p_request still fit? Checked only while earmarks exist.
    SELECT p_request.earmark_pool_id IS DISTINCT FROM p_pool_id
       AND EXISTS (SELECT FROM respool.requests b
                    WHERE b.earmark_pool_id = p_pool_id AND b.status = 'queued' AND b.id <> p_request.id)
       AND EXISTS (
           SELECT FROM jsonb_each_text(p_request.resources) x
             JOIN respool.pool_resources pr ON pr.pool_id = p_pool_id AND pr.key = x.key
            WHERE pr.capacity IS NOT NULL
              AND pr.used + x.value::bigint
                  - coalesce((SELECT sum((v.resources ->> x.key)::bigint) FROM respool.requests v
                               WHERE v.pool_id = p_pool_id AND v.status = 'preempting'), 0)
                  + coalesce((SELECT sum((b.resources ->> x.key)::bigint) FROM respool.requests b
                               WHERE b.earmark_pool_id = p_pool_id AND b.status = 'queued'
                                 AND b.id <> p_request.id), 0)
                  > pr.capacity)
$$;
COMMENT ON FUNCTION respool._earmark_blocks(respool.requests, uuid) IS
    'True when granting p_request would take units earmarked for another request (units that victims in their grace period will free). Never true for the earmark holder itself.';

CREATE OR REPLACE FUNCTION respool._rejection(p_resources jsonb, p_preemptible boolean, p_pool_id uuid,
                                              p_policy_id uuid, OUT reason text, OUT message text)
LANGUAGE sql STABLE AS $$
    WITH k AS (
        SELECT x.key, x.value::bigint AS need, respool._effective_capacity(x.key, pr.capacity) AS cap,
               coalesce(pol.reserved, 0) AS reserved, pol."limit" AS lim
          FROM jsonb_each_text(p_resources) x
          LEFT JOIN respool.pool_resources pr ON pr.pool_id = p_pool_id AND pr.key = x.key
          LEFT JOIN respool.policy_resources pol ON pol.policy_id = p_policy_id AND pol.key = x.key
    ), pool AS (SELECT name FROM respool.pools WHERE id = p_pool_id)
    SELECT c.reason, c.message FROM (VALUES (1)) AS one(x) LEFT JOIN LATERAL (
        SELECT 1 AS rank, key, 'pool_missing_key' AS reason,
               format('pool %s does not provide %s', (SELECT name FROM pool), key) AS message
          FROM k WHERE cap = 0
        UNION ALL
        SELECT 2, key, 'exceeds_capacity',
               format('%s: needs %s, pool %s has %s', key, need, (SELECT name FROM pool), cap)
          FROM k WHERE cap > 0 AND need > cap
        UNION ALL
        SELECT 3, key, 'exceeds_limit',
               format('%s: needs %s, the subject''s limit in pool %s is %s', key, need, (SELECT name FROM pool), lim)
          FROM k WHERE lim IS NOT NULL AND need > lim
        UNION ALL
        SELECT 4, key, 'exceeds_reserved',
               format('%s: non-preemptible request needs %s, the subject''s reserved share in pool %s is %s',
                      key, need, (SELECT name FROM pool), reserved)
          FROM k WHERE NOT p_preemptible AND cap IS NOT NULL AND need > reserved
        ORDER BY 1, 2
        LIMIT 1
    ) c ON true
$$;
COMMENT ON FUNCTION respool._rejection(jsonb, boolean, uuid, uuid) IS
    'The §4 rejection table for one candidate pool: always one row, (NULL, NULL) when the request can ever fit there.';

CREATE OR REPLACE FUNCTION respool._queue_order(p_pool_id uuid)
RETURNS TABLE (request_id uuid, policy_id uuid, subject text, priority integer, in_share boolean,
               queued_at timestamptz, "position" bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    -- In share: for every tracked key, the subject's used + the request <= its reserved share.
    -- Each policy's unused share is read once, so an entry costs a few jsonb lookups.
    WITH tracked AS (
        SELECT coalesce(array_agg(key) FILTER (WHERE capacity IS NOT NULL), '{}') AS keys
          FROM respool.pool_resources WHERE pool_id = p_pool_id
    ), share AS (
        SELECT p.id, p.subject, p.priority,
               coalesce((SELECT jsonb_object_agg(pol.key, pol.reserved - pol.used)
                           FROM respool.policy_resources pol WHERE pol.policy_id = p.id), '{}') AS room
          FROM respool.policies p WHERE p.pool_id = p_pool_id
    )
    SELECT e.request_id, e.policy_id, sh.subject, sh.priority, s.in_share, e.queued_at,
           row_number() OVER (ORDER BY sh.priority DESC, s.in_share DESC, e.queued_at, e.request_id)
      FROM respool.queue_entries e
      JOIN share sh ON sh.id = e.policy_id
      JOIN respool.requests r ON r.id = e.request_id
     CROSS JOIN tracked t
     CROSS JOIN LATERAL (
            SELECT NOT EXISTS (
                SELECT FROM jsonb_each_text(r.resources) x
                 WHERE (x.key = ANY (t.keys) OR NOT respool._is_soft_key(x.key))
                   AND x.value::bigint > coalesce((sh.room ->> x.key)::bigint, 0)) AS in_share) s
     WHERE e.pool_id = p_pool_id
     ORDER BY 7
$$;
COMMENT ON FUNCTION respool._queue_order(uuid) IS
    'A pool''s queue in grant order (SPEC §4): policy priority desc, in-share first, queue time, id. Read-only.';

CREATE OR REPLACE FUNCTION respool._grant(p_request_id uuid, p_pool_id uuid, p_policy_id uuid, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
    k text;
    n bigint;
    tracked boolean;
    np jsonb := '{}';
BEGIN
    SELECT * INTO r FROM respool.requests WHERE id = p_request_id;
    FOR k, n IN SELECT key, value::bigint FROM jsonb_each_text(r.resources) LOOP
        -- Guarded counter update: a bug that would over-allocate fails here instead.
        UPDATE respool.pool_resources SET used = used + n
         WHERE pool_id = p_pool_id AND key = k
           AND (used + n <= capacity OR (capacity IS NULL AND respool._is_soft_key(k)))
        RETURNING capacity IS NOT NULL INTO tracked;
        IF NOT FOUND THEN
            IF respool._is_soft_key(k)
               AND NOT EXISTS (SELECT FROM respool.pool_resources WHERE pool_id = p_pool_id AND key = k) THEN
                INSERT INTO respool.pool_resources (pool_id, key, used) VALUES (p_pool_id, k, n);
                tracked := false;
            ELSE
                RAISE EXCEPTION 'granting % % to request % would exceed pool capacity', n, k, p_request_id
                    USING ERRCODE = 'RP500';
            END IF;
        END IF;
        IF NOT r.preemptible AND tracked THEN
            np := np || jsonb_build_object(k, n);
        END IF;
        UPDATE respool.policy_resources
           SET used = used + n, np_used = np_used + coalesce((np ->> k)::bigint, 0)
         WHERE policy_id = p_policy_id AND key = k AND ("limit" IS NULL OR used + n <= "limit");
        IF NOT FOUND THEN
            IF EXISTS (SELECT FROM respool.policy_resources WHERE policy_id = p_policy_id AND key = k) THEN
                RAISE EXCEPTION 'granting % % to request % would exceed the subject limit', n, k, p_request_id
                    USING ERRCODE = 'RP500';
            END IF;
            INSERT INTO respool.policy_resources (policy_id, key, used, np_used)
            VALUES (p_policy_id, k, n, coalesce((np ->> k)::bigint, 0));
        END IF;
    END LOOP;
    DELETE FROM respool.queue_entries WHERE request_id = p_request_id;
    UPDATE respool.requests
       SET pool_id = p_pool_id,
           pool_name = (SELECT name FROM respool.pools WHERE id = p_pool_id),
           policy_id = p_policy_id,
           priority = (SELECT priority FROM respool.policies WHERE id = p_policy_id),
           np_charge = np, allocated_at = p_now, preempt_deadline = NULL,
           lease_expires_at = p_now + make_interval(secs => lease_seconds)
     WHERE id = p_request_id;
    PERFORM respool._set_status(p_request_id, 'allocated', NULL, '', p_now);
END $$;
COMMENT ON FUNCTION respool._grant(uuid, uuid, uuid, timestamptz) IS
    'Moves a locked queued request to allocated: charges pool and policy counters under guards (RP500 on a would-be over-allocation), leaves every queue, starts the lease.';

CREATE OR REPLACE FUNCTION respool._free(p_request_id uuid)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
    k text;
    n bigint;
BEGIN
    SELECT * INTO r FROM respool.requests WHERE id = p_request_id;
    FOR k, n IN SELECT key, value::bigint FROM jsonb_each_text(r.resources) LOOP
        UPDATE respool.pool_resources SET used = used - n WHERE pool_id = r.pool_id AND key = k;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'request % holds % but its pool has no counter', p_request_id, k USING ERRCODE = 'RP500';
        END IF;
        UPDATE respool.policy_resources
           SET used = used - n, np_used = np_used - coalesce((r.np_charge ->> k)::bigint, 0)
         WHERE policy_id = r.policy_id AND key = k;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'request % holds % but its policy has no counter', p_request_id, k USING ERRCODE = 'RP500';
        END IF;
    END LOOP;
    UPDATE respool.requests SET lease_expires_at = NULL, np_charge = '{}' WHERE id = p_request_id;
END $$;
COMMENT ON FUNCTION respool._free(uuid) IS
    'Returns a holding request''s units to its pool and policy counters (CHECK used >= 0 catches double frees). Caller changes the status.';

CREATE OR REPLACE FUNCTION respool._try_grant(p_request_id uuid, p_pool_id uuid, p_policy_id uuid, p_now timestamptz)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
BEGIN
    -- Admission is decided before the row lock: it depends only on the request's fixed resources
    -- and on this pool's counters, which the caller's pool lock holds still. A blocked request is
    -- thus never locked, and a concurrent pass of another candidate pool does not skip it.
    SELECT * INTO r FROM respool.requests WHERE id = p_request_id AND status = 'queued';
    IF NOT FOUND THEN
        RETURN 'gone';
    END IF;
    IF respool._blocker(r.resources, r.preemptible, p_pool_id, p_policy_id) IS NOT NULL
       OR respool._earmark_blocks(r, p_pool_id) THEN
        RETURN 'blocked';
    END IF;
    PERFORM 1 FROM respool.requests WHERE id = p_request_id AND status = 'queued' FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        -- Gone from the queue (committed after our snapshot) or locked by another transaction.
        RETURN CASE WHEN EXISTS (SELECT FROM respool.requests WHERE id = p_request_id AND status = 'queued')
                    THEN 'locked' ELSE 'gone' END;
    END IF;
    PERFORM respool._grant(p_request_id, p_pool_id, p_policy_id, p_now);
    RETURN 'granted';
END $$;
COMMENT ON FUNCTION respool._try_grant(uuid, uuid, uuid, timestamptz) IS
    'Grants one queued request in a pool whose row the caller has locked, if admissible: granted | blocked | locked | gone.';

CREATE OR REPLACE FUNCTION respool._free_units(p_pool_id uuid)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_object_agg(key, capacity - used), '{}')
      FROM respool.pool_resources WHERE pool_id = p_pool_id AND capacity IS NOT NULL
$$;
COMMENT ON FUNCTION respool._free_units(uuid) IS 'Free units (capacity - used, may be negative after a shrink) per tracked key of a pool.';

CREATE OR REPLACE FUNCTION respool._fits_free(p_resources jsonb, p_free jsonb)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT NOT EXISTS (SELECT FROM jsonb_each_text(p_resources) x
                        WHERE p_free ? x.key AND x.value::bigint > (p_free ->> x.key)::bigint)
$$;
COMMENT ON FUNCTION respool._fits_free(jsonb, jsonb) IS
    'Admission rule 1 alone against a _free_units map (keys the map lacks are not checked): a cheap necessary condition before the full check.';

CREATE OR REPLACE FUNCTION respool.allocate_pool(p_pool_id uuid, p_now timestamptz DEFAULT now())
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_queueing text;
    v_free jsonb;
    e record;
    outcome text;
    granted integer := 0;
BEGIN
    SELECT queueing INTO v_queueing FROM respool.pools WHERE id = p_pool_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    -- Requests that victims in their grace period were preempted for come first: the units
    -- those victims free are theirs (SPEC §5), whatever the queue order or queueing mode.
    FOR e IN SELECT r.id AS request_id, q.policy_id
               FROM respool.requests r
               JOIN respool.queue_entries q ON q.request_id = r.id AND q.pool_id = p_pool_id
              WHERE r.earmark_pool_id = p_pool_id AND r.status = 'queued'
              ORDER BY r.queued_at, r.id LOOP
        IF respool._try_grant(e.request_id, p_pool_id, e.policy_id, p_now) = 'granted' THEN
            granted := granted + 1;
        END IF;
    END LOOP;
    v_free := respool._free_units(p_pool_id);
    FOR e IN SELECT q.*, r.resources FROM respool._queue_order(p_pool_id) q
               JOIN respool.requests r ON r.id = q.request_id ORDER BY q.position LOOP
        -- Every request carries step_run: 1, so a full tracked step_run ends the pass.
        EXIT WHEN (v_free ->> 'step_run')::bigint <= 0;
        -- Free units only shrink during a pass: a request that fails rule 1 now stays blocked.
        IF NOT respool._fits_free(e.resources, v_free) THEN
            EXIT WHEN v_queueing = 'strict';
            CONTINUE;
        END IF;
        outcome := respool._try_grant(e.request_id, p_pool_id, e.policy_id, p_now);
        IF outcome = 'granted' THEN
            granted := granted + 1;
            v_free := respool._free_units(p_pool_id);
        ELSIF outcome IN ('blocked', 'locked') AND v_queueing = 'strict' THEN
            EXIT;
        END IF;
    END LOOP;
    RETURN granted;
END $$;
COMMENT ON FUNCTION respool.allocate_pool(uuid, timestamptz) IS
    'Locks the pool and grants its queue: first the requests holding an earmark in it, then in queue order; best_effort grants every request that fits, strict stops at the first that does not (or is locked elsewhere). Returns the number granted.';

CREATE OR REPLACE FUNCTION respool._enqueue(p_request_id uuid)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
    c record;
    added integer := 0;
BEGIN
    SELECT * INTO r FROM respool.requests WHERE id = p_request_id;
    FOR c IN SELECT p.id AS policy_id, p.pool_id
               FROM respool.policies p
              WHERE p.subject = r.subject AND p.pool_id = ANY (r.candidate_pool_ids) LOOP
        IF (respool._rejection(r.resources, r.preemptible, c.pool_id, c.policy_id)).reason IS NULL THEN
            INSERT INTO respool.queue_entries (pool_id, request_id, policy_id, queued_at)
            VALUES (c.pool_id, r.id, c.policy_id, r.queued_at);
            added := added + 1;
        END IF;
    END LOOP;
    RETURN added;
END $$;
COMMENT ON FUNCTION respool._enqueue(uuid) IS
    'Puts a request in the queue of every candidate pool where it can still ever fit (keeping its queue time); returns how many.';

CREATE OR REPLACE FUNCTION respool._after_preemption(p_request_id uuid, p_reason text, p_message text, p_now timestamptz)
RETURNS respool.requests LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
BEGIN
    r := respool._set_status(p_request_id, 'preempted', p_reason, p_message, p_now);
    IF r.attempt <= r.max_retries THEN
        UPDATE respool.requests
           SET attempt = attempt + 1,
               pool_id = CASE WHEN cardinality(candidate_pool_ids) = 1 THEN pool_id END,
               pool_name = CASE WHEN cardinality(candidate_pool_ids) = 1 THEN pool_name END
         WHERE id = p_request_id;
        IF respool._enqueue(p_request_id) > 0 THEN
            r := respool._set_status(p_request_id, 'queued', 'retry',
                                     format('requeued for attempt %s after preemption', r.attempt + 1), p_now);
        ELSE
            r := respool._reject_unfittable(p_request_id, p_now);
        END IF;
    END IF;
    RETURN r;
END $$;
COMMENT ON FUNCTION respool._after_preemption(uuid, text, text, timestamptz) IS
    'Marks a freed victim preempted and, while attempt <= max_retries, requeues it (attempt + 1, original queue time).';

CREATE OR REPLACE FUNCTION respool._reject_unfittable(p_request_id uuid, p_now timestamptz)
RETURNS respool.requests LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
    v_reason text := 'no_policy';
    v_messages text[] := '{}';
    c record;
BEGIN
    SELECT * INTO r FROM respool.requests WHERE id = p_request_id;
    FOR c IN SELECT p.id AS policy_id, p.pool_id, pl.name
               FROM respool.policies p JOIN respool.pools pl ON pl.id = p.pool_id
              WHERE p.subject = r.subject AND p.pool_id = ANY (r.candidate_pool_ids)
              ORDER BY p.priority DESC, pl.name LOOP
        DECLARE
            rej record := respool._rejection(r.resources, r.preemptible, c.pool_id, c.policy_id);
        BEGIN
            IF rej.reason IS NOT NULL THEN
                IF cardinality(v_messages) = 0 THEN
                    v_reason := rej.reason;
                END IF;
                v_messages := v_messages || rej.message;
            END IF;
        END;
    END LOOP;
    IF cardinality(v_messages) = 0 THEN
        v_messages := ARRAY[format('subject %s has no policy left on its candidate pools', r.subject)];
    END IF;
    DELETE FROM respool.queue_entries WHERE request_id = p_request_id;
    RETURN respool._set_status(p_request_id, 'rejected', v_reason, array_to_string(v_messages, '; '), p_now);
END $$;
COMMENT ON FUNCTION respool._reject_unfittable(uuid, timestamptz) IS
    'Rejects a request that can no longer fit any candidate pool, with the first candidate''s reason and every candidate''s message.';
