-- Creating requests, one route for one and for many (docs/engine.md, "How a batch is made"):
-- respool.create_request is a batch of one, respool.create_requests and create_requests_each
-- hand their members here too. The bookkeeping is set-based (each distinct value converted once,
-- one INSERT … SELECT for the requests and their first events, one for the queue entries of the
-- members still waiting); the grants go in member order through the routines a pass uses:
-- respool._try_grant (one request) and respool._grant_run (several alike requests, counted by
-- division), or respool._try_new (a pass) where a pool is strict or may hold for a starving head.
-- The outcome is what creating the members one by one in member order leaves. Each member's
-- outcome is data: its request (made or replayed), or the SQLSTATE and message its create raises.

DROP FUNCTION IF EXISTS respool._create_set(jsonb, integer, timestamptz, boolean);
DROP FUNCTION IF EXISTS respool._try_create_set(jsonb, integer, timestamptz, boolean);
DROP FUNCTION IF EXISTS respool._create_checked(jsonb, timestamptz, uuid, boolean);

CREATE OR REPLACE FUNCTION respool._member_values(p_bodies jsonb[], OUT resources jsonb[], OUT labels jsonb[],
                                                  OUT selectors jsonb[], OUT bodies jsonb[])
LANGUAGE plpgsql STABLE AS $$
DECLARE
    b jsonb := p_bodies[1];
BEGIN
    IF cardinality(p_bodies) = 1 THEN
        -- One member: its values checked in the order its errors name them.
        resources := ARRAY[respool.build_resources(nullif(b -> 'resources', 'null'), nullif(b -> 'settings', 'null'))];
        labels := ARRAY[respool._labels(b -> 'labels')];
        selectors := ARRAY[respool.build_node_selector(b -> 'node_selector', nullif(b -> 'settings', 'null'))];
        bodies := ARRAY[respool._request_body(b ->> 'pool', resources[1], (b ->> 'preemptible')::boolean,
                                              (b ->> 'max_retries')::integer, (b ->> 'lease_seconds')::integer,
                                              labels[1], (b ->> 'max_seconds')::integer, selectors[1],
                                              b ->> 'preemption_group')];
        RETURN;
    ELSE
        -- Each distinct resources/settings, labels and node_selector/settings value converted
        -- once (absent and JSON null alike).
        WITH m AS MATERIALIZED (
                 SELECT u.n, coalesce(u.b -> 'resources', 'null') AS r, coalesce(u.b -> 'settings', 'null') AS s,
                        coalesce(u.b -> 'labels', 'null') AS l, coalesce(u.b -> 'node_selector', 'null') AS x
                   FROM unnest(p_bodies) WITH ORDINALITY u(b, n)),
             res AS MATERIALIZED (
                 SELECT d.r, d.s, respool.build_resources(nullif(d.r, 'null'), nullif(d.s, 'null')) AS v
                   FROM (SELECT DISTINCT r, s FROM m) d),
             lab AS MATERIALIZED (SELECT d.l, respool._labels(d.l) AS v FROM (SELECT DISTINCT l FROM m) d),
             sel AS MATERIALIZED (
                 SELECT d.x, d.s, respool.build_node_selector(d.x, nullif(d.s, 'null')) AS v
                   FROM (SELECT DISTINCT x, s FROM m) d)
        SELECT array_agg(res.v ORDER BY m.n), array_agg(lab.v ORDER BY m.n), array_agg(sel.v ORDER BY m.n)
          INTO resources, labels, selectors
          FROM m JOIN res ON res.r = m.r AND res.s = m.s
                 JOIN lab ON lab.l = m.l
                 JOIN sel ON sel.x = m.x AND sel.s = m.s;
    END IF;
    -- The body each request stores, which an idempotent retry must repeat.
    bodies := ARRAY(SELECT respool._request_body(u.b ->> 'pool', u.r, (u.b ->> 'preemptible')::boolean,
                                                 (u.b ->> 'max_retries')::integer, (u.b ->> 'lease_seconds')::integer,
                                                 u.l, (u.b ->> 'max_seconds')::integer, u.x, u.b ->> 'preemption_group')
                      FROM unnest(p_bodies, resources, labels, selectors) WITH ORDINALITY u(b, r, l, x, n)
                     ORDER BY u.n);
END $$;
COMMENT ON FUNCTION respool._member_values(jsonb[]) IS
    'The converted values of checked create bodies, in member order: resources (respool.build_resources), labels (respool._labels), node selector (respool.build_node_selector), each distinct value converted once, and the body each request stores (respool._request_body). RP400 naming the field of a bad value (which member: the caller finds out).';

CREATE OR REPLACE FUNCTION respool._member_replays(p_bodies jsonb[], p_stored jsonb[], OUT ids uuid[],
                                                   OUT created boolean[], OUT codes text[], OUT messages text[])
LANGUAGE plpgsql
-- Planned for each call: a plan kept from when the table was small probes the subject's index
-- and reads every request of the subject (docs/benchmarks.md, "Plans kept from a small table").
SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_id uuid;
    v_differs boolean;
BEGIN
    IF cardinality(p_bodies) = 1 THEN
        -- One member, one key: a replay of the stored request it names, if any.
        SELECT r.id, r.request_body IS DISTINCT FROM p_stored[1] INTO v_id, v_differs
          FROM respool.requests r
         WHERE r.subject = p_bodies[1] ->> 'subject' AND r.idempotency_key = p_bodies[1] ->> 'idempotency_key';
        ids := ARRAY[coalesce(v_id, gen_random_uuid())];
        created := ARRAY[v_id IS NULL];
        codes := ARRAY[CASE WHEN v_differs THEN 'RP422' END];
        messages := ARRAY[CASE WHEN v_differs THEN format('idempotency_key %L was already used by request %s with a different body',
                                                          p_bodies[1] ->> 'idempotency_key', v_id) END];
        RETURN;
    END IF;
    -- The first member naming a key (or naming none) makes a new request unless the key is
    -- stored already; a later member naming it replays the first. A replay on another body: RP422.
    WITH m AS (
             SELECT u.n, u.b ->> 'subject' AS s, u.b ->> 'idempotency_key' AS k, u.v AS body,
                    CASE WHEN u.b ->> 'idempotency_key' IS NULL THEN u.n
                         ELSE first_value(u.n) OVER (PARTITION BY u.b ->> 'subject', u.b ->> 'idempotency_key'
                                                     ORDER BY u.n) END AS f
               FROM unnest(p_bodies, p_stored) WITH ORDINALITY u(b, v, n)),
         own AS MATERIALIZED (
             SELECT m.n, coalesce(st.id, gen_random_uuid()) AS id, st.id IS NULL AS made,
                    coalesce(st.request_body, m.body) AS body
               FROM m LEFT JOIN LATERAL (SELECT r.id, r.request_body FROM respool.requests r
                                          WHERE m.k IS NOT NULL AND r.subject = m.s AND r.idempotency_key = m.k
                                          LIMIT 1) st ON true  -- (one index probe per key)
              WHERE m.f = m.n),
         x AS (SELECT m.n, o.id, o.made AND m.f = m.n AS made,
                      NOT (o.made AND m.f = m.n) AND o.body IS DISTINCT FROM m.body AS differs, m.k
                 FROM m JOIN own o ON o.n = m.f)
    SELECT array_agg(x.id ORDER BY x.n), array_agg(x.made ORDER BY x.n),
           array_agg(CASE WHEN x.differs THEN 'RP422' END ORDER BY x.n),
           array_agg(CASE WHEN x.differs THEN format('idempotency_key %L was already used by request %s with a different body',
                                                     x.k, x.id) END ORDER BY x.n)
      INTO ids, created, codes, messages
      FROM x;
END $$;
COMMENT ON FUNCTION respool._member_replays(jsonb[], jsonb[]) IS
    'respool._member_ids for bodies of which one at least names an idempotency key: each key looked up by the idempotency index. Reads only.';

CREATE OR REPLACE FUNCTION respool._member_ids(p_bodies jsonb[], p_stored jsonb[], OUT ids uuid[],
                                               OUT created boolean[], OUT codes text[], OUT messages text[])
LANGUAGE plpgsql AS $$
BEGIN
    IF cardinality(p_bodies) = 1 THEN  -- (one member: no query)
        IF p_bodies[1] ->> 'idempotency_key' IS NULL THEN
            ids := ARRAY[gen_random_uuid()];
            created := '{true}';
            codes := '{NULL}';
            messages := codes;
            RETURN;
        END IF;
    ELSIF NOT EXISTS (SELECT FROM unnest(p_bodies) b WHERE b ->> 'idempotency_key' IS NOT NULL) THEN
        ids := ARRAY(SELECT gen_random_uuid() FROM unnest(p_bodies));  -- no key: every member is new
        created := array_fill(true, ARRAY[cardinality(p_bodies)]);
        codes := array_fill(NULL::text, ARRAY[cardinality(p_bodies)]);
        messages := codes;
        RETURN;
    END IF;
    SELECT * INTO ids, created, codes, messages FROM respool._member_replays(p_bodies, p_stored);
END $$;
COMMENT ON FUNCTION respool._member_ids(jsonb[], jsonb[]) IS
    'Idempotency for checked create bodies (p_stored: the body each would store), in member order: the request id each answers with (a new id, the stored request its key names, or the earlier member naming the same key), created (a new request), and RP422 with its message where a replay has another body. Reads only; the caller claimed the keys.';

CREATE OR REPLACE FUNCTION respool._member_pools(p_bodies jsonb[], p_made boolean[], OUT pool_ids uuid[],
                                                 OUT lock_ids uuid[])
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- The pool each member made names (respool.resolve_pool once per distinct ref: RP404, RP400).
    IF cardinality(p_bodies) = 1 THEN  -- (one member: without the set-based join)
        pool_ids := ARRAY[CASE WHEN p_made[1] AND p_bodies[1] ->> 'pool' IS NOT NULL
                               THEN respool.resolve_pool(p_bodies[1] ->> 'pool') END];
    ELSE
        SELECT array_agg(d.pool_id ORDER BY u.n) INTO pool_ids
          FROM unnest(p_bodies, p_made) WITH ORDINALITY u(b, made, n)
          LEFT JOIN (SELECT e.ref, respool.resolve_pool(e.ref) AS pool_id
                       FROM (SELECT DISTINCT x.b ->> 'pool' AS ref FROM unnest(p_bodies, p_made) x(b, made)
                              WHERE x.made AND x.b ->> 'pool' IS NOT NULL) e) d
                 ON u.made AND d.ref = u.b ->> 'pool';
    END IF;
    -- Their candidate pools: every pool of the subject's policies, or only the one named.
    lock_ids := ARRAY(SELECT DISTINCT s.pool_id
                        FROM (SELECT DISTINCT u.b ->> 'subject' AS subject, u.p
                                FROM unnest(p_bodies, p_made, pool_ids) u(b, made, p) WHERE u.made) m
                       CROSS JOIN LATERAL respool._subject_policies(m.subject) s
                       WHERE m.p IS NULL OR s.pool_id = m.p);
END $$;
COMMENT ON FUNCTION respool._member_pools(jsonb[], boolean[]) IS
    'For the members to be made (p_made) of checked create bodies: the pool each names (respool.resolve_pool: RP404 unknown, RP400 ambiguous; NULL: none named) and every candidate pool of them all, to be locked before they are validated. Read-only.';

CREATE OR REPLACE FUNCTION respool._insert_members(p_bodies jsonb[], p_ids uuid[], p_made boolean[], p_pool_ids uuid[],
                                                   p_resources jsonb[], p_labels jsonb[], p_selectors jsonb[],
                                                   p_stored jsonb[], p_now timestamptz, p_gang_id uuid,
                                                   p_slots integer[], OUT stored integer, OUT queued uuid[])
LANGUAGE plpgsql AS $$
BEGIN
    -- Validated under the pool locks (the caller's), so no capacity or policy change slips
    -- between: the rejection table once per distinct (subject, pool named, resources,
    -- preemptible, selector). Member i is made i µs after member 0 (queue order = member order).
    WITH m AS (
             SELECT u.n, u.b, u.id, u.p, u.r, u.l, u.x, u.body, (u.b ->> 'preemptible')::boolean AS pre,
                    p_now + make_interval(secs => coalesce(p_slots[u.n::integer], u.n - 1) / 1000000.0) AS at
               FROM unnest(p_bodies, p_ids, p_made, p_pool_ids, p_resources, p_labels, p_selectors, p_stored)
                    WITH ORDINALITY u(b, id, made, p, r, l, x, body, n)
              WHERE u.made),
         k AS (
             SELECT d.subject, d.p, d.r, d.pre, d.x, cardinality(a.all_pools) AS n_all, a.all_pools[1] AS only_pool,
                    coalesce(array_agg(c.pool_id ORDER BY c.k) FILTER (WHERE c.pool_id IS NOT NULL AND c.reason IS NULL),
                             '{}') AS ok_pools,
                    coalesce(array_agg(c.pool_name ORDER BY c.k) FILTER (WHERE c.pool_id IS NOT NULL), '{}') AS names,
                    (array_agg(c.reason ORDER BY c.k) FILTER (WHERE c.reason IS NOT NULL))[1] AS first_reason,
                    array_to_string(array_agg(c.message ORDER BY c.k) FILTER (WHERE c.reason IS NOT NULL), '; ') AS messages,
                    (array_agg(c.policy_id ORDER BY c.k))[1] AS first_policy  -- the highest priority
               FROM (SELECT DISTINCT m.b ->> 'subject' AS subject, m.p, m.r, m.pre, m.x FROM m) d
              CROSS JOIN LATERAL (SELECT coalesce(array_agg(s.pool_id ORDER BY s.pool_id), '{}') AS all_pools
                                    FROM respool._subject_policies(d.subject) s
                                   WHERE d.p IS NULL OR s.pool_id = d.p) a
               LEFT JOIN LATERAL respool._candidate_rejections(d.subject, a.all_pools, d.r, d.pre, d.x)
                                 WITH ORDINALITY c(policy_id, pool_id, pool_name, reason, message, k) ON true
              GROUP BY d.subject, d.p, d.r, d.pre, d.x, a.all_pools),
         made AS (
             INSERT INTO respool.requests AS t (id, subject, pool_ref, pool_id, pool_name, candidate_pool_ids, resources,
                                           preemptible, priority, status, reason, message, max_retries, lease_seconds,
                                           max_seconds, idempotency_key, request_body, labels, queued_at, created_at,
                                           updated_at, finished_at, gang_id, node_selector, preemption_group,
                                           command, job_env, workdir, job_name, array_index)
             SELECT m.id, m.b ->> 'subject', m.b ->> 'pool',
                    CASE WHEN k.n_all = 1 THEN k.only_pool ELSE m.p END,
                    CASE WHEN cardinality(k.names) = 1 THEN k.names[1]
                         WHEN m.p IS NOT NULL THEN (SELECT name FROM respool.pools WHERE id = m.p) END,
                    k.ok_pools, m.r, m.pre,
                    coalesce((SELECT p.priority FROM respool.policies p WHERE p.id = k.first_policy), 0),
                    CASE WHEN cardinality(k.ok_pools) = 0 THEN 'rejected' ELSE 'queued' END,
                    CASE WHEN cardinality(k.ok_pools) = 0 THEN coalesce(k.first_reason, 'no_policy') END,
                    CASE WHEN cardinality(k.ok_pools) > 0 THEN ''
                         WHEN cardinality(k.names) > 0 THEN k.messages
                         WHEN m.b ->> 'pool' IS NULL THEN format('subject %s has no policy on any pool', m.b ->> 'subject')
                         ELSE format('subject %s has no policy on pool %s', m.b ->> 'subject', m.b ->> 'pool') END,
                    (m.b ->> 'max_retries')::integer, (m.b ->> 'lease_seconds')::integer,
                    (m.b ->> 'max_seconds')::integer, m.b ->> 'idempotency_key', m.body, m.l, m.at, m.at, m.at,
                    CASE WHEN cardinality(k.ok_pools) = 0 THEN m.at END, p_gang_id, m.x, m.b ->> 'preemption_group',
                    -- a job (docs/jobs.md), stored before any grant: the node choice knows it is one
                    m.b #> '{job,command}', CASE WHEN jsonb_typeof(m.b -> 'job') = 'object'
                                                 THEN coalesce(nullif(m.b #> '{job,env}', 'null'), '{}') END,
                    m.b #>> '{job,workdir}', m.b #>> '{job,name}', (m.b #>> '{job,array_index}')::integer
               FROM m JOIN k ON k.subject = m.b ->> 'subject' AND k.p IS NOT DISTINCT FROM m.p AND k.r = m.r
                            AND k.pre = m.pre AND k.x = m.x
              ORDER BY m.n
             ON CONFLICT ON CONSTRAINT idempotency DO NOTHING
             RETURNING t AS r),
         -- Their first events, not notified: nobody knows these requests before the call answers.
         events AS (
             INSERT INTO respool.events (request_id, at, from_status, to_status, reason, attempt, message)
             SELECT (m.r).id, (m.r).created_at, NULL, (m.r).status, (m.r).reason, (m.r).attempt, (m.r).message
               FROM made m ORDER BY (m.r).created_at)
    SELECT count(*), coalesce(array_agg((m.r).id ORDER BY (m.r).created_at) FILTER (WHERE (m.r).status = 'queued'), '{}')
      INTO stored, queued
      FROM made m;
END $$;
COMMENT ON FUNCTION respool._insert_members(jsonb[], uuid[], boolean[], uuid[], jsonb[], jsonb[], jsonb[], jsonb[], timestamptz, uuid, integer[]) IS
    'Stores the members to be made (p_made) of checked create bodies, their candidate pools locked by the caller: each as rejected (the first candidate''s reason, every candidate''s message; no_policy) or queued with its admitted candidates in candidate order, member i at p_now + i µs (or p_slots[i] µs), its job, p_gang_id; one INSERT for the requests and one for their first events (not notified). Returns how many were stored (fewer: a key a concurrent create stored first) and the queued ones, in member order.';

CREATE OR REPLACE FUNCTION respool._queue_members(p_ids uuid[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_pools uuid[];
BEGIN
    -- One entry per admitted candidate (candidate_pool_ids, checked under the same pool locks:
    -- what respool._enqueue would find, without checking again) of each that still waits.
    WITH q AS MATERIALIZED (
             SELECT r.id, r.subject, r.candidate_pool_ids, r.queued_at, r.resources, r.preemptible, r.node_selector
               FROM respool.requests r WHERE r.id = ANY (p_ids) AND r.status = 'queued'),
         s AS MATERIALIZED (  -- each subject's policies, once
             SELECT d.subject, p.pool_id, p.policy_id
               FROM (SELECT DISTINCT subject FROM q) d CROSS JOIN LATERAL respool._subject_policies(d.subject) p),
         entered AS (
             INSERT INTO respool.queue_entries (pool_id, request_id, policy_id, queued_at, resources, preemptible,
                                                node_selector)
             SELECT s.pool_id, q.id, s.policy_id, q.queued_at, q.resources, q.preemptible, q.node_selector
               FROM q JOIN s ON s.subject = q.subject AND s.pool_id = ANY (q.candidate_pool_ids)
             RETURNING pool_id)
    SELECT array_agg(DISTINCT pool_id) INTO v_pools FROM entered;
    -- Still waiting: the reconcilers decide at once whether they may preempt.
    PERFORM respool._pool_changed(p) FROM unnest(v_pools) p;
END $$;
COMMENT ON FUNCTION respool._queue_members(uuid[]) IS
    'Writes the queue entries of the requests p_ids that a create has just made and that still wait (one per admitted candidate pool, in one INSERT; the caller holds their pools'' locks) and wakes the reconcilers of those pools.';

CREATE OR REPLACE FUNCTION respool._member_runs(p_ids uuid[], p_now timestamptz,
                                                OUT m_at timestamptz[], OUT r_first integer[], OUT r_res jsonb[],
                                                OUT r_pre boolean[], OUT r_sel jsonb[], OUT r_n integer[],
                                                OUT e_pool uuid[], OUT e_policy uuid[], OUT e_alone boolean[])
LANGUAGE plpgsql STABLE
-- (its statements take the members' arrays: planned once, not anew for every call)
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_firsts uuid[];  -- each run's first member
BEGIN
    -- Each member's queue instant; the runs of consecutive alike members (the same subject,
    -- admitted pools and shape): where each starts, its shape. One member: one run.
    IF cardinality(p_ids) = 1 THEN
        SELECT ARRAY[r.queued_at], ARRAY[1], ARRAY[r.id], ARRAY[r.resources], ARRAY[r.preemptible],
               ARRAY[r.node_selector]
          INTO m_at, r_first, v_firsts, r_res, r_pre, r_sel
          FROM respool.requests r WHERE r.id = p_ids[1];
    ELSE
        SELECT array_agg(x.queued_at ORDER BY x.n), array_agg(x.n ORDER BY x.n) FILTER (WHERE x.starts),
               array_agg(x.id ORDER BY x.n) FILTER (WHERE x.starts),
               array_agg(x.resources ORDER BY x.n) FILTER (WHERE x.starts),
               array_agg(x.preemptible ORDER BY x.n) FILTER (WHERE x.starts),
               array_agg(x.node_selector ORDER BY x.n) FILTER (WHERE x.starts)
          INTO m_at, r_first, v_firsts, r_res, r_pre, r_sel
          FROM (SELECT u.n::integer AS n, r.id, r.queued_at, r.resources, r.preemptible, r.node_selector,
                       ROW(r.subject, r.candidate_pool_ids, r.resources, r.preemptible, r.node_selector)
                       IS DISTINCT FROM lag(ROW(r.subject, r.candidate_pool_ids, r.resources, r.preemptible,
                                                r.node_selector)) OVER (ORDER BY u.n) AS starts
                  FROM unnest(p_ids) WITH ORDINALITY u(id, n)
                 -- (one index probe per member, whatever the plan thinks of the table's size)
                 CROSS JOIN LATERAL (SELECT * FROM respool.requests q WHERE q.id = u.id LIMIT 1) r) x;
    END IF;
    -- Each run's admitted candidates (r_n of them) with its policy there, in candidate order. A
    -- new request is tried alone (e_alone) in a best_effort pool that holds for nobody and cannot
    -- start holding during this call (no entry waits near starvation_seconds; docs/scheduling.md):
    -- every earlier request already had its chance. Elsewhere a pass decides (respool._try_new).
    SELECT array_agg(c.pool_id ORDER BY f.run, c.k),
           array_agg(s.policies[array_position(s.pools, c.pool_id)] ORDER BY f.run, c.k),
           array_agg(pl.queueing = 'best_effort'
                     AND (pl.starvation_seconds IS NULL
                          OR (pl.starvation_seconds > 0
                              AND NOT EXISTS (SELECT FROM respool.queue_entries q
                                               WHERE q.pool_id = pl.id
                                                 AND q.queued_at <= p_now + interval '1 second'
                                                                    - make_interval(secs => pl.starvation_seconds))))
                     ORDER BY f.run, c.k),
           array_agg(cardinality(r.candidate_pool_ids) ORDER BY f.run) FILTER (WHERE c.k = 1)
      INTO e_pool, e_policy, e_alone, r_n
      FROM unnest(v_firsts) WITH ORDINALITY f(id, run)
     CROSS JOIN LATERAL (SELECT q.subject, q.candidate_pool_ids FROM respool.requests q WHERE q.id = f.id LIMIT 1) r
     -- (the run's subject's policies read once, not once per candidate)
     CROSS JOIN LATERAL (SELECT array_agg(sp.pool_id) AS pools, array_agg(sp.policy_id) AS policies
                           FROM respool._subject_policies(r.subject) sp) s
     CROSS JOIN LATERAL unnest(r.candidate_pool_ids) WITH ORDINALITY c(pool_id, k)
      JOIN respool.pools pl ON pl.id = c.pool_id
     WHERE c.pool_id = ANY (s.pools);
END $$;
COMMENT ON FUNCTION respool._member_runs(uuid[], timestamptz) IS
    'The plan of a create''s grants for its queued new requests p_ids (member order): each one''s queue instant; the runs of consecutive alike members (same subject, admitted pools and shape): where each starts and its shape; each run''s admitted candidates (r_n) in candidate order with the policy there and whether a new request is tried alone there (a best_effort pool that holds for nobody and cannot start holding by p_now + 1 s). Read-only.';

CREATE OR REPLACE FUNCTION respool._grant_members(p_ids uuid[], p_now timestamptz)
RETURNS void LANGUAGE plpgsql
-- The grant routines are planned as everywhere else (their plans are shared with the passes).
SET plan_cache_mode = auto AS $$
DECLARE
    w record;              -- the runs (respool._member_runs)
    r respool.requests;
    v_blocked text[] := '{}';
    v_queued integer := 1; -- the members before it have their queue entries, or need none
    v_waiting boolean := false;  -- one of the members since v_queued still waits
    v_left integer;
    v_last integer;        -- the run's last member
    v_e integer := 1;      -- where the run's candidates start in w.e_*
    v_shape text;
BEGIN
    IF cardinality(p_ids) = 0 THEN
        RETURN;
    END IF;
    w := respool._member_runs(p_ids, p_now);
    FOR k IN 1 .. cardinality(w.r_first) LOOP
        v_last := coalesce(w.r_first[k + 1] - 1, cardinality(p_ids));
        IF w.e_alone[v_e : v_e + w.r_n[k] - 1] <@ ARRAY[true] THEN
            -- In each pool in turn, as many of those left as fit together, then one at a time
            -- until one is blocked: units are only taken here, so a shape blocked once stays
            -- blocked and is not tried again.
            v_left := w.r_first[k];
            FOR j IN v_e .. v_e + w.r_n[k] - 1 LOOP
                EXIT WHEN v_left > v_last;
                v_shape := w.e_pool[j]::text || w.e_policy[j]::text || w.r_pre[k] || w.r_res[k]::text || w.r_sel[k]::text;
                CONTINUE WHEN v_shape = ANY (v_blocked);
                IF v_last > v_left THEN
                    PERFORM set_config('respool.unannounced', array_to_string(p_ids[v_left : v_last], ','), true);
                    v_left := v_left + cardinality(respool._grant_run(
                        w.e_pool[j], w.e_policy[j], w.r_pre[k], w.r_res[k], w.r_sel[k], NULL, NULL, NULL, NULL,
                        w.m_at[v_left], p_ids[v_left : v_last]));
                END IF;
                WHILE v_left <= v_last LOOP
                    PERFORM set_config('respool.unannounced', p_ids[v_left]::text, true);
                    SELECT * INTO r FROM respool.requests WHERE id = p_ids[v_left];
                    EXIT WHEN respool._try_grant(r.id, w.e_pool[j], w.e_policy[j], r.queued_at, r) <> 'granted';
                    v_left := v_left + 1;
                END LOOP;
                IF v_left <= v_last THEN
                    v_blocked := v_blocked || v_shape;
                END IF;
            END LOOP;
            v_waiting := v_waiting OR v_left <= v_last;
        ELSE
            -- Member by member as its own create: at once where nobody queues in its first
            -- candidate, else queued and tried by respool._try_new, the members before it queued.
            IF v_waiting THEN
                PERFORM respool._queue_members(p_ids[v_queued : w.r_first[k] - 1]);
                v_waiting := false;
            END IF;
            FOR m IN w.r_first[k] .. v_last LOOP
                PERFORM set_config('respool.unannounced', p_ids[m]::text, true);
                SELECT * INTO r FROM respool.requests WHERE id = p_ids[m];
                IF EXISTS (SELECT FROM respool.queue_entries WHERE pool_id = w.e_pool[v_e])
                   OR respool._try_grant(r.id, w.e_pool[v_e], w.e_policy[v_e], r.queued_at, r) <> 'granted' THEN
                    PERFORM respool._queue_members(ARRAY[r.id]);
                    PERFORM respool._try_new(r.id, r.queued_at);
                    IF EXISTS (SELECT FROM respool.requests WHERE id = r.id AND status = 'queued')
                       AND NOT EXISTS (SELECT FROM respool.pools
                                        WHERE id = ANY (w.e_pool[v_e : v_e + w.r_n[k] - 1])
                                          AND queueing <> 'strict') THEN
                        -- It waits in strict queues that its full pass left as they are: every
                        -- alike member after it waits behind it, queued without a pass each. (Not
                        -- where a starvation hold decides: the hold's head may become this member.)
                        PERFORM respool._queue_members(p_ids[m + 1 : v_last]);
                        EXIT;
                    END IF;
                END IF;
            END LOOP;
            v_queued := v_last + 1;
        END IF;
        v_e := v_e + w.r_n[k];
    END LOOP;
    PERFORM set_config('respool.unannounced', '', true);
    IF v_waiting THEN
        PERFORM respool._queue_members(p_ids[v_queued : cardinality(p_ids)]);
    END IF;
END $$;
COMMENT ON FUNCTION respool._grant_members(uuid[], timestamptz) IS
    'Grants the queued requests p_ids (in member order) that this call has just made, as creating them one by one would: each tried in its admitted candidates in candidate order; where a new request is tried alone (respool._member_runs) a run of alike members by respool._grant_run, then respool._try_grant, elsewhere each by respool._try_new as its own create. Then writes the entries of those still waiting (respool._queue_members). Their own changes are not notified.';

CREATE OR REPLACE FUNCTION respool._create_members(p_bodies jsonb[], p_now timestamptz, p_gang_id uuid,
                                                   p_lock_all boolean, p_slots integer[] DEFAULT NULL,
                                                   OUT ids uuid[], OUT created boolean[],
                                                   OUT codes text[], OUT messages text[])
LANGUAGE plpgsql
-- Its statements take the members' arrays: planned once for every call, not anew each time.
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v record;
    m record;
    p record;
    s record;
    v_id uuid;
    v_differs boolean;
BEGIN
    PERFORM respool._claim_keys(p_bodies);
    IF p_lock_all THEN
        -- Every pool a member may be created in, in id order, up front (respool._batch_pools).
        PERFORM respool._lock_pools(respool._batch_pools(p_bodies));
    END IF;
    -- (each step a call assigned, not SELECT … FROM it: an expression, without a function scan)
    v := respool._member_values(p_bodies);
    m := respool._member_ids(p_bodies, v.bodies);
    ids := m.ids;
    created := m.created;
    codes := m.codes;
    messages := m.messages;
    p := respool._member_pools(p_bodies, created);
    PERFORM respool._lock_pools(p.lock_ids);
    s := respool._insert_members(p_bodies, ids, created, p.pool_ids, v.resources, v.labels, v.selectors,
                                 v.bodies, p_now, p_gang_id, p_slots);
    IF s.stored < cardinality(array_positions(created, true)) THEN
        -- A concurrent create stored one of the keys first (ON CONFLICT waited for it): a replay.
        FOR i IN 1 .. cardinality(ids) LOOP
            CONTINUE WHEN NOT created[i] OR EXISTS (SELECT FROM respool.requests WHERE id = ids[i]);
            SELECT r.id, r.request_body IS DISTINCT FROM v.bodies[i] INTO v_id, v_differs
              FROM respool.requests r
             WHERE r.subject = p_bodies[i] ->> 'subject' AND r.idempotency_key = p_bodies[i] ->> 'idempotency_key';
            ids[i] := v_id;
            created[i] := false;
            IF v_differs THEN
                codes[i] := 'RP422';
                messages[i] := format('idempotency_key %L was already used by request %s with a different body',
                                      p_bodies[i] ->> 'idempotency_key', v_id);
            END IF;
        END LOOP;
    END IF;
    IF p_gang_id IS NULL THEN
        PERFORM respool._grant_members(s.queued, p_now);
    END IF;
END $$;
COMMENT ON FUNCTION respool._create_members(jsonb[], timestamptz, uuid, boolean, integer[]) IS
    'The one create route, for one member or many (checked create bodies, in member order): keys claimed, values converted, replays found, candidates locked and validated, the new requests stored (member i at p_now + i µs, or p_slots[i] µs) and, unless they are the members of gang p_gang_id, granted as one by one would. p_lock_all: lock every pool a member may use first. Per member: its request id, created, and a refusal as data (RP422, message) that changed nothing; a bad value raises (RP400, RP404).';
