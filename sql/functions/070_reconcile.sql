-- The reconciler (SPEC §5): one pass per pool, in one transaction, under the pool's row lock.
-- Passes of several reconcilers share the pools with FOR NO KEY UPDATE SKIP LOCKED; a victim changes
-- status only under its pool's lock, so it is never preempted twice.
--
-- Units held by victims in their grace period (`preempting`) count as already gone, and units
-- earmarked for the requests they were preempted for count as already taken: respool._usage
-- (031_usage.sql) does that arithmetic. Without a grace period both are zero.

CREATE OR REPLACE FUNCTION respool._preempt_member(p_victim_id uuid, p_reason text, p_message text, p_now timestamptz)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
    v_grace integer;
BEGIN
    -- The caller holds the pool lock, so only a heartbeat can hold this row, briefly: wait for it.
    SELECT * INTO r FROM respool.requests WHERE id = p_victim_id FOR UPDATE;
    IF r.status <> 'allocated' OR NOT r.preemptible THEN
        RAISE EXCEPTION 'request % cannot be preempted: it is % (preemptible %)', p_victim_id, r.status, r.preemptible
            USING ERRCODE = 'RP500';
    END IF;
    SELECT preemption_grace_seconds INTO v_grace FROM respool.pools WHERE id = r.pool_id;
    IF v_grace > 0 THEN
        UPDATE respool.requests SET preempt_deadline = p_now + make_interval(secs => v_grace)
         WHERE id = p_victim_id;
        PERFORM respool._set_status(p_victim_id, 'preempting', p_reason,
                                    p_message || format('; release within %s s', v_grace), p_now);
        RETURN 'preempting';
    END IF;
    PERFORM respool._free(p_victim_id);
    RETURN (respool._after_preemption(p_victim_id, p_reason, p_message, p_now)).status;
END $$;
COMMENT ON FUNCTION respool._preempt_member(uuid, text, text, timestamptz) IS
    'Preempts one allocated, preemptible request of a pool the caller has locked: with a grace period it goes to preempting and keeps its units until release or deadline; without, its units are freed and it becomes preempted (or queued again while retries are left). Returns the new status.';

CREATE OR REPLACE FUNCTION respool._preempt(p_victim_id uuid, p_reason text, p_message text, p_now timestamptz)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_status text := respool._preempt_member(p_victim_id, p_reason, p_message, p_now);
BEGIN
    -- [SPEC §11.6] the rest of its gang goes too; the message keeps the cause (what-if reads it).
    PERFORM respool._gang_follow(p_victim_id, 'preempted', p_reason, 'preempted; ' || p_message, p_now);
    RETURN v_status;
END $$;
COMMENT ON FUNCTION respool._preempt(uuid, text, text, timestamptz) IS
    'Preempts one victim unit: the request (respool._preempt_member) and, for a gang member, every other member still holding (SPEC §11.6). Returns the victim''s new status.';

CREATE OR REPLACE FUNCTION respool._finish_grace(p_pool_id uuid, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid;
    n integer := 0;
BEGIN
    FOR v_id IN SELECT id FROM respool.requests
                 WHERE pool_id = p_pool_id AND status = 'preempting' AND preempt_deadline <= p_now
                 ORDER BY preempt_deadline, id FOR UPDATE LOOP
        PERFORM respool._free(v_id);
        PERFORM respool._after_preemption(v_id, 'grace_expired',
                                          'preempted: the grace period ended before the client released', p_now);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;
COMMENT ON FUNCTION respool._finish_grace(uuid, timestamptz) IS
    'Victims whose grace deadline passed lose their units and become preempted (or requeued); the units go to the earmark holders first.';

CREATE OR REPLACE FUNCTION respool._shed(p_pool_id uuid, p_policy_id uuid, p_excess jsonb,
                                         p_reason text, p_message text, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v record;
    excess jsonb := p_excess;  -- key -> units still to go (> 0: still over)
    chosen uuid[] := '{}';
    held jsonb[] := '{}';
    i integer;
BEGIN
    -- SPEC §2/§3: walk the victim order until usage fits on every key at once, then drop every
    -- chosen victim whose removal is not needed (latest pick first). A victim counts against
    -- every over key it holds, so a victim taken for one key also pays for the others.
    FOR v IN SELECT u.id, u.resources
               FROM respool._victim_units(p_pool_id) u  -- a gang is one unit (SPEC §11.6)
              WHERE p_policy_id IS NULL OR u.policy_id = p_policy_id
              ORDER BY u.priority, u.allocated_at DESC, u.id DESC LOOP
        CONTINUE WHEN NOT respool._holds_any(v.resources, excess);  -- frees nothing still over
        chosen := chosen || v.id;
        held := held || v.resources;
        excess := respool._take_units(excess, v.resources, 1);
        EXIT WHEN NOT respool._any_over(excess);
    END LOOP;
    FOR i IN REVERSE cardinality(chosen)..1 LOOP
        -- Not needed: with its units back, none of the keys it holds is over.
        IF NOT respool._holds_any(held[i], respool._take_units(excess, held[i], -1)) THEN
            excess := respool._take_units(excess, held[i], -1);
            chosen[i] := NULL;
        END IF;
    END LOOP;
    FOR i IN 1..cardinality(chosen) LOOP
        CONTINUE WHEN chosen[i] IS NULL;
        PERFORM respool._preempt(chosen[i], p_reason, p_message, p_now);
    END LOOP;
    RETURN cardinality(array_remove(chosen, NULL));
END $$;
COMMENT ON FUNCTION respool._shed(uuid, uuid, jsonb, text, text, timestamptz) IS
    'Preempts preemptible allocations (of one policy, or of the whole pool) until no key of p_excess {key: units over} is over any more: victim order lowest priority, then most recently allocated; a minimal set (every victim kept is needed on some key). Returns how many; when even all of them do not suffice, all of them go.';

CREATE OR REPLACE FUNCTION respool._enforce_shrinks(p_pool_id uuid, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_excess jsonb;
    v_message text;
    pol record;
    n integer := 0;
BEGIN
    -- Capacity (I1), every key at once: usage above a shrunk capacity, not counting victims
    -- already leaving. A custom key removed from the pool has capacity 0 (SPEC §1), so its
    -- holders go; a removed soft key is untracked (bound NULL) and sheds nothing.
    SELECT jsonb_object_agg(u.key, u.used - u.leaving - u.bound),
           'preempted: pool capacity of ' || string_agg(format('%s shrank to %s', u.key, u.bound), ', ' ORDER BY u.key)
      INTO v_excess, v_message
      FROM respool._usage(p_pool_id) u
     WHERE u.policy_id IS NULL AND u.bound IS NOT NULL AND u.used - u.leaving > u.bound;
    IF v_excess IS NOT NULL THEN
        n := n + respool._shed(p_pool_id, NULL::uuid, v_excess, 'capacity_shrink', v_message, p_now);
    END IF;
    -- Limits (I2), per subject and every limited key at once, read after the capacity victims left.
    FOR pol IN SELECT p.id, p.subject FROM respool.policies p WHERE p.pool_id = p_pool_id
                ORDER BY p.subject LOOP
        SELECT jsonb_object_agg(u.key, u.used - u.leaving - u.bound),
               format('preempted: the limit of %s on ', pol.subject)
               || string_agg(format('%s was lowered to %s', u.key, u.bound), ', ' ORDER BY u.key)
          INTO v_excess, v_message
          FROM respool._usage(p_pool_id) u
         WHERE u.policy_id = pol.id AND u.bound IS NOT NULL AND u.used - u.leaving > u.bound;
        CONTINUE WHEN v_excess IS NULL;
        n := n + respool._shed(p_pool_id, pol.id, v_excess, 'limit_shrink', v_message, p_now);
    END LOOP;
    RETURN n;
END $$;
COMMENT ON FUNCTION respool._enforce_shrinks(uuid, timestamptz) IS
    'Step 2: preempts allocations until usage fits every shrunk capacity (a removed custom key is capacity 0) and every lowered limit of the pool, all keys at once, with a minimal victim set (victims in their grace period already count as gone). Returns how many were preempted.';

CREATE OR REPLACE FUNCTION respool._choose_victims(p_pool_id uuid, p_request respool.requests, p_policy_id uuid,
                                                   p_mode text)
RETURNS uuid[] LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_priority integer := (SELECT priority FROM respool.policies WHERE id = p_policy_id);
    deficit jsonb;   -- tracked key -> units still missing for p_request (> 0: missing)
    over jsonb;      -- "policy/key" -> units that policy holds above its reserved share
    v record;
    chosen uuid[] := '{}';
    held jsonb[] := '{}';
    i integer;
    k text;
    n bigint;
    useful boolean;
BEGIN
    SELECT jsonb_object_agg(x.key, u.used - u.leaving + u.earmarked + x.value::bigint - u.bound) INTO deficit
      FROM jsonb_each_text(p_request.resources) x
      JOIN respool._usage(p_pool_id, p_request.id) u
        ON u.policy_id IS NULL AND u.key = x.key AND u.bound IS NOT NULL;
    IF deficit IS NULL OR NOT respool._any_over(deficit) THEN
        RETURN '{}';  -- fits already: nothing to preempt
    END IF;
    SELECT coalesce(jsonb_object_agg(u.policy_id || '/' || u.key, u.used - u.leaving - u.reserved), '{}')
      INTO over
      FROM respool._usage(p_pool_id) u
     WHERE u.policy_id IS NOT NULL AND deficit ? u.key;

    FOR v IN SELECT u.id, u.policy_id, u.resources
               FROM respool._victim_units(p_pool_id) u  -- a gang is one unit (SPEC §11.6)
              WHERE CASE p_mode
                      WHEN 'reclaim' THEN u.policy_id <> p_policy_id OR NOT p_request.preemptible
                      ELSE u.priority < v_priority AND u.policy_id <> p_policy_id END
              ORDER BY (u.policy_id = p_policy_id) DESC, u.priority, u.allocated_at DESC, u.id DESC LOOP
        -- Useful: it holds a key still missing. Eligible: its subject is above its reserved share
        -- of such a key (a non-preemptible requester may also take its own subject's work).
        useful := false;
        FOR k, n IN SELECT key, value::bigint FROM jsonb_each_text(v.resources) LOOP
            IF n > 0 AND coalesce((deficit ->> k)::bigint, 0) > 0
               AND (v.policy_id = p_policy_id OR coalesce((over ->> (v.policy_id || '/' || k))::bigint, 0) > 0) THEN
                useful := true;
            END IF;
        END LOOP;
        CONTINUE WHEN NOT useful;
        chosen := chosen || v.id;
        held := held || v.resources;
        FOR k, n IN SELECT key, value::bigint FROM jsonb_each_text(v.resources) WHERE deficit ? key LOOP
            over := jsonb_set(over, ARRAY[v.policy_id || '/' || k],
                              to_jsonb(coalesce((over ->> (v.policy_id || '/' || k))::bigint, 0) - n));
        END LOOP;
        deficit := respool._take_units(deficit, v.resources, 1);
        EXIT WHEN NOT respool._any_over(deficit);
    END LOOP;
    IF respool._any_over(deficit) THEN
        RETURN NULL;  -- even every eligible victim would not make room: preempt nobody
    END IF;
    -- Minimal set: put back, latest pick first, every victim the request can do without (with
    -- its units back, no key it holds is missing again), as respool._shed does.
    FOR i IN REVERSE cardinality(chosen)..1 LOOP
        IF NOT respool._holds_any(held[i], respool._take_units(deficit, held[i], -1)) THEN
            deficit := respool._take_units(deficit, held[i], -1);
            chosen[i] := NULL;
        END IF;
    END LOOP;
    RETURN array_remove(chosen, NULL);
END $$;
COMMENT ON FUNCTION respool._choose_victims(uuid, respool.requests, uuid, text) IS
    'The victim set for a queued request blocked by pool capacity (SPEC §5): reclaim takes other subjects'' preemptible allocations above their reserved share (and, for a non-preemptible request, its own subject''s preemptible work first); priority takes strictly lower-priority borrowers. Victim order: lowest priority, then most recently allocated; the walk stops once the request fits and unneeded victims are dropped. {} when it already fits, NULL when no set makes it fit.';

CREATE OR REPLACE FUNCTION respool._borrowers(p_pool_id uuid)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
    -- Only these subjects can lose work to reclaim or priority preemption.
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(p.id, p.priority), '{}')
      FROM respool.policies p
     WHERE p.pool_id = p_pool_id
       AND EXISTS (SELECT FROM respool.policy_resources pol JOIN respool.pool_resources pr
                            ON pr.pool_id = p_pool_id AND pr.key = pol.key AND pr.capacity IS NOT NULL
                    WHERE pol.policy_id = p.id AND pol.used > pol.reserved)
       AND EXISTS (SELECT FROM respool.requests q
                    WHERE q.pool_id = p_pool_id AND q.policy_id = p.id AND q.status = 'allocated'
                      AND q.preemptible));
END $$;
COMMENT ON FUNCTION respool._borrowers(uuid) IS
    '{policy id: priority} of the pool''s subjects that hold preemptible work and use more than their reserved share of a tracked key.';

CREATE OR REPLACE FUNCTION respool._headroom(p_pool_id uuid, p_column text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
    -- {policy id: {key: room}}: room under the limit (p_column 'limit') or under the reserved
    -- share for non-preemptible work (p_column 'np').
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(policy_id, room), '{}') FROM (
        SELECT pol.policy_id,
               jsonb_object_agg(pol.key, CASE p_column WHEN 'limit' THEN pol."limit" - pol.used
                                                       ELSE pol.reserved - pol.np_used END) AS room
          FROM respool.policy_resources pol JOIN respool.policies p ON p.id = pol.policy_id
         WHERE p.pool_id = p_pool_id AND (p_column <> 'limit' OR pol."limit" IS NOT NULL)
         GROUP BY pol.policy_id) x);
END $$;
COMMENT ON FUNCTION respool._headroom(uuid, text) IS
    'Per policy of a pool and key: units left under its limit, or under its reserved share for non-preemptible work.';

CREATE OR REPLACE FUNCTION respool._within(p_resources jsonb, p_room jsonb, p_keys_of_room boolean)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
    -- p_keys_of_room: check every key of p_room (limits bind even keys the request lacks);
    -- otherwise check the request's keys that p_room lists (a missing key means room 0).
BEGIN
    RETURN (SELECT CASE WHEN p_keys_of_room
                THEN NOT EXISTS (SELECT FROM jsonb_each_text(coalesce(p_room, '{}')) m
                                  WHERE coalesce((p_resources ->> m.key)::bigint, 0) > m.value::bigint)
                ELSE NOT EXISTS (SELECT FROM jsonb_each_text(p_resources) x
                                  WHERE x.value::bigint > coalesce((p_room ->> x.key)::bigint, 0))
           END);
END $$;
COMMENT ON FUNCTION respool._within(jsonb, jsonb, boolean) IS 'True when every amount fits the room map (see _headroom).';

CREATE OR REPLACE FUNCTION respool._preempt_for_queue(p_pool_id uuid, p_now timestamptz,
                                                      OUT preempted integer, OUT allocated integer,
                                                      OUT rejected integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_queueing text := (SELECT queueing FROM respool.pools WHERE id = p_pool_id);
    v_free jsonb;        -- effective free units per tracked key
    v_limits jsonb;      -- policy -> key -> room under the limit
    v_np jsonb;          -- policy -> tracked key -> room for non-preemptible work
    v_borrowers jsonb;   -- policy -> priority, for subjects that can lose work
    v_own jsonb;         -- policy -> true, for subjects holding preemptible work
    v_failed text[] := '{}';  -- shapes no victim set can help, until something changes
    v_changed boolean := false;
    v_strict_blocked boolean := false;
    v_mode text;
    v_shape text;
    v_victims uuid[];
    v_victim uuid;
    e record;
BEGIN
    preempted := 0; allocated := 0; rejected := 0;
    IF NOT EXISTS (SELECT FROM respool.requests
                    WHERE pool_id = p_pool_id AND status = 'allocated' AND preemptible) THEN
        RETURN;  -- nothing preemptible is held in the pool
    END IF;
    <<refresh>>
    LOOP
        SELECT coalesce(jsonb_object_agg(u.key, u.bound - (u.used - u.leaving + u.earmarked)), '{}') INTO v_free
          FROM respool._usage(p_pool_id) u
         WHERE u.policy_id IS NULL AND u.bound IS NOT NULL;
        v_limits := respool._headroom(p_pool_id, 'limit');
        v_np := respool._headroom(p_pool_id, 'np');
        v_borrowers := respool._borrowers(p_pool_id);
        SELECT coalesce(jsonb_object_agg(DISTINCT policy_id, true), '{}') INTO v_own
          FROM respool.requests WHERE pool_id = p_pool_id AND status = 'allocated' AND preemptible;
        EXIT refresh WHEN v_borrowers = '{}' AND v_own = '{}';
        v_changed := false;
        v_strict_blocked := false;
        -- Candidates, filtered in one query: rule 1 blocks them (counting units already leaving),
        -- rules 2 and 3 admit them, and some subject could lose work to them: for reclaim
        -- (in share, or non-preemptible) another borrower or, for non-preemptible work, its own
        -- preemptible work; for priority (a preemptible borrower) a lower-priority borrower.
        -- One candidate per shape (respool._queue_groups): entries of a shape pass the same
        -- filters and get the same victim set, so its first entry without an earmark stands for
        -- it, and the shapes' first entries in queue order are the queue order of the candidates.
        FOR e IN SELECT q.*, m.mode
                   FROM respool._queue_groups(p_pool_id, true) q
                  CROSS JOIN LATERAL (SELECT CASE WHEN q.in_share OR NOT q.preemptible THEN 'reclaim'
                                                  ELSE 'priority' END AS mode) m
                  WHERE NOT respool._fits_free(q.resources, v_free)
                    AND respool._within(q.resources, v_limits -> q.policy_id::text, true)
                    AND (q.preemptible OR respool._within(
                            (SELECT jsonb_object_agg(x.key, x.value) FROM jsonb_each(q.resources) x
                              WHERE v_free ? x.key), v_np -> q.policy_id::text, false))
                    AND CASE m.mode
                          WHEN 'reclaim' THEN (NOT q.preemptible AND v_own ? q.policy_id::text)
                                              OR EXISTS (SELECT FROM jsonb_object_keys(v_borrowers) b
                                                          WHERE b <> q.policy_id::text)
                          ELSE EXISTS (SELECT FROM jsonb_each_text(v_borrowers) b
                                        WHERE b.key <> q.policy_id::text AND b.value::integer < q.priority)
                        END
                  ORDER BY q.priority DESC, q.in_share DESC, q.share, q.queued_at, q.request_id LOOP
            v_mode := e.mode;
            -- In a strict pool, once a request could not be helped, only reclaim (the reserved
            -- share guarantee) still acts for the requests behind it.
            CONTINUE WHEN v_strict_blocked AND v_mode = 'priority';
            v_shape := concat_ws('|', e.policy_id, v_mode, e.preemptible, e.resources);
            CONTINUE WHEN v_shape = ANY (v_failed);
            -- [SPEC §11.6] a gang's entry stands for the gang: one request of the members' sum
            v_victims := respool._choose_victims(p_pool_id, respool._queued_as(e.request_id), e.policy_id, v_mode);
            IF v_victims IS NULL THEN
                v_failed := v_failed || v_shape;
                v_strict_blocked := v_queueing = 'strict';
                CONTINUE;
            END IF;
            CONTINUE WHEN cardinality(v_victims) = 0;  -- fits already: step 4 grants it in order
            -- Lock the requester before touching any victim; another pool's pass may hold it.
            CONTINUE WHEN NOT respool._lock_queued(e.request_id);
            FOREACH v_victim IN ARRAY v_victims LOOP
                IF respool._preempt(v_victim, v_mode,
                                    format('preempted (%s) for request %s of %s', v_mode, e.request_id, e.subject),
                                    p_now) = 'rejected' THEN
                    rejected := rejected + 1;
                END IF;
                preempted := preempted + 1;
            END LOOP;
            IF respool._try_grant(e.request_id, p_pool_id, e.policy_id, p_now) = 'granted' THEN
                allocated := allocated + 1;
            ELSIF EXISTS (SELECT FROM respool.requests WHERE pool_id = p_pool_id AND status = 'preempting') THEN
                -- Victims in their grace period still hold the units: keep them for this request.
                UPDATE respool.requests SET earmark_pool_id = p_pool_id WHERE id = e.request_id;
            ELSE
                RAISE EXCEPTION 'request % does not fit after preempting %', e.request_id, v_victims
                    USING ERRCODE = 'RP500';
            END IF;
            v_changed := true;
            v_failed := '{}';
            EXIT;  -- the queue order, free units and borrowers changed: read them again
        END LOOP;
        EXIT refresh WHEN NOT v_changed;
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._preempt_for_queue(uuid, timestamptz) IS
    'Step 3, in queue order: for each queued request that only the pool''s capacity blocks, reclaim (in share) or priority preemption (preemptible borrower); the victims'' units go to it in the same transaction (granted now, or earmarked until a grace period ends). No victim set, no preemption.';

CREATE OR REPLACE FUNCTION respool.reconcile_pool(p_pool_id uuid, p_now timestamptz DEFAULT now())
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_name text;
    expired integer;
    grace_ended integer;
    shed integer;
    q record;
    granted integer;
BEGIN
    SELECT name INTO v_name FROM respool.pools WHERE id = p_pool_id FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN NULL;  -- gone, or another transaction (a reconciler, an API call) holds it
    END IF;
    expired := 0;
    grace_ended := 0;
    IF respool.leases_may_lapse() THEN  -- not while respool looks down (072_outage_leases.sql)
        expired := respool._expire_pool(p_pool_id, p_now)
                   + respool._abandon_queue_leases(p_pool_id, p_now);  -- queue leases (075)
        grace_ended := respool._finish_grace(p_pool_id, p_now);
    END IF;
    -- [SPEC §11.1] a runtime cap ends whatever the heartbeats, also right after an outage
    expired := expired + respool._expire_max_seconds(p_pool_id, p_now);
    shed := respool._enforce_shrinks(p_pool_id, p_now);
    q := respool._preempt_for_queue(p_pool_id, p_now);
    granted := respool.allocate_pool(p_pool_id, p_now);
    RETURN jsonb_build_object('pool', v_name, 'expired', expired, 'grace_ended', grace_ended,
                              'preempted', shed + q.preempted, 'allocated', q.allocated + granted,
                              'rejected', q.rejected);
END $$;
COMMENT ON FUNCTION respool.reconcile_pool(uuid, timestamptz) IS
    'One reconciler pass over one pool in the caller''s transaction (SPEC §5): expire lapsed leases, runtime caps (max_seconds, §11.1) and grace periods, enforce shrunk capacities and limits, preempt for queued requests with a right to run, grant what fits. Returns {pool, expired, grace_ended, preempted, allocated, rejected}, or NULL when the pool is locked elsewhere (skip it: SKIP LOCKED) or gone.';
