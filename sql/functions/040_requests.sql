-- Resource requests: create (with idempotency), read, release, cancel, heartbeat, delete, expire.

DROP FUNCTION IF EXISTS respool._request_json(uuid, jsonb);

CREATE OR REPLACE FUNCTION respool._request_doc(r respool.requests, p_position bigint, p_message text,
                                                p_eta jsonb)
RETURNS json LANGUAGE sql IMMUTABLE AS $$
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
        'max_seconds', r.max_seconds, 'run_deadline', r.run_deadline, 'eta', p_eta, 'gang_id', r.gang_id)
$$;
COMMENT ON FUNCTION respool._request_doc(respool.requests, bigint, text, jsonb) IS
    'The one JSON shape of a request as the API shows it, from its row and the computed queue position, message (NULL: empty) and ETA: shared by the one-request read (as jsonb) and the page read (json_agg), so both give the same document.';

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
        -- [SPEC §11.6] a gang member waits as its gang: the entries of the gang's stand-in.
        q := CASE WHEN r.gang_id IS NULL THEN r ELSE respool._queued_as(r.id) END;
        -- One request on its own: positions by counting what is ahead (_queue_position), the ETA
        -- simulation stopped at it. respool._queued_details gives the same for a page at once.
        SELECT count(*) INTO v_pools FROM respool.queue_entries WHERE request_id = q.id;
        SELECT min(o.position),
               string_agg(CASE WHEN v_pools > 1 THEN pl.name || ': ' ELSE '' END
                          || CASE WHEN q.earmark_pool_id = e.pool_id
                                  THEN 'preempted units are being released for it'
                                  ELSE coalesce(respool._blocker(e.resources, e.preemptible, e.pool_id, e.policy_id),
                                                CASE WHEN respool._earmark_blocks(q, e.pool_id)
                                                     THEN 'waiting: freed units are earmarked for a request that preempted others'
                                                     -- [SPEC §11.1] the starvation guard holds it back
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
        v_eta := respool._request_eta(q.id, now());  -- [SPEC §11.4]
        IF r.gang_id IS NOT NULL THEN
            v_message := format('gang %s: ', r.gang_id)
                         || coalesce(v_message, 'waiting until every member has given its units back');
        END IF;
    END IF;
    RETURN respool._request_doc(r, v_position, v_message, v_eta)::jsonb;
END $$;
COMMENT ON FUNCTION respool._request_json(uuid) IS
    'A request as the API shows it; for a queued one, its best queue position, what blocks it (or the starvation hold) and its ETA, computed now for this request alone (for a gang member: its gang''s, SPEC §11.6).';

CREATE OR REPLACE FUNCTION respool.request_json(p_id uuid)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT respool._request_json(p_id)
$$;
COMMENT ON FUNCTION respool.request_json(uuid) IS
    'A request as the API shows it; for a queued one, its best queue position, what blocks it (or the starvation hold) and its ETA, computed now.';

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

CREATE OR REPLACE FUNCTION respool._grant_at_once(p_request respool.requests, p_now timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    SELECT p.pool_id, p.id AS policy_id INTO c
      FROM respool.policies p JOIN respool.pools pl ON pl.id = p.pool_id
     WHERE p.subject = p_request.subject AND p.pool_id = ANY (p_request.candidate_pool_ids)
     ORDER BY p.priority DESC, pl.name LIMIT 1;
    -- With an empty queue nothing is ahead of it, in either queueing mode, and no pool holds
    -- for a starving head (a pool with a queue is left to respool._try_new).
    RETURN FOUND AND NOT EXISTS (SELECT FROM respool.queue_entries WHERE pool_id = c.pool_id)
           AND respool._try_grant(p_request.id, c.pool_id, c.policy_id, p_now) = 'granted';
END $$;
COMMENT ON FUNCTION respool._grant_at_once(respool.requests, timestamptz) IS
    'A new request (not a gang member), its candidate pools locked by the caller and no queue entry yet: granted now in its first candidate pool when nobody queues there and the pool admits it, as respool._try_new would, without a queue entry written and deleted again. False (nothing changed) otherwise: the caller queues it (respool._try_new).';

CREATE OR REPLACE FUNCTION respool._try_new(p_id uuid, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT e.pool_id, e.policy_id, pl.queueing
               FROM respool.queue_entries e
               JOIN respool.pools pl ON pl.id = e.pool_id
               JOIN respool.policies p ON p.id = e.policy_id
              WHERE e.request_id = p_id
              ORDER BY p.priority DESC, pl.name LOOP
        -- best_effort, no hold: every earlier request already had its chance, so only the new one can move.
        -- [SPEC §11.1] while a best_effort pool holds for a starving head, the new request
        -- may become the head (ending that hold) or be held back: a full pass decides.
        IF c.queueing = 'strict' OR (respool._pool_hold(c.pool_id, p_now)).head_id IS NOT NULL THEN
            PERFORM respool.allocate_pool(c.pool_id, p_now);
        ELSE
            PERFORM respool._try_grant(p_id, c.pool_id, c.policy_id, p_now);
        END IF;
        EXIT WHEN NOT EXISTS (SELECT FROM respool.requests WHERE id = p_id AND status = 'queued');
    END LOOP;
    -- Still waiting: the reconcilers decide at once whether it may preempt.
    PERFORM respool._pool_changed(e.pool_id)
       FROM respool.queue_entries e WHERE e.request_id = p_id;
END $$;
COMMENT ON FUNCTION respool._try_new(uuid, timestamptz) IS
    'A newly queued request (or gang entry), its candidate pools locked by the caller: tried at once in candidate order (a full pass in strict pools and in pools holding for a starving head), and the reconcilers of the pools where it still waits are woken.';

CREATE OR REPLACE FUNCTION respool._lock_request(p_id uuid, p_attempt integer)
RETURNS respool.requests LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
BEGIN
    SELECT * INTO r FROM respool.requests WHERE id = p_id;
    IF NOT FOUND THEN
        PERFORM respool._fail('RP404', 'id', format('request %s not found', p_id));
    END IF;
    PERFORM respool._lock_pools(r.candidate_pool_ids || r.pool_id);
    SELECT * INTO r FROM respool.requests WHERE id = p_id FOR UPDATE;
    IF p_attempt IS NOT NULL AND p_attempt <> r.attempt THEN
        PERFORM respool._fail('RP409', 'attempt', format(
            'stale attempt %s: request %s is on attempt %s', p_attempt, p_id, r.attempt));
    END IF;
    RETURN r;
END $$;
COMMENT ON FUNCTION respool._lock_request(uuid, integer) IS
    'Locks a request''s candidate pools (id order) and then the request; RP404 if unknown, RP409 when p_attempt is stale (fencing).';

CREATE OR REPLACE FUNCTION respool._leave_queue(p_id uuid, p_to text, p_reason text, p_message text, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_pools uuid[];
    v_held uuid[];
    v_pool uuid;
BEGIN
    v_pools := respool._unqueue(p_id);
    -- [SPEC §11.6] members of its gang still holding units (in a grace period, before the gang
    -- is requeued) give them back when they follow: their pool is granted below (SPEC §4).
    v_held := ARRAY(SELECT DISTINCT m.pool_id FROM respool.requests m
                     WHERE m.gang_id = (SELECT gang_id FROM respool.requests WHERE id = p_id)
                       AND m.id <> p_id AND m.status IN ('allocated', 'preempting'));
    PERFORM respool._set_status(p_id, p_to, p_reason, p_message, p_now);
    PERFORM respool._gang_follow(p_id, p_to, p_reason, p_to, p_now);  -- [SPEC §11.6]
    -- In a strict pool the request may have been the head that blocked everyone else; in a
    -- best_effort pool with the starvation guard, the head the pool held units for (SPEC §11.1).
    FOR v_pool IN SELECT id FROM respool.pools
                   WHERE (id = ANY (v_pools) AND (queueing = 'strict' OR starvation_seconds IS NOT NULL))
                      OR id = ANY (v_held)
                   ORDER BY id LOOP
        PERFORM respool.allocate_pool(v_pool, p_now);
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._leave_queue(uuid, text, text, text, timestamptz) IS
    'Takes a locked queued request (and the rest of its gang, SPEC §11.6) out of every queue with a terminal status, then lets strict queues behind it move (and best_effort queues whose starvation hold it may have been), and grants in the pool where members of its gang gave units back.';

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
COMMENT ON FUNCTION respool._unqueue(uuid) IS
    'Removes the queue entries of a request, and of its gang (whose one entry per pool may be another member''s); returns the pools it waited in.';

CREATE OR REPLACE FUNCTION respool._end_holding(p_id uuid, p_to text, p_reason text, p_message text, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
BEGIN
    SELECT * INTO r FROM respool.requests WHERE id = p_id;
    PERFORM respool._free(p_id);
    IF r.status = 'preempting' AND p_to <> 'cancelled' THEN
        PERFORM respool._after_preemption(p_id, r.reason, r.message, p_now);
    ELSE
        PERFORM respool._set_status(p_id, p_to, p_reason, p_message, p_now);
        IF p_to = 'cancelled' OR (p_to = 'expired' AND r.status = 'allocated') THEN
            PERFORM respool._gang_follow(p_id, p_to, p_reason, p_to, p_now);  -- [SPEC §11.6]
        END IF;
    END IF;
    PERFORM respool.allocate_pool(r.pool_id, p_now);
END $$;
COMMENT ON FUNCTION respool._end_holding(uuid, text, text, text, timestamptz) IS
    'Frees a locked allocated/preempting request, sets its final status (a preempting one becomes preempted; a cancelled or expired gang member takes the rest of its gang along, SPEC §11.6), and grants what now fits in its pool.';

CREATE OR REPLACE FUNCTION respool._end_request(p_id uuid, p_attempt integer, p_status text,
                                                p_reason text, p_message text,
                                                p_queued_reason text, p_queued_message text,
                                                p_now timestamptz)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests := respool._lock_request(p_id, p_attempt);
BEGIN
    IF r.status IN ('allocated', 'preempting') THEN
        PERFORM respool._end_holding(p_id, p_status, p_reason, p_message, p_now);
    ELSIF r.status = 'queued' THEN
        PERFORM respool._leave_queue(p_id, 'cancelled', p_queued_reason, p_queued_message, p_now);
    END IF;
    RETURN respool.request_json(p_id);
END $$;
COMMENT ON FUNCTION respool._end_request(uuid, integer, text, text, text, text, text, timestamptz) IS
    'Release and cancel in one place: a holding request (attempt fenced) ends as p_status (preempting -> preempted) with its units freed and what fits granted; a queued one becomes cancelled with p_queued_reason; a terminal one is unchanged. Returns the request''s JSON.';

CREATE OR REPLACE FUNCTION respool.release_request(p_id uuid, p_attempt integer DEFAULT NULL,
                                                   p_now timestamptz DEFAULT now())
RETURNS jsonb LANGUAGE sql AS $$
    SELECT respool._end_request(p_id, p_attempt, 'released', NULL, '',
                                'released_while_queued', 'released before it was allocated', p_now)
$$;
COMMENT ON FUNCTION respool.release_request(uuid, integer, timestamptz) IS
    'allocated -> released (preempting -> preempted), queued -> cancelled, terminal unchanged; frees units and grants what fits in the same transaction.';

CREATE OR REPLACE FUNCTION respool.cancel_request(p_id uuid, p_attempt integer DEFAULT NULL,
                                                  p_now timestamptz DEFAULT now())
RETURNS jsonb LANGUAGE sql AS $$
    SELECT respool._end_request(p_id, p_attempt, 'cancelled', 'cancelled', 'cancelled by the client',
                                'cancelled', 'cancelled by the client', p_now)
$$;
COMMENT ON FUNCTION respool.cancel_request(uuid, integer, timestamptz) IS
    'queued/allocated/preempting -> cancelled (units freed, the queue moves); terminal unchanged.';

-- The signature grew p_lease_seconds (0008), last so that positional calls keep working: drop
-- the old one, or calls by name would be ambiguous.
DROP FUNCTION IF EXISTS respool.heartbeat_request(uuid, integer, timestamptz);
CREATE OR REPLACE FUNCTION respool.heartbeat_request(p_id uuid, p_attempt integer DEFAULT NULL,
                                                     p_now timestamptz DEFAULT now(),
                                                     p_lease_seconds integer DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
    v_seconds integer;
BEGIN
    IF p_lease_seconds IS NOT NULL AND p_lease_seconds NOT BETWEEN 1 AND 31536000 THEN
        PERFORM respool._fail('RP400', 'lease_seconds', 'lease_seconds must be between 1 and 31536000');
    END IF;
    SELECT * INTO r FROM respool.requests WHERE id = p_id;
    IF FOUND AND r.status = 'allocated' AND r.lease_expires_at <= p_now
       AND respool.leases_may_lapse() THEN
        -- The lease already lapsed: expire it now rather than revive it (no double use).
        -- Not while respool looks down (an outage): the lapse was ours, the lease is extended.
        r := respool._lock_request(p_id, p_attempt);
        IF r.status = 'allocated' AND r.lease_expires_at <= p_now THEN
            PERFORM respool._end_holding(p_id, 'expired', 'lease_expired',
                                         'lease lapsed without a heartbeat', p_now);
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
    v_seconds := coalesce(p_lease_seconds, r.lease_seconds);
    -- No FOR UPDATE here: a lock on a queued request would make a concurrent allocation pass
    -- skip it (SKIP LOCKED; a strict pool stops there). Only the lease UPDATE locks the row,
    -- and only while it is still allocated on the same attempt.
    IF r.status = 'allocated' AND v_seconds IS NOT NULL THEN
        UPDATE respool.requests SET lease_expires_at = p_now + make_interval(secs => v_seconds),
                                    updated_at = p_now
         WHERE id = p_id AND status = 'allocated' AND attempt = r.attempt;
        IF NOT FOUND THEN
            SELECT * INTO r FROM respool.requests WHERE id = p_id;  -- it moved on meanwhile
            IF p_attempt IS NOT NULL AND p_attempt <> r.attempt THEN
                PERFORM respool._fail('RP409', 'attempt', format(
                    'stale attempt %s: request %s is on attempt %s', p_attempt, p_id, r.attempt));
            END IF;
        END IF;
    ELSIF r.status = 'queued' AND v_seconds IS NOT NULL THEN
        -- The queue lease lives in its own row (0008): the request row stays unlocked.
        INSERT INTO respool.queue_leases AS l (request_id, attempt, expires_at)
        VALUES (p_id, r.attempt, p_now + make_interval(secs => v_seconds))
        ON CONFLICT (request_id) DO UPDATE SET attempt = excluded.attempt, expires_at = excluded.expires_at;
    END IF;
    RETURN respool.request_json(p_id);
END $$;
COMMENT ON FUNCTION respool.heartbeat_request(uuid, integer, timestamptz, integer) IS
    'Heartbeat (SPEC §6). Allocated: the lease becomes now + p_lease_seconds (default: the request''s lease_seconds), locking only the request row; a lapsed lease is expired instead, never revived. Queued: sets the queue lease (respool.queue_leases) to now + that many seconds without locking the request; when it lapses the reconciler cancels the request (abandoned). RP400 for a bad p_lease_seconds, RP409 for a stale p_attempt; returns the request so a preempted step learns it.';

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
COMMENT ON FUNCTION respool.delete_request(uuid) IS 'Deletes a terminal request; its events stay (SPEC §8, append-only; only retention removes them); RP409 while it is queued or holds units.';

CREATE OR REPLACE FUNCTION respool._expire_one(p_id uuid, p_reason text, p_message text, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT status FROM respool.requests WHERE id = p_id) <> 'allocated' THEN
        RETURN 0;  -- it already followed its gang
    END IF;
    PERFORM respool._free(p_id);
    PERFORM respool._set_status(p_id, 'expired', p_reason, p_message, p_now);
    RETURN 1 + respool._gang_follow(p_id, 'expired', p_reason, 'expired', p_now);  -- [SPEC §11.6]
END $$;
COMMENT ON FUNCTION respool._expire_one(uuid, text, text, timestamptz) IS
    'An allocated request the caller has locked (in a pool it has locked) becomes expired with p_reason, its units freed, and the rest of its gang follows (SPEC §11.6). Returns how many requests expired (0 when it was no longer allocated).';

CREATE OR REPLACE FUNCTION respool._expire_pool(p_pool_id uuid, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    RETURN (SELECT coalesce(sum(respool._expire_one(id, 'lease_expired', 'lease lapsed without a heartbeat', p_now)), 0)
              FROM (SELECT id FROM respool.requests
                     WHERE pool_id = p_pool_id AND status = 'allocated' AND lease_expires_at <= p_now
                     ORDER BY lease_expires_at, id FOR UPDATE SKIP LOCKED) due);
END $$;
COMMENT ON FUNCTION respool._expire_pool(uuid, timestamptz) IS
    'In a pool the caller has locked: allocated requests whose lease lapsed become expired (with the rest of their gang, SPEC §11.6) and their units are freed. A request locked by a concurrent heartbeat is left for the next pass.';

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
COMMENT ON FUNCTION respool.expire_leases(uuid, timestamptz) IS
    'Lease expiry alone for one pool (reconcile_pool does it as its step 1): lapsed leases become expired, their units are freed and the queue is granted.';

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
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 1000 THEN
        PERFORM respool._fail('RP400', 'limit', 'limit must be between 1 and 1000');
    END IF;
    IF p_status IS NOT NULL AND p_status NOT IN ('queued', 'allocated', 'preempting', 'released', 'preempted',
                                                 'expired', 'cancelled', 'rejected') THEN
        PERFORM respool._fail('RP400', 'status', format('unknown status %L', p_status));
    END IF;
    IF p_pool IS NOT NULL THEN
        v_pool_id := respool.resolve_pool(p_pool);
    END IF;
    -- Positions, messages and ETAs for the whole page at once (respool.request_docs: each
    -- involved pool computed once, each shape's blocker once; issue 15), the same answers as
    -- respool.request_json gives one request at a time.
    RETURN coalesce((
        WITH page AS MATERIALIZED (
               SELECT r.id, r.created_at FROM respool.requests r
                 WHERE (v_pool_id IS NULL OR r.pool_id = v_pool_id OR v_pool_id = ANY (r.candidate_pool_ids))
                   AND (p_subject IS NULL OR r.subject = p_subject)
                   AND (p_status IS NULL OR r.status = p_status)
                   AND (p_subject_like IS NULL OR r.subject LIKE ANY (p_subject_like))
                   AND (p_gang_id IS NULL OR r.gang_id = p_gang_id)
                   AND (p_before_created IS NULL OR (r.created_at, r.id) < (p_before_created, p_before_id))
                 ORDER BY r.created_at DESC, r.id DESC
                 LIMIT p_limit)
        SELECT json_agg(d.doc ORDER BY q.created_at DESC, q.id DESC)
          FROM page q JOIN respool.request_docs(ARRAY(SELECT id FROM page)) d ON d.id = q.id), '[]'::json);
END $$;
COMMENT ON FUNCTION respool.list_requests(text, text, text, integer, timestamptz, uuid, text[], uuid) IS
    'Requests newest first, filtered (p_gang_id: the members of one gang, SPEC §11.6), keyset-paged by (created_at, id), as one json array of _request_doc documents (the same as request_json gives each); p_subject_like scopes a client token.';

CREATE OR REPLACE FUNCTION respool.list_request_events(p_id uuid)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM respool.requests WHERE id = p_id) THEN
        PERFORM respool._fail('RP404', 'id', format('request %s not found', p_id));
    END IF;
    RETURN coalesce((SELECT jsonb_agg(jsonb_build_object('from', from_status, 'to', to_status, 'reason', reason,
                                                         'attempt', attempt, 'message', message, 'at', at)
                                      ORDER BY id)
                       FROM respool.events WHERE request_id = p_id), '[]'::jsonb);
END $$;
COMMENT ON FUNCTION respool.list_request_events(uuid) IS 'A request''s history in order (from, to, reason, attempt, message, at).';
