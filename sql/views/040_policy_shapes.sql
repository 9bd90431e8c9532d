-- Views of policy shapes (docs/preemption.md, "Policy shapes"; docs/ops.md), readable by
-- respool_reader like 010_ops.sql (099_reader_scope.sql moves the grants to this database's
-- reader role). Plain joins of base tables: no function that reads a table, so a reader needs
-- nothing more.

CREATE VIEW respool.policy_subjects AS
WITH through AS (
    -- What a subject holds through a pattern policy (the request's policy, chosen at creation
    -- and kept) ...
    SELECT r.policy_id, r.subject, r.resources, true AS holding
      FROM respool.requests r
      JOIN respool.policies p ON p.id = r.policy_id AND p.is_pattern
     WHERE r.status IN ('allocated', 'preempting')
    UNION ALL
    -- ... and what it waits for through one (a queue entry per candidate pool, with that pool's
    -- policy).
    SELECT e.policy_id, r.subject, e.resources, false
      FROM respool.queue_entries e
      JOIN respool.policies p ON p.id = e.policy_id AND p.is_pattern
      JOIN respool.requests r ON r.id = e.request_id
), covered AS (
    SELECT DISTINCT policy_id, subject FROM through
), sums AS (
    SELECT t.policy_id, t.subject, x.key,
           coalesce(sum(x.value::numeric) FILTER (WHERE t.holding), 0) AS used,
           coalesce(sum(x.value::numeric) FILTER (WHERE NOT t.holding), 0) AS queued
      FROM through t CROSS JOIN LATERAL jsonb_each_text(t.resources) x
     GROUP BY t.policy_id, t.subject, x.key
)
SELECT pl.name AS pool, p.subject AS policy_subject, c.subject, s.key,
       coalesce(s.used, 0) AS used, coalesce(s.queued, 0) AS queued
  FROM covered c
  JOIN respool.policies p ON p.id = c.policy_id
  JOIN respool.pools pl ON pl.id = p.pool_id
  LEFT JOIN sums s ON s.policy_id = c.policy_id AND s.subject = c.subject
 ORDER BY pl.name, p.subject, c.subject, s.key;
COMMENT ON VIEW respool.policy_subjects IS
    'For every pattern policy (a team quota, docs/preemption.md), the subjects it covers now (with a request allocated, preempting or queued through it) and, per key, the units each holds (used) and waits for (queued). The pattern''s own row in policy_usage is their sum. key is NULL only for a subject whose requests ask for no units. Ordered by pool, pattern, subject, key.';

GRANT SELECT ON respool.policy_subjects TO respool_reader;
