-- Views for operations (docs/ops.md), readable by respool_reader (SELECT on views only).
-- Sums of amounts are numeric: a view never fails on a total, however many rows add up.

CREATE VIEW respool.pool_usage AS
SELECT pl.name AS pool, k.key,
       respool._effective_capacity(k.key, k.capacity) AS capacity,
       coalesce(k.used, 0) AS allocated,
       respool._effective_capacity(k.key, k.capacity) - coalesce(k.used, 0) AS free,
       coalesce(k.demand, 0) AS queued_demand
  FROM respool.pools pl
 CROSS JOIN LATERAL (
        -- The pool's keys and the queued keys. The demand is summed per queue shape (entries
        -- carry their request's resources): one pass over the queue entries, no join with
        -- requests and no per-entry JSON expansion.
        SELECT coalesce(pr.key, d.key) AS key, pr.capacity, pr.used, d.demand
          FROM (SELECT p.key, p.capacity, p.used FROM respool.pool_resources p WHERE p.pool_id = pl.id) pr
          FULL JOIN (
                SELECT x.key, sum(x.value::numeric * s.n) AS demand
                  FROM (SELECT e.resources, count(*) AS n FROM respool.queue_entries e
                         WHERE e.pool_id = pl.id GROUP BY e.resources) s
                 CROSS JOIN LATERAL jsonb_each_text(s.resources) x
                 GROUP BY x.key) d ON d.key = pr.key) k;
COMMENT ON VIEW respool.pool_usage IS
    'Per pool and key: capacity and free (NULL when untracked), allocated units, units wanted by queued requests.';

CREATE VIEW respool.policy_usage AS
SELECT pl.name AS pool, p.subject, pr.key, p.priority, pr.reserved, pr."limit", pr.used,
       CASE WHEN respool._effective_capacity(pr.key, c.capacity) IS NOT NULL
            THEN greatest(pr.used - pr.reserved, 0) ELSE 0 END AS borrowed,
       pr.np_used
  FROM respool.policy_resources pr
  JOIN respool.policies p ON p.id = pr.policy_id
  JOIN respool.pools pl ON pl.id = p.pool_id
  LEFT JOIN respool.pool_resources c ON c.pool_id = p.pool_id AND c.key = pr.key;
COMMENT ON VIEW respool.policy_usage IS
    'Per policy and key: reserved, limit, used, borrowed (used above reserved on tracked keys), non-preemptible used.';

CREATE VIEW respool.queue AS
SELECT pl.name AS pool, q.position, q.request_id, q.subject, qe.resources, r.preemptible, q.priority,
       q.in_share, extract(epoch FROM now() - r.queued_at)::double precision AS waiting_seconds,
       r.max_seconds, h.head_id AS held_for,
       CASE WHEN h.head_id IS NOT NULL THEN respool._held_back(pl.id, r, now(), h) END AS held_message,
       eta.p50_seconds AS eta_p50_seconds, eta.p90_seconds AS eta_p90_seconds, r.gang_id
  FROM respool.pools pl
 CROSS JOIN LATERAL respool._pool_hold(pl.id, now()) h
 CROSS JOIN LATERAL respool._queue_order(pl.id) q
  JOIN respool.requests r ON r.id = q.request_id
  JOIN respool.queue_entries qe ON qe.pool_id = pl.id AND qe.request_id = q.request_id
  LEFT JOIN (SELECT p2.id AS pool_id, e.* FROM respool.pools p2
               CROSS JOIN LATERAL respool._eta_pool(p2.id, now()) e) eta  -- one simulation per pool
         ON eta.pool_id = pl.id AND eta.request_id = q.request_id;
COMMENT ON VIEW respool.queue IS
    'One row per (pool, waiting request), in grant order; held_for: the head the pool holds free units for (docs/scheduling.md, starvation guard), held_message when that hold keeps this row back; eta_*: its ETA in this pool (docs/scheduling.md, ETA); gang_id: a gang waits as one row, its first member''s, holding its members'' summed resources (docs/scheduling.md, gangs).';

CREATE VIEW respool.request_events AS
SELECT request_id, at, from_status, to_status, reason, attempt, message
  FROM respool.events;
COMMENT ON VIEW respool.request_events IS 'Append-only history of request status changes.';

CREATE VIEW respool.invariant_violations AS
WITH held AS (
    SELECT r.pool_id, r.policy_id, x.key, x.value::numeric AS amount,
           coalesce((r.np_charge ->> x.key)::numeric, 0) AS np_amount
      FROM respool.requests r CROSS JOIN LATERAL jsonb_each_text(r.resources) x
     WHERE r.status IN ('allocated', 'preempting')
), pool_sums AS (
    SELECT pool_id, key, sum(amount) AS used FROM held GROUP BY pool_id, key
), policy_sums AS (
    SELECT policy_id, key, sum(amount) AS used, sum(np_amount) AS np_used FROM held GROUP BY policy_id, key
)
SELECT 'I1' AS invariant, pl.name AS pool, NULL::text AS subject, s.key,
       format('allocated %s > capacity %s', s.used, respool._effective_capacity(s.key, c.capacity)) AS detail
  FROM pool_sums s JOIN respool.pools pl ON pl.id = s.pool_id
  LEFT JOIN respool.pool_resources c ON c.pool_id = s.pool_id AND c.key = s.key
 WHERE s.used > respool._effective_capacity(s.key, c.capacity)
UNION ALL
SELECT 'I2', pl.name, p.subject, s.key, format('allocated %s > limit %s', s.used, pr."limit")
  FROM policy_sums s JOIN respool.policies p ON p.id = s.policy_id JOIN respool.pools pl ON pl.id = p.pool_id
  JOIN respool.policy_resources pr ON pr.policy_id = s.policy_id AND pr.key = s.key
 WHERE s.used > pr."limit"
UNION ALL
SELECT 'I3', pl.name, p.subject, s.key, format('non-preemptible %s > reserved %s', s.np_used, coalesce(pr.reserved, 0))
  FROM policy_sums s JOIN respool.policies p ON p.id = s.policy_id JOIN respool.pools pl ON pl.id = p.pool_id
  LEFT JOIN respool.policy_resources pr ON pr.policy_id = s.policy_id AND pr.key = s.key
 WHERE s.np_used > coalesce(pr.reserved, 0)
UNION ALL
SELECT 'I4', pl.name, NULL, c.key, format('pool counter %s <> held sum %s', c.used, coalesce(s.used, 0))
  FROM respool.pool_resources c JOIN respool.pools pl ON pl.id = c.pool_id
  LEFT JOIN pool_sums s ON s.pool_id = c.pool_id AND s.key = c.key
 WHERE c.used <> coalesce(s.used, 0)
UNION ALL
SELECT 'I4', pl.name, NULL, s.key, format('pool counter missing, held sum %s', s.used)
  FROM pool_sums s JOIN respool.pools pl ON pl.id = s.pool_id
 WHERE NOT EXISTS (SELECT FROM respool.pool_resources c WHERE c.pool_id = s.pool_id AND c.key = s.key)
UNION ALL
SELECT 'I4', pl.name, p.subject, c.key,
       format('policy counters used %s / np %s <> held sums %s / %s', c.used, c.np_used,
              coalesce(s.used, 0), coalesce(s.np_used, 0))
  FROM respool.policy_resources c JOIN respool.policies p ON p.id = c.policy_id
  JOIN respool.pools pl ON pl.id = p.pool_id
  LEFT JOIN policy_sums s ON s.policy_id = c.policy_id AND s.key = c.key
 WHERE c.used <> coalesce(s.used, 0) OR c.np_used <> coalesce(s.np_used, 0)
UNION ALL
SELECT 'I4', NULL, p.subject, s.key, format('policy counter missing, held sum %s', s.used)
  FROM policy_sums s LEFT JOIN respool.policies p ON p.id = s.policy_id
 WHERE NOT EXISTS (SELECT FROM respool.policy_resources c WHERE c.policy_id = s.policy_id AND c.key = s.key);
COMMENT ON VIEW respool.invariant_violations IS
    'One row per broken invariant I1-I4 (docs/preemption.md, invariants), computed from the requests that hold units; empty when healthy. I1/I2 may show briefly after a shrink, until the reconciler acts.';

GRANT USAGE ON SCHEMA respool TO respool_reader;
GRANT SELECT ON respool.pool_usage, respool.policy_usage, respool.queue, respool.request_events,
                respool.invariant_violations TO respool_reader;
