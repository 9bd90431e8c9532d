-- The reconciler (docs/preemption.md): one pass per pool, in one transaction, under the pool's row lock.
-- Passes of several reconcilers share the pools with FOR NO KEY UPDATE SKIP LOCKED; a victim changes
-- status only under its pool's lock, so it is never preempted twice.
--
-- Units held by victims in their grace period (`preempting`) count as already gone, and units
-- earmarked for the requests they were preempted for count as already taken: respool._usage
-- (038_usage.sql) does that arithmetic. Without a grace period both are zero. Victim choice and
-- shrink enforcement are in 070_victims.sql.

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
    PERFORM respool._unplace(p_victim_id);
    RETURN (respool._after_preemption(p_victim_id, p_reason, p_message, p_now)).status;
END $$;
COMMENT ON FUNCTION respool._preempt_member(uuid, text, text, timestamptz) IS 'Preempts one allocated, preemptible request of a pool the caller has locked: with a grace period it goes to preempting and keeps its units until release or deadline; without, its units are freed and it becomes preempted (or queued again while retries are left). Returns the new status.';

CREATE OR REPLACE FUNCTION respool._preempt(p_victim_id uuid, p_reason text, p_message text, p_now timestamptz)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_status text := respool._preempt_member(p_victim_id, p_reason, p_message, p_now);
BEGIN
    -- The rest of its gang goes too (docs/scheduling.md, gangs); its events record the same cause.
    PERFORM respool._gang_follow(p_victim_id, 'preempted', p_reason, 'preempted; ' || p_message, p_now);
    RETURN v_status;
END $$;
COMMENT ON FUNCTION respool._preempt(uuid, text, text, timestamptz) IS 'Preempts one victim unit: the request (respool._preempt_member) and, for a gang member, every other member still holding (docs/scheduling.md, gangs). Returns the victim''s new status.';

CREATE OR REPLACE FUNCTION respool._preempt_for(p_victim_id uuid, p_mode text, p_for uuid, p_now timestamptz)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_status text;
BEGIN
    -- The message does not name p_for: a victim's owner may not read that request. Every event
    -- of this preemption records it as data instead (respool._record_events, 030_status.sql).
    PERFORM set_config('respool.cause', p_for::text, true);
    v_status := respool._preempt(p_victim_id, p_mode, format('preempted (%s) for another request', p_mode), p_now);
    PERFORM set_config('respool.cause', '', true);
    RETURN v_status;
END $$;
COMMENT ON FUNCTION respool._preempt_for(uuid, text, uuid, timestamptz) IS 'Preempts one victim unit (respool._preempt, reason p_mode) for the waiting request p_for: the messages say "preempted (<mode>) for another request" and every event this writes (the victim''s, its gang''s, a requeue) records p_for and its subject as cause_request_id / cause_subject (docs/api.md: the API shows them only to callers that may read that subject). Returns the victim''s new status.';

CREATE OR REPLACE FUNCTION respool._finish_grace(p_pool_id uuid, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid;
    v_reason text;
    v_message text;
    n integer := 0;
BEGIN
    FOR v_id, v_reason, v_message IN SELECT id, reason, message FROM respool.requests
                 WHERE pool_id = p_pool_id AND status = 'preempting' AND preempt_deadline <= p_now
                 ORDER BY preempt_deadline, id FOR UPDATE LOOP
        PERFORM respool._unplace(v_id);
        IF v_reason IN ('terminated', 'over_slice') THEN  -- ended for good (047_terminate.sql)
            PERFORM respool._after_preemption(v_id, v_reason,
                                              regexp_replace(v_message, '; release within \d+ s$', '')
                                              || '; the grace period ended before the client released', p_now);
        ELSE
            PERFORM respool._after_preemption(v_id, 'grace_expired',
                                              'preempted: the grace period ended before the client released', p_now);
        END IF;
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;
COMMENT ON FUNCTION respool._finish_grace(uuid, timestamptz) IS 'Victims whose grace deadline passed lose their units and become preempted (or requeued) with reason grace_expired; a terminated one (reason terminated or over_slice, 047_terminate.sql) keeps its reason and message and is never requeued. The units go to the earmark holders first.';

CREATE OR REPLACE FUNCTION respool._drop_stale_earmarks(p_pool_id uuid, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_nodes boolean := respool._pool_has_nodes(p_pool_id);
    e record;
    v_stale boolean;
    v_try text;
    n integer := 0;
BEGIN
    -- An earmark keeps units that victims in their grace period free for the request they were
    -- preempted for (docs/preemption.md, "Grace periods and earmarks"). It has no point once
    -- (a) the request has no queue entry in the pool any more, or, in a pool with nodes, its
    --     node is no longer an active node of the pool that matches the request and could hold
    --     it (cordoned, draining, deleted, moved out, shrunk below the need, relabelled);
    -- (b) no victim is in its grace period any more (on its node, in a pool with nodes) and the
    --     request still cannot be granted.
    -- Then it goes: the units stop counting as taken, and the request is a candidate for
    -- preemption again (reclaim on another node), in queue order.
    FOR e IN SELECT r.id, r.earmark_node_id, r.resources, r.node_selector, q.policy_id
               FROM respool.requests r
               LEFT JOIN respool.queue_entries q ON q.request_id = r.id AND q.pool_id = p_pool_id
              WHERE r.earmark_pool_id = p_pool_id AND r.status = 'queued'
              ORDER BY r.queued_at, r.id LOOP
        v_stale := e.policy_id IS NULL
                   OR v_nodes AND NOT EXISTS (
                       SELECT FROM respool.nodes nd
                        WHERE nd.id = e.earmark_node_id AND nd.pool_id = p_pool_id AND nd.state = 'active'
                          AND respool._node_matches(nd.name, nd.labels, e.node_selector)
                          AND respool._could_hold(nd.id, e.resources));
        IF NOT v_stale THEN
            CONTINUE WHEN EXISTS (
                SELECT FROM respool.requests v
                 WHERE v.pool_id = p_pool_id AND v.status = 'preempting'
                   AND (NOT v_nodes OR EXISTS (SELECT FROM respool.placements pl
                                                WHERE pl.request_id = v.id AND pl.node_id = e.earmark_node_id)));
            -- Its victims are gone: the units are free now and go to it first, if it fits.
            v_try := respool._try_grant(e.id, p_pool_id, e.policy_id, p_now);
            IF v_try = 'granted' THEN
                n := n + 1;
            END IF;
            CONTINUE WHEN v_try IN ('granted', 'locked', 'gone');
        END IF;
        -- (a request another transaction holds keeps its earmark until the next pass)
        PERFORM FROM respool.requests WHERE id = e.id AND status = 'queued' FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        UPDATE respool.requests SET earmark_pool_id = NULL, earmark_node_id = NULL WHERE id = e.id;
    END LOOP;
    RETURN n;
END $$;
COMMENT ON FUNCTION respool._drop_stale_earmarks(uuid, timestamptz) IS 'Drops the earmarks in a locked pool that can no longer be honoured: the request left this pool''s queue, its node is no longer an active node of the pool that matches and could hold it, or its victims are gone and it still cannot be granted (it is granted when it can). The request is then a preemption candidate again (docs/preemption.md); rows another transaction holds keep theirs until the next pass. Returns how many earmark holders it granted.';

CREATE OR REPLACE FUNCTION respool._stand_in_victims(p_pool_id uuid, p_nodes boolean, p_request_id uuid,
                                                     p_policy_id uuid, p_preemptible boolean,
                                                     p_resources jsonb, p_node_selector jsonb, p_mode text,
                                                     OUT stand_in uuid, OUT on_node uuid,
                                                     OUT victim_ids uuid[])
LANGUAGE plpgsql AS $$
DECLARE
    v_group text;
    v_tried text[] := '{}';  -- preemption groups whose stand-in found no victims
BEGIN
    stand_in := p_request_id;
    LOOP
        -- A gang's entry stands for the gang: one request of the members' sum
        on_node := NULL;
        IF p_nodes THEN
            SELECT c.node_id, c.victims INTO on_node, victim_ids
              FROM respool._choose_node_victims(p_pool_id, respool._queued_as(stand_in), p_policy_id, p_mode) c;
        ELSE
            victim_ids := respool._choose_victims(p_pool_id, respool._queued_as(stand_in), p_policy_id, p_mode);
        END IF;
        EXIT WHEN victim_ids IS NOT NULL;
        -- Entries of one shape differ only in their preemption group: when the stand-in's
        -- own group may have kept it from preempting, the shape's first entry of another
        -- group (or of none) stands in next (docs/preemption.md, preemption groups).
        v_group := (SELECT preemption_group FROM respool.requests WHERE id = stand_in);
        EXIT WHEN v_group IS NULL OR NOT EXISTS (
            SELECT FROM respool.requests WHERE pool_id = p_pool_id AND status = 'allocated'
                                           AND preemptible AND preemption_group = v_group);
        v_tried := v_tried || v_group;
        stand_in := respool._next_other_group(p_pool_id, p_policy_id, p_preemptible, p_resources,
                                              p_node_selector, v_tried);
        EXIT WHEN stand_in IS NULL;
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._stand_in_victims(uuid, boolean, uuid, uuid, boolean, jsonb, jsonb, text) IS 'The victims (respool._choose_victims, or respool._choose_node_victims and their node in a pool with nodes: p_nodes) that would let a queued shape in under p_mode, tried for its first entry p_request_id and then, while a preemption group may be what keeps the stand-in from preempting, for the shape''s first entry of another group. victim_ids NULL: no victim set helps the shape.';

CREATE OR REPLACE FUNCTION respool._preempt_then_grant(p_pool_id uuid, p_nodes boolean, p_request_id uuid,
                                                       p_policy_id uuid, p_mode text, p_victims uuid[],
                                                       p_node_id uuid, p_now timestamptz,
                                                       OUT preempted integer, OUT allocated integer,
                                                       OUT rejected integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_victim uuid;
BEGIN
    preempted := 0; allocated := 0; rejected := 0;
    FOREACH v_victim IN ARRAY p_victims LOOP
        IF respool._preempt_for(v_victim, p_mode, p_request_id, p_now) = 'rejected' THEN
            rejected := rejected + 1;
        END IF;
        preempted := preempted + 1;
    END LOOP;
    IF respool._try_grant(p_request_id, p_pool_id, p_policy_id, p_now) = 'granted' THEN
        allocated := 1;
    ELSIF EXISTS (SELECT FROM respool.requests WHERE pool_id = p_pool_id AND status = 'preempting') THEN
        -- Victims in their grace period still hold the units: keep them for this request.
        -- (in a pool with nodes, on the node its victims leave: docs/placement.md)
        UPDATE respool.requests SET earmark_pool_id = p_pool_id, earmark_node_id = p_node_id
         WHERE id = p_request_id;
    ELSIF p_nodes THEN
        -- Its pool-wide rules still block it (a node over capacity elsewhere after a
        -- shrink): the units wait for it without an earmark.
        NULL;
    ELSE
        RAISE EXCEPTION 'request % does not fit after preempting %', p_request_id, p_victims
            USING ERRCODE = 'RP500';
    END IF;
END $$;
COMMENT ON FUNCTION respool._preempt_then_grant(uuid, boolean, uuid, uuid, text, uuid[], uuid, timestamptz) IS 'Preempts p_victims for the queued request p_request_id (locked by the caller, with the pool), then grants it, or earmarks the units (on p_node_id in a pool with nodes) while victims are in their grace period. A pool without nodes where it still does not fit raises RP500. Returns the counts preempted, allocated, rejected.';

CREATE OR REPLACE FUNCTION respool._preempt_for_queue(p_pool_id uuid, p_now timestamptz,
                                                      OUT preempted integer, OUT allocated integer,
                                                      OUT rejected integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_queueing text := (SELECT queueing FROM respool.pools WHERE id = p_pool_id);
    v_free jsonb;        -- effective free units per tracked key
    v_limits jsonb;      -- policy -> key -> room under the limit
    v_np jsonb;          -- policy -> tracked key -> room for non-preemptible work
    v_borrowers jsonb;   -- policy -> rank (respool._rank), for subjects that can lose work
    v_own jsonb;         -- policy -> true, for subjects holding preemptible work
    v_failed text[] := '{}';  -- shapes no victim set can help, until something changes
    v_changed boolean := false;
    v_strict_blocked boolean := false;
    v_mode text;
    v_shape text;
    v_nodes boolean := respool._pool_has_nodes(p_pool_id);
    e record;
    s record;            -- the shape's stand-in and its victims (respool._stand_in_victims)
    d record;            -- what preempting them did (respool._preempt_then_grant)
BEGIN
    preempted := 0; allocated := 0; rejected := 0;
    IF NOT EXISTS (SELECT FROM respool.requests
                    WHERE pool_id = p_pool_id AND status = 'allocated' AND preemptible) THEN
        RETURN;  -- nothing preemptible is held in the pool
    END IF;
    <<refresh>>
    LOOP
        SELECT coalesce(jsonb_object_agg(u.key, respool._room(u.bound, u.used, u.earmarked - u.leaving)), '{}') INTO v_free
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
                  CROSS JOIN LATERAL (SELECT CASE WHEN q.in_share OR NOT q.preemptible
                                                       -- (in share but for rate keys: 039_rates.sql)
                                                       OR respool._in_share_but_rates(p_pool_id, q.policy_id, q.resources)
                                                  THEN 'reclaim' ELSE 'priority' END AS mode) m
                  WHERE (NOT respool._fits_room_unbounded(q.resources, v_free)
                         -- in a pool with nodes, also blocked for want of one node with room
                         -- (a gang does not preempt there: it is placed member by member)
                         OR (v_nodes AND respool._node_for(p_pool_id, q.resources, q.node_selector, q.request_id) IS NULL))
                    AND (NOT v_nodes OR NOT EXISTS (SELECT FROM respool.requests g
                                                     WHERE g.id = q.request_id AND g.gang_id IS NOT NULL))
                    AND respool._fits_every_room(q.resources, v_limits -> q.policy_id::text)
                    -- rate keys are never a reason to preempt: only time frees them (039_rates.sql)
                    AND NOT respool._rate_blocks(p_pool_id, q.policy_id, q.resources)
                    AND (q.preemptible OR respool._fits_room_zero(
                            (SELECT jsonb_object_agg(x.key, x.value) FROM jsonb_each(q.resources) x
                              WHERE v_free ? x.key), v_np -> q.policy_id::text))
                    AND CASE m.mode
                          WHEN 'reclaim' THEN (NOT q.preemptible AND v_own ? q.policy_id::text)
                                              OR EXISTS (SELECT FROM jsonb_object_keys(v_borrowers) b
                                                          WHERE b <> q.policy_id::text)
                          ELSE EXISTS (SELECT FROM jsonb_each_text(v_borrowers) b
                                        WHERE b.key <> q.policy_id::text AND b.value::bigint < q.rank)
                        END
                  ORDER BY q.rank DESC, q.in_share DESC, q.share, q.queued_at, q.request_id LOOP
            v_mode := e.mode;
            -- In a strict pool, once a request could not be helped, only reclaim (the reserved
            -- share guarantee) still acts for the requests behind it.
            CONTINUE WHEN v_strict_blocked AND v_mode = 'priority';
            v_shape := concat_ws('|', e.policy_id, v_mode, e.preemptible, e.resources, e.node_selector);
            CONTINUE WHEN v_shape = ANY (v_failed);
            s := respool._stand_in_victims(p_pool_id, v_nodes, e.request_id, e.policy_id, e.preemptible,
                                           e.resources, e.node_selector, v_mode);
            IF s.victim_ids IS NULL THEN
                v_failed := v_failed || v_shape;
                v_strict_blocked := v_queueing = 'strict';
                CONTINUE;
            END IF;
            CONTINUE WHEN cardinality(s.victim_ids) = 0;  -- fits already: step 4 grants it in order
            -- Lock the requester before touching any victim; another pool's pass may hold it.
            CONTINUE WHEN NOT respool._lock_queued(s.stand_in);
            d := respool._preempt_then_grant(p_pool_id, v_nodes, s.stand_in, e.policy_id, v_mode,
                                             s.victim_ids, s.on_node, p_now);
            preempted := preempted + d.preempted;
            allocated := allocated + d.allocated;
            rejected := rejected + d.rejected;
            v_changed := true;
            v_failed := '{}';
            EXIT;  -- the queue order, free units and borrowers changed: read them again
        END LOOP;
        EXIT refresh WHEN NOT v_changed;
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._preempt_for_queue(uuid, timestamptz) IS 'Step 3, in queue order: for each queued request that only the pool''s capacity blocks, reclaim (in share) or priority preemption (preemptible borrower); the victims'' units go to it in the same transaction (granted now, or earmarked until a grace period ends). No victim set, no preemption.';

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
    PERFORM respool._expire_charges(p_pool_id) WHERE respool._pool_has_rates(p_pool_id);  -- rate keys: 039_rates.sql
    -- Window boundaries due by now (docs/preemption.md, time windows): the shares in force
    -- change first, and the steps below reclaim and grant accordingly. Under the pool lock, so
    -- two passes never apply one boundary twice.
    PERFORM respool._apply_windows(p_pool_id, p_now);
    expired := 0;
    grace_ended := 0;
    IF respool.leases_may_lapse() THEN  -- not while respool looks down (072_outage_leases.sql)
        expired := respool._expire_pool(p_pool_id, p_now)
                   + respool._abandon_queue_leases(p_pool_id, p_now);  -- queue leases (043_leases.sql)
        grace_ended := respool._finish_grace(p_pool_id, p_now);
        expired := expired + respool._agent_pass(p_pool_id, p_now);  -- lost agents (docs/jobs.md)
    END IF;
    -- A runtime cap (max_seconds) ends whatever the heartbeats, also right after an outage
    expired := expired + respool._expire_max_seconds(p_pool_id, p_now);
    -- Earmarks whose node changed or whose victims are gone (docs/preemption.md, earmarks)
    granted := respool._drop_stale_earmarks(p_pool_id, p_now);
    shed := respool._enforce_shrinks(p_pool_id, p_now);
    q := respool._preempt_for_queue(p_pool_id, p_now);
    granted := granted + respool.allocate_pool(p_pool_id, p_now);
    RETURN jsonb_build_object('pool', v_name, 'expired', expired, 'grace_ended', grace_ended,
                              'preempted', shed + q.preempted, 'allocated', q.allocated + granted,
                              'rejected', q.rejected);
END $$;
COMMENT ON FUNCTION respool.reconcile_pool(uuid, timestamptz) IS 'One reconciler pass over one pool in the caller''s transaction (docs/preemption.md): apply the window boundaries due (respool._apply_windows), expire lapsed leases, runtime caps (max_seconds) and grace periods, enforce shrunk capacities and limits, preempt for queued requests with a right to run, grant what fits. Returns {pool, expired, grace_ended, preempted, allocated, rejected}, or NULL when the pool is locked elsewhere (skip it: SKIP LOCKED) or gone.';
