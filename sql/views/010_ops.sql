-- Views for operations (docs/ops.md), readable by respool_reader (SELECT on views only).
-- Sums of amounts are numeric: a view never fails on a total, however many rows add up.

CREATE VIEW respool.pool_usage AS
SELECT pl.name AS pool, k.key,
       respool._effective_capacity(k.key, k.capacity) AS capacity,
       (coalesce(k.used, 0) - coalesce(k.left_window, 0))::bigint AS allocated,
       (respool._effective_capacity(k.key, k.capacity) - (coalesce(k.used, 0) - coalesce(k.left_window, 0)))::bigint AS free,
       coalesce(k.demand, 0) AS queued_demand
  FROM respool.pools pl
 CROSS JOIN LATERAL (
        -- The pool's keys and the queued keys. The demand is summed per queue shape (entries
        -- carry their request's resources): one pass over the queue entries, no join with
        -- requests and no per-entry JSON expansion.
        SELECT coalesce(pr.key, d.key) AS key, pr.capacity, pr.used, d.demand,
               -- a rate key (docs/rates.md): counted charges that have left the window by now
               (SELECT sum(c.amount) FROM respool.pool_rates rk JOIN respool.rate_charges c
                    ON c.pool_id = rk.pool_id AND c.key = rk.key AND c.counted
                   AND c.at <= now() - make_interval(secs => rk.per_seconds)
                 WHERE rk.pool_id = pl.id AND rk.key = pr.key) AS left_window
          FROM (SELECT p.key, p.capacity, p.used FROM respool.pool_resources p WHERE p.pool_id = pl.id) pr
          FULL JOIN (
                SELECT x.key, sum(x.value::numeric * s.n) AS demand
                  FROM (SELECT e.resources, count(*) AS n FROM respool.queue_entries e
                         WHERE e.pool_id = pl.id GROUP BY e.resources) s
                 CROSS JOIN LATERAL jsonb_each_text(s.resources) x
                 GROUP BY x.key) d ON d.key = pr.key) k
 ORDER BY pl.name, k.key;
COMMENT ON VIEW respool.pool_usage IS
    'Per pool and key: capacity and free (NULL when untracked), allocated units (a rate key: the charges inside its window now, docs/rates.md), units wanted by queued requests.';

CREATE VIEW respool.policy_usage AS
SELECT pl.name AS pool, p.subject, pr.key, p.priority, pr.reserved, pr."limit", (pr.used - w.left_window)::bigint AS used,
       CASE WHEN respool._effective_capacity(pr.key, c.capacity) IS NOT NULL
            THEN greatest(pr.used - w.left_window - pr.reserved, 0)::bigint ELSE 0 END AS borrowed,
       pr.np_used,
       -- Policy shapes (docs/preemption.md, "Policy shapes"): the share as set, whether the
       -- policy is inside one of its windows now, and whether it is a priority lane.
       pr.configured, p.active, p.priority_lane
  FROM respool.policy_resources pr
  JOIN respool.policies p ON p.id = pr.policy_id
  JOIN respool.pools pl ON pl.id = p.pool_id
  LEFT JOIN respool.pool_resources c ON c.pool_id = p.pool_id AND c.key = pr.key
  -- a rate key (docs/rates.md): counted charges that have left the window by now
 CROSS JOIN LATERAL (
        SELECT coalesce((SELECT sum(ch.amount) FROM respool.pool_rates rk JOIN respool.rate_charges ch
                            ON ch.policy_id = p.id AND ch.key = rk.key AND ch.counted
                           AND ch.at <= now() - make_interval(secs => rk.per_seconds)
                         WHERE rk.pool_id = p.pool_id AND rk.key = pr.key), 0) AS left_window) w
 ORDER BY pl.name, p.subject, pr.key;
COMMENT ON VIEW respool.policy_usage IS
    'Per policy and key: reserved (the share in force now, as the engine uses it: configured while the policy is active, 0 outside its windows), limit, used (a rate key: inside its window now), borrowed (used above the share in force, on tracked keys), non-preemptible used, configured (the share the operator set), active, priority_lane (docs/preemption.md, policy shapes). A pattern policy''s counters are shared by every subject it covers (respool.policy_subjects splits them).';

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
         ON eta.pool_id = pl.id AND eta.request_id = q.request_id
 ORDER BY pl.name, q.position;
COMMENT ON VIEW respool.queue IS
    'One row per (pool, waiting request), in grant order; held_for: the head the pool holds free units for (docs/scheduling.md, starvation guard), held_message when that hold keeps this row back; eta_*: its ETA in this pool (docs/scheduling.md, ETA); gang_id: a gang waits as one row, its first member''s, holding its members'' summed resources (docs/scheduling.md, gangs).';

CREATE VIEW respool.request_events AS
SELECT request_id, at, from_status, to_status, reason, attempt, message
  FROM respool.events
 ORDER BY at, id;
COMMENT ON VIEW respool.request_events IS 'Append-only history of request status changes.';

CREATE VIEW respool.invariant_violations AS
WITH held AS (
    SELECT r.pool_id, r.policy_id, x.key, x.value::numeric AS amount,
           coalesce((r.np_charge ->> x.key)::numeric, 0) AS np_amount
      FROM respool.requests r CROSS JOIN LATERAL jsonb_each_text(r.resources) x
     WHERE r.status IN ('allocated', 'preempting')
       AND NOT EXISTS (SELECT FROM respool.pool_rates rk WHERE rk.pool_id = r.pool_id AND rk.key = x.key)
    UNION ALL
    -- Whole shared devices take their memory and share on the pool's counters, not the policy's
    -- (docs/placement.md, "Sharing a GPU").
    SELECT r.pool_id, NULL, x.key, x.value::numeric, 0
      FROM respool.placements p JOIN respool.requests r ON r.id = p.request_id
     CROSS JOIN LATERAL jsonb_each_text(p.extra) x
     WHERE r.status IN ('allocated', 'preempting')
    UNION ALL
    -- A rate key's counters hold its charges still counted, not what holders hold (docs/rates.md).
    SELECT c.pool_id, c.policy_id, c.key, c.amount::numeric, c.np::numeric
      FROM respool.rate_charges c WHERE c.counted
), pool_sums AS (
    SELECT pool_id, key, sum(amount) AS used FROM held GROUP BY pool_id, key
), policy_sums AS (
    SELECT policy_id, key, sum(amount) AS used, sum(np_amount) AS np_used FROM held
     WHERE policy_id IS NOT NULL GROUP BY policy_id, key
), rate_events AS (
    -- I10 (docs/rates.md): a sweep over each rate key's charges made since its last change, a
    -- charge entering at its instant and leaving per_seconds later (leaving first at one
    -- instant); each charge counts what it was admitted for, at most its estimate.
    SELECT c.pool_id, c.key, c.at AS t, 1 AS entering, c.id, least(c.amount, c.estimate)::numeric AS n, pr.capacity
      FROM respool.rate_charges c JOIN respool.pool_rates rk ON rk.pool_id = c.pool_id AND rk.key = c.key
      JOIN respool.pool_resources pr ON pr.pool_id = c.pool_id AND pr.key = c.key
     WHERE c.at >= rk.changed_at
    UNION ALL
    SELECT c.pool_id, c.key, c.at + make_interval(secs => rk.per_seconds), 0, c.id, -least(c.amount, c.estimate), pr.capacity
      FROM respool.rate_charges c JOIN respool.pool_rates rk ON rk.pool_id = c.pool_id AND rk.key = c.key
      JOIN respool.pool_resources pr ON pr.pool_id = c.pool_id AND pr.key = c.key
     WHERE c.at >= rk.changed_at
), rate_windows AS (
    SELECT pool_id, key, capacity, t, entering,
           sum(n) OVER (PARTITION BY pool_id, key ORDER BY t, entering, id ROWS UNBOUNDED PRECEDING) AS inside
      FROM rate_events
), placed AS (
    -- Placements of holding requests (docs/placement.md): the units charged on their node.
    SELECT p.request_id, p.node_id, p.resources, r.pool_id, r.subject, r.status
      FROM respool.placements p JOIN respool.requests r ON r.id = p.request_id
     WHERE r.status IN ('allocated', 'preempting')
), node_sums AS (
    SELECT pd.node_id, x.key, sum(x.value::numeric) AS used
      FROM placed pd CROSS JOIN LATERAL jsonb_each_text(pd.resources) x
     GROUP BY pd.node_id, x.key
), device_keys AS (
    SELECT DISTINCT node_id, key FROM respool.node_devices
), held_devices AS (
    SELECT node_id, key, holder_id, count(*) AS n FROM respool.node_devices
     WHERE holder_id IS NOT NULL GROUP BY node_id, key, holder_id
), slice_sums AS (
    -- Slices of shared devices (docs/placement.md, "Sharing a GPU"): per device, of holding requests.
    SELECT ds.node_id, ds.key, ds.device, sum(ds.memory_mb) AS memory, sum(coalesce(ds.share, 0)) AS share,
           count(*) AS slices, min(ds.request_id::text) AS some_request
      FROM respool.device_slices ds JOIN respool.requests r ON r.id = ds.request_id
     WHERE r.status IN ('allocated', 'preempting')
     GROUP BY ds.node_id, ds.key, ds.device
)
SELECT 'I1' AS invariant, pl.name AS pool, NULL::text AS subject, s.key,
       format('allocated %s > capacity %s', s.used, respool._effective_capacity(s.key, c.capacity)) AS detail
  FROM pool_sums s JOIN respool.pools pl ON pl.id = s.pool_id
  LEFT JOIN respool.pool_resources c ON c.pool_id = s.pool_id AND c.key = s.key
 WHERE s.used > respool._effective_capacity(s.key, c.capacity)
   AND NOT EXISTS (SELECT FROM respool.pool_rates rk WHERE rk.pool_id = s.pool_id AND rk.key = s.key)  -- I10
UNION ALL
SELECT 'I2', pl.name, p.subject, s.key, format('allocated %s > limit %s', s.used, pr."limit")
  FROM policy_sums s JOIN respool.policies p ON p.id = s.policy_id JOIN respool.pools pl ON pl.id = p.pool_id
  JOIN respool.policy_resources pr ON pr.policy_id = s.policy_id AND pr.key = s.key
 WHERE s.used > pr."limit"
   AND NOT EXISTS (SELECT FROM respool.pool_rates rk WHERE rk.pool_id = p.pool_id AND rk.key = s.key)
UNION ALL
SELECT 'I10', pl.name, NULL, w.key,
       format('charges of %s within one window (at most their estimates) > amount %s, window ending %s',
              max(w.inside), w.capacity, (array_agg(w.t ORDER BY w.inside DESC))[1])
  FROM rate_windows w JOIN respool.pools pl ON pl.id = w.pool_id
 WHERE w.entering = 1 AND w.inside > w.capacity
 GROUP BY pl.name, w.key, w.capacity
UNION ALL
-- I3 against the share as set: non-preemptible work keeps its units when a window closes
-- (docs/preemption.md, "What we chose"), so the share in force may drop below it.
SELECT 'I3', pl.name, p.subject, s.key, format('non-preemptible %s > reserved %s', s.np_used, coalesce(pr.configured, 0))
  FROM policy_sums s JOIN respool.policies p ON p.id = s.policy_id JOIN respool.pools pl ON pl.id = p.pool_id
  LEFT JOIN respool.policy_resources pr ON pr.policy_id = s.policy_id AND pr.key = s.key
 WHERE s.np_used > coalesce(pr.configured, 0)
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
 WHERE NOT EXISTS (SELECT FROM respool.policy_resources c WHERE c.policy_id = s.policy_id AND c.key = s.key)
-- Nodes (docs/placement.md, invariants). pool: the node's pool; the node is named in detail.
UNION ALL
SELECT 'I5', pl.name, NULL, s.key,
       format('node %s: allocated %s > capacity %s', n.name, s.used,
              respool._effective_capacity(s.key, nr.capacity))
  FROM node_sums s JOIN respool.nodes n ON n.id = s.node_id
  LEFT JOIN respool.pools pl ON pl.id = n.pool_id
  LEFT JOIN respool.node_resources nr ON nr.node_id = s.node_id AND nr.key = s.key
 WHERE s.used > respool._effective_capacity(s.key, nr.capacity)
UNION ALL
SELECT 'I4', pl.name, NULL, nr.key,
       format('node %s: counter %s <> placed sum %s', n.name, nr.used, coalesce(s.used, 0))
  FROM respool.node_resources nr JOIN respool.nodes n ON n.id = nr.node_id
  LEFT JOIN respool.pools pl ON pl.id = n.pool_id
  LEFT JOIN node_sums s ON s.node_id = nr.node_id AND s.key = nr.key
 WHERE nr.used <> coalesce(s.used, 0)
UNION ALL
SELECT 'I4', pl.name, NULL, s.key, format('node %s: counter missing, placed sum %s', n.name, s.used)
  FROM node_sums s JOIN respool.nodes n ON n.id = s.node_id
  LEFT JOIN respool.pools pl ON pl.id = n.pool_id
 WHERE NOT EXISTS (SELECT FROM respool.node_resources nr WHERE nr.node_id = s.node_id AND nr.key = s.key)
UNION ALL
SELECT 'I6', pl.name, r.subject, d.key,
       format('node %s: device %s held by request %s, %s', n.name, d.device, d.holder_id,
              CASE WHEN r.id IS NULL THEN 'which does not exist'
                   WHEN r.status NOT IN ('allocated', 'preempting') THEN 'which is ' || r.status
                   WHEN p.request_id IS NULL THEN 'which is not placed'
                   ELSE 'which is placed on node ' || coalesce(pn.name, '?') END)
  FROM respool.node_devices d JOIN respool.nodes n ON n.id = d.node_id
  LEFT JOIN respool.pools pl ON pl.id = n.pool_id
  LEFT JOIN respool.requests r ON r.id = d.holder_id
  LEFT JOIN respool.placements p ON p.request_id = d.holder_id
  LEFT JOIN respool.nodes pn ON pn.id = p.node_id
 WHERE d.holder_id IS NOT NULL
   AND NOT coalesce(r.status IN ('allocated', 'preempting') AND p.node_id = d.node_id, false)
UNION ALL
SELECT 'I6', pl.name, pd.subject, k.key,
       format('node %s: request %s holds %s %s devices, placed units %s', n.name, pd.request_id,
              coalesce(h.n, 0), k.key, coalesce((pd.resources ->> k.key)::numeric, 0))
  FROM placed pd JOIN device_keys k ON k.node_id = pd.node_id
  JOIN respool.nodes n ON n.id = pd.node_id
  LEFT JOIN respool.pools pl ON pl.id = n.pool_id
  LEFT JOIN held_devices h ON h.node_id = pd.node_id AND h.key = k.key AND h.holder_id = pd.request_id
 WHERE coalesce(h.n, 0) <> coalesce((pd.resources ->> k.key)::numeric, 0)
UNION ALL
-- I8: per shared device, its slices' memory within its offer and their share within 100; the
-- device's counters equal its slices' sums; a slice is on a shared device of its request's node.
SELECT 'I8', pl.name, NULL, d.key,
       format('node %s: device %s slices hold %s MiB and share %s, %s', n.name, d.device, s.memory, s.share,
              CASE WHEN d.memory_mb IS NULL THEN 'but the device is not shared'
                   ELSE format('the device offers %s MiB and share 100', d.memory_mb) END)
  FROM slice_sums s JOIN respool.node_devices d ON d.node_id = s.node_id AND d.key = s.key AND d.device = s.device
  JOIN respool.nodes n ON n.id = d.node_id LEFT JOIN respool.pools pl ON pl.id = n.pool_id
 WHERE d.memory_mb IS NULL OR s.memory > d.memory_mb OR s.share > 100
UNION ALL
SELECT 'I8', pl.name, NULL, d.key,
       format('node %s: device %s counters memory %s / share %s <> its slices'' sums %s / %s', n.name, d.device,
              d.memory_used, d.share_used, coalesce(s.memory, 0), coalesce(s.share, 0))
  FROM respool.node_devices d JOIN respool.nodes n ON n.id = d.node_id
  LEFT JOIN respool.pools pl ON pl.id = n.pool_id
  LEFT JOIN slice_sums s ON s.node_id = d.node_id AND s.key = d.key AND s.device = d.device
 WHERE d.memory_used <> coalesce(s.memory, 0) OR d.share_used <> coalesce(s.share, 0)
UNION ALL
SELECT 'I8', npl.name, r.subject, ds.key,
       format('request %s holds a slice of device %s, %s', ds.request_id, ds.device,
              CASE WHEN r.id IS NULL OR r.status NOT IN ('allocated', 'preempting') THEN 'but it holds nothing'
                   WHEN d.device IS NULL THEN 'which does not exist on its node'
                   ELSE 'but it is not placed on that node' END)
  FROM respool.device_slices ds
  LEFT JOIN respool.requests r ON r.id = ds.request_id
  LEFT JOIN respool.placements p ON p.request_id = ds.request_id
  LEFT JOIN respool.node_devices d ON d.node_id = ds.node_id AND d.key = ds.key AND d.device = ds.device
  LEFT JOIN respool.nodes n ON n.id = ds.node_id LEFT JOIN respool.pools npl ON npl.id = n.pool_id
 WHERE r.id IS NULL OR r.status NOT IN ('allocated', 'preempting') OR d.device IS NULL
    OR p.node_id IS DISTINCT FROM ds.node_id
UNION ALL
-- I9: no device is held whole and in slices at once.
SELECT 'I9', pl.name, r.subject, d.key,
       format('node %s: device %s is held whole by request %s and in %s slices (%s MiB, share %s)', n.name, d.device,
              d.holder_id, coalesce(s.slices, 0), greatest(coalesce(s.memory, 0), d.memory_used),
              greatest(coalesce(s.share, 0), d.share_used))
  FROM respool.node_devices d JOIN respool.nodes n ON n.id = d.node_id
  LEFT JOIN respool.pools pl ON pl.id = n.pool_id
  LEFT JOIN respool.requests r ON r.id = d.holder_id
  LEFT JOIN slice_sums s ON s.node_id = d.node_id AND s.key = d.key AND s.device = d.device
 WHERE d.holder_id IS NOT NULL AND (s.slices > 0 OR d.memory_used > 0 OR d.share_used > 0)
UNION ALL
SELECT 'I7', pl.name, r.subject, NULL, format('request %s (%s) is not placed on a node', r.id, r.status)
  FROM respool.requests r JOIN respool.pools pl ON pl.id = r.pool_id
 WHERE r.status IN ('allocated', 'preempting')
   AND EXISTS (SELECT FROM respool.nodes n WHERE n.pool_id = r.pool_id)
   AND NOT EXISTS (SELECT FROM respool.placements p WHERE p.request_id = r.id)
   -- (a holder of rate keys only, no job, holds no node, docs/rates.md: the test of
   -- respool._holds_no_node, written out so that a reader of the view needs no more rights)
   AND NOT (r.command IS NULL
            AND EXISTS (SELECT FROM jsonb_object_keys(r.resources) k(key)
                         WHERE k.key <> 'step_run'
                           AND EXISTS (SELECT FROM respool.pool_rates pr WHERE pr.pool_id = r.pool_id AND pr.key = k.key))
            AND NOT EXISTS (SELECT FROM jsonb_object_keys(r.resources) k(key)
                             WHERE k.key <> 'step_run'
                               AND NOT EXISTS (SELECT FROM respool.pool_rates pr
                                                WHERE pr.pool_id = r.pool_id AND pr.key = k.key)))
UNION ALL
SELECT 'I7', pl.name, pd.subject, NULL,
       format('request %s is placed on node %s, %s', pd.request_id, n.name,
              CASE WHEN n.pool_id IS NULL THEN 'which is in no pool'
                   ELSE 'of pool ' || coalesce(npl.name, '?') END)
  FROM placed pd JOIN respool.nodes n ON n.id = pd.node_id
  LEFT JOIN respool.pools pl ON pl.id = pd.pool_id
  LEFT JOIN respool.pools npl ON npl.id = n.pool_id
 WHERE n.pool_id IS DISTINCT FROM pd.pool_id
UNION ALL
SELECT 'I7', npl.name, r.subject, NULL,
       format('request %s is %s but still placed on node %s', p.request_id,
              coalesce(r.status, 'gone'), n.name)
  FROM respool.placements p JOIN respool.nodes n ON n.id = p.node_id
  LEFT JOIN respool.pools npl ON npl.id = n.pool_id
  LEFT JOIN respool.requests r ON r.id = p.request_id
 WHERE r.status IS NULL OR r.status NOT IN ('allocated', 'preempting')
 ORDER BY invariant, pool, subject, key, detail;
COMMENT ON VIEW respool.invariant_violations IS
    'One row per broken invariant I1-I10 (docs/ops.md, invariant violations; docs/placement.md; docs/rates.md), computed from the requests that hold units, their placements, their slices of shared devices and the charges of rate keys; empty when healthy. I8: a shared device''s slices within its offer and share 100 (and its counters equal to them); I9: no device held whole and in slices at once. I1/I2/I5 may show briefly after a shrink, until the reconciler acts. Node rows name the node in detail; pool is the node''s pool (I4, I5, I6) or the request''s (I7).';

GRANT USAGE ON SCHEMA respool TO respool_reader;
GRANT SELECT ON respool.pool_usage, respool.policy_usage, respool.queue, respool.request_events,
                respool.invariant_violations TO respool_reader;
