-- 0027_comments_in_own_words: the catalog comments of 0011 and 0012 point to the user docs.
COMMENT ON COLUMN respool.pools.starvation_seconds IS
    'best_effort pools: once the queue head has waited this long the pool holds free units for it (EASY backfill, docs/scheduling.md); NULL: never.';
COMMENT ON COLUMN respool.pools.ordering IS
    'fifo: queue order of docs/admission.md; fair: at equal priority and in-share class, lower dominant share first (docs/scheduling.md).';
COMMENT ON COLUMN respool.requests.run_deadline IS
    'allocated_at + max_seconds while the request holds units; the reconciler expires it there and backfill (docs/scheduling.md) counts on it.';
COMMENT ON TYPE respool.pool_hold IS
    'A best_effort pool holding free units for its queue head (docs/scheduling.md): the head, its need on tracked keys, its shadow time (NULL: none) and how long it has waited.';
COMMENT ON COLUMN respool.requests.gang_id IS
    'The gang (all_or_nothing batch, docs/scheduling.md) the request belongs to; NULL for a request on its own.';
