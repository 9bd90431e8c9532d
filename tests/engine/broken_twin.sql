-- TEST ONLY: a deliberately broken allocation path, installed by tests/engine/test_storm.py
-- into that test's own throw-away database to prove the invariant auditor can fail.
-- Never part of the migrations.

-- Admits everything: no capacity, limit or reserved-share check.
CREATE OR REPLACE FUNCTION respool._blocker(p_resources jsonb, p_preemptible boolean, p_pool_id uuid, p_policy_id uuid)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT NULL::text
$$;

-- Charges the counters without the guarded WHERE clauses (plain used = used + n).
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
        UPDATE respool.pool_resources SET used = used + n
         WHERE pool_id = p_pool_id AND key = k
        RETURNING capacity IS NOT NULL INTO tracked;
        IF NOT FOUND THEN
            INSERT INTO respool.pool_resources (pool_id, key, used) VALUES (p_pool_id, k, n);
            tracked := false;
        END IF;
        IF NOT r.preemptible AND tracked THEN
            np := np || jsonb_build_object(k, n);
        END IF;
        UPDATE respool.policy_resources
           SET used = used + n, np_used = np_used + coalesce((np ->> k)::bigint, 0)
         WHERE policy_id = p_policy_id AND key = k;
        IF NOT FOUND THEN
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
           lease_expires_at = p_now + make_interval(secs => lease_seconds)
     WHERE id = p_request_id;
    PERFORM respool._set_status(p_request_id, 'allocated', NULL, '', p_now);
END $$;
