-- Batch create, set-based (docs/engine.md, "How a batch is made"; docs/api.md, "Batch create").
-- respool.create_requests hands a batch that is not a gang here first. Every step is done once
-- for the whole batch: each distinct body checked once, each distinct value converted once,
-- candidates and rejections computed once per distinct combination, then one INSERT … SELECT
-- each for the requests, their events and their queue entries, then the grants in member order.
-- It answers exactly what creating the members one by one through respool.create_request would
-- leave; where that cannot be decided set-based (a strict pool, a pool that holds or may start
-- holding for a starving head, any refused member) it gives way (SQLSTATE RP298, or the member's
-- error) and the caller creates the members one by one.

CREATE OR REPLACE FUNCTION respool._create_set(p_members jsonb, p_default_lease_seconds integer,
                                               p_now timestamptz, p_lock_subject_pools boolean)
RETURNS TABLE (member integer, created boolean, request_id uuid)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_bodies jsonb[];
    -- per member (index = member + 1)
    v_ids uuid[];
    v_created boolean[];
    v_new_count integer;
    v_inserted integer;
    -- per queued new member, in member order
    q_id uuid[];
    q_at timestamptz[];
    q_pools uuid[];         -- candidate pools admitted (candidate order), flattened
    q_policies uuid[];
    q_shapes text[];
    q_first integer[];      -- where each member's pools start in q_pools
    q_last integer[];
    v_blocked text[] := '{}';
    v_outcome text;
    j integer;
BEGIN
    -- Each distinct body checked and completed once (respool._create_body); a member's error
    -- makes the caller create one by one, which names the first refused member.
    SELECT array_agg(c.body ORDER BY m.n) INTO v_bodies
      FROM jsonb_array_elements(p_members) WITH ORDINALITY m(b, n)
      JOIN (SELECT d.b, respool._create_body(d.b, p_default_lease_seconds) AS body
              FROM (SELECT DISTINCT b FROM jsonb_array_elements(p_members) b) d) c ON c.b = m.b;
    PERFORM respool._claim_keys(v_bodies);
    IF p_lock_subject_pools THEN
        -- As the one-by-one path: every pool of every member's subject, in id order, up front.
        PERFORM respool._lock_pools(array(
            SELECT DISTINCT s.pool_id FROM (SELECT DISTINCT b ->> 'subject' AS subject FROM unnest(v_bodies) b) b
             CROSS JOIN LATERAL respool._subject_policies(b.subject) s));
    END IF;

    CREATE TEMP TABLE IF NOT EXISTS pg_temp.respool_batch (
        n integer PRIMARY KEY, id uuid, created boolean, subject text, pool_ref text, preemptible boolean,
        max_retries integer, lease_seconds integer, max_seconds integer, idempotency_key text,
        preemption_group text, resources jsonb, labels jsonb, selector jsonb, body jsonb, at timestamptz,
        pool_id uuid, all_pools uuid[], ok_pools uuid[], ok_policies uuid[], names text[],
        first_reason text, messages text[], priority integer) ON COMMIT DROP;
    TRUNCATE pg_temp.respool_batch;

    -- Each distinct resources/settings, labels and node_selector/settings value converted once.
    WITH m AS (SELECT (u.n - 1)::integer AS n, u.b FROM unnest(v_bodies) WITH ORDINALITY u(b, n)),
         res AS (SELECT d.r, d.s, respool.build_resources(nullif(d.r, 'null'), nullif(d.s, 'null')) AS v
                   FROM (SELECT DISTINCT b -> 'resources' AS r, b -> 'settings' AS s FROM m) d),
         lab AS (SELECT d.l, respool._labels(d.l) AS v FROM (SELECT DISTINCT b -> 'labels' AS l FROM m) d),
         sel AS (SELECT d.x, d.s, respool.build_node_selector(d.x, nullif(d.s, 'null')) AS v
                   FROM (SELECT DISTINCT b -> 'node_selector' AS x, b -> 'settings' AS s FROM m) d)
    INSERT INTO pg_temp.respool_batch (n, subject, pool_ref, preemptible, max_retries, lease_seconds, max_seconds,
                                       idempotency_key, preemption_group, resources, labels, selector, at)
    SELECT m.n, m.b ->> 'subject', m.b ->> 'pool', (m.b ->> 'preemptible')::boolean,
           (m.b ->> 'max_retries')::integer, (m.b ->> 'lease_seconds')::integer, (m.b ->> 'max_seconds')::integer,
           m.b ->> 'idempotency_key', m.b ->> 'preemption_group', res.v, lab.v, sel.v,
           -- Member i is queued i microseconds after member 0 (queue order = member order).
           p_now + make_interval(secs => m.n / 1000000.0)
      FROM m
      JOIN res ON res.r IS NOT DISTINCT FROM m.b -> 'resources' AND res.s IS NOT DISTINCT FROM m.b -> 'settings'
      JOIN lab ON lab.l IS NOT DISTINCT FROM m.b -> 'labels'
      JOIN sel ON sel.x IS NOT DISTINCT FROM m.b -> 'node_selector' AND sel.s IS NOT DISTINCT FROM m.b -> 'settings';
    -- What an idempotent retry must repeat: the body respool._create_checked stores.
    UPDATE pg_temp.respool_batch t
       SET body = jsonb_build_object('pool', t.pool_ref, 'resources', t.resources, 'preemptible', t.preemptible,
                                     'max_retries', t.max_retries, 'lease_seconds', t.lease_seconds,
                                     'labels', t.labels)
                  || CASE WHEN t.max_seconds IS NOT NULL THEN jsonb_build_object('max_seconds', t.max_seconds)
                          ELSE '{}' END
                  || CASE WHEN t.selector <> '{}' THEN jsonb_build_object('node_selector', t.selector) ELSE '{}' END
                  || CASE WHEN t.preemption_group IS NOT NULL
                          THEN jsonb_build_object('preemption_group', t.preemption_group) ELSE '{}' END;

    -- Idempotency: a key already stored is a replay of that request (RP422 on another body);
    -- a key named again later in the batch replays the earlier member's request.
    -- (LIMIT 1: an index probe per key, never a scan of every request.)
    UPDATE pg_temp.respool_batch t SET id = x.id, created = false
      FROM (SELECT k.n, r.id FROM pg_temp.respool_batch k
             CROSS JOIN LATERAL (SELECT r.id FROM respool.requests r
                                  WHERE r.subject = k.subject AND r.idempotency_key = k.idempotency_key LIMIT 1) r
             WHERE k.idempotency_key IS NOT NULL) x
     WHERE x.n = t.n;
    IF EXISTS (SELECT FROM pg_temp.respool_batch t
                WHERE NOT t.created
                  AND (SELECT r.request_body FROM respool.requests r WHERE r.id = t.id) IS DISTINCT FROM t.body) THEN
        PERFORM respool._fail('RP422', 'idempotency_key', 'idempotency_key was already used with a different body');
    END IF;
    UPDATE pg_temp.respool_batch t SET id = gen_random_uuid(), created = true WHERE t.id IS NULL;
    UPDATE pg_temp.respool_batch t SET id = f.id, created = false
      FROM pg_temp.respool_batch f
     WHERE t.created AND t.idempotency_key IS NOT NULL AND f.created
       AND f.subject = t.subject AND f.idempotency_key = t.idempotency_key AND f.n < t.n
       AND NOT EXISTS (SELECT FROM pg_temp.respool_batch e
                        WHERE e.created AND e.subject = t.subject AND e.idempotency_key = t.idempotency_key
                          AND e.n < f.n);
    IF EXISTS (SELECT FROM pg_temp.respool_batch t JOIN pg_temp.respool_batch f ON f.id = t.id AND f.created
                WHERE NOT t.created AND f.body IS DISTINCT FROM t.body) THEN
        PERFORM respool._fail('RP422', 'idempotency_key', 'idempotency_key was already used with a different body');
    END IF;

    -- Candidate pools once per distinct (subject, pool ref), locked in id order.
    WITH c AS (SELECT d.subject, d.pool_ref, d.pool_id,
                      coalesce((SELECT array_agg(s.pool_id ORDER BY s.pool_id) FROM respool._subject_policies(d.subject) s
                                 WHERE d.pool_id IS NULL OR s.pool_id = d.pool_id), '{}') AS all_pools
                 FROM (SELECT e.subject, e.pool_ref,
                              CASE WHEN e.pool_ref IS NOT NULL THEN respool.resolve_pool(e.pool_ref) END AS pool_id
                         FROM (SELECT DISTINCT subject, pool_ref FROM pg_temp.respool_batch WHERE created) e) d)
    UPDATE pg_temp.respool_batch t SET pool_id = c.pool_id, all_pools = c.all_pools
      FROM c WHERE t.created AND c.subject = t.subject AND c.pool_ref IS NOT DISTINCT FROM t.pool_ref;
    PERFORM respool._lock_pools(array(SELECT DISTINCT unnest(all_pools) FROM pg_temp.respool_batch WHERE created));

    -- Rejections once per distinct (subject, candidates, resources, preemptible, selector), under the locks.
    WITH d AS (SELECT DISTINCT subject, all_pools, resources, preemptible, selector
                 FROM pg_temp.respool_batch WHERE created),
         c AS (SELECT d.subject, d.all_pools, d.resources, d.preemptible, d.selector,
                      coalesce(array_agg(x.pool_id ORDER BY x.k) FILTER (WHERE x.pool_id IS NOT NULL AND x.reason IS NULL), '{}') AS ok_pools,
                      coalesce(array_agg(x.policy_id ORDER BY x.k) FILTER (WHERE x.pool_id IS NOT NULL AND x.reason IS NULL), '{}') AS ok_policies,
                      coalesce(array_agg(x.pool_name ORDER BY x.k) FILTER (WHERE x.pool_id IS NOT NULL), '{}') AS names,
                      (array_agg(x.reason ORDER BY x.k) FILTER (WHERE x.reason IS NOT NULL))[1] AS first_reason,
                      coalesce(array_agg(x.message ORDER BY x.k) FILTER (WHERE x.reason IS NOT NULL), '{}') AS messages,
                      coalesce((SELECT max(p.priority) FROM respool._subject_policies(d.subject) s
                                  JOIN respool.policies p ON p.id = s.policy_id
                                 WHERE p.pool_id = ANY (d.all_pools)), 0) AS priority
                 FROM d LEFT JOIN LATERAL respool._candidate_rejections(d.subject, d.all_pools, d.resources,
                                                                        d.preemptible, d.selector)
                                          WITH ORDINALITY x(policy_id, pool_id, pool_name, reason, message, k) ON true
                GROUP BY d.subject, d.all_pools, d.resources, d.preemptible, d.selector)
    UPDATE pg_temp.respool_batch t
       SET ok_pools = c.ok_pools, ok_policies = c.ok_policies, names = c.names, priority = c.priority,
           first_reason = CASE WHEN cardinality(c.names) = 0 THEN 'no_policy' ELSE c.first_reason END,
           messages = CASE WHEN cardinality(c.names) = 0
                           THEN ARRAY[CASE WHEN t.pool_ref IS NULL
                                           THEN format('subject %s has no policy on any pool', t.subject)
                                           ELSE format('subject %s has no policy on pool %s', t.subject, t.pool_ref) END]
                           ELSE c.messages END
      FROM c
     WHERE t.created AND c.subject = t.subject AND c.all_pools = t.all_pools AND c.resources = t.resources
       AND c.preemptible = t.preemptible AND c.selector = t.selector;

    -- Set-based grants decide as the one-by-one path only where a new request is tried alone in
    -- each candidate pool in turn: best_effort pools that hold for nobody and cannot start holding
    -- in this batch (no entry waited starvation_seconds; docs/scheduling.md). Else: one by one.
    IF EXISTS (SELECT FROM respool.pools pl
                WHERE pl.id IN (SELECT DISTINCT unnest(ok_pools) FROM pg_temp.respool_batch WHERE created)
                  AND (pl.queueing <> 'best_effort'
                       OR (pl.starvation_seconds IS NOT NULL
                           AND (pl.starvation_seconds = 0
                                OR EXISTS (SELECT FROM respool.queue_entries e
                                            WHERE e.pool_id = pl.id
                                              AND e.queued_at <= p_now + interval '1 second'
                                                                 - make_interval(secs => pl.starvation_seconds)))))) THEN
        RAISE EXCEPTION 'batch: created one by one' USING ERRCODE = 'RP298';
    END IF;

    -- One INSERT each: the requests, their first events, their queue entries (member order).
    SELECT count(*) INTO v_new_count FROM pg_temp.respool_batch WHERE created;
    WITH made AS (
    INSERT INTO respool.requests (id, subject, pool_ref, pool_id, pool_name, candidate_pool_ids, resources,
                                  preemptible, priority, status, reason, message, max_retries, lease_seconds,
                                  max_seconds, idempotency_key, request_body, labels, queued_at, created_at, updated_at,
                                  finished_at, gang_id, node_selector, preemption_group)
    SELECT t.id, t.subject, t.pool_ref,
           CASE WHEN cardinality(t.all_pools) = 1 THEN t.all_pools[1] ELSE t.pool_id END,
           CASE WHEN cardinality(t.names) = 1 THEN t.names[1]
                WHEN t.pool_id IS NOT NULL THEN (SELECT name FROM respool.pools WHERE id = t.pool_id) END,
           t.ok_pools, t.resources, t.preemptible, t.priority,
           CASE WHEN cardinality(t.ok_pools) = 0 THEN 'rejected' ELSE 'queued' END,
           CASE WHEN cardinality(t.ok_pools) = 0 THEN t.first_reason END,
           CASE WHEN cardinality(t.ok_pools) = 0 THEN array_to_string(t.messages, '; ') ELSE '' END,
           t.max_retries, t.lease_seconds, t.max_seconds, t.idempotency_key, t.body, t.labels, t.at, t.at, t.at,
           CASE WHEN cardinality(t.ok_pools) = 0 THEN t.at END, NULL, t.selector, t.preemption_group
      FROM pg_temp.respool_batch t WHERE t.created ORDER BY t.n
    ON CONFLICT ON CONSTRAINT idempotency DO NOTHING
    RETURNING id, created_at, status, reason, attempt, message)
    -- Their first events, not notified: nobody knows these requests before the batch answers.
    INSERT INTO respool.events (request_id, at, from_status, to_status, reason, attempt, message)
    SELECT r.id, r.created_at, NULL, r.status, r.reason, r.attempt, r.message
      FROM made r ORDER BY r.created_at;
    GET DIAGNOSTICS v_inserted = ROW_COUNT;
    IF v_inserted <> v_new_count THEN
        -- A concurrent create took a key first: the one-by-one path waits for it and replays.
        RAISE EXCEPTION 'batch: created one by one' USING ERRCODE = 'RP298';
    END IF;
    INSERT INTO respool.queue_entries (pool_id, request_id, policy_id, queued_at, resources, preemptible, node_selector)
    SELECT c.pool_id, t.id, c.policy_id, t.at, t.resources, t.preemptible, t.selector
      FROM pg_temp.respool_batch t CROSS JOIN LATERAL unnest(t.ok_pools, t.ok_policies) c(pool_id, policy_id)
     WHERE t.created ORDER BY t.n;

    -- The grants, in member order: each new queued request tried in its candidate pools in turn
    -- (respool._try_grant, the one fit decision). Within the batch units are only taken, never
    -- freed, so a shape (pool, policy, resources, preemptible, selector) blocked once stays
    -- blocked: it is not tried again.
    SELECT coalesce(array_agg(t.id ORDER BY t.n), '{}'), array_agg(t.at ORDER BY t.n),
           array_agg(coalesce(s.first, 1) ORDER BY t.n), array_agg(coalesce(s.last, 0) ORDER BY t.n)
      INTO q_id, q_at, q_first, q_last
      FROM (SELECT t.*, sum(cardinality(t.ok_pools)) OVER (ORDER BY t.n) AS upto
              FROM pg_temp.respool_batch t WHERE t.created AND cardinality(t.ok_pools) > 0) t
     CROSS JOIN LATERAL (SELECT (t.upto - cardinality(t.ok_pools) + 1)::integer AS first, t.upto::integer AS last) s;
    SELECT coalesce(array_agg(c.pool_id ORDER BY t.n, c.k), '{}'), coalesce(array_agg(c.policy_id ORDER BY t.n, c.k), '{}'),
           coalesce(array_agg(c.pool_id || ' ' || c.policy_id || ' ' || t.preemptible || ' ' || t.resources::text
                              || ' ' || t.selector::text ORDER BY t.n, c.k), '{}')
      INTO q_pools, q_policies, q_shapes
      FROM pg_temp.respool_batch t
     CROSS JOIN LATERAL unnest(t.ok_pools, t.ok_policies) WITH ORDINALITY c(pool_id, policy_id, k)
     WHERE t.created;
    FOR i IN 1 .. cardinality(q_id) LOOP
        j := q_first[i];
        WHILE j <= q_last[i] LOOP
            IF NOT q_shapes[j] = ANY (v_blocked) THEN
                -- Its own grant is not notified (respool._record_events): the answer carries it.
                PERFORM set_config('respool.unannounced', q_id[i]::text, true);
                v_outcome := respool._try_grant(q_id[i], q_pools[j], q_policies[j], q_at[i]);
                EXIT WHEN v_outcome = 'granted';
                IF v_outcome = 'blocked' THEN
                    v_blocked := v_blocked || q_shapes[j];
                ELSE
                    RAISE EXCEPTION 'batch: created one by one' USING ERRCODE = 'RP298';
                END IF;
            END IF;
            j := j + 1;
        END LOOP;
    END LOOP;
    PERFORM set_config('respool.unannounced', '', true);
    -- Still waiting: the reconcilers decide at once whether they may preempt (respool._try_new).
    PERFORM respool._pool_changed(e.pool_id)
       FROM (SELECT DISTINCT e.pool_id FROM respool.queue_entries e WHERE e.request_id = ANY (q_id)) e;

    RETURN QUERY SELECT t.n, t.created, t.id FROM pg_temp.respool_batch t ORDER BY t.n;
END $$;
COMMENT ON FUNCTION respool._create_set(jsonb, integer, timestamptz, boolean) IS
    'The set-based batch create behind respool.create_requests (not a gang): leaves exactly what creating the members one by one in member order through respool.create_request leaves (statuses, pools, nodes, queue order, events per request; no NOTIFY of a member''s own changes), with each distinct body checked once, each distinct value converted once, candidates and rejections computed once per distinct combination and one INSERT each for requests, events and queue entries, then the grants in member order (a shape blocked once is not tried again). Raises RP298 (nothing kept) when one by one is needed instead: a strict candidate pool, one that holds or may start holding for a starving head, a key taken concurrently; a member''s error (RP4xx) likewise leaves the naming of it to the one-by-one path. p_lock_subject_pools: lock every pool of every member''s subject first (a batch of more than one). One row per member: created and the request''s id.';
