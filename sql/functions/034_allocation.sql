-- Allocation: grant queued requests through the placement seam (031_placement.sql: _fits, _place),
-- set-based runs of one shape, and the allocation pass of a pool.
-- Locking order everywhere: pool rows (id order) -> policy rows -> request rows.
-- Queued requests are picked with FOR UPDATE SKIP LOCKED; capacity is read only from the
-- counter rows of the locked pool, never inferred from skipped rows.

CREATE OR REPLACE FUNCTION respool._sum_units(p_maps jsonb[])
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(s.key, s.n), '{}')
              FROM (SELECT x.key, sum(x.value::bigint) AS n
                      FROM unnest(p_maps) m CROSS JOIN LATERAL jsonb_each_text(m) x
                     GROUP BY x.key) s);
END $$;
COMMENT ON FUNCTION respool._sum_units(jsonb[]) IS 'The key-wise sum of unit maps {key: n}.';

CREATE OR REPLACE FUNCTION respool._granted_at(p_now timestamptz, r respool.requests)
RETURNS timestamptz LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN r.gang_id IS NULL THEN greatest(p_now, r.queued_at) ELSE p_now END
$$;
COMMENT ON FUNCTION respool._granted_at(timestamptz, respool.requests) IS
    'The instant a grant at p_now gives request r: p_now, but never before r was queued (members of a batch are queued i µs apart and a run of them is granted at once, each then at its own instant, as one by one); a gang member at p_now, so a gang is granted at one instant. Inlined (SQL).';

CREATE OR REPLACE FUNCTION respool._grant_many(p_ids uuid[], p_pool_id uuid, p_policy_id uuid, p_now timestamptz,
                                               p_nodes uuid[] DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql
-- (its statements take the ids as an array: planned once, not anew for every call)
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_pool_name text;
    v_priority integer;
    v_tracked text[];
    v_granted respool.requests[];
    v_left uuid[];
BEGIN
    -- What every grant row takes from its pool and policy, in one statement.
    SELECT pl.name, p.priority,
           ARRAY(SELECT pr.key FROM respool.pool_resources pr WHERE pr.pool_id = p_pool_id AND pr.capacity IS NOT NULL)
      INTO v_pool_name, v_priority, v_tracked
      FROM respool.pools pl CROSS JOIN respool.policies p
     WHERE pl.id = p_pool_id AND p.id = p_policy_id;
    -- The status change is the one respool._set_status makes, in the same row version as the
    -- grant's own columns: one new version per granted request.
    WITH granted AS (
        UPDATE respool.requests r
           SET pool_id = p_pool_id, pool_name = v_pool_name, policy_id = p_policy_id, priority = v_priority,
               np_charge = CASE WHEN r.preemptible THEN '{}'::jsonb
                                ELSE (SELECT coalesce(jsonb_object_agg(x.key, x.value::bigint), '{}')
                                        FROM jsonb_each_text(r.resources) x WHERE x.key = ANY (v_tracked)) END,
               allocated_at = respool._granted_at(p_now, r), preempt_deadline = NULL,
               earmark_pool_id = NULL, earmark_node_id = NULL,
               -- (a job's lease runs from its claim, respool.claim_job; a gang member's from here)
               lease_expires_at = CASE WHEN r.command IS NULL OR r.gang_id IS NOT NULL
                                       THEN respool._granted_at(p_now, r) + make_interval(secs => r.lease_seconds) END,
               run_deadline = respool._granted_at(p_now, r) + make_interval(secs => r.max_seconds),  -- runtime cap (max_seconds)
               status = 'allocated', reason = NULL, message = '', version = r.version + 1,
               updated_at = respool._granted_at(p_now, r), finished_at = NULL
         WHERE r.id = ANY (p_ids) AND r.status = 'queued'
        RETURNING r.*)
    SELECT coalesce(array_agg(g::respool.requests ORDER BY g.queued_at, g.id), '{}') INTO v_granted FROM granted g;
    IF cardinality(v_granted) <> cardinality(p_ids) THEN
        RAISE EXCEPTION 'granting % requests in pool %: only % of them were queued', cardinality(p_ids), p_pool_id,
            cardinality(v_granted) USING ERRCODE = 'RP500';
    END IF;
    PERFORM respool._place(p_pool_id, p_policy_id, v_granted, p_nodes);
    WITH gone AS (DELETE FROM respool.queue_entries WHERE request_id = ANY (p_ids) RETURNING pool_id)
    SELECT array_agg(DISTINCT pool_id) FILTER (WHERE pool_id <> p_pool_id) INTO v_left FROM gone;
    PERFORM respool._record_events(v_granted, 'queued', p_now);
    IF v_left IS NOT NULL THEN
        PERFORM respool._queues_left(v_left, p_now);  -- their other candidates' queues
    END IF;
    RETURN cardinality(v_granted);
END $$;
COMMENT ON FUNCTION respool._grant_many(uuid[], uuid, uuid, timestamptz, uuid[]) IS
    'Moves queued requests the caller has locked (in a pool it has locked, under one policy) to allocated, set-based: placed (p_nodes: the nodes respool._fit_node chose, one per id in queue order) and charged by respool._place (one guarded statement for both counter tables, RP500 on a would-be over-allocation), every queue left, leases (a job''s at its claim) and runtime caps (max_seconds) started, one row version, event and NOTIFY each. Returns how many (all of p_ids, else RP500).';

CREATE OR REPLACE FUNCTION respool._try_grant(p_request_id uuid, p_pool_id uuid, p_policy_id uuid, p_now timestamptz,
                                              p_new respool.requests DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
    f record;
    v_ids uuid[];
    v_nodes uuid[];
BEGIN
    -- Admission is decided before the row lock: it depends only on the request's fixed resources
    -- and on this pool's counters, which the caller's pool lock holds still. A blocked request is
    -- thus never locked, and a concurrent pass of another candidate pool does not skip it.
    IF p_new.id IS NOT NULL THEN
        r := p_new;  -- inserted by this transaction: nobody else can see it, let alone lock it
    ELSE
        SELECT * INTO r FROM respool.requests WHERE id = p_request_id AND status = 'queued';
        IF NOT FOUND THEN
            RETURN 'gone';
        END IF;
    END IF;
    IF r.gang_id IS NOT NULL THEN
        r := respool._queued_as(p_request_id);  -- the gang as one request of the sum (docs/scheduling.md)
    END IF;
    -- (A gang stands in with its members' sum: its nodes are chosen member by member below.)
    f := respool._fit_node(r.resources, r.preemptible, p_pool_id, p_policy_id, r.id, r.earmark_pool_id,
                           CASE WHEN r.gang_id IS NULL THEN r.node_selector END);
    IF NOT f.fits THEN
        RETURN 'blocked';
    END IF;
    IF p_new.id IS NULL AND NOT respool._lock_queued(p_request_id) THEN
        -- Gone from the queue (committed after our snapshot) or locked by another transaction.
        RETURN CASE WHEN EXISTS (SELECT FROM respool.requests WHERE id = p_request_id AND status = 'queued')
                    THEN 'locked' ELSE 'gone' END;
    END IF;
    IF r.gang_id IS NULL THEN
        PERFORM respool._grant_many(ARRAY[p_request_id], p_pool_id, p_policy_id, p_now, ARRAY[f.node_id]);
        RETURN 'granted';
    END IF;
    -- A gang: every member, in this transaction, at the same instant, in this pool. In a pool
    -- with nodes the members are placed one by one (docs/placement.md); when one finds no node
    -- the subtransaction takes the whole gang's grant back.
    v_ids := ARRAY(SELECT id FROM respool.requests WHERE gang_id = r.gang_id AND status = 'queued'
                    ORDER BY queued_at, id);
    BEGIN
        PERFORM respool._grant_many(v_ids, p_pool_id, p_policy_id, p_now);
    EXCEPTION WHEN SQLSTATE 'RP501' THEN
        -- Member by member, one member found no node: search an arrangement of all of them on
        -- what is free now (one that the members taken in order miss, docs/placement.md).
        v_nodes := (respool._gang_arrangement(
                        p_pool_id, ARRAY(SELECT m.resources FROM respool.requests m WHERE m.id = ANY (v_ids)
                                          ORDER BY m.queued_at, m.id),
                        r.node_selector, r.distinct_nodes, true, r.id)).nodes;
        IF v_nodes IS NULL THEN
            RETURN 'blocked';
        END IF;
        BEGIN
            PERFORM respool._grant_many(v_ids, p_pool_id, p_policy_id, p_now, v_nodes);
        EXCEPTION WHEN SQLSTATE 'RP501' THEN
            RETURN 'blocked';
        END;
    END;
    RETURN 'granted';
END $$;
COMMENT ON FUNCTION respool._try_grant(uuid, uuid, uuid, timestamptz, respool.requests) IS
    'Grants one queued (or, p_new, just inserted) request in a pool whose row the caller has locked, if admissible (respool._fit_node, a node included in a pool with nodes, placed there): granted | blocked | locked | gone. A gang''s queue entry grants every member together when their sum fits and, in a pool with nodes, every member finds a node (distinct ones with distinct_nodes: member by member, else in an arrangement respool._gang_arrangement finds on the free units), or none (docs/scheduling.md, gangs; docs/placement.md). p_new (not a gang member) needs no re-read or row lock.';

CREATE OR REPLACE FUNCTION respool._scale_units(p_units jsonb, p_times integer)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(x.key, x.value::bigint * p_times), '{}') FROM jsonb_each_text(p_units) x);
END $$;
COMMENT ON FUNCTION respool._scale_units(jsonb, integer) IS 'A unit map {key: n} times p_times: the need of that many requests of one shape.';

DROP FUNCTION IF EXISTS respool._grant_run(uuid, uuid, boolean, jsonb, jsonb, timestamptz, uuid, timestamptz, uuid,
                                            timestamptz);
CREATE OR REPLACE FUNCTION respool._grant_run(p_pool_id uuid, p_policy_id uuid, p_preemptible boolean,
                                              p_resources jsonb, p_selector jsonb,
                                              p_from_at timestamptz, p_from_id uuid,
                                              p_before_at timestamptz, p_before_id uuid, p_now timestamptz,
                                              p_new uuid[] DEFAULT NULL)
RETURNS uuid[] LANGUAGE plpgsql AS $$
DECLARE
    v_run uuid[] := '{}';
    v_high bigint;
    v_locked uuid[];
    v_prefix integer := 0;
    c record;
BEGIN
    -- Only for a pass without earmarks or a starvation hold (those need the per-request checks:
    -- the caller, respool.allocate_pool, decides), or for requests a create has just made, each
    -- tried alone (respool._grant_members). The bound is the next other shape's head.
    -- How many requests of the shape fit together, before reading the queue: the capacity
    -- model's count by division (respool._fit_count) and, in a pool with nodes, its nodes' slots
    -- (respool._node_slots). So the work is the same whatever the length of the queue.
    v_high := respool._fit_count(p_resources, p_preemptible, p_pool_id, p_policy_id);
    IF p_new IS NOT NULL THEN
        v_high := least(v_high, cardinality(p_new));
    END IF;
    IF v_high >= 2 AND respool._pool_has_nodes(p_pool_id) THEN
        v_high := least(v_high, respool._node_slots(p_pool_id, p_resources, p_selector));
    END IF;
    -- The placement seam has the last word on the whole run (respool._fits of k times the need):
    -- a count it refuses is left to the one-request path, which asks it for each request.
    IF v_high < 2 OR NOT respool._fits(respool._scale_units(p_resources, v_high::integer), p_preemptible,
                                       p_pool_id, p_policy_id, NULL, NULL, NULL) THEN
        RETURN '{}';  -- nothing to gain over the one-request path
    END IF;
    -- The run: at most that many of the shape's entries from (p_from_at, p_from_id) on, in
    -- queue-time order (an index range of queue_entries_shape_idx), that come before the next
    -- other shape's head in the queue order ((p_before_at, p_before_id), NULL: none), up to the
    -- first gang entry (a gang is granted on its own); or the first of p_new, in their order.
    FOR c IN (SELECT e.request_id, r.gang_id, r.command IS NOT NULL AS job
                FROM respool.queue_entries e JOIN respool.requests r ON r.id = e.request_id
               WHERE p_new IS NULL AND e.pool_id = p_pool_id AND e.policy_id = p_policy_id
                 AND e.preemptible = p_preemptible AND e.resources = p_resources AND e.node_selector = p_selector
                 AND (e.queued_at, e.request_id) >= (p_from_at, p_from_id)
                 AND (p_before_at IS NULL OR (e.queued_at, e.request_id) < (p_before_at, p_before_id))
               ORDER BY e.queued_at, e.request_id
               LIMIT v_high)
             UNION ALL
             (SELECT x.id, NULL::uuid, r.command IS NOT NULL
                FROM unnest(p_new[1:v_high]) WITH ORDINALITY x(id, k) JOIN respool.requests r ON r.id = x.id
               WHERE p_new IS NOT NULL AND r.id = ANY (p_new[1:v_high])
               ORDER BY x.k) LOOP
        EXIT WHEN c.gang_id IS NOT NULL;
        -- (a job may not go to a lost agent's node, which _node_slots counts: one by one, docs/jobs.md)
        EXIT WHEN c.job AND EXISTS (SELECT FROM respool.nodes n WHERE n.pool_id = p_pool_id AND n.agent = 'lost');
        v_run := v_run || c.request_id;
    END LOOP;
    IF cardinality(v_run) < 2 THEN
        RETURN '{}';
    END IF;
    IF p_new IS NULL THEN
        -- Lock them without waiting; the run ends before the first one another transaction holds
        -- or already took (the one-request path then decides on it: skip it, or stop a strict pool).
        -- (Requests this transaction just made are invisible to every other: nothing to lock.)
        v_locked := ARRAY(SELECT id FROM respool.requests WHERE id = ANY (v_run) AND status = 'queued'
                           ORDER BY id FOR UPDATE SKIP LOCKED);
        WHILE v_prefix < cardinality(v_run) AND v_run[v_prefix + 1] = ANY (v_locked) LOOP
            v_prefix := v_prefix + 1;
        END LOOP;
        v_run := v_run[1:v_prefix];
    END IF;
    IF cardinality(v_run) > 0 THEN
        PERFORM respool._grant_many(v_run, p_pool_id, p_policy_id, p_now);
    END IF;
    RETURN v_run;
END $$;
COMMENT ON FUNCTION respool._grant_run(uuid, uuid, boolean, jsonb, jsonb, timestamptz, uuid, timestamptz, uuid, timestamptz, uuid[]) IS
    'Set-based grants of several alike requests in a pool the caller has locked: of one queue shape''s entries from (p_from_at, p_from_id) on and before (p_before_at, p_before_id) (NULL: no bound), or of p_new (requests this transaction made, in order, no row lock needed), as many as fit together (respool._fit_count by division; at least two, else none) are granted in one respool._grant_many, stopping before a gang entry or an entry locked or taken elsewhere. Returns the granted ids in order.';

CREATE OR REPLACE FUNCTION respool._grant_earmarked(p_pool_id uuid, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    e record;
    granted integer := 0;
BEGIN
    FOR e IN SELECT r.id AS request_id, q.policy_id
               FROM respool.requests r
               JOIN respool.queue_entries q ON q.request_id = r.id AND q.pool_id = p_pool_id
              WHERE r.earmark_pool_id = p_pool_id AND r.status = 'queued'
              ORDER BY r.queued_at, r.id LOOP
        IF respool._try_grant(e.request_id, p_pool_id, e.policy_id, p_now) = 'granted' THEN
            granted := granted + 1;
        END IF;
    END LOOP;
    RETURN granted;
END $$;
COMMENT ON FUNCTION respool._grant_earmarked(uuid, timestamptz) IS
    'Tries to grant, in queue-time order and one by one (respool._try_grant), every queued request holding an earmark in a pool the caller has locked. Returns the number granted.';

CREATE OR REPLACE FUNCTION respool._best_head(p_rank bigint[], p_in_share boolean[], p_share double precision[],
                                              p_at timestamptz[], p_id uuid[],
                                              OUT best integer, OUT bound_at timestamptz, OUT bound_id uuid)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    second integer;
BEGIN
    FOR i IN 1..coalesce(cardinality(p_id), 0) LOOP
        CONTINUE WHEN p_id[i] IS NULL;  -- shape done for this pass
        IF best IS NULL
           OR (-p_rank[i], NOT p_in_share[i], p_share[i], p_at[i], p_id[i])
              < (-p_rank[best], NOT p_in_share[best], p_share[best], p_at[best], p_id[best]) THEN
            second := best;
            best := i;
        ELSIF second IS NULL
           OR (-p_rank[i], NOT p_in_share[i], p_share[i], p_at[i], p_id[i])
              < (-p_rank[second], NOT p_in_share[second], p_share[second], p_at[second], p_id[second]) THEN
            second := i;
        END IF;
    END LOOP;
    -- The bound of the best shape's run: the second-best head when it is of the same (rank,
    -- in-share, share) class, else none (every entry of the best shape comes first).
    IF second IS NOT NULL AND (p_rank[second], p_in_share[second], -p_share[second])
                              = (p_rank[best], p_in_share[best], -p_share[best]) THEN
        bound_at := p_at[second];
        bound_id := p_id[second];
    END IF;
END $$;
COMMENT ON FUNCTION respool._best_head(bigint[], boolean[], double precision[], timestamptz[], uuid[]) IS
    'One merge step over the heads of a pool''s queue shapes (parallel arrays; a NULL id: shape done): best, the index of the head first in queue order (rank, in-share, share, queued_at, id), NULL when none is left; bound_at/bound_id, the next other head of the same (rank, in-share, share) class, NULL when there is none.';

CREATE OR REPLACE FUNCTION respool._allocate_pass(p_pool_id uuid, p_now timestamptz,
                                                   OUT granted integer, OUT again boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_queueing text; v_starvation integer;
    v_free jsonb;
    -- The starvation guard (docs/scheduling.md): the pass's head (first entry that stays blocked) and,
    -- once it has waited starvation_seconds, the hold for it.
    v_head_seen boolean := false;
    v_hold respool.pool_hold;
    outcome text;
    g_policy uuid[]; g_preemptible boolean[]; g_resources jsonb[]; g_selector jsonb[];
    g_priority bigint[];    -- the shapes' ranks (respool._rank: lane first)
    g_in_share boolean[]; g_share double precision[]; g_backfill boolean[];
    g_at timestamptz[]; g_id uuid[];
    best integer;
    bound_at timestamptz; bound_id uuid;  -- the end of the best shape's run (respool._best_head)
    next_at timestamptz; next_id uuid;
    v_run uuid[]; v_runs boolean;
BEGIN
    granted := 0; again := false;
    SELECT queueing, starvation_seconds INTO v_queueing, v_starvation
      FROM respool.pools WHERE id = p_pool_id FOR NO KEY UPDATE;
    IF NOT FOUND OR NOT EXISTS (SELECT FROM respool.queue_entries WHERE pool_id = p_pool_id) THEN
        RETURN;  -- gone, or nobody waits: the common case after a release
    END IF;
    PERFORM respool._expire_charges(p_pool_id) WHERE respool._pool_has_rates(p_pool_id);  -- rate keys: 039_rates.sql
    -- Requests that victims in their grace period were preempted for come first: the units
    -- those victims free are theirs (docs/preemption.md, earmarks), whatever the queue order or
    -- queueing mode. Set-based runs of one shape (respool._grant_run) only in a pass that met none.
    v_runs := NOT EXISTS (SELECT FROM respool.requests WHERE earmark_pool_id = p_pool_id AND status = 'queued');
    IF NOT v_runs THEN
        granted := respool._grant_earmarked(p_pool_id, p_now);
    END IF;
    v_free := respool._free_units(p_pool_id);
    -- Every request carries step_run: 1, so a full tracked step_run ends the pass.
    IF (v_free ->> 'step_run')::bigint <= 0 THEN
        RETURN;
    END IF;
    -- The queue order is the merge of the shapes' queues (respool._queue_groups): take the best
    -- head each time. In-share is decided at the start of the pass, as for the whole queue.
    SELECT coalesce(array_agg(g.policy_id), '{}'), array_agg(g.preemptible), array_agg(g.resources),
           array_agg(g.rank), array_agg(g.in_share), array_agg(g.queued_at), array_agg(g.request_id),
           array_agg(g.share), array_agg(false), array_agg(g.node_selector)
      INTO g_policy, g_preemptible, g_resources, g_priority, g_in_share, g_at, g_id, g_share, g_backfill, g_selector
      FROM respool._queue_groups(p_pool_id) g;
    LOOP
        SELECT h.best, h.bound_at, h.bound_id INTO best, bound_at, bound_id
          FROM respool._best_head(g_priority, g_in_share, g_share, g_at, g_id) h;
        EXIT WHEN best IS NULL;
        -- Free units only shrink during a pass, and the limit and reserved-share rules only
        -- tighten: a shape that is blocked now stays blocked, whichever of its entries we try.
        IF NOT respool._fits_room_unbounded(g_resources[best], v_free) THEN
            outcome := 'blocked';
        -- While the pool holds for its head, an entry behind it must leave the head's
        -- units free (a shape-wide test) or backfill: end by max_seconds before the shadow time
        -- (an entry-wide test: the shape's next entry that can is tried instead).
        ELSIF v_hold.head_id IS NOT NULL AND NOT g_backfill[best]
           AND NOT respool._leaves_head_room(v_hold, g_resources[best], v_free, g_selector[best]) THEN
            SELECT n.queued_at, n.request_id INTO next_at, next_id
              FROM respool._next_backfill(p_pool_id, g_policy[best], g_preemptible[best], g_resources[best], g_selector[best],
                                          g_at[best], g_id[best], v_hold.shadow, p_now) n;
            g_at[best] := next_at;
            g_id[best] := next_id;
            g_backfill[best] := true;
            CONTINUE;  -- merge again: the shape's candidate moved back in the queue
        ELSE
            v_run := '{}';
            -- (a run is two or more: not when the free units hold one at most)
            IF v_runs AND v_hold.head_id IS NULL
               AND respool._fits_room_unbounded(respool._scale_units(g_resources[best], 2), v_free) THEN
                -- The shape's entries ahead of the second-best head: all of them when the
                -- second is of a lower (priority, in-share, share) class, else those queued before it.
                v_run := respool._grant_run(
                    p_pool_id, g_policy[best], g_preemptible[best], g_resources[best], g_selector[best],
                    g_at[best], g_id[best], bound_at, bound_id, p_now);
            END IF;
            IF cardinality(v_run) > 0 THEN
                outcome := 'granted';
                granted := granted + cardinality(v_run) - 1;  -- (+ 1 below)
                -- the shape goes on after the run's last entry (below)
                SELECT queued_at, id INTO next_at, next_id FROM respool.requests WHERE id = v_run[cardinality(v_run)];
                g_at[best] := next_at;
                g_id[best] := next_id;
            ELSE
                outcome := respool._try_grant(g_id[best], p_pool_id, g_policy[best], p_now);
            END IF;
        END IF;
        IF outcome = 'granted' THEN
            granted := granted + 1;
            v_free := respool._free_units(p_pool_id);
            EXIT WHEN (v_free ->> 'step_run')::bigint <= 0;
        ELSIF outcome = 'blocked' THEN  -- a shape blocked now stays blocked in this pass
            EXIT WHEN v_queueing = 'strict';
            -- The first blocked entry is the head; hold for it once it waited enough.
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
                                      g_selector[best], g_at[best], g_id[best]) n;
        g_at[best] := next_at;
        g_id[best] := next_id;
        g_backfill[best] := false;
    END LOOP;
    -- The order was taken at the start of the pass; its grants may have changed it (in-share,
    -- fair shares): where the order decides, a strict stop or a hold, the caller walks again.
    again := granted > 0 AND ((v_queueing = 'strict' AND outcome IS NOT DISTINCT FROM 'blocked')
                              OR v_hold.head_id IS NOT NULL);
END $$;
COMMENT ON FUNCTION respool._allocate_pass(uuid, timestamptz) IS
    'One walk of respool.allocate_pool: locks the pool, grants the earmark holders, then the queue in its order at the start of the walk; best_effort grants every request that fits, strict stops at the first that does not (or is locked elsewhere); in best_effort, once the head has waited starvation_seconds, a request behind it only if it leaves the head''s units free or backfills (docs/scheduling.md). again: it granted and a strict stop or a hold depended on that order.';

CREATE OR REPLACE FUNCTION respool.allocate_pool(p_pool_id uuid, p_now timestamptz DEFAULT now())
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    total integer := 0;
    v_again boolean := true;
    w record;
    v_outer text := coalesce(current_setting('respool.passing', true), '');
BEGIN
    -- The pools in a pass in this transaction (respool._queues_left does not start a second one).
    PERFORM set_config('respool.passing', v_outer || p_pool_id || ' ', true);
    -- Each walk that goes on grants at least one request: the loop ends.
    WHILE v_again LOOP
        w := respool._allocate_pass(p_pool_id, p_now);
        n := w.granted;
        v_again := w.again;
        total := total + n;
    END LOOP;
    PERFORM set_config('respool.passing', v_outer, true);
    RETURN total;
END $$;
COMMENT ON FUNCTION respool.allocate_pool(uuid, timestamptz) IS
    'Locks the pool and grants its queue (respool._allocate_pass: earmark holders first, then queue order, best_effort or strict, the starvation guard), walking it again while a walk granted and stopped where the queue order decides (a strict stop, a hold for a starving head), as grants change in-share and fair shares: it ends with the queue in its current order left as a fresh pass would leave it. Returns the number granted.';
