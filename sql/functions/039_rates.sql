-- Rate keys (docs/rates.md): pool keys whose units come back with time, not on release.
--
-- A rate key's capacity (pool_resources.capacity) is its amount per sliding window of
-- per_seconds (respool.pool_rates). A grant charges its amount of each rate key of the pool
-- (respool._charge_rates, from respool._place): one respool.rate_charges row, and the pool's and
-- policy's counters go up through the guarded charge every grant makes. So the counters of a rate
-- key hold the charges still counted, and every admission rule (capacity, limit, reserved share,
-- queue order, fair share) runs on them unchanged. Giving units back is the difference:
-- respool._unplace skips rate keys (respool._without_rates), and respool._expire_charges, run
-- under the pool lock before anything is admitted (respool._lock_pools, allocate_pool,
-- reconcile_pool), takes the charges that left their window off the counters. A settlement
-- (respool._settle, on release with used) sets a charge's amount to what was really used, at
-- its original instant. Rate keys never cause preemption (respool._usage gives them no bound,
-- the reconciler's step 3 skips requests they block); the reconciler wakes when enough charges
-- leave a window for a head (respool.rate_refills).

CREATE OR REPLACE FUNCTION respool._max_rate_seconds()
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 86400 $$;
COMMENT ON FUNCTION respool._max_rate_seconds() IS 'The longest window of a rate key, in seconds (one day).';

CREATE OR REPLACE FUNCTION respool._rate_retention()
RETURNS interval LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '1 hour' $$;
COMMENT ON FUNCTION respool._rate_retention() IS
    'How long a charge is kept once it left its window (the history invariant I10 and the overrun report read).';

CREATE OR REPLACE FUNCTION respool._pool_has_rates(p_pool_id uuid)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT FROM respool.pool_rates WHERE pool_id = p_pool_id);
END $$;
COMMENT ON FUNCTION respool._pool_has_rates(uuid) IS 'True when the pool has a rate key. One index probe.';

CREATE OR REPLACE FUNCTION respool._is_rate_key(p_pool_id uuid, p_key text)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT FROM respool.pool_rates WHERE pool_id = p_pool_id AND key = p_key);
END $$;
COMMENT ON FUNCTION respool._is_rate_key(uuid, text) IS 'True when p_key is a rate key of the pool.';

CREATE OR REPLACE FUNCTION respool._without_rates(p_pool_id uuid, p_units jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_units IS NULL OR p_units = '{}' OR NOT respool._pool_has_rates(p_pool_id) THEN
        RETURN p_units;
    END IF;
    RETURN (SELECT coalesce(jsonb_object_agg(x.key, x.value), '{}') FROM jsonb_each(p_units) x
             WHERE NOT EXISTS (SELECT FROM respool.pool_rates r WHERE r.pool_id = p_pool_id AND r.key = x.key));
END $$;
COMMENT ON FUNCTION respool._without_rates(uuid, jsonb) IS
    'A unit map {key: n} without the pool''s rate keys: what a holder gives back when it ends (rate units come back with time, respool._expire_charges).';

CREATE OR REPLACE FUNCTION respool._expire_charges(p_pool_id uuid, p_now timestamptz DEFAULT NULL,
                                                   p_grant boolean DEFAULT false)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_gone integer;
BEGIN
    -- Nearly always nothing is due: one index probe per rate key says so.
    IF NOT EXISTS (SELECT FROM respool.pool_rates r
                    WHERE r.pool_id = p_pool_id
                      AND EXISTS (SELECT FROM respool.rate_charges c
                                   WHERE c.pool_id = p_pool_id AND c.key = r.key AND c.counted
                                     AND c.at <= v_now - make_interval(secs => r.per_seconds))) THEN
        RETURN 0;
    END IF;
    -- Charges whose window has passed leave the pool's and their policy's counters, one
    -- statement per table. expired_until records the latest instant one stopped counting: new
    -- charges are never placed before it (respool._charge_rates), so a charge that shares a
    -- window with an expired one cannot be admitted without it.
    WITH gone AS (
        UPDATE respool.rate_charges c SET counted = false
          FROM respool.pool_rates r
         WHERE r.pool_id = p_pool_id AND c.pool_id = p_pool_id AND c.key = r.key AND c.counted
           AND c.at <= v_now - make_interval(secs => r.per_seconds)
        RETURNING c.key, c.policy_id, c.amount, c.np, c.at + make_interval(secs => r.per_seconds) AS until
    ), by_key AS (
        SELECT key, sum(amount) AS n, max(until) AS until FROM gone GROUP BY key
    ), pool_side AS (
        UPDATE respool.pool_resources pr SET used = pr.used - k.n
          FROM by_key k WHERE pr.pool_id = p_pool_id AND pr.key = k.key
        RETURNING 1
    ), clock AS (
        UPDATE respool.pool_rates r SET expired_until = greatest(r.expired_until, k.until)
          FROM by_key k WHERE r.pool_id = p_pool_id AND r.key = k.key
        RETURNING 1
    ), policy_side AS (
        UPDATE respool.policy_resources pol SET used = pol.used - g.n, np_used = pol.np_used - g.np
          FROM (SELECT policy_id, key, sum(amount) AS n, sum(np) AS np FROM gone
                 WHERE policy_id IS NOT NULL GROUP BY policy_id, key) g
         WHERE pol.policy_id = g.policy_id AND pol.key = g.key
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM gone) + 0 * ((SELECT count(*) FROM pool_side) + (SELECT count(*) FROM clock)
                                              + (SELECT count(*) FROM policy_side))
      INTO v_gone;
    IF v_gone > 0 AND p_grant AND EXISTS (SELECT FROM respool.queue_entries WHERE pool_id = p_pool_id) THEN
        -- The units that came back go to the queue, in its order, before the caller's own
        -- change (a new request must not take them ahead of those waiting for them).
        PERFORM respool.allocate_pool(p_pool_id, coalesce(p_now, now()));
    END IF;
    IF v_gone > 0 THEN
        -- The history past the retention goes a bounded slice at a time, when something expired.
        DELETE FROM respool.rate_charges WHERE id IN (
            SELECT c.id FROM respool.rate_charges c JOIN respool.pool_rates r ON r.pool_id = c.pool_id AND r.key = c.key
             WHERE c.pool_id = p_pool_id AND NOT c.counted
               AND c.at < v_now - make_interval(secs => r.per_seconds) - respool._rate_retention()
             LIMIT 1000);
    END IF;
    RETURN v_gone;
END $$;
COMMENT ON FUNCTION respool._expire_charges(uuid, timestamptz, boolean) IS
    'Rate keys: takes the charges of a pool that left their window by p_now (default: the clock) off the pool''s and policies'' counters, records how far expiry got (pool_rates.expired_until), drops history past respool._rate_retention() and, with p_grant, grants the queue in its order (allocate_pool) when units came back. The caller holds the pool lock; called before any admission in the pool. Returns how many charges left.';

CREATE OR REPLACE FUNCTION respool._charge_rates(p_pool_id uuid, p_policy_id uuid, p_granted respool.requests[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_at timestamptz;
BEGIN
    IF NOT respool._pool_has_rates(p_pool_id) THEN
        RETURN;
    END IF;
    -- The grant instant, never before an expiry already done (pool_rates.expired_until).
    v_at := greatest(clock_timestamp(), (SELECT max(expired_until) FROM respool.pool_rates WHERE pool_id = p_pool_id));
    INSERT INTO respool.rate_charges (pool_id, key, request_id, attempt, policy_id, subject, at, estimate, amount, np)
    SELECT p_pool_id, x.key, g.id, g.attempt, p_policy_id, g.subject, v_at, x.value::bigint, x.value::bigint,
           coalesce((g.np_charge ->> x.key)::bigint, 0)
      FROM unnest(p_granted) g
     CROSS JOIN LATERAL jsonb_each_text(g.resources) x
      JOIN respool.pool_rates r ON r.pool_id = p_pool_id AND r.key = x.key
     WHERE x.value::bigint > 0;
END $$;
COMMENT ON FUNCTION respool._charge_rates(uuid, uuid, respool.requests[]) IS
    'Rate keys: records one charge per granted request and rate key of the pool, at the grant instant (never before pool_rates.expired_until), its amount the request''s and np its non-preemptible part. The counters were charged by respool._place''s guarded move. Called by respool._place.';

CREATE OR REPLACE FUNCTION respool._rate_used(p_pool_id uuid, p_key text, p_policy_id uuid, p_now timestamptz)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_w interval := (SELECT make_interval(secs => per_seconds) FROM respool.pool_rates
                      WHERE pool_id = p_pool_id AND key = p_key);
BEGIN
    -- The counter minus the counted charges that have left the window by p_now (those wait for
    -- the next expiry under the pool lock): the sum of the charges inside the trailing window.
    IF p_policy_id IS NULL THEN
        RETURN (SELECT pr.used FROM respool.pool_resources pr WHERE pr.pool_id = p_pool_id AND pr.key = p_key)
               - coalesce((SELECT sum(c.amount) FROM respool.rate_charges c
                            WHERE c.pool_id = p_pool_id AND c.key = p_key AND c.counted AND c.at <= p_now - v_w), 0);
    END IF;
    RETURN (SELECT pol.used FROM respool.policy_resources pol WHERE pol.policy_id = p_policy_id AND pol.key = p_key)
           - coalesce((SELECT sum(c.amount) FROM respool.rate_charges c
                        WHERE c.policy_id = p_policy_id AND c.key = p_key AND c.counted AND c.at <= p_now - v_w), 0);
END $$;
COMMENT ON FUNCTION respool._rate_used(uuid, text, uuid, timestamptz) IS
    'The used units of a rate key at p_now: the sum of the pool''s (p_policy_id NULL) or one policy''s charges inside the trailing window. Read-only.';

CREATE OR REPLACE FUNCTION respool._rates_json(p_pool_id uuid, p_now timestamptz)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_object_agg(r.key, jsonb_build_object(
               'amount', pr.capacity, 'per_seconds', r.per_seconds,
               'used', respool._rate_used(p_pool_id, r.key, NULL, p_now),
               -- when the oldest charge inside the window leaves it (null: none inside)
               'next_refill_at', (SELECT min(c.at) + make_interval(secs => r.per_seconds) FROM respool.rate_charges c
                                   WHERE c.pool_id = p_pool_id AND c.key = r.key AND c.counted
                                     AND c.at > p_now - make_interval(secs => r.per_seconds)),
               -- units settled above their estimates, over the charges inside the window
               'overrun', (SELECT coalesce(sum(greatest(c.amount - c.estimate, 0)), 0) FROM respool.rate_charges c
                            WHERE c.pool_id = p_pool_id AND c.key = r.key AND c.counted
                              AND c.at > p_now - make_interval(secs => r.per_seconds)))), '{}')
      FROM respool.pool_rates r JOIN respool.pool_resources pr ON pr.pool_id = r.pool_id AND pr.key = r.key
     WHERE r.pool_id = p_pool_id
$$;
COMMENT ON FUNCTION respool._rates_json(uuid, timestamptz) IS
    'A pool''s rate keys as the API shows them: {key: {amount, per_seconds, used (inside the window at p_now), next_refill_at, overrun}}. Read-only.';

CREATE OR REPLACE FUNCTION respool._rate_ready_at(p_pool_id uuid, p_policy_id uuid, p_need jsonb,
                                                  p_policy_need jsonb, p_now timestamptz)
RETURNS timestamptz LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_at timestamptz := p_now;
    k record;
    c record;
    v_cum bigint;
    v_found boolean;
BEGIN
    -- Per rate key and bound (the pool place's key, with p_need; the policy's limit, with
    -- p_policy_need): the units missing (need - room, respool._room), then the oldest counted
    -- charges in order until that many have left: the instant the last of them leaves its window.
    -- 'infinity' when a need would not fit the bound even empty.
    FOR k IN SELECT p.key, make_interval(secs => r.per_seconds) AS w, p.need, p.free AS room, p.room_ever,
                    NULL::uuid AS policy_id
               FROM respool._pool_place(p_pool_id, respool._rate_part(p_pool_id, p_need)) p
               JOIN respool.pool_rates r ON r.pool_id = p_pool_id AND r.key = p.key
              WHERE p.need > 0
             UNION ALL
             -- (a limit binds every key, also one the need lacks: a subject above it waits)
             SELECT r.key, make_interval(secs => r.per_seconds), coalesce((p_policy_need ->> r.key)::bigint, 0),
                    respool._room(pol."limit", pol.used), respool._room(pol."limit", 0), pol.policy_id
               FROM respool.pool_rates r JOIN respool.policy_resources pol ON pol.key = r.key
              WHERE r.pool_id = p_pool_id AND pol.policy_id = p_policy_id AND pol."limit" IS NOT NULL
                AND (coalesce((p_policy_need ->> r.key)::bigint, 0) > 0
                     OR NOT respool._fits_room(0, respool._room(pol."limit", pol.used))) LOOP
        IF NOT respool._fits_room(k.need, k.room_ever) THEN
            RETURN 'infinity';
        END IF;
        CONTINUE WHEN respool._fits_room(k.need, k.room);
        v_cum := 0;
        v_found := false;
        FOR c IN SELECT x.at, x.amount FROM respool.rate_charges x
                  WHERE x.pool_id = p_pool_id AND x.key = k.key AND x.counted
                    AND (k.policy_id IS NULL OR x.policy_id = k.policy_id)
                  ORDER BY x.at, x.id LOOP
            v_cum := v_cum + c.amount;
            IF respool._fits_room(k.need, k.room + v_cum) THEN
                v_at := greatest(v_at, c.at + k.w);
                v_found := true;
                EXIT;
            END IF;
        END LOOP;
        IF NOT v_found THEN
            RETURN 'infinity';
        END IF;
    END LOOP;
    RETURN v_at;
END $$;
COMMENT ON FUNCTION respool._rate_ready_at(uuid, uuid, jsonb, jsonb, timestamptz) IS
    'Rate keys: the first instant at or after p_now when p_need fits the pool place''s rate keys and p_policy_need the policy''s limits on them (respool._fits_room), if nothing new is charged: the instant enough of the oldest charges have left their window. Other keys are not looked at. ''infinity'' when a need exceeds its bound. Read-only.';

CREATE OR REPLACE FUNCTION respool._rate_part(p_pool_id uuid, p_units jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(x.key, x.value), '{}') FROM jsonb_each(p_units) x
             WHERE EXISTS (SELECT FROM respool.pool_rates r WHERE r.pool_id = p_pool_id AND r.key = x.key));
END $$;
COMMENT ON FUNCTION respool._rate_part(uuid, jsonb) IS 'The pool''s rate keys of a unit map {key: n}.';

CREATE OR REPLACE FUNCTION respool._rate_blocks(p_pool_id uuid, p_policy_id uuid, p_resources jsonb)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- The pool place's rate keys as their counters are (the caller expired the charges under the
    -- pool lock), and the subject's limits on them: a rate key whose room the need does not fit.
    RETURN EXISTS (SELECT FROM respool._pool_place(p_pool_id, respool._rate_part(p_pool_id, p_resources)) p
                     LEFT JOIN respool.policy_resources pol ON pol.policy_id = p_policy_id AND pol.key = p.key
                    WHERE p.need > 0
                      AND NOT (respool._fits_room(p.need, p.free)
                               AND respool._fits_room(p.need, respool._room(pol."limit", coalesce(pol.used, 0)))))
        OR EXISTS (SELECT FROM respool.policy_resources pol
                     JOIN respool.pool_rates r ON r.pool_id = p_pool_id AND r.key = pol.key
                    WHERE pol.policy_id = p_policy_id AND NOT respool._fits_room(0, respool._room(pol."limit", pol.used)));
END $$;
COMMENT ON FUNCTION respool._rate_blocks(uuid, uuid, jsonb) IS
    'True when a rate key keeps p_resources of policy p_policy_id out of the pool now: the need does not fit the room of a rate key of the pool place (respool._pool_place) or under the subject''s limit, or the subject is above a limit on one. The reconciler never preempts for such a request: only time frees rate units. Read-only.';

CREATE OR REPLACE FUNCTION respool._settle_refusals(p_ids uuid[], p_used jsonb[])
RETURNS TABLE (member integer, code text, field text, message text)
LANGUAGE sql STABLE AS $$
    -- Per member (1-based), its first refusal in the order the checks are listed (the keys of
    -- one check in key order); members settling nothing, or settling well, have no row.
    SELECT DISTINCT ON (m.n) m.n::integer, x.code, x.field, x.message
      FROM unnest(p_ids, p_used) WITH ORDINALITY m(id, used, n)
      LEFT JOIN respool.requests r ON r.id = m.id
     CROSS JOIN LATERAL (SELECT jsonb_typeof(m.used) = 'object' AS object) t
     -- the charge to settle: the request's last (its pool and attempt)
      LEFT JOIN LATERAL (SELECT c.pool_id, c.attempt FROM respool.rate_charges c WHERE c.request_id = m.id
                          ORDER BY c.attempt DESC, c.id DESC LIMIT 1) last ON true
     CROSS JOIN LATERAL (SELECT coalesce(last.pool_id, r.pool_id) AS id) pool
     CROSS JOIN LATERAL (
            SELECT 1 AS step, NULL::text AS k, 'RP400' AS code, 'used' AS field,
                   'used must be an object of rate key: units used' AS message
             WHERE NOT t.object
            UNION ALL
            SELECT 2, NULL, 'RP400', 'used', format('used has more than %s keys', respool._max_keys())
             WHERE (SELECT count(*) FROM jsonb_object_keys(CASE WHEN t.object THEN m.used ELSE '{}' END))
                   > respool._max_keys()
            UNION ALL
            SELECT 3, e.key, 'RP400', 'used.' || left(e.key, 70),
                   CASE WHEN e.key !~ respool._key_pattern()
                        THEN format('used: bad resource key %L (expected %s)', left(e.key, 70), respool._key_pattern())
                        WHEN jsonb_typeof(e.value) <> 'number' OR CASE WHEN jsonb_typeof(e.value) = 'number' THEN
                                 e.value::numeric <> trunc(e.value::numeric)
                                 OR e.value::numeric NOT BETWEEN 0 AND respool._max_amount() END
                        THEN format('used.%s must be an integer between 0 and %s, got %s', left(e.key, 70),
                                    respool._max_amount(), left(e.value::text, 40))
                        WHEN NOT EXISTS (SELECT FROM respool.pool_rates pr
                                          WHERE pr.key = e.key AND (pr.pool_id = pool.id
                                                OR (pool.id IS NULL AND pr.pool_id = ANY (r.candidate_pool_ids))))
                        THEN format('used.%s: %s is not a rate key of pool %s; only rate keys are settled', e.key,
                                    e.key, coalesce((SELECT name FROM respool.pools WHERE id = pool.id), 'of the request'))
                   END
              FROM jsonb_each(CASE WHEN t.object THEN m.used ELSE '{}' END) e
            UNION ALL
            SELECT 4, NULL, 'RP409', 'used',
                   format('request %s holds no charge to settle: it was never granted', m.id)
             WHERE t.object AND last.attempt IS NULL
            UNION ALL
            SELECT 5, e.key, CASE WHEN c.request_id IS NULL THEN 'RP400' ELSE 'RP409' END, 'used.' || e.key,
                   CASE WHEN c.request_id IS NULL AND e.value::numeric > 0
                        THEN format('used.%s: request %s reserved no %s; settle only the rate keys it reserved',
                                    e.key, m.id, e.key)
                        WHEN c.settled_at IS NOT NULL AND c.amount <> e.value::numeric
                        THEN format('used.%s: the charge of request %s was already settled at %s', e.key, m.id,
                                    c.amount)
                   END
              FROM jsonb_each(CASE WHEN t.object AND last.attempt IS NOT NULL THEN m.used ELSE '{}' END) e
              LEFT JOIN respool.rate_charges c ON c.request_id = m.id AND c.attempt = last.attempt AND c.key = e.key
           ) x
     WHERE m.used IS NOT NULL AND m.used <> 'null'::jsonb AND x.message IS NOT NULL
     ORDER BY m.n, x.step, x.k
$$;
COMMENT ON FUNCTION respool._settle_refusals(uuid[], jsonb[]) IS
    'Why the settlements of requests p_ids ({key: units used} each, p_used) are refused, one row for each refused one (member, 1-based): RP400 naming used.<key> (bad key or amount, not a rate key of its pool, not reserved) or used (not an object, too many keys), RP409 (never granted: field used; settled before with another amount: used.<key>). The first failing check in that order, a check''s keys in key order. Read-only; respool._settle raises it.';

CREATE OR REPLACE FUNCTION respool._settle_refusal(p_id uuid, p_used jsonb,
                                                   OUT code text, OUT field text, OUT message text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- (PL/pgSQL: its plan is kept, the set-returning function inlined into it)
    SELECT x.code, x.field, x.message INTO code, field, message
      FROM respool._settle_refusals(ARRAY[p_id], ARRAY[p_used]) x;
END $$;
COMMENT ON FUNCTION respool._settle_refusal(uuid, jsonb) IS
    'respool._settle_refusals for one request: its refusal, NULLs when it settles nothing or settles well.';

DROP FUNCTION IF EXISTS respool._settle(uuid, jsonb, timestamptz);
CREATE OR REPLACE FUNCTION respool._settle(p_id uuid, p_used jsonb, p_now timestamptz, p_checked boolean DEFAULT false)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    r respool.requests := (SELECT q FROM respool.requests q WHERE q.id = p_id);
    refusal record;
    v_pool uuid;
    v_attempt integer;
    v_units jsonb;
    c record;
    v_np bigint;
    v_room bigint;
    v_parts text[] := '{}';
    v_over boolean := false;
    v_refund boolean := false;
BEGIN
    IF NOT p_checked THEN  -- (p_checked: the caller has just asked, under the same locks)
        refusal := respool._settle_refusal(p_id, p_used);
        IF refusal.code IS NOT NULL THEN
            PERFORM respool._fail(refusal.code, refusal.field, refusal.message);
        END IF;
    END IF;
    IF p_used IS NULL OR p_used = 'null'::jsonb THEN
        RETURN;
    END IF;
    v_units := p_used;
    SELECT c2.pool_id, c2.attempt INTO v_pool, v_attempt FROM respool.rate_charges c2
     WHERE c2.request_id = p_id ORDER BY c2.attempt DESC, c2.id DESC LIMIT 1;
    -- Then each charge takes the units really used, at its original instant; while it still
    -- counts, the counters move by the difference (an extra charge may pass the amount: it is
    -- reported, never refused: the units were used).
    FOR c IN SELECT x.*, (v_units ->> x.key)::bigint AS actual FROM respool.rate_charges x
              WHERE x.request_id = p_id AND x.attempt = v_attempt AND v_units ? x.key AND x.settled_at IS NULL
              ORDER BY x.key LOOP
        v_room := CASE WHEN c.counted THEN (SELECT greatest(respool._room(pol.configured, pol.np_used), 0) FROM respool.policy_resources pol
                                             WHERE pol.policy_id = c.policy_id AND pol.key = c.key) ELSE 0 END;
        v_np := CASE WHEN c.np = 0 OR c.actual <= c.np THEN least(c.np, c.actual)
                     ELSE c.np + least(c.actual - c.np, coalesce(v_room, 0)) END;
        UPDATE respool.rate_charges SET amount = c.actual, np = v_np, settled_at = p_now WHERE id = c.id;
        IF c.counted THEN
            UPDATE respool.pool_resources SET used = used + (c.actual - c.amount)
             WHERE pool_id = c.pool_id AND key = c.key;
            UPDATE respool.policy_resources SET used = used + (c.actual - c.amount), np_used = np_used + (v_np - c.np)
             WHERE policy_id = c.policy_id AND key = c.key;
            v_refund := v_refund OR c.actual < c.amount;
        END IF;
        v_over := v_over OR c.actual > c.estimate;
        v_parts := v_parts || format('%s %s of %s reserved%s', c.key, c.actual, c.estimate,
                                     CASE WHEN c.actual < c.estimate THEN format(' (%s back)', c.estimate - c.actual)
                                          WHEN c.actual > c.estimate THEN format(' (%s over the estimate)', c.actual - c.estimate)
                                          ELSE '' END);
    END LOOP;
    IF cardinality(v_parts) = 0 THEN
        RETURN;  -- nothing to change: a repeated settlement, or nothing asked
    END IF;
    INSERT INTO respool.events (request_id, at, from_status, to_status, reason, attempt, message)
    VALUES (p_id, p_now, r.status, r.status, CASE WHEN v_over THEN 'overrun' ELSE 'settled' END, v_attempt,
            'settled: ' || array_to_string(v_parts, ', '));
    -- Units given back while the request no longer holds anything: the queue may move now (a
    -- holder's release grants in the same transaction anyway).
    IF v_refund AND r.status NOT IN ('allocated', 'preempting') THEN
        PERFORM respool.allocate_pool(v_pool, p_now);
    END IF;
END $$;
COMMENT ON FUNCTION respool._settle(uuid, jsonb, timestamptz, boolean) IS
    'Settles a request''s latest charges with the units really used ({rate key: n}): each becomes n at its original instant, the counters move by the difference while it counts, an event (settled, or overrun when above the estimate) records it. Refused (respool._settle_refusal raised: RP400 used.<key>, RP409) before anything changes, unless p_checked: the caller found no refusal under the same locks. The caller holds the pool and request locks.';

CREATE OR REPLACE FUNCTION respool._settle_many(p_ids uuid[], p_used jsonb[], p_now timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    -- respool._settle of each distinct request p_ids[i] with p_used[i] (NULL: none), set-based:
    -- one statement per table. Only when no charge it settles has a non-preemptible part (that
    -- part's room moves from one settlement to the next): false, and nothing done, otherwise.
    IF EXISTS (SELECT FROM unnest(p_ids, p_used) x(id, used)
                CROSS JOIN LATERAL (SELECT max(c2.attempt) AS a FROM respool.rate_charges c2 WHERE c2.request_id = x.id) l
                 JOIN respool.rate_charges c ON c.request_id = x.id AND c.attempt = l.a AND x.used ? c.key
                                            AND c.settled_at IS NULL
                WHERE x.used IS NOT NULL AND x.used <> 'null'::jsonb AND c.np <> 0) THEN
        RETURN false;
    END IF;
    -- The latest grant's charges each settlement names and that are not settled yet, each
    -- becoming the units really used at its original instant; counted ones move the counters.
    WITH s AS MATERIALIZED (
             SELECT c.id, c.request_id, c.pool_id, c.policy_id, c.key, c.counted, c.amount, c.estimate, c.attempt,
                    (x.used ->> c.key)::bigint AS actual, x.n
               FROM unnest(p_ids, p_used) WITH ORDINALITY x(id, used, n)
              CROSS JOIN LATERAL (SELECT max(c2.attempt) AS a FROM respool.rate_charges c2 WHERE c2.request_id = x.id) l
               JOIN respool.rate_charges c ON c.request_id = x.id AND c.attempt = l.a AND x.used ? c.key
                                          AND c.settled_at IS NULL
              WHERE x.used IS NOT NULL AND x.used <> 'null'::jsonb),
         charged AS (
             UPDATE respool.rate_charges rc SET amount = s.actual, np = 0, settled_at = p_now
               FROM s WHERE rc.id = s.id),
         pooled AS (
             UPDATE respool.pool_resources pr SET used = pr.used + d.delta
               FROM (SELECT pool_id, key, sum(actual - amount) AS delta FROM s WHERE counted GROUP BY pool_id, key) d
              WHERE pr.pool_id = d.pool_id AND pr.key = d.key),
         policed AS (
             UPDATE respool.policy_resources pol SET used = pol.used + d.delta
               FROM (SELECT policy_id, key, sum(actual - amount) AS delta FROM s WHERE counted GROUP BY policy_id, key) d
              WHERE pol.policy_id = d.policy_id AND pol.key = d.key)
    INSERT INTO respool.events (request_id, at, from_status, to_status, reason, attempt, message)
    SELECT s.request_id, p_now, q.status, q.status,
           CASE WHEN bool_or(s.actual > s.estimate) THEN 'overrun' ELSE 'settled' END, min(s.attempt),
           'settled: ' || string_agg(format('%s %s of %s reserved%s', s.key, s.actual, s.estimate,
                                            CASE WHEN s.actual < s.estimate THEN format(' (%s back)', s.estimate - s.actual)
                                                 WHEN s.actual > s.estimate THEN format(' (%s over the estimate)', s.actual - s.estimate)
                                                 ELSE '' END), ', ' ORDER BY s.key)
      FROM s JOIN respool.requests q ON q.id = s.request_id
     GROUP BY s.request_id, q.status
     ORDER BY min(s.n);
    RETURN true;
END $$;
COMMENT ON FUNCTION respool._settle_many(uuid[], jsonb[], timestamptz) IS
    'respool._settle of several distinct requests (p_used[i] for p_ids[i], NULL: none) in one statement per table: the same charges, counters and settled/overrun events, in member order. Only when none of the charges it settles has a non-preemptible part: else false and nothing changed (the caller settles one by one). The caller checked each settlement (respool._settle_refusal) and holds the pool and request locks; the requests still hold their grants.';

CREATE OR REPLACE FUNCTION respool._rate_spec(p_key text, p_value jsonb, p_old respool.pool_rates, p_old_amount bigint,
                                              OUT amount bigint, OUT per_seconds integer)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    f text;
    v_field text := 'rates.' || p_key;
BEGIN
    IF jsonb_typeof(p_value) <> 'object' THEN
        PERFORM respool._fail('RP400', v_field, format('%s must be an object {"amount": int, "per_seconds": int}', v_field));
    END IF;
    SELECT x INTO f FROM jsonb_object_keys(p_value) x WHERE x NOT IN ('amount', 'per_seconds') ORDER BY x LIMIT 1;
    IF FOUND THEN
        PERFORM respool._fail('RP400', v_field || '.' || left(f, 70),
            format('%s: unknown field %L (known: amount, per_seconds)', v_field, left(f, 70)));
    END IF;
    IF p_value ? 'amount' THEN
        amount := respool._amount(p_value -> 'amount', v_field || '.amount', true);
    ELSIF p_old.key IS NULL THEN
        PERFORM respool._fail('RP400', v_field || '.amount', format('%s.amount is required', v_field));
    ELSE
        amount := p_old_amount;
    END IF;
    IF p_value ? 'per_seconds' THEN
        IF jsonb_typeof(p_value -> 'per_seconds') <> 'number'
           OR (p_value ->> 'per_seconds')::numeric <> trunc((p_value ->> 'per_seconds')::numeric)
           OR (p_value ->> 'per_seconds')::numeric NOT BETWEEN 1 AND respool._max_rate_seconds() THEN
            PERFORM respool._fail('RP400', v_field || '.per_seconds', format(
                '%s.per_seconds must be an integer between 1 and %s', v_field, respool._max_rate_seconds()));
        END IF;
        per_seconds := (p_value ->> 'per_seconds')::integer;
    ELSIF p_old.key IS NULL THEN
        PERFORM respool._fail('RP400', v_field || '.per_seconds', format('%s.per_seconds is required', v_field));
    ELSE
        per_seconds := p_old.per_seconds;
    END IF;
END $$;
COMMENT ON FUNCTION respool._rate_spec(text, jsonb, respool.pool_rates, bigint) IS
    'Validates one rate key''s body {"amount", "per_seconds"} (amount 1.._max_amount(), per_seconds 1.._max_rate_seconds()); a field missing from an update keeps p_old''s. RP400 naming rates.<key>.<field>.';

CREATE OR REPLACE FUNCTION respool._recount_rate(p_pool_id uuid, p_key text, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_w interval := (SELECT make_interval(secs => per_seconds) FROM respool.pool_rates
                      WHERE pool_id = p_pool_id AND key = p_key);
BEGIN
    -- After a window change (or the key's removal: v_w NULL), the charges inside the new window
    -- count and the counters are their sums.
    UPDATE respool.rate_charges SET counted = coalesce(at > p_now - v_w, false)
     WHERE pool_id = p_pool_id AND key = p_key AND counted IS DISTINCT FROM coalesce(at > p_now - v_w, false);
    UPDATE respool.pool_resources pr
       SET used = coalesce((SELECT sum(c.amount) FROM respool.rate_charges c
                             WHERE c.pool_id = p_pool_id AND c.key = p_key AND c.counted), 0)
     WHERE pr.pool_id = p_pool_id AND pr.key = p_key;
    UPDATE respool.policy_resources pol
       SET used = s.n, np_used = least(s.np, pol.configured, s.n)
      FROM (SELECT p.id, coalesce(sum(c.amount), 0) AS n, coalesce(sum(c.np), 0) AS np
              FROM respool.policies p
              LEFT JOIN respool.rate_charges c ON c.policy_id = p.id AND c.key = p_key AND c.counted
             WHERE p.pool_id = p_pool_id GROUP BY p.id) s
     WHERE pol.policy_id = s.id AND pol.key = p_key;
    UPDATE respool.pool_rates SET expired_until = greatest(expired_until, p_now), changed_at = p_now
     WHERE pool_id = p_pool_id AND key = p_key;
END $$;
COMMENT ON FUNCTION respool._recount_rate(uuid, text, timestamptz) IS
    'Rate keys: after a window change, recounts which charges of a key are inside the window at p_now and sets the pool''s and policies'' counters to their sums (after the key''s removal: to 0). The caller holds the pool lock.';

CREATE OR REPLACE FUNCTION respool._set_rates(p_pool_id uuid, p_rates jsonb, p_capacity jsonb, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    k text;
    v jsonb;
    old respool.pool_rates;
    s record;
    v_amount bigint;
    v_name text := (SELECT name FROM respool.pools WHERE id = p_pool_id);
BEGIN
    -- p_capacity: the capacity keys of the same call, which may not name a rate key.
    SELECT x INTO k FROM jsonb_object_keys(coalesce(p_capacity, '{}')) x
     WHERE EXISTS (SELECT FROM respool.pool_rates r WHERE r.pool_id = p_pool_id AND r.key = x)
        OR coalesce(p_rates ? x, false)
     ORDER BY x LIMIT 1;
    IF FOUND THEN
        PERFORM respool._fail('RP400', 'capacity.' || k, format(
            'capacity.%s: %s is a rate key of pool %s; set its amount under rates', k, k, v_name));
    END IF;
    IF respool._absent_map(p_rates, 'rates', 'rates must be an object of key: {"amount": int, "per_seconds": int}') THEN
        RETURN;
    END IF;
    FOR k, v IN SELECT * FROM jsonb_each(p_rates) ORDER BY 1 LOOP
        -- (nodes count their keys per machine: a key a node tracks is no budget of the pool)
        IF EXISTS (SELECT FROM respool.node_resources nr JOIN respool.nodes n ON n.id = nr.node_id
                    WHERE n.pool_id = p_pool_id AND nr.key = k) THEN
            PERFORM respool._fail('RP400', 'rates.' || k, format(
                'rates.%s: nodes of pool %s track %s (%s); a rate may only be declared on a key no node tracks',
                k, v_name, k, (SELECT string_agg(n.name, ', ' ORDER BY n.name) FROM respool.nodes n
                                 JOIN respool.node_resources nr ON nr.node_id = n.id AND nr.key = k
                                WHERE n.pool_id = p_pool_id)));
        END IF;
        SELECT * INTO old FROM respool.pool_rates WHERE pool_id = p_pool_id AND key = k;
        IF old.key IS NULL AND EXISTS (SELECT FROM respool.pool_resources
                                        WHERE pool_id = p_pool_id AND key = k AND (capacity IS NOT NULL OR used > 0)) THEN
            PERFORM respool._fail('RP400', 'rates.' || k, format(
                'rates.%s: %s is an ordinary key of pool %s (capacity); remove it from capacity first', k, k, v_name));
        END IF;
        IF jsonb_typeof(v) = 'null' THEN
            CONTINUE WHEN old.key IS NULL;
            -- The key stops being a rate key: its charges go, the pool no longer tracks it.
            DELETE FROM respool.pool_rates WHERE pool_id = p_pool_id AND key = k;
            PERFORM respool._recount_rate(p_pool_id, k, p_now);
            DELETE FROM respool.rate_charges WHERE pool_id = p_pool_id AND key = k;
            DELETE FROM respool.pool_resources WHERE pool_id = p_pool_id AND key = k;
            CONTINUE;
        END IF;
        v_amount := (SELECT capacity FROM respool.pool_resources WHERE pool_id = p_pool_id AND key = k);
        s := respool._rate_spec(k, v, old, v_amount);
        INSERT INTO respool.pool_resources (pool_id, key, capacity) VALUES (p_pool_id, k, s.amount)
        ON CONFLICT (pool_id, key) DO UPDATE SET capacity = excluded.capacity;
        INSERT INTO respool.pool_rates (pool_id, key, per_seconds, changed_at) VALUES (p_pool_id, k, s.per_seconds, p_now)
        ON CONFLICT (pool_id, key) DO UPDATE SET per_seconds = excluded.per_seconds,
            changed_at = CASE WHEN (old.per_seconds, v_amount) IS DISTINCT FROM (s.per_seconds, s.amount)
                              THEN p_now ELSE respool.pool_rates.changed_at END;
        IF old.key IS NOT NULL AND old.per_seconds <> s.per_seconds THEN
            PERFORM respool._recount_rate(p_pool_id, k, p_now);
        END IF;
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._set_rates(uuid, jsonb, jsonb, timestamptz) IS
    'Declares, changes (fields merge) or removes (null) rate keys of a pool: {key: {"amount", "per_seconds"}}; the amount is the key''s capacity per window. RP400 naming the field: bad key or fields, a key also in p_capacity, already an ordinary key or tracked by a node of the pool. A window change recounts the key''s charges. The caller holds the pool lock and checks reserved shares after.';

CREATE OR REPLACE FUNCTION respool.rate_refills(p_now timestamptz DEFAULT clock_timestamp())
RETURNS TABLE (pool_id uuid, at timestamptz) LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- Per pool with rate keys and a queue: the soonest instant a queue shape's head gets the
    -- rate units it waits for (its counters say blocked; time frees them). A head the counters
    -- block although its charges have already left the window is due now.
    RETURN QUERY
    SELECT p.pool_id, min(greatest(t.at, p_now))
      FROM (SELECT DISTINCT r.pool_id FROM respool.pool_rates r
             WHERE EXISTS (SELECT FROM respool.queue_entries e WHERE e.pool_id = r.pool_id)) p
     CROSS JOIN LATERAL respool._queue_groups(p.pool_id) g
     CROSS JOIN LATERAL (SELECT respool._rate_part(p.pool_id, g.resources) AS need) n
     CROSS JOIN LATERAL (SELECT respool._rate_ready_at(p.pool_id, g.policy_id, n.need, n.need, p_now) AS at) t
     WHERE t.at < 'infinity'
       AND (t.at > p_now OR respool._rate_blocks(p.pool_id, g.policy_id, g.resources))
     GROUP BY p.pool_id;
END $$;
COMMENT ON FUNCTION respool.rate_refills(timestamptz) IS
    'When the reconciler should pass each pool whose queue waits for rate units: per pool, the soonest instant a queue shape''s head fits its rate keys again as charges leave their windows (respool._rate_ready_at; p_now when already due). Read-only.';

CREATE OR REPLACE FUNCTION respool._rate_eta_pool(p_pool_id uuid, p_now timestamptz, p_until uuid DEFAULT NULL)
RETURNS TABLE (request_id uuid, p50_seconds bigint, p90_seconds bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_free jsonb := respool._without_rates(p_pool_id, respool._free_units(p_pool_id));
    v_need jsonb := '{}';     -- rate units of the entries ahead, and its own
    v_policy jsonb := '{}';   -- the same per policy (its limits)
    v_rate jsonb;
    v_other jsonb;
    v_at timestamptz;
    e record;
BEGIN
    -- In queue order, an entry that only rate keys hold (its other keys fit what is free, after
    -- the entries ahead of it that also fit) gets the instant its rate units and those of the
    -- entries ahead are back: exact while nothing new is charged or settled.
    FOR e IN SELECT o.request_id, o.policy_id, q.resources
               FROM respool._queue_top(p_pool_id, respool._eta_depth()) o
               JOIN respool.queue_entries q ON q.pool_id = p_pool_id AND q.request_id = o.request_id
              ORDER BY o.position LOOP
        v_rate := respool._rate_part(p_pool_id, e.resources);
        v_other := respool._without_rates(p_pool_id, e.resources);
        CONTINUE WHEN v_rate = '{}' OR NOT respool._fits_room(v_other, v_free);
        v_free := respool._take_units(v_free, v_other, 1);
        v_need := respool._sum_units(ARRAY[v_need, v_rate]);
        v_policy := v_policy || jsonb_build_object(e.policy_id::text, respool._sum_units(
                        ARRAY[coalesce(v_policy -> e.policy_id::text, '{}'), v_rate]));
        v_at := respool._rate_ready_at(p_pool_id, e.policy_id, v_need, v_policy -> e.policy_id::text, p_now);
        EXIT WHEN v_at = 'infinity';
        request_id := e.request_id;
        p50_seconds := greatest(ceil(extract(epoch FROM v_at - p_now)), 0)::bigint;
        p90_seconds := p50_seconds;
        RETURN NEXT;
        EXIT WHEN e.request_id = p_until;
    END LOOP;
END $$;
COMMENT ON FUNCTION respool._rate_eta_pool(uuid, timestamptz, uuid) IS
    'The ETA in a pool with rate keys (respool._eta_pool hands over to it): for the first respool._eta_depth() queued requests, in queue order, those whose other keys fit now get the seconds until the rate units they and the requests ahead of them need have left their windows (p50 = p90: exact while nothing new is charged or settled); the others no estimate. Read-only.';

CREATE OR REPLACE FUNCTION respool._in_share_but_rates(p_pool_id uuid, p_policy_id uuid, p_resources jsonb)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- The reclaim right (docs/preemption.md) judged on the keys preemption can free: the queue's
    -- in-share test (every key the pool place bounds fits the subject's room under its reserved
    -- share, respool._queue_groups) over the request's keys but the pool's rate keys. False in
    -- a pool without rate keys (the queue's own in-share flag decides there).
    RETURN respool._pool_has_rates(p_pool_id) AND NOT EXISTS (
        SELECT FROM respool._pool_place(p_pool_id, respool._without_rates(p_pool_id, p_resources)) p
          LEFT JOIN respool.policy_resources pol ON pol.policy_id = p_policy_id AND pol.key = p.key
         WHERE p.capacity IS NOT NULL
           AND NOT respool._fits_room(p.need, respool._room(coalesce(pol.reserved, 0), coalesce(pol.used, 0))));
END $$;
COMMENT ON FUNCTION respool._in_share_but_rates(uuid, uuid, jsonb) IS
    'In a pool with rate keys: true when p_resources fit the policy''s unused reserved share of every key the pool place bounds other than the rate keys, which preemption never frees, so a request that also asks for tokens may still reclaim its reserved GPUs. False in a pool without rate keys. Read-only.';

CREATE OR REPLACE FUNCTION respool._check_node_rate_keys(p_pool_id uuid, p_capacity jsonb, p_devices jsonb)
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    k text;
BEGIN
    -- A rate key is a budget of the pool place only; no node place tracks it (docs/rates.md).
    SELECT r.key INTO k FROM respool.pool_rates r
     WHERE r.pool_id = p_pool_id AND (coalesce(p_capacity ? r.key, false) OR coalesce(p_devices ? r.key, false))
     ORDER BY r.key LIMIT 1;
    IF FOUND THEN
        PERFORM respool._fail('RP400', CASE WHEN coalesce(p_capacity ? k, false) THEN 'capacity.' ELSE 'devices.' END || k,
            format('%s is a rate key of pool %s (units per window, counted by the pool, not per machine); a node of the pool may not track it',
                   k, (SELECT name FROM respool.pools WHERE id = p_pool_id)));
    END IF;
END $$;
COMMENT ON FUNCTION respool._check_node_rate_keys(uuid, jsonb, jsonb) IS
    'Before a node joins or changes in pool p_pool_id: RP400 naming capacity.<key> (or devices.<key>) when the node''s capacity or device map names a rate key of the pool. Read-only.';
