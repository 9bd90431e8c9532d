-- Lease life in one place: heartbeats renew a holding's lease (or a queued request's queue lease);
-- the reconciler's step 1 expires lapsed leases and abandoned queue leases, and ends runtime caps
-- (max_seconds) whatever the heartbeats.

-- The signature grew p_lease_seconds (0008), last so that positional calls keep working: drop
-- the old one, or calls by name would be ambiguous.
DROP FUNCTION IF EXISTS respool.heartbeat_request(uuid, integer, timestamptz);
DROP FUNCTION IF EXISTS respool.heartbeat_request(uuid, integer, timestamptz, integer);
DROP FUNCTION IF EXISTS respool.heartbeat_request(uuid, integer, timestamptz, integer, integer);
CREATE OR REPLACE FUNCTION respool._check_usage(p_usage jsonb)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
    v jsonb;
BEGIN
    IF respool._absent_map(p_usage, 'usage',
                           'usage must be an object of <key>_memory_mb to the MiB used, e.g. {"gpu_memory_mb": 20480}') THEN
        RETURN;
    END IF;
    FOR k, v IN SELECT key, value FROM jsonb_each(p_usage) ORDER BY key LOOP
        IF k !~ '_memory_mb$' THEN
            PERFORM respool._fail('RP400', 'usage.' || k, format(
                'usage.%s: not a <K>_memory_mb key (the memory of a slice of device key K, e.g. gpu_memory_mb)', k));
        END IF;
        PERFORM respool._amount(v, 'usage.' || k);
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._check_usage(jsonb) IS 'Validates a heartbeat''s usage (NULL: none): an object of at most _max_keys() <K>_memory_mb keys, each a whole number of MiB from 0 to _max_amount(); RP400 naming usage or usage.<key>.';

CREATE OR REPLACE FUNCTION respool._report_usage(p_id uuid, p_attempt integer, p_usage jsonb, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
    u record;
    v_crossed text[] := '{}';
    v_message text;
BEGIN
    SELECT * INTO r FROM respool.requests WHERE id = p_id;
    IF NOT FOUND OR r.status <> 'allocated' OR r.attempt <> coalesce(p_attempt, r.attempt) THEN
        RETURN;
    END IF;
    -- Above a slice: decide under the pool and request locks (lock order: pools, then the
    -- request), so two reports never both see the crossing and a termination can follow.
    IF EXISTS (SELECT FROM jsonb_each_text(p_usage) x
                WHERE r.resources ? x.key AND x.value::bigint > (r.resources ->> x.key)::bigint) THEN
        r := respool._lock_request(p_id, p_attempt);
        IF r.status <> 'allocated' THEN
            RETURN;
        END IF;
    END IF;
    -- Only the keys the request asked (its own resources): a key it holds no slice of is ignored.
    FOR u IN SELECT x.key, x.value::bigint AS used, (r.resources ->> x.key)::bigint AS slice,
                    coalesce(s.over AND s.attempt = r.attempt, false) AS was_over
               FROM jsonb_each_text(p_usage) x
               LEFT JOIN respool.slice_use s ON s.request_id = p_id AND s.key = x.key
              WHERE r.resources ? x.key
              ORDER BY x.key LOOP
        INSERT INTO respool.slice_use AS s (request_id, key, attempt, used, slice, over, reported_at)
        VALUES (p_id, u.key, r.attempt, u.used, u.slice, u.used > u.slice, p_now)
        ON CONFLICT (request_id, key) DO UPDATE
           SET attempt = excluded.attempt, used = excluded.used, slice = excluded.slice,
               over = excluded.over, reported_at = excluded.reported_at;
        IF u.used > u.slice AND NOT u.was_over THEN  -- a crossing: once until it drops back
            v_crossed := v_crossed || format('%s %s MiB used, above its slice of %s MiB', u.key, u.used, u.slice);
        END IF;
    END LOOP;
    IF cardinality(v_crossed) = 0 THEN
        RETURN;
    END IF;
    v_message := 'over its slice: ' || array_to_string(v_crossed, ', ');
    -- An event without a status change, as a settlement's (039_rates.sql).
    INSERT INTO respool.events (request_id, at, from_status, to_status, reason, attempt, message)
    VALUES (p_id, p_now, 'allocated', 'allocated', 'over_slice', r.attempt, v_message);
    IF (SELECT slice_overuse FROM respool.pools WHERE id = r.pool_id) = 'terminate' THEN
        PERFORM respool._terminate_holding(p_id, 'over_slice', v_message || '; its pool terminates slice overuse',
                                           format('gang %s: member %s was over its slice', r.gang_id, p_id), p_now);
    END IF;
END $$;
COMMENT ON FUNCTION respool._report_usage(uuid, integer, jsonb, timestamptz) IS 'A holder''s reported use of its slices, for an allocated request on p_attempt (else nothing): per <K>_memory_mb key the request asked (others are ignored), respool.slice_use keeps the last report. Use above the slice that was not above at the previous report of the attempt (a crossing) records one over_slice event (from and to allocated), under the pool and request locks; when the pool''s slice_overuse is terminate, the holder and its gang are also terminated, reason over_slice (respool._terminate_holding).';

CREATE OR REPLACE FUNCTION respool.heartbeat_request(p_id uuid, p_attempt integer DEFAULT NULL,
                                                     p_now timestamptz DEFAULT now(),
                                                     p_lease_seconds integer DEFAULT NULL,
                                                     p_queue_lease_seconds integer DEFAULT NULL,
                                                     p_usage jsonb DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
    v_seconds integer;
BEGIN
    IF p_lease_seconds IS NOT NULL AND p_lease_seconds NOT BETWEEN 1 AND respool._max_seconds() THEN
        PERFORM respool._fail('RP400', 'lease_seconds', 'lease_seconds must be between 1 and ' || respool._max_seconds());
    END IF;
    IF p_queue_lease_seconds IS NOT NULL AND p_queue_lease_seconds NOT BETWEEN 1 AND respool._max_seconds() THEN
        PERFORM respool._fail('RP400', 'queue_lease_seconds',
                              'queue_lease_seconds must be between 1 and ' || respool._max_seconds());
    END IF;
    PERFORM respool._check_usage(p_usage);
    SELECT * INTO r FROM respool.requests WHERE id = p_id;
    IF FOUND AND r.status = 'allocated' AND r.lease_expires_at <= p_now
       AND respool.leases_may_lapse() THEN
        -- The lease already lapsed: expire it now rather than revive it (no double use).
        -- Not while respool looks down (an outage): the lapse was ours, the lease is extended.
        -- As the reconciler would: a job with retries left is queued again as the next attempt.
        r := respool._lock_request(p_id, p_attempt);
        IF r.status = 'allocated' AND r.lease_expires_at <= p_now THEN
            PERFORM respool._expire_one(p_id, 'lease_expired', 'lease lapsed without a heartbeat', p_now);
            PERFORM respool.allocate_pool(r.pool_id, p_now);
        END IF;
        RETURN respool.request_json(p_id);
    END IF;
    IF NOT FOUND THEN
        PERFORM respool._fail('RP404', 'id', format('request %s not found', p_id));
    END IF;
    IF p_attempt IS NOT NULL AND p_attempt <> r.attempt THEN
        PERFORM respool._fail('RP409', 'attempt', format(
            'stale attempt %s: request %s is on attempt %s', p_attempt, p_id, r.attempt));
    END IF;
    IF r.status = 'allocated' AND p_usage IS NOT NULL AND p_usage <> '{}' AND jsonb_typeof(p_usage) = 'object' THEN
        -- Before the lease update, which locks the request row: a crossing locks the pools first.
        PERFORM respool._report_usage(p_id, p_attempt, p_usage, p_now);
        SELECT * INTO r FROM respool.requests WHERE id = p_id;  -- terminated: no lease to renew
    END IF;
    v_seconds := coalesce(p_lease_seconds, r.lease_seconds);
    -- No FOR UPDATE here: a lock on a queued request would make a concurrent allocation pass
    -- skip it (SKIP LOCKED; a strict pool stops there). Only the lease UPDATE locks the row,
    -- and only while it is still allocated on the same attempt.
    IF r.status = 'allocated' AND v_seconds IS NOT NULL THEN
        -- (a job not claimed yet has no lease: it starts at the claim, respool.claim_job)
        UPDATE respool.requests SET lease_expires_at = p_now + make_interval(secs => v_seconds),
                                    updated_at = p_now
         WHERE id = p_id AND status = 'allocated' AND attempt = r.attempt
           AND (command IS NULL OR gang_id IS NOT NULL OR claimed_attempt = attempt);
        IF NOT FOUND THEN
            SELECT * INTO r FROM respool.requests WHERE id = p_id;  -- it moved on meanwhile
            IF p_attempt IS NOT NULL AND p_attempt <> r.attempt THEN
                PERFORM respool._fail('RP409', 'attempt', format(
                    'stale attempt %s: request %s is on attempt %s', p_attempt, p_id, r.attempt));
            END IF;
        END IF;
    ELSIF r.status = 'queued' AND coalesce(p_queue_lease_seconds, v_seconds) IS NOT NULL THEN
        -- The queue lease lives in its own row (0008): the request row stays unlocked.
        INSERT INTO respool.queue_leases AS l (request_id, attempt, expires_at)
        VALUES (p_id, r.attempt, p_now + make_interval(secs => coalesce(p_queue_lease_seconds, v_seconds)))
        ON CONFLICT (request_id) DO UPDATE SET attempt = excluded.attempt, expires_at = excluded.expires_at;
    END IF;
    RETURN respool.request_json(p_id);
END $$;
COMMENT ON FUNCTION respool.heartbeat_request(uuid, integer, timestamptz, integer, integer, jsonb) IS 'Allocated: the lease becomes now + p_lease_seconds (default: the request''s lease_seconds; none without one, nor for a job not yet claimed), locking only the request row; a lapsed lease is expired as the reconciler would (a job with retries left is requeued), never revived. p_usage: use of its slices (respool._report_usage). Queued: the queue lease (respool.queue_leases) becomes now + p_queue_lease_seconds, the request row unlocked; when it lapses the request is cancelled (abandoned). RP400 for a bad length, RP404, RP409 for a stale p_attempt. Returns the request.';

CREATE OR REPLACE FUNCTION respool._expire_one(p_id uuid, p_reason text, p_message text, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT status FROM respool.requests WHERE id = p_id) <> 'allocated' THEN
        RETURN 0;  -- it already followed its gang
    END IF;
    PERFORM respool._unplace(p_id);
    IF p_reason = 'lease_expired' AND respool._job_requeue_expired(p_id, p_now) THEN
        RETURN 1;  -- a job with retries left runs again (docs/jobs.md)
    END IF;
    PERFORM respool._set_status(p_id, 'expired', p_reason, p_message, p_now);
    RETURN 1 + respool._gang_follow(p_id, 'expired', p_reason, 'expired', p_now);  -- gangs: docs/scheduling.md
END $$;
COMMENT ON FUNCTION respool._expire_one(uuid, text, text, timestamptz) IS 'An allocated request the caller has locked (in a pool it has locked) becomes expired with p_reason, its units freed, and the rest of its gang follows (docs/scheduling.md, gangs). Returns how many requests expired (0 when it was no longer allocated).';

CREATE OR REPLACE FUNCTION respool._expire_pool(p_pool_id uuid, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    RETURN (SELECT coalesce(sum(respool._expire_one(id, 'lease_expired', 'lease lapsed without a heartbeat', p_now)), 0)
              FROM (SELECT id FROM respool.requests
                     WHERE pool_id = p_pool_id AND status = 'allocated' AND lease_expires_at <= p_now
                     ORDER BY lease_expires_at, id FOR UPDATE SKIP LOCKED) due);
END $$;
COMMENT ON FUNCTION respool._expire_pool(uuid, timestamptz) IS 'In a pool the caller has locked: allocated requests whose lease lapsed become expired (with the rest of their gang, docs/scheduling.md, gangs) and their units are freed. A request locked by a concurrent heartbeat is left for the next pass.';

CREATE OR REPLACE FUNCTION respool._abandon_queue_leases(p_pool_id uuid, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    abandoned integer := 0;
    v_id uuid;
    v_pool uuid;
    v_pools uuid[];
BEGIN
    -- Queued requests of this pool whose queue lease (on their current attempt) lapsed. A request
    -- locked elsewhere (being granted, or a heartbeat's lease update) is left for the next pass.
    -- gangs (docs/scheduling.md): a gang waits on one member's entries: a lapsed member of it counts too.
    FOR v_id IN SELECT r.id
                  FROM respool.queue_leases l
                  JOIN respool.requests r ON r.id = l.request_id
                 WHERE l.expires_at <= p_now AND r.status = 'queued' AND r.attempt = l.attempt
                   AND EXISTS (SELECT FROM respool.queue_entries e
                                WHERE e.pool_id = p_pool_id
                                  AND (e.request_id = r.id
                                       OR e.request_id IN (SELECT m.id FROM respool.requests m
                                                            WHERE m.gang_id = r.gang_id)))
                 ORDER BY l.expires_at, r.id
                   FOR UPDATE OF r SKIP LOCKED LOOP
        -- Re-check under the row lock: a heartbeat may have renewed the lease meanwhile.
        CONTINUE WHEN NOT EXISTS (SELECT FROM respool.queue_leases l JOIN respool.requests r ON r.id = l.request_id
                                   WHERE l.request_id = v_id AND l.expires_at <= p_now
                                     AND r.status = 'queued' AND r.attempt = l.attempt);
        CONTINUE WHEN NOT respool._gang_lockable(v_id);  -- gangs (docs/scheduling.md): never wait for a member
        v_pools := respool._unqueue(v_id);
        PERFORM respool._set_status(v_id, 'cancelled', 'abandoned',
                                    'queue lease lapsed: the waiting client stopped heartbeating', p_now);
        PERFORM respool._gang_follow(v_id, 'cancelled', 'abandoned', 'abandoned', p_now);  -- gangs: docs/scheduling.md
        DELETE FROM respool.queue_leases WHERE request_id = v_id;
        -- This pool's queue moves in the caller's step 4; other candidate pools are not locked
        -- here (lock order), so their reconcilers are woken instead.
        FOREACH v_pool IN ARRAY coalesce(v_pools, '{}') LOOP
            IF v_pool <> p_pool_id THEN
                PERFORM respool._pool_changed(v_pool);
            END IF;
        END LOOP;
        abandoned := abandoned + 1;
    END LOOP;
    -- Rows that bind nothing any more: their request left the queue, moved to another attempt,
    -- or is gone. Rows locked by a concurrent heartbeat or pass are left for a later one.
    DELETE FROM respool.queue_leases l
     WHERE l.request_id IN (SELECT x.request_id FROM respool.queue_leases x
                             WHERE NOT EXISTS (SELECT FROM respool.requests r
                                                WHERE r.id = x.request_id AND r.status = 'queued'
                                                  AND r.attempt = x.attempt)
                             FOR UPDATE SKIP LOCKED);
    RETURN abandoned;
END $$;
COMMENT ON FUNCTION respool._abandon_queue_leases(uuid, timestamptz) IS 'Reconciler step 1, in a pool the caller has locked: queued requests of the pool whose queue lease lapsed on their current attempt become cancelled (reason abandoned; with the rest of their gang, docs/scheduling.md, gangs) and leave every queue; other candidate pools'' reconcilers are woken. Also removes queue leases that no longer bind a queued request. Returns how many were abandoned.';

CREATE OR REPLACE FUNCTION respool._expire_max_seconds(p_pool_id uuid, p_now timestamptz)
RETURNS integer LANGUAGE sql AS $$
    SELECT coalesce(sum(respool._expire_one(id, 'max_seconds',
                                            format('ran for its max_seconds (%s s)', max_seconds), p_now)), 0)::integer
      FROM (SELECT id, max_seconds FROM respool.requests
             WHERE pool_id = p_pool_id AND status = 'allocated' AND run_deadline <= p_now
             ORDER BY run_deadline, id FOR UPDATE SKIP LOCKED) due
$$;
COMMENT ON FUNCTION respool._expire_max_seconds(uuid, timestamptz) IS 'In a pool the caller has locked: allocated requests past allocated_at + max_seconds become expired (reason max_seconds; with the rest of their gang, docs/scheduling.md), whatever their heartbeats, and their units are freed. A row locked by a concurrent heartbeat is left for the next pass.';

CREATE OR REPLACE FUNCTION respool.expire_leases(p_pool_id uuid, p_now timestamptz DEFAULT now())
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    expired integer;
BEGIN
    PERFORM respool._lock_pools(ARRAY[p_pool_id]);
    expired := respool._expire_pool(p_pool_id, p_now);
    IF expired > 0 THEN
        PERFORM respool.allocate_pool(p_pool_id, p_now);
    END IF;
    RETURN expired;
END $$;
COMMENT ON FUNCTION respool.expire_leases(uuid, timestamptz) IS 'Lease expiry alone for one pool (reconcile_pool does it as its step 1): lapsed leases become expired, their units are freed and the queue is granted.';
