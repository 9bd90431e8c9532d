-- 0011_scheduling: what SPEC §11.1-§11.4 needs (starvation guard with backfill, fair share,
-- runtime caps, ETA history).
ALTER TABLE respool.pools
    ADD COLUMN starvation_seconds integer DEFAULT 300 CHECK (starvation_seconds >= 0),
    ADD COLUMN ordering text NOT NULL DEFAULT 'fifo' CHECK (ordering IN ('fifo', 'fair'));
COMMENT ON COLUMN respool.pools.starvation_seconds IS
    'best_effort pools: once the queue head has waited this long the pool holds free units for it (EASY backfill, SPEC §11.1); NULL: never.';
COMMENT ON COLUMN respool.pools.ordering IS
    'fifo: queue order of SPEC §4; fair: at equal priority and in-share class, lower dominant share first (SPEC §11.2).';

ALTER TABLE respool.requests
    ADD COLUMN max_seconds integer CHECK (max_seconds > 0),
    ADD COLUMN run_deadline timestamptz;
COMMENT ON COLUMN respool.requests.max_seconds IS
    'Hard runtime cap: an allocation older than this ends as expired (reason max_seconds); NULL: none.';
COMMENT ON COLUMN respool.requests.run_deadline IS
    'allocated_at + max_seconds while the request holds units; the reconciler expires it there and backfill (SPEC §11.1) counts on it.';

CREATE INDEX requests_run_deadline_idx ON respool.requests (pool_id, run_deadline)
    WHERE status = 'allocated' AND run_deadline IS NOT NULL;
-- ETA (SPEC §11.4): a pool's most recent hold times.
CREATE INDEX requests_pool_finished_idx ON respool.requests (pool_id, finished_at DESC)
    WHERE finished_at IS NOT NULL AND allocated_at IS NOT NULL;

CREATE TYPE respool.pool_hold AS (
    head_id        uuid,
    need           jsonb,
    shadow         timestamptz,
    waited_seconds bigint
);
COMMENT ON TYPE respool.pool_hold IS
    'A best_effort pool holding free units for its queue head (SPEC §11.1): the head, its need on tracked keys, its shadow time (NULL: none) and how long it has waited.';
