-- Allocation: grant and free units under guarded counters, and the allocation pass of a pool.
-- Locking order everywhere: pool rows (id order) -> policy rows -> request rows.
-- Queued requests are picked with FOR UPDATE SKIP LOCKED; capacity is read only from the
-- counter rows of the locked pool, never inferred from skipped rows.

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
           lease_expires_at = p_now + make_interval(secs => lease_seconds),
           run_deadline = p_now + make_interval(secs => max_seconds)  -- [SPEC §11.1] runtime cap
     WHERE id = p_request_id;
    PERFORM respool._set_status(p_request_id, 'allocated', NULL, '', p_now);
END $$;
COMMENT ON FUNCTION respool._grant(uuid, uuid, uuid, timestamptz) IS
    'Moves a locked queued request to allocated: charges pool and policy counters under guards (RP500 on a would-be over-allocation), leaves every queue, starts the lease and the runtime cap (max_seconds).';

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
    UPDATE respool.requests SET lease_expires_at = NULL, run_deadline = NULL, np_charge = '{}'
     WHERE id = p_request_id;
END $$;
COMMENT ON FUNCTION respool._free(uuid) IS
    'Returns a holding request''s units to its pool and policy counters (CHECK used >= 0 catches double frees). Caller changes the status.';

CREATE OR REPLACE FUNCTION respool._try_grant(p_request_id uuid, p_pool_id uuid, p_policy_id uuid, p_now timestamptz)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
    m uuid;
BEGIN
    -- Admission is decided before the row lock: it depends only on the request's fixed resources
    -- and on this pool's counters, which the caller's pool lock holds still. A blocked request is
    -- thus never locked, and a concurrent pass of another candidate pool does not skip it.
    SELECT * INTO r FROM respool.requests WHERE id = p_request_id AND status = 'queued';
    IF NOT FOUND THEN
        RETURN 'gone';
    END IF;
    IF r.gang_id IS NOT NULL THEN
        r := respool._queued_as(p_request_id);  -- [SPEC §11.6] the gang as one request of the sum
    END IF;
    IF respool._blocker(r.resources, r.preemptible, p_pool_id, p_policy_id) IS NOT NULL
       OR respool._earmark_blocks(r, p_pool_id) THEN
        RETURN 'blocked';
    END IF;
    IF NOT respool._lock_queued(p_request_id) THEN
        -- Gone from the queue (committed after our snapshot) or locked by another transaction.
        RETURN CASE WHEN EXISTS (SELECT FROM respool.requests WHERE id = p_request_id AND status = 'queued')
                    THEN 'locked' ELSE 'gone' END;
    END IF;
    IF r.gang_id IS NULL THEN
        PERFORM respool._grant(p_request_id, p_pool_id, p_policy_id, p_now);
    ELSE
        -- Every member, in this transaction, at the same instant, in this pool.
        FOR m IN SELECT id FROM respool.requests WHERE gang_id = r.gang_id AND status = 'queued'
                  ORDER BY queued_at, id LOOP
            PERFORM respool._grant(m, p_pool_id, p_policy_id, p_now);
        END LOOP;
    END IF;
    RETURN 'granted';
END $$;
COMMENT ON FUNCTION respool._try_grant(uuid, uuid, uuid, timestamptz) IS
    'Grants one queued request in a pool whose row the caller has locked, if admissible: granted | blocked | locked | gone. A gang''s queue entry grants every member together when their sum is admissible, or none (SPEC §11.6).';

CREATE OR REPLACE FUNCTION respool.allocate_pool(p_pool_id uuid, p_now timestamptz DEFAULT now())
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_queueing text;
    v_starvation integer;
    v_free jsonb;
    -- [SPEC §11.1] the starvation guard: the pass's head (first entry that stays blocked) and,
    -- once it has waited starvation_seconds, the hold for it.
    v_head_seen boolean := false;
    v_hold respool.pool_hold;
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
    g_share double precision[];
    g_backfill boolean[];
    best integer;
    i integer;
    next_at timestamptz;
    next_id uuid;
BEGIN
    SELECT queueing, starvation_seconds INTO v_queueing, v_starvation
      FROM respool.pools WHERE id = p_pool_id FOR NO KEY UPDATE;
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
           array_agg(g.priority), array_agg(g.in_share), array_agg(g.queued_at), array_agg(g.request_id),
           array_agg(g.share), array_agg(false)
      INTO g_policy, g_preemptible, g_resources, g_priority, g_in_share, g_at, g_id, g_share, g_backfill
      FROM respool._queue_groups(p_pool_id) g;
    LOOP
        best := NULL;
        FOR i IN 1..cardinality(g_policy) LOOP
            CONTINUE WHEN g_id[i] IS NULL;  -- shape done for this pass
            IF best IS NULL
               OR (-g_priority[i]::bigint, NOT g_in_share[i], g_share[i], g_at[i], g_id[i])
                  < (-g_priority[best]::bigint, NOT g_in_share[best], g_share[best], g_at[best], g_id[best]) THEN
                best := i;
            END IF;
        END LOOP;
        EXIT WHEN best IS NULL;
        -- Free units only shrink during a pass, and the limit and reserved-share rules only
        -- tighten: a shape that is blocked now stays blocked, whichever of its entries we try.
        IF NOT respool._fits_free(g_resources[best], v_free) THEN
            outcome := 'blocked';
        -- [SPEC §11.1] while the pool holds for its head, an entry behind it must leave the head's
        -- units free (a shape-wide test) or backfill: end by max_seconds before the shadow time
        -- (an entry-wide test: the shape's next entry that can is tried instead).
        ELSIF v_hold.head_id IS NOT NULL AND NOT g_backfill[best]
           AND NOT respool._leaves_head_room(v_hold, g_resources[best], v_free) THEN
            SELECT n.queued_at, n.request_id INTO next_at, next_id
              FROM respool._next_backfill(p_pool_id, g_policy[best], g_preemptible[best], g_resources[best],
                                          g_at[best], g_id[best], v_hold.shadow, p_now) n;
            g_at[best] := next_at;
            g_id[best] := next_id;
            g_backfill[best] := true;
            CONTINUE;  -- merge again: the shape's candidate moved back in the queue
        ELSE
            outcome := respool._try_grant(g_id[best], p_pool_id, g_policy[best], p_now);
        END IF;
        IF outcome = 'granted' THEN
            granted := granted + 1;
            v_free := respool._free_units(p_pool_id);
            EXIT WHEN (v_free ->> 'step_run')::bigint <= 0;
        ELSIF outcome = 'blocked' THEN  -- a shape blocked now stays blocked in this pass
            EXIT WHEN v_queueing = 'strict';
            -- [SPEC §11.1] the first blocked entry is the head; hold for it once it waited enough.
            IF NOT v_head_seen THEN
                v_head_seen := true;
                v_hold := respool._hold_for(p_pool_id, g_id[best], g_resources[best], g_at[best],
                                            v_starvation, p_now);
            END IF;
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
        g_backfill[best] := false;
    END LOOP;
    RETURN granted;
END $$;
COMMENT ON FUNCTION respool.allocate_pool(uuid, timestamptz) IS
    'Locks the pool and grants its queue: first the requests holding an earmark in it, then in queue order; best_effort grants every request that fits, strict stops at the first that does not (or is locked elsewhere). In best_effort, once the first blocked request (the head) has waited starvation_seconds, a request behind it is granted only if it leaves the head''s units free or backfills (max_seconds ends before the head''s shadow time), SPEC §11.1. Returns the number granted.';
