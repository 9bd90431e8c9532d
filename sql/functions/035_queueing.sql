-- Entering and leaving queues: enqueue in every candidate pool that can ever fit, requeue after
-- preemption, reject what can no longer fit anywhere.
-- New requests: granted at once where nobody queues, else queued and tried in candidate order.

CREATE OR REPLACE FUNCTION respool._enqueue(p_request_id uuid)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
    added integer;
BEGIN
    SELECT * INTO r FROM respool.requests WHERE id = p_request_id;
    INSERT INTO respool.queue_entries (pool_id, request_id, policy_id, queued_at, resources, preemptible, node_selector)
    SELECT c.pool_id, r.id, c.policy_id, r.queued_at, r.resources, r.preemptible, r.node_selector
      FROM respool._candidate_rejections(r.subject, r.candidate_pool_ids, r.resources, r.preemptible,
                                         r.node_selector, r.id) c
     WHERE c.reason IS NULL;
    GET DIAGNOSTICS added = ROW_COUNT;
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
    -- A terminated request is never requeued (docs/preemption.md, "Terminate"), nor one its pool
    -- ended for using more than its slice (over_slice, docs/placement.md, "Sharing a GPU").
    IF r.attempt <= r.max_retries AND p_reason IS DISTINCT FROM 'terminated'
       AND p_reason IS DISTINCT FROM 'over_slice' THEN
        UPDATE respool.requests
           SET attempt = attempt + 1,
               pool_id = CASE WHEN cardinality(candidate_pool_ids) = 1 THEN pool_id END,
               pool_name = CASE WHEN cardinality(candidate_pool_ids) = 1 THEN pool_name END
         WHERE id = p_request_id;
        IF r.gang_id IS NOT NULL THEN
            -- gangs (docs/scheduling.md): queued again without entries; the gang queues as a whole once the
            -- last member has given its units back (or is rejected as a whole).
            r := respool._set_status(p_request_id, 'queued', 'retry',
                                     format('requeued for attempt %s after preemption', r.attempt + 1), p_now);
            PERFORM respool._gang_enqueue(r.gang_id, p_now);
            SELECT * INTO r FROM respool.requests WHERE id = p_request_id;
        ELSIF respool._enqueue(p_request_id) > 0 THEN
            r := respool._set_status(p_request_id, 'queued', 'retry',
                                     format('requeued for attempt %s after preemption', r.attempt + 1), p_now);
        ELSE
            r := respool._reject_unfittable(p_request_id, p_now);
        END IF;
    END IF;
    RETURN r;
END $$;
COMMENT ON FUNCTION respool._after_preemption(uuid, text, text, timestamptz) IS
    'Marks a freed victim preempted and, while attempt <= max_retries and unless p_reason is terminated (an admin ended it: docs/preemption.md, "Terminate") or over_slice (its pool ended it for using more than its slice: docs/placement.md, "Sharing a GPU"), requeues it (attempt + 1, original queue time); a gang member is requeued with its gang, which queues once no member holds units (docs/scheduling.md, gangs).';

CREATE OR REPLACE FUNCTION respool._reject_unfittable(p_request_id uuid, p_now timestamptz)
RETURNS respool.requests LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests;
    v_reason text;
    v_messages text[];
BEGIN
    r := respool._queued_as(p_request_id);  -- gangs (docs/scheduling.md): a gang as one request of the sum
    SELECT coalesce((array_agg(c.reason ORDER BY c.n) FILTER (WHERE c.reason IS NOT NULL))[1], 'no_policy'),
           coalesce(array_agg(c.message ORDER BY c.n) FILTER (WHERE c.reason IS NOT NULL), '{}')
      INTO v_reason, v_messages
      FROM respool._candidate_rejections(r.subject, r.candidate_pool_ids, r.resources, r.preemptible,
                                         r.node_selector, r.id)
           WITH ORDINALITY c(policy_id, pool_id, pool_name, reason, message, n);
    IF cardinality(v_messages) = 0 THEN
        v_messages := ARRAY[format('subject %s has no policy left on its candidate pools', r.subject)];
    END IF;
    PERFORM respool._unqueue(p_request_id);
    r := respool._set_status(p_request_id, 'rejected', v_reason,
                             CASE WHEN r.gang_id IS NOT NULL THEN format('gang %s: its members together: ', r.gang_id) ELSE '' END
                             || array_to_string(v_messages, '; '), p_now);
    PERFORM respool._gang_follow(p_request_id, 'rejected', v_reason, 'rejected', p_now);
    RETURN r;
END $$;
COMMENT ON FUNCTION respool._reject_unfittable(uuid, timestamptz) IS
    'Rejects a request that can no longer fit any candidate pool, with the first candidate''s reason and every candidate''s message; a gang is judged by its members'' sum and rejected whole (docs/scheduling.md, gangs).';

DROP FUNCTION IF EXISTS respool._grant_at_once(respool.requests, timestamptz);
CREATE OR REPLACE FUNCTION respool._try_new(p_id uuid, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    c record;
    v_head uuid;
    v_head_resources jsonb;
    v_head_at timestamptz;
BEGIN
    FOR c IN SELECT e.pool_id, e.policy_id, pl.queueing, pl.starvation_seconds
               FROM respool.queue_entries e
               JOIN respool.pools pl ON pl.id = e.pool_id
               JOIN respool.policies p ON p.id = e.policy_id
              WHERE e.request_id = p_id
              ORDER BY p.priority DESC, pl.name LOOP
        -- best_effort, no hold: every earlier request already had its chance, so only the new one can move.
        -- starvation guard (docs/scheduling.md): while a best_effort pool held for a starving head before
        -- the new request joined, the new request may become the head (ending that hold: what it kept
        -- back may go now) or be held back: a full pass decides. So the hold is the one for the first of
        -- the others in queue order (with the new request the head, the hold now is for nobody).
        v_head := NULL;
        IF c.queueing = 'best_effort' AND c.starvation_seconds IS NOT NULL THEN
            SELECT q.request_id, q.resources, q.queued_at INTO v_head, v_head_resources, v_head_at
              FROM respool._queue_groups(c.pool_id) q
             WHERE q.request_id <> p_id
             ORDER BY q.rank DESC, q.in_share DESC, q.share, q.queued_at, q.request_id
             LIMIT 1;
        END IF;
        IF c.queueing = 'strict'
           OR (respool._hold_for(c.pool_id, v_head, v_head_resources, v_head_at, c.starvation_seconds,
                                 p_now)).head_id IS NOT NULL THEN
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
    'A newly queued request (or gang entry), its candidate pools locked by the caller: tried at once in candidate order (a full pass in strict pools and in pools that held for a starving head before it joined: it may end that hold by heading the queue), and the reconcilers of the pools where it still waits are woken.';
