-- Applying a manifest in one transaction (app/db/apply.py).

-- apply_pools_to_lock --
-- Ids of the existing pools an apply may touch: those named in $1, those the nodes named in $3
-- are in now, or all when $2 (prune).
SELECT id FROM respool.pools
 WHERE $2 OR name = ANY ($1::text[])
    OR id IN (SELECT pool_id FROM respool.nodes WHERE name = ANY ($3::text[]))
 ORDER BY id;

-- lock_pools --
-- Lock these pools in id order until the transaction ends.
SELECT respool.lock_pools(p_pool_ids => $1::uuid[]);

-- last_event_id --
-- The newest event id (0 when there is none): the apply reads events after it.
SELECT coalesce(max(id), 0) FROM respool.events;

-- pool_ids_by_name --
-- Ids of the pools named in $1, in id order.
SELECT id FROM respool.pools WHERE name = ANY ($1::text[]) ORDER BY id;

-- apply_events --
-- Events after id $1 of requests in (or candidates for) the pools $2, oldest first.
SELECT e.request_id, r.subject, e.from_status, e.to_status, e.reason, e.message,
       coalesce(r.pool_name, (SELECT string_agg(p.name, ',' ORDER BY p.name) FROM respool.pools p
                               WHERE p.id = ANY (r.candidate_pool_ids))) AS pool
  FROM respool.events e JOIN respool.requests r ON r.id = e.request_id
 WHERE e.id > $1 AND (r.pool_id = ANY ($2::uuid[]) OR r.candidate_pool_ids && $2::uuid[])
 ORDER BY e.id;

-- apply_overcommitted --
-- Usage above a pool capacity or a policy limit in the pools named in $1.
SELECT pool, NULL::text AS subject, key, allocated AS used, capacity AS ceiling, 'capacity' AS kind
  FROM respool.pool_usage
 WHERE pool = ANY ($1::text[]) AND capacity IS NOT NULL AND allocated > capacity
UNION ALL
SELECT pool, subject, key, used, "limit", 'limit'
  FROM respool.policy_usage
 WHERE pool = ANY ($1::text[]) AND "limit" IS NOT NULL AND used > "limit"
 ORDER BY pool, subject NULLS FIRST, key;

