-- 0019_hold_nodes: the starvation guard in a pool with nodes holds only the nodes its head could
-- use (docs/scheduling.md, docs/placement.md): a hold carries its pool and those nodes.

ALTER TYPE respool.pool_hold ADD ATTRIBUTE pool_id uuid, ADD ATTRIBUTE nodes uuid[];
COMMENT ON TYPE respool.pool_hold IS
    'A best_effort pool holding free units for its queue head: the head, its need on tracked keys, its shadow time (NULL: none), how long it has waited, the pool, and in a pool with nodes the active nodes that match the head and could hold it (only their free units are held; NULL in a pool without nodes).';
