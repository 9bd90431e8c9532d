-- What the dashboard shows beyond the metrics queries (read in one repeatable-read snapshot).

-- dashboard_pools --
-- Every pool with its queue length and number of holders.
SELECT pl.name, pl.queueing, pl.preemption_grace_seconds,
       (SELECT count(*) FROM respool.queue_entries e WHERE e.pool_id = pl.id) AS queued,
       (SELECT count(*) FROM respool.requests r WHERE r.pool_id = pl.id
           AND r.status IN ('allocated', 'preempting')) AS holding
  FROM respool.pools pl
 ORDER BY pl.name;

-- dashboard_queue --
-- The first $1 queue entries over all pools with what each waits for and its ETA (each pool
-- ordered once, its ETA simulated once).
SELECT pool, position, request_id, subject, resources, preemptible, priority, in_share,
       waiting_seconds, attempt, labels, waiting_for, eta
  FROM respool.dashboard_queue(p_limit => $1);

-- dashboard_holdings --
-- The $1 most recent holdings per pool order.
SELECT pool, subject, request_id, status, resources, preemptible, held_seconds, labels
  FROM respool.holdings
 ORDER BY pool, allocated_at DESC
 LIMIT $1;

-- dashboard_events --
-- The $1 newest events with their request's subject and pool.
SELECT e.id, e.at, e.request_id, r.subject, r.pool_name AS pool, e.from_status,
       e.to_status, e.reason, e.message
  FROM respool.events e JOIN respool.requests r ON r.id = e.request_id
 ORDER BY e.id DESC
 LIMIT $1;

-- dashboard_nodes --
-- Every node of every pool with per-key used/capacity and its devices' holders.
SELECT pool, name, state, labels, keys, devices
  FROM respool.dashboard_nodes();

-- dashboard_jobs --
-- The $1 most recently granted running jobs with the last $2 lines of their current attempt's
-- output (NULL: none yet). Never the job's env.
SELECT r.id AS request_id, r.pool_name AS pool, r.subject,
       coalesce(r.job_name, regexp_replace(r.command ->> 0, '^.*/', '')) AS name, r.status,
       r.attempt,
       (SELECT n.name FROM respool.placements pl JOIN respool.nodes n ON n.id = pl.node_id
         WHERE pl.request_id = r.id) AS node,
       respool.job_log_tail(r.id, $2) AS tail
  FROM respool.requests r
 WHERE r.command IS NOT NULL AND r.status IN ('allocated', 'preempting')
 ORDER BY r.allocated_at DESC, r.id
 LIMIT $1;
