-- Metrics reads for GET /metrics (app/db/metrics.py); the dashboard reuses some of them.

-- request_counts --
-- Number of stored requests per status.
SELECT status, count(*) AS n FROM respool.requests GROUP BY status;

-- pool_key_rows --
-- Per pool and key: respool.pool_usage plus the policies' reserved and borrowed sums; sums stay
-- numeric (no total of many amounts can overflow). A rate key (docs/rates.md) has its window
-- and next refill.
SELECT u.pool, u.key, u.capacity, u.allocated, u.free, u.queued_demand,
       coalesce(p.reserved, 0) AS reserved, coalesce(p.borrowed, 0) AS borrowed,
       r.per_seconds, r.next_refill_at
  FROM respool.pool_usage u
  LEFT JOIN (SELECT pool, key, sum(reserved) AS reserved, sum(borrowed) AS borrowed
               FROM respool.policy_usage GROUP BY pool, key) p
    ON p.pool = u.pool AND p.key = u.key
  LEFT JOIN respool.rate_usage r ON r.pool = u.pool AND r.key = u.key AND r.subject IS NULL
 ORDER BY u.pool, u.key;

-- rate_rows --
-- Per pool and rate key (subject NULL) and per policy counter of it: respool.rate_usage, with the
-- seconds until the oldest charge inside the window leaves it (0: none inside).
SELECT pool, subject, key, amount, per_seconds, used, overrun,
       coalesce(greatest(extract(epoch FROM next_refill_at - now()), 0), 0)::float8 AS refill_seconds
  FROM respool.rate_usage
 ORDER BY pool, subject, key;

-- policy_rows --
-- Per policy and key: priority, reserved, limit, usage and borrowing.
SELECT pool, subject, key, priority, reserved::bigint, "limit"::bigint, used::bigint,
       borrowed::bigint, np_used::bigint
  FROM respool.policy_usage
 ORDER BY pool, subject, key;

-- policy_shape_rows --
-- Per policy (keys or not): whether it is inside one of its windows now, and for a pattern
-- policy how many subjects it covers now (respool.policy_subjects); NULL for an exact subject.
SELECT pl.name AS pool, p.subject, p.active,
       CASE WHEN p.is_pattern THEN (SELECT count(DISTINCT s.subject) FROM respool.policy_subjects s
                                     WHERE s.pool = pl.name AND s.policy_subject = p.subject) END
           AS covered_subjects
  FROM respool.policies p JOIN respool.pools pl ON pl.id = p.pool_id
 ORDER BY pl.name, p.subject;

-- node_key_rows --
-- Per node and key it tracks: respool.node_usage (pool NULL: a node in no pool).
SELECT pool, node, state, key, capacity, allocated, free FROM respool.node_usage;

-- device_rows --
-- Per shared device (docs/placement.md, "Sharing a GPU"): respool.device_usage, devices of a key
-- with a sharing mode only (pool NULL: a node in no pool).
SELECT pool, node, key, device, memory_mb, memory_used, slices
  FROM respool.device_usage
 WHERE sharing IS NOT NULL;

-- node_states --
-- Every node with its pool and state, keys or not (respool.node_usage has a row per key only).
SELECT pl.name AS pool, n.name AS node, n.state
  FROM respool.nodes n LEFT JOIN respool.pools pl ON pl.id = n.pool_id
 ORDER BY n.name;

-- queue_stats --
-- Per pool with a queue: waiting requests and how long the oldest has waited.
SELECT pool, count(*) AS n, max(waiting_seconds) AS oldest FROM respool.queue GROUP BY pool;

-- invariant_violation_counts --
-- Number of broken accounting invariants, per invariant.
SELECT invariant, count(*) AS n FROM respool.invariant_violations GROUP BY invariant;

-- database_now --
-- The database clock (the transaction's start time).
SELECT now();

-- tally_events --
-- Every event since $1, oldest first, with what the metrics count about it.
SELECT e.id, e.at, r.pool_name AS pool, e.to_status, e.reason,
       (e.to_status = 'preempting' OR (e.to_status = 'preempted'
        AND e.from_status IS DISTINCT FROM 'preempting')) AS preemption,
       (e.to_status IN ('released', 'rejected', 'cancelled', 'expired')
        OR (e.to_status = 'preempted' AND NOT EXISTS (
            SELECT FROM respool.events n WHERE n.request_id = e.request_id
               AND n.id > e.id AND n.from_status = 'preempted'))) AS final,
       CASE WHEN e.to_status = 'allocated' AND e.from_status IS DISTINCT FROM 'allocated' THEN extract(epoch FROM e.at - (
            SELECT q.at FROM respool.events q WHERE q.request_id = e.request_id
               AND q.id < e.id AND q.to_status = 'queued'
             ORDER BY q.id DESC LIMIT 1))::double precision END AS wait_seconds
  FROM respool.events e JOIN respool.requests r ON r.id = e.request_id
 WHERE e.at >= $1
 ORDER BY e.id;

-- slice_overuse_rows --
-- Per pool and <K>_memory_mb key: holders whose last reported use is above their slice now, and
-- by how many MiB in all (docs/placement.md, "Sharing a GPU").
SELECT r.pool_name AS pool, s.key, count(*) FILTER (WHERE s.over) AS holders,
       coalesce(sum(s.used - s.slice) FILTER (WHERE s.over), 0) AS over_mb
  FROM respool.slice_use s
  JOIN respool.requests r ON r.id = s.request_id AND r.attempt = s.attempt
 WHERE r.status IN ('allocated', 'preempting') AND r.pool_name IS NOT NULL
 GROUP BY r.pool_name, s.key
 ORDER BY r.pool_name, s.key;
