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

CREATE OR REPLACE FUNCTION respool._blocker(p_resources jsonb, p_preemptible boolean, p_pool_id uuid, p_policy_id uuid)
RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- PL/pgSQL, not SQL: PostgreSQL before 18 plans a SQL function's body on every call, and
    -- this runs for every grant attempt and every read of a queued request.
    RETURN (SELECT msg FROM (
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
    LIMIT 1);
END $$;
COMMENT ON FUNCTION respool._blocker(jsonb, boolean, uuid, uuid) IS
    'Admission rules 1-3 of SPEC §4 against the current counters: NULL when admissible, else what blocks it.';

CREATE OR REPLACE FUNCTION respool._earmark_blocks(p_request respool.requests, p_pool_id uuid)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- Once every victim in its grace period has left (their units gone) and every earmarked
    -- request has its units, would p_request still fit? Checked only while earmarks exist.
    -- The two cheap tests first, as statements of their own: nearly always one of them ends it.
    IF p_request.earmark_pool_id IS NOT DISTINCT FROM p_pool_id
       OR NOT EXISTS (SELECT FROM respool.requests b
                       WHERE b.earmark_pool_id = p_pool_id AND b.status = 'queued'
                         AND b.id <> p_request.id) THEN
        RETURN false;
    END IF;
    RETURN EXISTS (
           SELECT FROM jsonb_each_text(p_request.resources) x
             JOIN respool.pool_resources pr ON pr.pool_id = p_pool_id AND pr.key = x.key
            WHERE pr.capacity IS NOT NULL
              AND pr.used + x.value::bigint
                  - coalesce((SELECT sum((v.resources ->> x.key)::bigint) FROM respool.requests v
                               WHERE v.pool_id = p_pool_id AND v.status = 'preempting'), 0)
                  + coalesce((SELECT sum((b.resources ->> x.key)::bigint) FROM respool.requests b
                               WHERE b.earmark_pool_id = p_pool_id AND b.status = 'queued'
                                 AND b.id <> p_request.id), 0)
                  > pr.capacity);
END $$;
COMMENT ON FUNCTION respool._earmark_blocks(respool.requests, uuid) IS
    'True when granting p_request would take units earmarked for another request (units that victims in their grace period will free). Never true for the earmark holder itself.';

CREATE OR REPLACE FUNCTION respool._rejection(p_resources jsonb, p_preemptible boolean, p_pool_id uuid,
                                              p_policy_id uuid, OUT reason text, OUT message text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    WITH k AS (
        SELECT x.key, x.value::bigint AS need, respool._effective_capacity(x.key, pr.capacity) AS cap,
               coalesce(pol.reserved, 0) AS reserved, pol."limit" AS lim
          FROM jsonb_each_text(p_resources) x
          LEFT JOIN respool.pool_resources pr ON pr.pool_id = p_pool_id AND pr.key = x.key
          LEFT JOIN respool.policy_resources pol ON pol.policy_id = p_policy_id AND pol.key = x.key
    ), pool AS (SELECT name FROM respool.pools WHERE id = p_pool_id)
    SELECT c.reason, c.message INTO reason, message FROM (VALUES (1)) AS one(x) LEFT JOIN LATERAL (
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
    ) c ON true;
END $$;
COMMENT ON FUNCTION respool._rejection(jsonb, boolean, uuid, uuid) IS
    'The §4 rejection table for one candidate pool: always one row, (NULL, NULL) when the request can ever fit there.';

CREATE OR REPLACE FUNCTION respool._queue_groups(p_pool_id uuid, p_skip_earmarked boolean DEFAULT false)
RETURNS TABLE (policy_id uuid, subject text, preemptible boolean, resources jsonb, priority integer,
               in_share boolean, queued_at timestamptz, request_id uuid)
LANGUAGE sql STABLE AS $$
    -- Entries of one shape (policy, preemptible, resources) are alike for every admission rule
    -- and for in-share, so they keep their queue-time order among themselves: one row per shape,
    -- with its first entry. A skip scan of queue_entries_shape_idx finds the shapes, so this
    -- costs O(shapes * log(queue)), not O(queue).
    WITH RECURSIVE shapes AS (
        (SELECT e.policy_id, e.preemptible, e.resources FROM respool.queue_entries e
          WHERE e.pool_id = p_pool_id
          ORDER BY e.policy_id, e.preemptible, e.resources LIMIT 1)
        UNION ALL
        SELECT n.* FROM shapes s CROSS JOIN LATERAL (
            SELECT e.policy_id, e.preemptible, e.resources FROM respool.queue_entries e
             WHERE e.pool_id = p_pool_id
               AND (e.policy_id, e.preemptible, e.resources) > (s.policy_id, s.preemptible, s.resources)
             ORDER BY e.policy_id, e.preemptible, e.resources LIMIT 1) n
    ), tracked AS (
        SELECT coalesce(array_agg(pr.key) FILTER (WHERE pr.capacity IS NOT NULL), '{}') AS keys
          FROM respool.pool_resources pr WHERE pr.pool_id = p_pool_id
    )
    SELECT s.policy_id, p.subject, s.preemptible, s.resources, p.priority, i.in_share, h.queued_at, h.request_id
      FROM shapes s
      JOIN respool.policies p ON p.id = s.policy_id
     CROSS JOIN tracked t
     CROSS JOIN LATERAL (
            -- In share: for every tracked (or non-soft) key, the subject's used + the request
            -- <= its reserved share.
            SELECT NOT EXISTS (
                SELECT FROM jsonb_each_text(s.resources) x
                  LEFT JOIN respool.policy_resources pol ON pol.policy_id = s.policy_id AND pol.key = x.key
                 WHERE (x.key = ANY (t.keys) OR NOT respool._is_soft_key(x.key))
                   AND x.value::bigint > coalesce(pol.reserved - pol.used, 0)) AS in_share) i
     CROSS JOIN LATERAL (
            SELECT e.queued_at, e.request_id FROM respool.queue_entries e
             WHERE e.pool_id = p_pool_id AND e.policy_id = s.policy_id
               AND e.preemptible = s.preemptible AND e.resources = s.resources
               AND (NOT p_skip_earmarked
                    OR NOT EXISTS (SELECT FROM respool.requests r
                                    WHERE r.id = e.request_id AND r.earmark_pool_id IS NOT NULL))
             ORDER BY e.queued_at, e.request_id LIMIT 1) h
$$;
COMMENT ON FUNCTION respool._queue_groups(uuid, boolean) IS
    'A pool''s queue by shape (policy, preemptible, resources): each shape''s policy priority, in-share flag and first entry (with p_skip_earmarked, its first entry holding no earmark; a shape with none is left out). Entries of one shape are granted in queue-time order, so the queue order is the merge of the shapes by (priority desc, in-share first, queue time, id). Costs O(shapes), not O(queue). Read-only.';

CREATE OR REPLACE FUNCTION respool._next_of_shape(p_pool_id uuid, p_policy_id uuid, p_preemptible boolean,
                                                  p_resources jsonb, p_after_at timestamptz, p_after_id uuid,
                                                  OUT queued_at timestamptz, OUT request_id uuid)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT e.queued_at, e.request_id INTO queued_at, request_id FROM respool.queue_entries e
     WHERE e.pool_id = p_pool_id AND e.policy_id = p_policy_id
       AND e.preemptible = p_preemptible AND e.resources = p_resources
       AND (e.queued_at, e.request_id) > (p_after_at, p_after_id)
     ORDER BY e.queued_at, e.request_id LIMIT 1;
END $$;
COMMENT ON FUNCTION respool._next_of_shape(uuid, uuid, boolean, jsonb, timestamptz, uuid) IS
    'The entry of one queue shape that follows (p_after_at, p_after_id) in queue-time order (NULLs when none): one index probe.';

CREATE OR REPLACE FUNCTION respool._queue_order(p_pool_id uuid)
RETURNS TABLE (request_id uuid, policy_id uuid, subject text, priority integer, in_share boolean,
               queued_at timestamptz, "position" bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    -- In-share is decided once per shape (respool._queue_groups), not once per entry.
    SELECT e.request_id, e.policy_id, g.subject, g.priority, g.in_share, e.queued_at,
           row_number() OVER (ORDER BY g.priority DESC, g.in_share DESC, e.queued_at, e.request_id)
      FROM respool.queue_entries e
      JOIN respool._queue_groups(p_pool_id) g
        ON g.policy_id = e.policy_id AND g.preemptible = e.preemptible AND g.resources = e.resources
     WHERE e.pool_id = p_pool_id
     ORDER BY 7
$$;
COMMENT ON FUNCTION respool._queue_order(uuid) IS
    'A pool''s whole queue in grant order (SPEC §4): policy priority desc, in-share first, queue time, id. Read-only; O(queue), for the respool.queue view (the engine itself works shape by shape).';

CREATE OR REPLACE FUNCTION respool._queue_position(p_pool_id uuid, p_request_id uuid)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    me respool.queue_entries;
    g record;
    v_priority integer;
    v_in_share boolean;
    ahead bigint := 0;
    n bigint;
BEGIN
    SELECT * INTO me FROM respool.queue_entries WHERE pool_id = p_pool_id AND request_id = p_request_id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT q.priority, q.in_share INTO v_priority, v_in_share FROM respool._queue_groups(p_pool_id) q
     WHERE q.policy_id = me.policy_id AND q.preemptible = me.preemptible AND q.resources = me.resources;
    -- Count only what is ahead: whole shapes of a higher (priority, in-share) class, and the
    -- earlier entries of shapes in the request's own class. A policy that queues one shape only
    -- is counted on queue_entries_policy_idx (no comparison of resources per entry).
    FOR g IN SELECT * FROM (SELECT q.*, count(*) OVER (PARTITION BY q.policy_id) AS policy_shapes
                              FROM respool._queue_groups(p_pool_id) q) q
              WHERE (q.priority, q.in_share) >= (v_priority, v_in_share) LOOP
        IF g.policy_shapes = 1 AND (g.priority, g.in_share) > (v_priority, v_in_share) THEN
            SELECT count(*) INTO n FROM respool.queue_entries e WHERE e.policy_id = g.policy_id;
        ELSIF g.policy_shapes = 1 THEN
            SELECT count(*) INTO n FROM respool.queue_entries e
             WHERE e.policy_id = g.policy_id AND (e.queued_at, e.request_id) < (me.queued_at, me.request_id);
        ELSIF (g.priority, g.in_share) > (v_priority, v_in_share) THEN
            SELECT count(*) INTO n FROM respool.queue_entries e
             WHERE e.pool_id = p_pool_id AND e.policy_id = g.policy_id
               AND e.preemptible = g.preemptible AND e.resources = g.resources;
        ELSE
            SELECT count(*) INTO n FROM respool.queue_entries e
             WHERE e.pool_id = p_pool_id AND e.policy_id = g.policy_id
               AND e.preemptible = g.preemptible AND e.resources = g.resources
               AND (e.queued_at, e.request_id) < (me.queued_at, me.request_id);
        END IF;
        ahead := ahead + n;
    END LOOP;
    RETURN ahead + 1;
END $$;
COMMENT ON FUNCTION respool._queue_position(uuid, uuid) IS
    'A queued request''s 1-based position in one pool''s queue, exactly as in _queue_order, by counting only the entries ahead of it (whole shapes of a higher class, earlier entries of its own class); NULL when it is not in that queue.';

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
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(key, capacity - used), '{}')
              FROM respool.pool_resources WHERE pool_id = p_pool_id AND capacity IS NOT NULL);
END $$;
COMMENT ON FUNCTION respool._free_units(uuid) IS 'Free units (capacity - used, may be negative after a shrink) per tracked key of a pool.';

CREATE OR REPLACE FUNCTION respool._fits_free(p_resources jsonb, p_free jsonb)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN NOT EXISTS (SELECT FROM jsonb_each_text(p_resources) x
                        WHERE p_free ? x.key AND x.value::bigint > (p_free ->> x.key)::bigint);
END $$;
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
    g_policy uuid[];
    g_preemptible boolean[];
    g_resources jsonb[];
    g_priority integer[];
    g_in_share boolean[];
    g_at timestamptz[];
    g_id uuid[];
    best integer;
    i integer;
    next_at timestamptz;
    next_id uuid;
BEGIN
    SELECT queueing INTO v_queueing FROM respool.pools WHERE id = p_pool_id FOR NO KEY UPDATE;
    IF NOT FOUND OR NOT EXISTS (SELECT FROM respool.queue_entries WHERE pool_id = p_pool_id) THEN
        RETURN 0;  -- gone, or nobody waits: the common case after a release
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
    -- Every request carries step_run: 1, so a full tracked step_run ends the pass.
    IF (v_free ->> 'step_run')::bigint <= 0 THEN
        RETURN granted;
    END IF;
    -- The queue order is the merge of the shapes' queues (respool._queue_groups): take the best
    -- head each time. In-share is decided at the start of the pass, as for the whole queue.
    SELECT coalesce(array_agg(g.policy_id), '{}'), array_agg(g.preemptible), array_agg(g.resources),
           array_agg(g.priority), array_agg(g.in_share), array_agg(g.queued_at), array_agg(g.request_id)
      INTO g_policy, g_preemptible, g_resources, g_priority, g_in_share, g_at, g_id
      FROM respool._queue_groups(p_pool_id) g;
    LOOP
        best := NULL;
        FOR i IN 1..cardinality(g_policy) LOOP
            CONTINUE WHEN g_id[i] IS NULL;  -- shape done for this pass
            IF best IS NULL
               OR (-g_priority[i]::bigint, NOT g_in_share[i], g_at[i], g_id[i])
                  < (-g_priority[best]::bigint, NOT g_in_share[best], g_at[best], g_id[best]) THEN
                best := i;
            END IF;
        END LOOP;
        EXIT WHEN best IS NULL;
        -- Free units only shrink during a pass, and the limit and reserved-share rules only
        -- tighten: a shape that is blocked now stays blocked, whichever of its entries we try.
        IF NOT respool._fits_free(g_resources[best], v_free) THEN
            EXIT WHEN v_queueing = 'strict';
            g_id[best] := NULL;
            CONTINUE;
        END IF;
        outcome := respool._try_grant(g_id[best], p_pool_id, g_policy[best], p_now);
        IF outcome = 'granted' THEN
            granted := granted + 1;
            v_free := respool._free_units(p_pool_id);
            EXIT WHEN (v_free ->> 'step_run')::bigint <= 0;
        ELSIF outcome = 'blocked' THEN
            EXIT WHEN v_queueing = 'strict';
            g_id[best] := NULL;
            CONTINUE;
        ELSIF outcome = 'locked' AND v_queueing = 'strict' THEN
            EXIT;
        END IF;
        -- granted, gone, or locked in best_effort: the shape's next entry
        SELECT n.queued_at, n.request_id INTO next_at, next_id
          FROM respool._next_of_shape(p_pool_id, g_policy[best], g_preemptible[best], g_resources[best],
                                      g_at[best], g_id[best]) n;
        g_at[best] := next_at;
        g_id[best] := next_id;
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
            INSERT INTO respool.queue_entries (pool_id, request_id, policy_id, queued_at, resources, preemptible)
            VALUES (c.pool_id, r.id, c.policy_id, r.queued_at, r.resources, r.preemptible);
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
