-- The minimal same-essentials allocator cycle (python -m bench baseline; docs/benchmarks.md).
--
-- What every allocator of this kind must do, and nothing more: a request row; guarded counters
-- per key on the pool and on the subject's policy; an event row per status change; the pool row
-- as the lock; a NOTIFY on release. No candidate pools, queue entries, idempotency, validation,
-- JSON answers, rejections, leases or preemption bookkeeping. The engine's cycle is measured
-- against this one on the same server in the same run.

DROP SCHEMA IF EXISTS bench_min CASCADE;
CREATE SCHEMA bench_min;

CREATE TABLE bench_min.pools (
    id   serial PRIMARY KEY,
    name text NOT NULL UNIQUE
);

CREATE TABLE bench_min.pool_counters (
    pool_id  integer NOT NULL REFERENCES bench_min.pools (id),
    key      text NOT NULL,
    capacity bigint NOT NULL,
    used     bigint NOT NULL DEFAULT 0 CHECK (used >= 0 AND used <= capacity),
    PRIMARY KEY (pool_id, key)
);

CREATE TABLE bench_min.policies (
    id      serial PRIMARY KEY,
    subject text NOT NULL,
    pool_id integer NOT NULL REFERENCES bench_min.pools (id),
    UNIQUE (subject, pool_id)
);

CREATE TABLE bench_min.policy_counters (
    policy_id integer NOT NULL REFERENCES bench_min.policies (id),
    key       text NOT NULL,
    "limit"   bigint,
    used      bigint NOT NULL DEFAULT 0 CHECK (used >= 0),
    PRIMARY KEY (policy_id, key)
);

CREATE TABLE bench_min.requests (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    policy_id    integer NOT NULL REFERENCES bench_min.policies (id),
    pool_id      integer NOT NULL REFERENCES bench_min.pools (id),
    resources    jsonb NOT NULL,
    status       text NOT NULL CHECK (status IN ('queued', 'allocated', 'released')),
    created_at   timestamptz NOT NULL,
    allocated_at timestamptz,
    finished_at  timestamptz
);

CREATE TABLE bench_min.events (
    id          bigserial PRIMARY KEY,
    request_id  uuid NOT NULL REFERENCES bench_min.requests (id) ON DELETE CASCADE,
    from_status text,
    to_status   text NOT NULL,
    at          timestamptz NOT NULL
);
CREATE INDEX ON bench_min.events (request_id);

-- Create a request and grant it at once when every key fits (guarded counters); else queued.
CREATE FUNCTION bench_min.create_request(p_subject text, p_pool text, p_resources jsonb)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    v_pool integer;
    v_policy integer;
    v_id uuid;
    v_keys integer;
    v_pool_rows integer;
    v_policy_rows integer;
BEGIN
    SELECT id INTO v_pool FROM bench_min.pools WHERE name = p_pool FOR NO KEY UPDATE;
    SELECT id INTO v_policy FROM bench_min.policies WHERE subject = p_subject AND pool_id = v_pool;
    INSERT INTO bench_min.requests (policy_id, pool_id, resources, status, created_at)
    VALUES (v_policy, v_pool, p_resources, 'queued', now())
    RETURNING id INTO v_id;
    INSERT INTO bench_min.events (request_id, from_status, to_status, at) VALUES (v_id, NULL, 'queued', now());
    SELECT count(*) INTO v_keys FROM jsonb_object_keys(p_resources);
    UPDATE bench_min.pool_counters c SET used = c.used + r.n
      FROM (SELECT key, value::bigint AS n FROM jsonb_each_text(p_resources)) r
     WHERE c.pool_id = v_pool AND c.key = r.key AND c.used + r.n <= c.capacity;
    GET DIAGNOSTICS v_pool_rows = ROW_COUNT;
    IF v_pool_rows <> v_keys THEN
        RAISE EXCEPTION 'bench: the pool is full (never in this benchmark)';
    END IF;
    UPDATE bench_min.policy_counters c SET used = c.used + r.n
      FROM (SELECT key, value::bigint AS n FROM jsonb_each_text(p_resources)) r
     WHERE c.policy_id = v_policy AND c.key = r.key AND (c."limit" IS NULL OR c.used + r.n <= c."limit");
    GET DIAGNOSTICS v_policy_rows = ROW_COUNT;
    IF v_policy_rows <> v_keys THEN
        RAISE EXCEPTION 'bench: over the limit (never in this benchmark)';
    END IF;
    UPDATE bench_min.requests SET status = 'allocated', allocated_at = now() WHERE id = v_id;
    INSERT INTO bench_min.events (request_id, from_status, to_status, at) VALUES (v_id, 'queued', 'allocated', now());
    RETURN v_id;
END $$;

-- Release a held request: counters back, an event, a NOTIFY for the pool's waiters.
CREATE FUNCTION bench_min.release_request(p_id uuid)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    r bench_min.requests;
BEGIN
    SELECT * INTO r FROM bench_min.requests WHERE id = p_id;
    PERFORM 1 FROM bench_min.pools WHERE id = r.pool_id FOR NO KEY UPDATE;
    SELECT * INTO r FROM bench_min.requests WHERE id = p_id FOR UPDATE;
    IF r.status <> 'allocated' THEN
        RETURN false;
    END IF;
    UPDATE bench_min.pool_counters c SET used = c.used - x.value::bigint
      FROM jsonb_each_text(r.resources) x WHERE c.pool_id = r.pool_id AND c.key = x.key;
    UPDATE bench_min.policy_counters c SET used = c.used - x.value::bigint
      FROM jsonb_each_text(r.resources) x WHERE c.policy_id = r.policy_id AND c.key = x.key;
    UPDATE bench_min.requests SET status = 'released', finished_at = now() WHERE id = p_id;
    INSERT INTO bench_min.events (request_id, from_status, to_status, at) VALUES (p_id, 'allocated', 'released', now());
    PERFORM pg_notify('bench_min_pool', r.pool_id::text);
    RETURN true;
END $$;
