-- 0021_jobs: jobs (requests that carry a command) and node agents that run them (docs/jobs.md).

ALTER TABLE respool.requests
    ADD COLUMN command jsonb CHECK (command IS NULL OR jsonb_typeof(command) = 'array'),
    ADD COLUMN job_env jsonb CHECK (job_env IS NULL OR jsonb_typeof(job_env) = 'object'),
    ADD COLUMN workdir text,
    ADD COLUMN job_name text,
    ADD COLUMN array_index integer CHECK (array_index >= 0),
    ADD COLUMN claimed_node_id uuid,
    ADD COLUMN claimed_attempt integer,
    ADD COLUMN claimed_at timestamptz,
    ADD COLUMN exit_code integer;
COMMENT ON COLUMN respool.requests.command IS 'A job''s argv (JSON array of strings); NULL: not a job.';
COMMENT ON COLUMN respool.requests.job_env IS
    'A job''s environment {NAME: value}. The values are shown only to the agent that claims the job: never in documents, events, logs or metrics.';
COMMENT ON COLUMN respool.requests.array_index IS 'Member index of an array batch (RESPOOL_ARRAY_INDEX).';
COMMENT ON COLUMN respool.requests.claimed_node_id IS 'The node whose agent claimed the job (NULL: a pool agent, or unclaimed).';
COMMENT ON COLUMN respool.requests.claimed_attempt IS 'The attempt an agent claimed; one claim per attempt.';
COMMENT ON COLUMN respool.requests.exit_code IS 'The exit code a release reported (the job''s last run).';
CREATE INDEX requests_jobs_idx ON respool.requests (pool_id) WHERE command IS NOT NULL AND status IN ('allocated', 'preempting');

CREATE TABLE respool.job_logs (
    request_id uuid NOT NULL REFERENCES respool.requests (id) ON DELETE CASCADE,
    attempt    integer NOT NULL CHECK (attempt >= 1),
    seq        integer NOT NULL,  -- -1 - seq: the head part of chunk seq, whose rest is in the tail
    stream     text NOT NULL CHECK (stream IN ('stdout', 'stderr')),
    data       text NOT NULL,
    bytes      integer NOT NULL CHECK (bytes >= 0),
    head       boolean NOT NULL,
    PRIMARY KEY (request_id, attempt, seq)
);
COMMENT ON TABLE respool.job_logs IS
    'Output chunks of a job''s attempts, numbered by seq. head: part of the first half of the per-attempt bound (kept); the others are the tail (oldest dropped first).';

CREATE TABLE respool.job_log_attempts (
    request_id    uuid NOT NULL REFERENCES respool.requests (id) ON DELETE CASCADE,
    attempt       integer NOT NULL CHECK (attempt >= 1),
    head_bytes    bigint NOT NULL DEFAULT 0 CHECK (head_bytes >= 0),
    tail_bytes    bigint NOT NULL DEFAULT 0 CHECK (tail_bytes >= 0),
    dropped_bytes bigint NOT NULL DEFAULT 0 CHECK (dropped_bytes >= 0),
    last_seq      integer NOT NULL DEFAULT -1,
    PRIMARY KEY (request_id, attempt)
);
COMMENT ON TABLE respool.job_log_attempts IS
    'Per attempt of a job: bytes kept in the head and the tail, bytes dropped between them, and the last seq stored (a seq at or below it is a retried send, ignored). The row is the lock appends of one attempt take.';

ALTER TABLE respool.tokens DROP CONSTRAINT tokens_role_check;
ALTER TABLE respool.tokens ADD CONSTRAINT tokens_role_check CHECK (role IN ('admin', 'client', 'reader', 'agent'));
ALTER TABLE respool.tokens
    ADD COLUMN node_id uuid,
    ADD COLUMN pool_id uuid,
    ADD CONSTRAINT agent_bound CHECK ((role = 'agent') = (num_nonnulls(node_id, pool_id) = 1));
COMMENT ON COLUMN respool.tokens.node_id IS 'Agent tokens: the node whose jobs it may run.';
COMMENT ON COLUMN respool.tokens.pool_id IS 'Agent tokens of a pool without nodes: the pool whose jobs it may run.';

ALTER TABLE respool.nodes
    ADD COLUMN agent text CHECK (agent IN ('ready', 'lost')),
    ADD COLUMN agent_seen_at timestamptz,
    ADD COLUMN agent_interval_seconds integer CHECK (agent_interval_seconds BETWEEN 1 AND 300);
COMMENT ON COLUMN respool.nodes.agent IS
    'The node''s agent: ready (heard within 3 of its intervals), lost (not heard since), NULL (no agent ever ran here). A lost node takes no new jobs.';
