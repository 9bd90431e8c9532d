-- Gangs (docs/scheduling.md, gangs): the members of an all_or_nothing batch, granted all together or not at all.
--
-- A queued gang waits as ONE queue entry per candidate pool: its first member's (queue time, id),
-- carrying the members' summed resources. The engine's queue machinery (queue order, admission,
-- the starvation hold, reclaim and priority preemption, ETA) therefore sees the gang as one
-- request of the sum, and respool._try_grant grants every member in the same transaction. The
-- other members are queued without entries of their own. Allocated, the gang is one victim unit
-- (respool._victim_units). Preempting, expiring or cancelling one member does the same to every
-- member still holding or queued (respool._gang_follow), under the pool locks the caller holds.

CREATE OR REPLACE FUNCTION respool._gang_units(p_gang_id uuid, p_statuses text[])
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN respool._sum_units(ARRAY(SELECT m.resources FROM respool.requests m
                                     WHERE m.gang_id = p_gang_id AND m.status = ANY (p_statuses)));
END $$;
COMMENT ON FUNCTION respool._gang_units(uuid, text[]) IS
    'The summed resources {key: units} of a gang''s members in the given statuses. Read-only.';

CREATE OR REPLACE FUNCTION respool._queued_as(p_id uuid)
RETURNS respool.requests LANGUAGE plpgsql STABLE AS $$
DECLARE
    r respool.requests;
    g respool.requests;
BEGIN
    SELECT * INTO r FROM respool.requests WHERE id = p_id;
    IF r.gang_id IS NULL THEN
        RETURN r;
    END IF;
    -- The member that stands in the queues: the one with queue entries, else the first queued.
    SELECT m.* INTO g FROM respool.requests m
     WHERE m.gang_id = r.gang_id AND m.status = 'queued'
     ORDER BY EXISTS (SELECT FROM respool.queue_entries e WHERE e.request_id = m.id) DESC, m.queued_at, m.id
     LIMIT 1;
    IF NOT FOUND THEN
        RETURN r;
    END IF;
    g.resources := respool._gang_units(r.gang_id, ARRAY['queued']);
    -- A runtime cap for the gang only when every member has one: the longest.
    g.max_seconds := (SELECT CASE WHEN bool_and(m.max_seconds IS NOT NULL) THEN max(m.max_seconds) END
                        FROM respool.requests m WHERE m.gang_id = r.gang_id AND m.status = 'queued');
    RETURN g;
END $$;
COMMENT ON FUNCTION respool._queued_as(uuid) IS
    'A queued request as the queue sees it: itself, or for a gang member the gang''s queue stand-in (the member holding its queue entries) with the queued members'' summed resources and the longest max_seconds (NULL when a member has none). Read-only.';

CREATE OR REPLACE FUNCTION respool._lock_queued(p_id uuid)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_gang uuid := (SELECT gang_id FROM respool.requests WHERE id = p_id);
    v_locked integer;
BEGIN
    IF v_gang IS NULL THEN
        PERFORM 1 FROM respool.requests WHERE id = p_id AND status = 'queued' FOR UPDATE SKIP LOCKED;
        RETURN FOUND;
    END IF;
    SELECT count(*) INTO v_locked FROM (
        SELECT 1 FROM respool.requests WHERE gang_id = v_gang AND status = 'queued'
         ORDER BY id FOR UPDATE SKIP LOCKED) x;
    RETURN v_locked > 0
       AND v_locked = (SELECT count(*) FROM respool.requests WHERE gang_id = v_gang AND status = 'queued')
       AND NOT EXISTS (SELECT FROM respool.requests
                        WHERE gang_id = v_gang AND status IN ('allocated', 'preempting'));
END $$;
COMMENT ON FUNCTION respool._lock_queued(uuid) IS
    'Locks a queued request, or every queued member of its gang, with SKIP LOCKED; true only when all of them are locked (a gang with a member still holding units is not grantable). Never waits.';

DROP FUNCTION IF EXISTS respool._victim_units(uuid, uuid);
DROP FUNCTION IF EXISTS respool._node_victim_units(uuid, uuid[]);
CREATE OR REPLACE FUNCTION respool._victim_units(p_pool_id uuid, p_node_id uuid DEFAULT NULL)
RETURNS TABLE (id uuid, policy_id uuid, priority integer, resources jsonb, allocated_at timestamptz,
               rank bigint, lane boolean, preemption_group text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- Gang members are allocated together in one pool under one policy (same allocated_at) and
    -- share one preemption group: the gang is one unit, named by its member with the lowest id,
    -- holding the members' sum.
    IF p_node_id IS NULL THEN
        RETURN QUERY
        SELECT q.id, q.policy_id, p.priority,
               CASE WHEN q.gang_id IS NULL THEN q.resources ELSE respool._gang_units(q.gang_id, ARRAY['allocated']) END,
               q.allocated_at, respool._rank(p.priority, p.priority_lane), p.priority_lane, q.preemption_group
          FROM respool.requests q JOIN respool.policies p ON p.id = q.policy_id
         WHERE q.pool_id = p_pool_id AND q.status = 'allocated' AND q.preemptible
           AND (q.gang_id IS NULL
                OR NOT EXISTS (SELECT FROM respool.requests m
                                WHERE m.gang_id = q.gang_id AND m.status = 'allocated' AND m.id < q.id));
        RETURN;
    END IF;
    RETURN QUERY
    SELECT u.id, u.policy_id, u.priority, u.resources, u.allocated_at, u.rank, u.lane, u.preemption_group
      FROM respool._node_victim_units(p_pool_id, ARRAY[p_node_id]) u;
END $$;
CREATE OR REPLACE FUNCTION respool._node_victim_units(p_pool_id uuid, p_node_ids uuid[])
RETURNS TABLE (node_id uuid, id uuid, policy_id uuid, priority integer, resources jsonb, allocated_at timestamptz,
               rank bigint, lane boolean, preemption_group text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- On each node (docs/placement.md): the units that node gets back, a gang's members on it summed.
    RETURN QUERY
    SELECT pl.node_id, u.unit_id, (array_agg(q.policy_id))[1], min(p.priority),
           CASE WHEN count(*) = 1 THEN (array_agg(pl.resources))[1]
                ELSE respool._sum_units(array_agg(pl.resources)) END,
           min(q.allocated_at), min(respool._rank(p.priority, p.priority_lane)), bool_or(p.priority_lane),
           min(q.preemption_group)
      FROM respool.placements pl
      JOIN respool.requests q ON q.id = pl.request_id
      JOIN respool.policies p ON p.id = q.policy_id
     CROSS JOIN LATERAL (
            SELECT CASE WHEN q.gang_id IS NULL THEN q.id
                        ELSE (SELECT m.id FROM respool.requests m
                               WHERE m.gang_id = q.gang_id AND m.status = 'allocated' ORDER BY m.id LIMIT 1) END AS unit_id) u
     WHERE pl.node_id = ANY (p_node_ids) AND q.pool_id = p_pool_id AND q.status = 'allocated' AND q.preemptible
     GROUP BY pl.node_id, u.unit_id;
END $$;
COMMENT ON FUNCTION respool._node_victim_units(uuid, uuid[]) IS
    'The victim units (respool._victim_units) placed on each of p_node_ids: per node, one row per request on its own and one per gang with a member there (named by its lowest-id allocated member), holding what they hold on that node. Read-only.';

COMMENT ON FUNCTION respool._victim_units(uuid, uuid) IS
    'The preemptible allocations of a pool as victim units (docs/preemption.md): one row per request on its own, one per gang (its lowest-id allocated member, the members'' summed resources), with its policy''s priority, rank (respool._rank) and lane flag and its preemption group; preempting the unit''s request preempts its whole gang. With p_node_id (docs/placement.md): only the units with a request placed on that node, holding what they hold there. Read-only.';

CREATE OR REPLACE FUNCTION respool._gang_follow(p_member_id uuid, p_to text, p_reason text, p_verb text,
                                                p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_gang uuid := (SELECT gang_id FROM respool.requests WHERE id = p_member_id);
    v_message text;
    m record;
    n integer := 0;
BEGIN
    IF v_gang IS NULL THEN
        RETURN 0;
    END IF;
    v_message := format('gang %s: member %s was %s', v_gang, p_member_id, p_verb);
    -- The caller holds the locks of the gang's pools (members share their candidate pools and
    -- hold units in one pool); only a heartbeat can hold a member row, briefly: wait for it.
    FOR m IN SELECT r.id, r.status FROM respool.requests r
              WHERE r.gang_id = v_gang AND r.id <> p_member_id
                AND r.status IN ('queued', 'allocated', 'preempting')
              ORDER BY r.id FOR UPDATE LOOP
        m.status := (SELECT status FROM respool.requests WHERE id = m.id);  -- as of now, in this loop
        IF m.status = 'queued' THEN
            DELETE FROM respool.queue_entries WHERE request_id = m.id;
            PERFORM respool._set_status(m.id, CASE WHEN p_to = 'rejected' THEN 'rejected' ELSE 'cancelled' END,
                                        p_reason, v_message, p_now);
        ELSIF m.status = 'allocated' AND p_to = 'preempted' THEN
            PERFORM respool._preempt_member(m.id, p_reason, v_message, p_now);
        ELSIF p_to = 'cancelled' OR (p_to = 'expired' AND m.status = 'allocated') THEN
            PERFORM respool._unplace(m.id);
            PERFORM respool._set_status(m.id, p_to, p_reason, v_message, p_now);
        ELSE
            CONTINUE;  -- already being preempted: it ends as preempted on its own
        END IF;
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;
COMMENT ON FUNCTION respool._gang_follow(uuid, text, text, text, timestamptz) IS
    'docs/scheduling.md, gangs: after one member of a gang was preempted, expired, cancelled or rejected (p_to), does the same to every other member still holding or queued (queued ones are cancelled, or rejected), same reason, message "gang <id>: member <id> was <p_verb>". Holding members give their units back; the caller lets the queue move. Returns how many followed.';

CREATE OR REPLACE FUNCTION respool._gang_lockable(p_member_id uuid)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_gang uuid := (SELECT gang_id FROM respool.requests WHERE id = p_member_id);
    v_live integer;
    v_locked integer;
BEGIN
    IF v_gang IS NULL THEN
        RETURN true;
    END IF;
    SELECT count(*) INTO v_live FROM respool.requests
     WHERE gang_id = v_gang AND id <> p_member_id AND status IN ('queued', 'allocated', 'preempting');
    SELECT count(*) INTO v_locked
      FROM (SELECT id FROM respool.requests
             WHERE gang_id = v_gang AND id <> p_member_id AND status IN ('queued', 'allocated', 'preempting')
             ORDER BY id FOR UPDATE SKIP LOCKED) x;
    RETURN v_locked = v_live;
END $$;
COMMENT ON FUNCTION respool._gang_lockable(uuid) IS
    'For a caller that locked one gang member out of id order (a reconciler cursor, which holds only its own pool while a queued gang waits in several): locks the other live members without waiting; false when another transaction holds one (leave the member for a later pass: waiting could deadlock with a pass of another candidate pool). True for a request without a gang.';

CREATE OR REPLACE FUNCTION respool._gang_enqueue(p_gang_id uuid, p_now timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_first respool.requests;
    v_sum jsonb;
    v_pools uuid[];
    v_added integer;
    v_reason text;
    v_messages text[];
    m record;
BEGIN
    -- Only once no member holds units any more (after a preemption with a grace period the
    -- members come back one by one) and the gang has no entries yet.
    IF EXISTS (SELECT FROM respool.requests WHERE gang_id = p_gang_id AND status IN ('allocated', 'preempting'))
       OR EXISTS (SELECT FROM respool.queue_entries e JOIN respool.requests r ON r.id = e.request_id
                   WHERE r.gang_id = p_gang_id) THEN
        RETURN false;
    END IF;
    SELECT * INTO v_first FROM respool.requests WHERE gang_id = p_gang_id AND status = 'queued'
     ORDER BY queued_at, id LIMIT 1;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    v_sum := respool._gang_units(p_gang_id, ARRAY['queued']);
    SELECT coalesce(array_agg(DISTINCT c ORDER BY c), '{}') INTO v_pools
      FROM respool.requests r CROSS JOIN LATERAL unnest(r.candidate_pool_ids) c
     WHERE r.gang_id = p_gang_id AND r.status = 'queued';
    -- Every member waits on the same candidate pools (and so locks the same pools).
    UPDATE respool.requests SET candidate_pool_ids = v_pools
     WHERE gang_id = p_gang_id AND status = 'queued' AND candidate_pool_ids IS DISTINCT FROM v_pools;
    INSERT INTO respool.queue_entries (pool_id, request_id, policy_id, queued_at, resources, preemptible,
                                       node_selector)
    SELECT c.pool_id, v_first.id, c.policy_id, v_first.queued_at, v_sum, v_first.preemptible, v_first.node_selector
      FROM respool._candidate_rejections(v_first.subject, v_pools, v_sum, v_first.preemptible,
                                         v_first.node_selector, v_first.id) c
     WHERE c.reason IS NULL;
    GET DIAGNOSTICS v_added = ROW_COUNT;
    IF v_added > 0 THEN
        RETURN true;
    END IF;
    -- The members together can never fit any candidate pool: the whole gang is rejected.
    SELECT coalesce((array_agg(c.reason ORDER BY c.n) FILTER (WHERE c.reason IS NOT NULL))[1], 'no_policy'),
           coalesce(array_agg(c.message ORDER BY c.n) FILTER (WHERE c.reason IS NOT NULL), '{}')
      INTO v_reason, v_messages
      FROM respool._candidate_rejections(v_first.subject, v_pools, v_sum, v_first.preemptible,
                                         v_first.node_selector, v_first.id)
           WITH ORDINALITY c(policy_id, pool_id, pool_name, reason, message, n);
    FOR m IN SELECT id FROM respool.requests WHERE gang_id = p_gang_id AND status = 'queued' ORDER BY id LOOP
        PERFORM respool._set_status(m.id, 'rejected', v_reason,
            format('gang %s: its members together can never fit: %s', p_gang_id,
                   coalesce(nullif(array_to_string(v_messages, '; '), ''),
                            format('subject %s has no policy left on its candidate pools', v_first.subject))),
            p_now);
    END LOOP;
    RETURN false;
END $$;
COMMENT ON FUNCTION respool._gang_enqueue(uuid, timestamptz) IS
    'Puts a gang whose members are all queued (none holds units) in the queue of every candidate pool where the members'' sum can ever fit, as one entry: the first member''s queue time and id, the summed resources; when no candidate can ever hold the sum, rejects every member (message naming the gang). Returns whether it is queued now. The caller holds the candidate pools'' locks.';

CREATE OR REPLACE FUNCTION respool._gang_start(p_gang_id uuid, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    rej respool.requests;
    m record;
    v_first uuid;
BEGIN
    -- A member rejected on its own (the rejection table, docs/admission.md) rejects the whole gang.
    SELECT * INTO rej FROM respool.requests WHERE gang_id = p_gang_id AND status = 'rejected'
     ORDER BY queued_at, id LIMIT 1;
    IF FOUND THEN
        FOR m IN SELECT id FROM respool.requests WHERE gang_id = p_gang_id AND status = 'queued' ORDER BY id LOOP
            PERFORM respool._set_status(m.id, 'rejected', rej.reason,
                format('gang %s: member %s was rejected: %s', p_gang_id, rej.id, rej.message), p_now);
        END LOOP;
        RETURN;
    END IF;
    IF respool._gang_enqueue(p_gang_id, p_now) THEN
        SELECT e.request_id INTO v_first FROM respool.queue_entries e JOIN respool.requests r ON r.id = e.request_id
         WHERE r.gang_id = p_gang_id LIMIT 1;
        PERFORM respool._try_new(v_first, p_now);
    END IF;
END $$;
COMMENT ON FUNCTION respool._gang_start(uuid, timestamptz) IS
    'Right after a gang''s members were stored (docs/scheduling.md, gangs): rejects them all when one was rejected, else queues the gang as one entry and grants it at once where the whole gang fits (all members in one pool, in this transaction). The caller holds the candidate pools'' locks.';
