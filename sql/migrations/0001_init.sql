-- 0001_init: the allocation engine's tables.
-- Counters live on one row per (pool, key) and per (policy, key); every allocation updates them
-- with a guarded UPDATE, and CHECK constraints make a counting bug fail loudly.
CREATE SCHEMA IF NOT EXISTS respool;

CREATE TABLE respool.pools (
    id                       uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name                     text NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
    description              text NOT NULL DEFAULT '',
    queueing                 text NOT NULL DEFAULT 'best_effort'
                                  CHECK (queueing IN ('best_effort', 'strict')),
    preemption_grace_seconds integer NOT NULL DEFAULT 0 CHECK (preemption_grace_seconds >= 0),
    created_at               timestamptz NOT NULL DEFAULT now(),
    updated_at               timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE respool.pools IS 'Published capacity. The row is the lock every allocation in the pool takes first.';

CREATE TABLE respool.pool_resources (
    pool_id  uuid NOT NULL REFERENCES respool.pools (id) ON DELETE CASCADE,
    key      text NOT NULL CHECK (key ~ '^[a-z][a-z0-9_]{0,62}$'),
    capacity bigint CHECK (capacity > 0),
    used     bigint NOT NULL DEFAULT 0 CHECK (used >= 0),
    PRIMARY KEY (pool_id, key)
);
COMMENT ON TABLE respool.pool_resources IS 'Capacity and allocated units per pool and key.';
COMMENT ON COLUMN respool.pool_resources.capacity IS 'NULL: the pool does not track the key (soft keys: unbounded; other keys: 0).';
COMMENT ON COLUMN respool.pool_resources.used IS 'Units held by allocated and preempting requests (I4).';

CREATE TABLE respool.policies (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    subject     text NOT NULL CHECK (subject ~ '^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,127}$'),
    pool_id     uuid NOT NULL REFERENCES respool.pools (id) ON DELETE CASCADE,
    priority    integer NOT NULL DEFAULT 0,
    description text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (subject, pool_id)
);
CREATE INDEX policies_pool_idx ON respool.policies (pool_id);
COMMENT ON TABLE respool.policies IS 'Binds a subject to a pool with a priority, reserved shares and limits.';

CREATE TABLE respool.policy_resources (
    policy_id uuid NOT NULL REFERENCES respool.policies (id) ON DELETE CASCADE,
    key       text NOT NULL CHECK (key ~ '^[a-z][a-z0-9_]{0,62}$'),
    reserved  bigint NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    "limit"   bigint CHECK ("limit" > 0),
    used      bigint NOT NULL DEFAULT 0 CHECK (used >= 0),
    np_used   bigint NOT NULL DEFAULT 0 CHECK (np_used >= 0 AND np_used <= used),
    PRIMARY KEY (policy_id, key),
    CONSTRAINT reserved_within_limit CHECK ("limit" IS NULL OR reserved <= "limit"),
    CONSTRAINT np_within_reserved CHECK (np_used <= reserved)
);
COMMENT ON TABLE respool.policy_resources IS 'Reserved share, limit and usage counters per policy and key.';
COMMENT ON COLUMN respool.policy_resources."limit" IS 'NULL: no limit beyond the pool.';
COMMENT ON COLUMN respool.policy_resources.np_used IS 'Units of tracked keys held by non-preemptible requests (I3 is a CHECK).';

CREATE TABLE respool.requests (
    id                 uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    subject            text NOT NULL CHECK (subject ~ '^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,127}$'),
    pool_ref           text,
    pool_id            uuid,
    pool_name          text,
    policy_id          uuid,
    candidate_pool_ids uuid[] NOT NULL DEFAULT '{}',
    resources          jsonb NOT NULL,
    np_charge          jsonb NOT NULL DEFAULT '{}',
    preemptible        boolean NOT NULL DEFAULT true,
    priority           integer NOT NULL DEFAULT 0,
    status             text NOT NULL CHECK (status IN ('queued', 'allocated', 'preempting', 'released',
                                                       'preempted', 'expired', 'cancelled', 'rejected')),
    reason             text,
    message            text NOT NULL DEFAULT '',
    attempt            integer NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    max_retries        integer NOT NULL DEFAULT 0 CHECK (max_retries >= 0),
    lease_seconds      integer CHECK (lease_seconds > 0),
    lease_expires_at   timestamptz,
    preempt_deadline   timestamptz,
    idempotency_key    text CHECK (length(idempotency_key) BETWEEN 1 AND 200),
    request_body       jsonb,
    labels             jsonb NOT NULL DEFAULT '{}',
    version            bigint NOT NULL DEFAULT 1,
    queued_at          timestamptz NOT NULL,
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,
    allocated_at       timestamptz,
    finished_at        timestamptz,
    CONSTRAINT idempotency UNIQUE (subject, idempotency_key),
    CONSTRAINT holder_has_pool CHECK (status NOT IN ('allocated', 'preempting')
                                      OR (pool_id IS NOT NULL AND policy_id IS NOT NULL
                                          AND allocated_at IS NOT NULL))
);
CREATE INDEX requests_holding_idx ON respool.requests (pool_id, allocated_at DESC)
    WHERE status IN ('allocated', 'preempting');
CREATE INDEX requests_lease_idx ON respool.requests (lease_expires_at)
    WHERE status = 'allocated' AND lease_expires_at IS NOT NULL;
CREATE INDEX requests_created_idx ON respool.requests (created_at DESC, id DESC);
CREATE INDEX requests_subject_idx ON respool.requests (subject, created_at DESC);
CREATE INDEX requests_finished_idx ON respool.requests (finished_at) WHERE finished_at IS NOT NULL;
COMMENT ON TABLE respool.requests IS 'Resource requests and their state machine (docs/engine.md).';
COMMENT ON COLUMN respool.requests.candidate_pool_ids IS 'Pools the request may be granted in; fixed at creation. Locked, in id order, before the request row.';
COMMENT ON COLUMN respool.requests.np_charge IS 'Units charged to policy_resources.np_used at grant time, returned at release.';
COMMENT ON COLUMN respool.requests.request_body IS 'Normalised create body, compared on an idempotent retry.';
COMMENT ON COLUMN respool.requests.queued_at IS 'Queue time; kept when a preempted request is requeued.';

CREATE TABLE respool.queue_entries (
    pool_id    uuid NOT NULL REFERENCES respool.pools (id),
    request_id uuid NOT NULL REFERENCES respool.requests (id) ON DELETE CASCADE,
    policy_id  uuid NOT NULL REFERENCES respool.policies (id),
    queued_at  timestamptz NOT NULL,
    PRIMARY KEY (pool_id, request_id)
);
CREATE INDEX queue_entries_request_idx ON respool.queue_entries (request_id);
CREATE INDEX queue_entries_policy_idx ON respool.queue_entries (policy_id);
COMMENT ON TABLE respool.queue_entries IS 'One row per (candidate pool, queued request); removed when the request leaves the queue.';

CREATE TABLE respool.events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    request_id  uuid NOT NULL REFERENCES respool.requests (id) ON DELETE CASCADE,
    at          timestamptz NOT NULL,
    from_status text,
    to_status   text NOT NULL,
    reason      text,
    attempt     integer NOT NULL,
    message     text NOT NULL DEFAULT ''
);
CREATE INDEX events_request_idx ON respool.events (request_id, id);
CREATE INDEX events_at_idx ON respool.events (at);
COMMENT ON TABLE respool.events IS 'Append-only history of request status changes (rows leave only with their request).';

CREATE FUNCTION respool.forbid_event_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'respool.events is append-only' USING ERRCODE = 'RP500';
END $$;
COMMENT ON FUNCTION respool.forbid_event_update() IS 'Guarantees event rows are never rewritten.';
CREATE TRIGGER events_append_only BEFORE UPDATE ON respool.events
    FOR EACH ROW EXECUTE FUNCTION respool.forbid_event_update();

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'respool_reader') THEN
        CREATE ROLE respool_reader NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;  -- another database of this cluster created it at the same moment
END $$;
ALTER ROLE respool_reader SET statement_timeout = '30s';
ALTER ROLE respool_reader SET default_transaction_read_only = on;
