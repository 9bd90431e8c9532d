-- Reporting views for operations (docs/ops.md), readable by respool_reader like 010_ops.sql.
-- History comes from respool.events (append-only), so these views cover what retention kept.
-- Pool attribution: a request's pool is the one it was last granted in (requests.pool_name); only
-- a multi-pool request that was preempted, requeued and granted in another pool has an earlier
-- stint attributed to its later pool, because events do not record the pool.

CREATE VIEW respool.holdings AS
SELECT r.pool_name AS pool, r.subject, r.id AS request_id, r.status, r.resources, r.preemptible,
       r.priority, r.attempt, r.allocated_at, r.lease_expires_at, r.preempt_deadline, r.labels,
       extract(epoch FROM now() - r.allocated_at)::double precision AS held_seconds,
       r.preemption_group
  FROM respool.requests r
 WHERE r.status IN ('allocated', 'preempting')
 ORDER BY r.pool_name, r.subject, r.allocated_at, r.id;
COMMENT ON VIEW respool.holdings IS
    'Who holds what now: one row per allocated or preempting request, with its units, lease, labels and preemption group (NULL: none; docs/preemption.md, preemption groups).';

CREATE VIEW respool.allocation_intervals AS
SELECT a.request_id, r.pool_name AS pool, r.subject, a.attempt, r.preemptible, r.resources,
       a.at AS started_at, x.at AS ended_at, x.to_status AS end_status, x.reason AS end_reason
  FROM respool.events a
  JOIN respool.request_history r ON r.id = a.request_id
  LEFT JOIN LATERAL (
        SELECT e.at, e.to_status, e.reason FROM respool.events e
         WHERE e.request_id = a.request_id AND e.id > a.id
           AND e.to_status NOT IN ('allocated', 'preempting')
         ORDER BY e.id
         LIMIT 1) x ON true
 WHERE a.to_status = 'allocated' AND a.from_status IS DISTINCT FROM 'allocated'  -- not an over_slice note
 ORDER BY a.at, a.request_id;
COMMENT ON VIEW respool.allocation_intervals IS
    'One row per time a request held units: from its allocated event to the event that ended the holding (released, preempted, expired, cancelled). A preempting request still holds. ended_at is NULL while it holds.';

CREATE VIEW respool.usage_by_subject_day AS
SELECT d.day, i.pool, i.subject, x.key,
       round(sum(x.value::bigint * extract(epoch FROM d.overlap) / 3600), 6) AS unit_hours,
       count(*) AS allocations
  FROM respool.allocation_intervals i
 CROSS JOIN LATERAL jsonb_each_text(i.resources) x
 CROSS JOIN LATERAL (
        SELECT s::date AS day,
               least(coalesce(i.ended_at, now()), (s + interval '1 day') AT TIME ZONE 'UTC')
               - greatest(i.started_at, s AT TIME ZONE 'UTC') AS overlap
          FROM generate_series(date_trunc('day', i.started_at AT TIME ZONE 'UTC'),
                               date_trunc('day', coalesce(i.ended_at, now()) AT TIME ZONE 'UTC'),
                               interval '1 day') s) d
 WHERE d.overlap > interval '0'
 GROUP BY d.day, i.pool, i.subject, x.key
 ORDER BY d.day, i.pool, i.subject, x.key;
COMMENT ON VIEW respool.usage_by_subject_day IS
    'Units held times hours, per UTC day, pool, subject and key (gpu: GPU-hours; step_run: step-hours), from allocation_intervals. An interval is split at UTC midnight; one still held counts up to now().';

CREATE VIEW respool.request_waits AS
SELECT a.request_id, r.pool_name AS pool, r.subject, a.attempt, r.preemptible,
       q.at AS queued_at, a.at AS allocated_at,
       extract(epoch FROM a.at - q.at)::double precision AS wait_seconds
  FROM respool.events a
  JOIN respool.request_history r ON r.id = a.request_id
 CROSS JOIN LATERAL (
        SELECT e.at FROM respool.events e
         WHERE e.request_id = a.request_id AND e.id < a.id AND e.to_status = 'queued'
         ORDER BY e.id DESC
         LIMIT 1) q
 WHERE a.to_status = 'allocated' AND a.from_status IS DISTINCT FROM 'allocated'  -- not an over_slice note
 ORDER BY a.at, a.request_id;
COMMENT ON VIEW respool.request_waits IS
    'One row per grant: how long the request waited since it (re-)entered the queue. A request granted at creation waited 0 s; requests still queued are in respool.queue, not here.';

CREATE VIEW respool.preemptions AS
SELECT e.request_id, e.at, r.pool_name AS pool, r.subject, e.reason, e.attempt,
       e.to_status = 'preempting' AS with_grace, e.message
  FROM respool.events e
  JOIN respool.request_history r ON r.id = e.request_id
 WHERE e.to_status = 'preempting'
    OR (e.to_status = 'preempted' AND e.from_status IS DISTINCT FROM 'preempting')
 ORDER BY e.at, e.request_id;
COMMENT ON VIEW respool.preemptions IS
    'One row per preemption, counted once: the preempting event (grace period) or a direct preempted event; reason is why (reclaim, priority, capacity_shrink, limit_shrink, node_drain, node_removed, terminated).';

GRANT SELECT ON respool.holdings, respool.allocation_intervals, respool.usage_by_subject_day,
                respool.request_waits, respool.preemptions TO respool_reader;
