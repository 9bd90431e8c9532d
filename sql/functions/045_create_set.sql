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
    v_new_count integer;
    v_inserted integer;
    -- per queued new member, in member order
    q_id uuid[];
    q_at timestamptz[];
    q_pools uuid[];         -- its admitted candidate pools (candidate order), flattened
    q_policies uuid[];
    q_shapes text[];
    q_first integer[];      -- where its pools start and end in q_pools
    q_last integer[];
    q_res jsonb[];
    q_pre boolean[];
    q_sig text[];           -- what makes members alike: admitted pools and shape
    q_psig text[];          -- the same without the policies: alike but for the subject
    v_wend integer;
    v_policies uuid[];
    v_ok boolean;
    v_nowin integer := 0;   -- members up to here were in a window that did not fit: not tried again
    v_end integer;
    v_left integer;
    v_low integer;
    i integer;
    v_blocked text[] := '{}';
    v_outcome text;
    j integer;
BEGIN
    IF jsonb_path_exists(p_members, '$[*].job') THEN  -- jobs (docs/jobs.md) are created one by one
        RAISE EXCEPTION 'batch: created one by one' USING ERRCODE = 'RP298';
    END IF;
    -- Each distinct body checked and completed once (respool._create_body); a member's error
    -- makes the caller create one by one, which names the first refused member.
    SELECT array_agg(c.body ORDER BY m.n) INTO v_bodies
      FROM jsonb_array_elements(p_members) WITH ORDINALITY m(b, n)
      JOIN (SELECT d.b, respool._create_body(d.b, p_default_lease_seconds) AS body
              FROM (SELECT DISTINCT b FROM jsonb_array_elements(p_members) b) d) c ON c.b = m.b;
    PERFORM respool._claim_keys(v_bodies);
    IF p_lock_subject_pools THEN
        -- As the one-by-one path: every pool a member may be created in, in id order, up front.
        PERFORM respool._lock_pools(respool._batch_pools(v_bodies));
    END IF;

    -- Session-local work tables, emptied at commit (kept between transactions, so the plans
    -- below stay prepared): one row per member, one per distinct candidate combination.
    IF to_regclass('pg_temp.respool_batch_combo') IS NULL THEN
        CREATE TEMP TABLE IF NOT EXISTS respool_batch (
            n integer PRIMARY KEY, id uuid, created boolean, subject text, pool_ref text, preemptible boolean,
            max_retries integer, lease_seconds integer, max_seconds integer, idempotency_key text,
            preemption_group text, resources jsonb, labels jsonb, selector jsonb, body jsonb, at timestamptz,
            pool_id uuid, all_pools uuid[], combo integer) ON COMMIT DELETE ROWS;
        CREATE TEMP TABLE IF NOT EXISTS respool_batch_combo (
            combo integer PRIMARY KEY, ok_pools uuid[], ok_policies uuid[], names text[], first_reason text,
            messages text[], priority integer) ON COMMIT DELETE ROWS;
    END IF;
    DELETE FROM pg_temp.respool_batch;
    DELETE FROM pg_temp.respool_batch_combo;

    -- One row per member: each distinct resources/settings, labels and node_selector/settings
    -- value converted once (absent and JSON null alike, as for a single create); the body an
    -- idempotent retry must repeat (what respool._create_checked stores); the request its key
    -- already names (an index probe each); candidate pools once per distinct (subject, pool ref).
    WITH m AS MATERIALIZED (
             SELECT (u.n - 1)::integer AS n, u.b,
                    coalesce(u.b -> 'resources', 'null') AS r, coalesce(u.b -> 'settings', 'null') AS s,
                    coalesce(u.b -> 'labels', 'null') AS l, coalesce(u.b -> 'node_selector', 'null') AS x,
                    coalesce(u.b ->> 'pool', '') AS ref
               FROM unnest(v_bodies) WITH ORDINALITY u(b, n)),
         res AS MATERIALIZED (
             SELECT d.r, d.s, respool.build_resources(nullif(d.r, 'null'), nullif(d.s, 'null')) AS v
               FROM (SELECT DISTINCT r, s FROM m) d),
         lab AS MATERIALIZED (SELECT d.l, respool._labels(d.l) AS v FROM (SELECT DISTINCT l FROM m) d),
         sel AS MATERIALIZED (
             SELECT d.x, d.s, respool.build_node_selector(d.x, nullif(d.s, 'null')) AS v
               FROM (SELECT DISTINCT x, s FROM m) d),
         cand AS MATERIALIZED (
             SELECT d.subject, d.ref, d.pool_id,
                    coalesce((SELECT array_agg(s.pool_id ORDER BY s.pool_id) FROM respool._subject_policies(d.subject) s
                               WHERE d.pool_id IS NULL OR s.pool_id = d.pool_id), '{}') AS all_pools
               FROM (SELECT e.subject, e.ref, CASE WHEN e.ref <> '' THEN respool.resolve_pool(e.ref) END AS pool_id
                       FROM (SELECT DISTINCT b ->> 'subject' AS subject, ref FROM m) e) d),
         c AS (
             SELECT m.n, m.b ->> 'subject' AS subject, m.b ->> 'pool' AS pool_ref,
                    (m.b ->> 'preemptible')::boolean AS preemptible, (m.b ->> 'max_retries')::integer AS max_retries,
                    (m.b ->> 'lease_seconds')::integer AS lease_seconds, (m.b ->> 'max_seconds')::integer AS max_seconds,
                    m.b ->> 'idempotency_key' AS idempotency_key, m.b ->> 'preemption_group' AS preemption_group,
                    res.v AS resources, lab.v AS labels, sel.v AS selector, cand.pool_id, cand.all_pools
               FROM m
               JOIN res ON res.r = m.r AND res.s = m.s
               JOIN lab ON lab.l = m.l
               JOIN sel ON sel.x = m.x AND sel.s = m.s
               JOIN cand ON cand.subject = m.b ->> 'subject' AND cand.ref = m.ref)
    INSERT INTO pg_temp.respool_batch (n, id, created, subject, pool_ref, preemptible, max_retries, lease_seconds,
                                       max_seconds, idempotency_key, preemption_group, resources, labels, selector,
                                       body, at, pool_id, all_pools, combo)
    SELECT c.n,
           CASE WHEN ex.id IS NOT NULL THEN ex.id WHEN c.first THEN gen_random_uuid() END,
           ex.id IS NULL AND c.first,
           c.subject, c.pool_ref, c.preemptible, c.max_retries, c.lease_seconds, c.max_seconds, c.idempotency_key,
           c.preemption_group, c.resources, c.labels, c.selector,
           respool._request_body(c.pool_ref, c.resources, c.preemptible, c.max_retries, c.lease_seconds, c.labels,
                                 c.max_seconds, c.selector, c.preemption_group),
           -- Member i is queued i microseconds after member 0 (queue order = member order).
           p_now + make_interval(secs => c.n / 1000000.0),
           c.pool_id, c.all_pools,
           dense_rank() OVER (ORDER BY c.subject, c.all_pools, c.resources, c.preemptible, c.selector)::integer
      FROM (SELECT c.*, c.idempotency_key IS NULL
                        OR row_number() OVER (PARTITION BY c.subject, c.idempotency_key ORDER BY c.n) = 1 AS first
              FROM c) c
      LEFT JOIN LATERAL (SELECT r.id FROM respool.requests r
                          WHERE c.idempotency_key IS NOT NULL AND r.subject = c.subject
                            AND r.idempotency_key = c.idempotency_key LIMIT 1) ex ON true;
    -- Idempotency: a key already stored is a replay of that request; a key named again later in
    -- the batch replays the first member naming it; either on another body: RP422.
    UPDATE pg_temp.respool_batch t SET id = f.id
      FROM pg_temp.respool_batch f
     WHERE t.id IS NULL AND f.created AND f.subject = t.subject AND f.idempotency_key = t.idempotency_key;
    IF EXISTS (SELECT FROM pg_temp.respool_batch t
                WHERE NOT t.created
                  AND (SELECT coalesce(r.request_body, f.body)
                         FROM (SELECT) one
                         LEFT JOIN respool.requests r ON r.id = t.id
                         LEFT JOIN pg_temp.respool_batch f ON f.id = t.id AND f.created) IS DISTINCT FROM t.body) THEN
        PERFORM respool._fail('RP422', 'idempotency_key', 'idempotency_key was already used with a different body');
    END IF;

    -- Validated under the pool locks (id order), so no capacity or policy change slips between:
    -- rejections once per distinct (subject, candidates, resources, preemptible, selector).
    PERFORM respool._lock_pools(array(SELECT DISTINCT unnest(all_pools) FROM pg_temp.respool_batch WHERE created));
    WITH d AS MATERIALIZED (SELECT DISTINCT ON (combo) combo, subject, all_pools, resources, preemptible, selector,
                                   pool_ref
                              FROM pg_temp.respool_batch WHERE created ORDER BY combo)
    INSERT INTO pg_temp.respool_batch_combo (combo, ok_pools, ok_policies, names, first_reason, messages, priority)
    SELECT d.combo,
           coalesce(array_agg(x.pool_id ORDER BY x.k) FILTER (WHERE x.pool_id IS NOT NULL AND x.reason IS NULL), '{}'),
           coalesce(array_agg(x.policy_id ORDER BY x.k) FILTER (WHERE x.pool_id IS NOT NULL AND x.reason IS NULL), '{}'),
           coalesce(array_agg(x.pool_name ORDER BY x.k) FILTER (WHERE x.pool_id IS NOT NULL), '{}'),
           CASE WHEN count(x.pool_id) = 0 THEN 'no_policy'
                ELSE (array_agg(x.reason ORDER BY x.k) FILTER (WHERE x.reason IS NOT NULL))[1] END,
           CASE WHEN count(x.pool_id) = 0 THEN ARRAY[NULL::text]  -- (the sentence is the member's: below)
                ELSE coalesce(array_agg(x.message ORDER BY x.k) FILTER (WHERE x.reason IS NOT NULL), '{}') END,
           coalesce((SELECT max(p.priority) FROM respool._subject_policies(d.subject) s
                       JOIN respool.policies p ON p.id = s.policy_id
                      WHERE p.pool_id = ANY (d.all_pools)), 0)
      FROM d LEFT JOIN LATERAL respool._candidate_rejections(d.subject, d.all_pools, d.resources, d.preemptible,
                                                             d.selector)
                               WITH ORDINALITY x(policy_id, pool_id, pool_name, reason, message, k) ON true
     GROUP BY d.combo, d.subject, d.all_pools;

    -- Set-based grants decide as the one-by-one path only where a new request is tried alone in
    -- each candidate pool in turn: best_effort pools that hold for nobody and cannot start holding
    -- in this batch (no entry waited starvation_seconds; docs/scheduling.md). Else: one by one.
    IF EXISTS (SELECT FROM respool.pools pl
                WHERE pl.id IN (SELECT DISTINCT unnest(ok_pools) FROM pg_temp.respool_batch_combo)
                  AND (pl.queueing <> 'best_effort'
                       OR (pl.starvation_seconds IS NOT NULL
                           AND (pl.starvation_seconds = 0
                                OR EXISTS (SELECT FROM respool.queue_entries e
                                            WHERE e.pool_id = pl.id
                                              AND e.queued_at <= p_now + interval '1 second'
                                                                 - make_interval(secs => pl.starvation_seconds)))))) THEN
        RAISE EXCEPTION 'batch: created one by one' USING ERRCODE = 'RP298';
    END IF;

    -- One INSERT each: the requests and their first events (not notified: nobody knows these
    -- requests before the batch answers), then their queue entries, in member order.
    SELECT count(*) INTO v_new_count FROM pg_temp.respool_batch WHERE created;
    WITH made AS (
        INSERT INTO respool.requests (id, subject, pool_ref, pool_id, pool_name, candidate_pool_ids, resources,
                                      preemptible, priority, status, reason, message, max_retries, lease_seconds,
                                      max_seconds, idempotency_key, request_body, labels, queued_at, created_at,
                                      updated_at, finished_at, gang_id, node_selector, preemption_group)
        SELECT t.id, t.subject, t.pool_ref,
               CASE WHEN cardinality(t.all_pools) = 1 THEN t.all_pools[1] ELSE t.pool_id END,
               CASE WHEN cardinality(k.names) = 1 THEN k.names[1]
                    WHEN t.pool_id IS NOT NULL THEN (SELECT name FROM respool.pools WHERE id = t.pool_id) END,
               k.ok_pools, t.resources, t.preemptible, k.priority,
               CASE WHEN cardinality(k.ok_pools) = 0 THEN 'rejected' ELSE 'queued' END,
               CASE WHEN cardinality(k.ok_pools) = 0 THEN k.first_reason END,
               CASE WHEN cardinality(k.ok_pools) = 0 AND cardinality(k.names) = 0
                    THEN CASE WHEN t.pool_ref IS NULL THEN format('subject %s has no policy on any pool', t.subject)
                              ELSE format('subject %s has no policy on pool %s', t.subject, t.pool_ref) END
                    WHEN cardinality(k.ok_pools) = 0 THEN array_to_string(k.messages, '; ')
                    ELSE '' END,
               t.max_retries, t.lease_seconds, t.max_seconds, t.idempotency_key, t.body, t.labels, t.at, t.at, t.at,
               CASE WHEN cardinality(k.ok_pools) = 0 THEN t.at END, NULL, t.selector, t.preemption_group
          FROM pg_temp.respool_batch t JOIN pg_temp.respool_batch_combo k ON k.combo = t.combo
         WHERE t.created ORDER BY t.n
        ON CONFLICT ON CONSTRAINT idempotency DO NOTHING
        RETURNING id, created_at, status, reason, attempt, message)
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
      FROM pg_temp.respool_batch t JOIN pg_temp.respool_batch_combo k ON k.combo = t.combo
     CROSS JOIN LATERAL unnest(k.ok_pools, k.ok_policies) c(pool_id, policy_id)
     WHERE t.created ORDER BY t.n;

    -- The grants, in member order: each new queued request tried in its candidate pools in turn.
    -- Within the batch units are only taken, never freed, so a shape (pool, policy, resources,
    -- preemptible, selector) blocked once stays blocked: it is not tried again. A run of
    -- consecutive alike members (the same admitted pools and shape) is granted as one: in each of
    -- its pools in turn, as many of those left as fit together (k requests of one shape fit a pool
    -- without nodes exactly when one of k times the need does, respool._fits), in one
    -- respool._grant_many at the time of the first of them; in a pool with nodes one member at a
    -- time (respool._try_grant: the node is chosen per request).
    SELECT coalesce(array_agg(t.id ORDER BY t.n), '{}'), array_agg(t.at ORDER BY t.n),
           array_agg((t.upto - cardinality(t.ok_pools) + 1)::integer ORDER BY t.n),
           array_agg(t.upto::integer ORDER BY t.n), array_agg(t.resources ORDER BY t.n),
           array_agg(t.preemptible ORDER BY t.n),
           array_agg(t.ok_pools::text || t.ok_policies::text || t.preemptible || t.resources::text
                     || t.selector::text ORDER BY t.n),
           array_agg(t.ok_pools::text || t.preemptible || t.resources::text || t.selector::text ORDER BY t.n)
      INTO q_id, q_at, q_first, q_last, q_res, q_pre, q_sig, q_psig
      FROM (SELECT t.n, t.id, t.at, t.resources, t.preemptible, t.selector, k.ok_pools, k.ok_policies,
                   sum(cardinality(k.ok_pools)) OVER (ORDER BY t.n) AS upto
              FROM pg_temp.respool_batch t JOIN pg_temp.respool_batch_combo k ON k.combo = t.combo
             WHERE t.created AND cardinality(k.ok_pools) > 0) t;
    SELECT coalesce(array_agg(c.pool_id ORDER BY t.n, c.k), '{}'),
           coalesce(array_agg(c.policy_id ORDER BY t.n, c.k), '{}'),
           coalesce(array_agg(c.pool_id || ' ' || c.policy_id || ' ' || t.preemptible || ' ' || t.resources::text
                              || ' ' || t.selector::text ORDER BY t.n, c.k), '{}')
      INTO q_pools, q_policies, q_shapes
      FROM pg_temp.respool_batch t JOIN pg_temp.respool_batch_combo k ON k.combo = t.combo
     CROSS JOIN LATERAL unnest(k.ok_pools, k.ok_policies) WITH ORDINALITY c(pool_id, policy_id, k)
     WHERE t.created;
    i := 1;
    WHILE i <= cardinality(q_id) LOOP
        v_end := i;  -- the run: members i .. v_end
        WHILE v_end < cardinality(q_id) AND q_sig[v_end + 1] = q_sig[i] LOOP
            v_end := v_end + 1;
        END LOOP;
        -- A window of members alike but for their subjects (their policies), in one pool without
        -- nodes or earmarks (interleaved callers of a few teams: runs of one): when the pool has
        -- room for the whole window and each policy for its own members, every member of it
        -- would be granted one by one in member order (a grant only lowers the pool's room by its
        -- own units, and its policy's rooms), so each policy's members are granted as one
        -- respool._grant_many, each at its own instant. Else the runs below decide as before.
        IF i > v_nowin AND v_end < cardinality(q_id) AND q_psig[v_end + 1] = q_psig[i] AND q_first[i] = q_last[i] THEN
            v_wend := v_end + 1;
            WHILE v_wend < cardinality(q_id) AND q_psig[v_wend + 1] = q_psig[i] LOOP
                v_wend := v_wend + 1;
            END LOOP;
            v_ok := NOT respool._pool_has_nodes(q_pools[q_first[i]]) AND NOT respool._earmarked(q_pools[q_first[i]])
                    AND NOT EXISTS (SELECT FROM unnest(q_shapes[q_first[i] : q_last[v_wend]]) b WHERE b = ANY (v_blocked));
            -- The pool's room for the whole window (rule 1 and the counters' ceiling), then each
            -- policy's rules for its own members (respool._fits of that many times the need).
            v_ok := v_ok AND NOT EXISTS (SELECT FROM respool._pool_place(q_pools[q_first[i]],
                                                                         respool._scale_units(q_res[i], v_wend - i + 1)) p
                                          WHERE p.need > 0 AND NOT respool._fits_room(p.need, p.room));
            IF v_ok THEN
                v_policies := ARRAY(SELECT p.policy
                                      FROM unnest(q_policies[q_first[i] : q_last[v_wend]]) WITH ORDINALITY p(policy, k)
                                     GROUP BY p.policy ORDER BY min(p.k));
                FOREACH j IN ARRAY ARRAY(SELECT generate_series(1, cardinality(v_policies))) LOOP
                    v_ok := v_ok AND respool._fits(
                        respool._scale_units(q_res[i], (SELECT count(*)::integer FROM generate_series(i, v_wend) m
                                                          WHERE q_policies[q_first[m]] = v_policies[j])),
                        q_pre[i], q_pools[q_first[i]], v_policies[j], NULL, NULL, NULL);
                END LOOP;
            END IF;
            IF v_ok THEN
                PERFORM set_config('respool.unannounced', array_to_string(q_id[i : v_wend], ','), true);
                FOREACH j IN ARRAY ARRAY(SELECT generate_series(1, cardinality(v_policies))) LOOP
                    PERFORM respool._grant_many(
                        ARRAY(SELECT q_id[m] FROM generate_series(i, v_wend) m
                               WHERE q_policies[q_first[m]] = v_policies[j] ORDER BY m),
                        q_pools[q_first[i]], v_policies[j],
                        (SELECT q_at[m] FROM generate_series(i, v_wend) m
                          WHERE q_policies[q_first[m]] = v_policies[j] ORDER BY m LIMIT 1));
                END LOOP;
                i := v_wend + 1;
                CONTINUE;
            END IF;
            v_nowin := v_wend;  -- (its members go one run at a time, as before: no window tried again)
        END IF;
        v_left := i;  -- its first member not granted yet
        j := q_first[i];
        WHILE j <= q_last[i] AND v_left <= v_end LOOP
            IF NOT q_shapes[j] = ANY (v_blocked) THEN
                IF v_end > v_left AND NOT respool._pool_has_nodes(q_pools[j]) THEN
                    -- The largest k (of those left) that fit together.
                    v_low := least(v_end - v_left + 1, respool._fit_count(q_res[i], q_pre[i], q_pools[j], q_policies[j]));
                    IF v_low > 0 AND NOT respool._fits(respool._scale_units(q_res[i], v_low), q_pre[i], q_pools[j],
                                                        q_policies[j], NULL, NULL, NULL) THEN
                        v_low := 0;  -- the placement seam refuses the run
                    END IF;
                    IF v_low > 0 THEN
                        -- Their own grants are not notified (respool._record_events): the answers carry them.
                        PERFORM set_config('respool.unannounced', array_to_string(q_id[v_left : v_left + v_low - 1], ','),
                                           true);
                        PERFORM respool._grant_many(q_id[v_left : v_left + v_low - 1], q_pools[j], q_policies[j],
                                                    q_at[v_left]);
                        v_left := v_left + v_low;
                    END IF;
                    IF v_left <= v_end THEN
                        v_blocked := v_blocked || q_shapes[j];  -- the next one did not fit
                    END IF;
                ELSE
                    WHILE v_left <= v_end LOOP
                        PERFORM set_config('respool.unannounced', q_id[v_left]::text, true);
                        v_outcome := respool._try_grant(q_id[v_left], q_pools[j], q_policies[j], q_at[v_left]);
                        IF v_outcome = 'granted' THEN
                            v_left := v_left + 1;
                        ELSIF v_outcome = 'blocked' THEN
                            v_blocked := v_blocked || q_shapes[j];
                            EXIT;
                        ELSE
                            RAISE EXCEPTION 'batch: created one by one' USING ERRCODE = 'RP298';
                        END IF;
                    END LOOP;
                END IF;
            END IF;
            j := j + 1;
        END LOOP;
        i := v_end + 1;
    END LOOP;
    PERFORM set_config('respool.unannounced', '', true);
    -- Still waiting: the reconcilers decide at once whether they may preempt (respool._try_new).
    PERFORM respool._pool_changed(e.pool_id)
       FROM (SELECT DISTINCT e.pool_id FROM respool.queue_entries e WHERE e.request_id = ANY (q_id)) e;

    RETURN QUERY SELECT t.n, t.created, t.id FROM pg_temp.respool_batch t ORDER BY t.n;
END $$;
COMMENT ON FUNCTION respool._create_set(jsonb, integer, timestamptz, boolean) IS
    'The set-based batch create behind respool.create_requests (not a gang; docs/engine.md, "How a batch is made"): leaves exactly what creating the members one by one in member order through respool.create_request leaves, each step done once for the batch. Raises RP298 (nothing kept) where one by one is needed instead (a strict pool, one that holds or may start holding, a key taken concurrently, a job), or a member''s RP4xx error, left for the one-by-one path to name. p_lock_subject_pools: lock every pool a member may be created in first. One row per member: created and the request''s id.';
