-- Views of rate keys (docs/rates.md; docs/ops.md), readable by respool_reader like 010_ops.sql
-- (099_reader_scope.sql moves the grants to this database's reader role). Plain joins of base
-- tables: no function that reads a table, so a reader needs nothing more.

CREATE VIEW respool.rate_usage AS
WITH budgets AS (
    SELECT rk.pool_id, rk.key, rk.per_seconds, NULL::uuid AS policy_id, NULL::text AS subject,
           pr.capacity AS amount
      FROM respool.pool_rates rk
      JOIN respool.pool_resources pr ON pr.pool_id = rk.pool_id AND pr.key = rk.key
    UNION ALL
    SELECT rk.pool_id, rk.key, rk.per_seconds, p.id, p.subject, pol."limit"
      FROM respool.pool_rates rk
      JOIN respool.policies p ON p.pool_id = rk.pool_id
      JOIN respool.policy_resources pol ON pol.policy_id = p.id AND pol.key = rk.key)
SELECT pl.name AS pool, b.subject, b.key, b.amount, b.per_seconds,
       coalesce(w.used, 0) AS used, b.amount - coalesce(w.used, 0) AS free,
       w.oldest + make_interval(secs => b.per_seconds) AS next_refill_at,
       coalesce(w.overrun, 0) AS overrun, coalesce(w.charges, 0) AS charges
  FROM budgets b
  JOIN respool.pools pl ON pl.id = b.pool_id
  LEFT JOIN LATERAL (
        SELECT sum(c.amount) AS used, min(c.at) AS oldest, count(*) AS charges,
               sum(greatest(c.amount - c.estimate, 0)) AS overrun
          FROM respool.rate_charges c
         WHERE c.pool_id = b.pool_id AND c.key = b.key AND c.counted
           AND (b.policy_id IS NULL OR c.policy_id = b.policy_id)
           AND c.at > now() - make_interval(secs => b.per_seconds)) w ON true
 ORDER BY 1, 2, 3;
COMMENT ON VIEW respool.rate_usage IS
    'Per pool and rate key (subject NULL), and per policy of it with a counter for the key: amount per window (a policy: its limit, NULL for none), per_seconds, used (the charges inside the trailing window now), free, next_refill_at (when the oldest charge inside leaves), overrun (units settled above their estimates, inside the window) and how many charges are inside.';

CREATE VIEW respool.rate_charge_history AS
SELECT pl.name AS pool, c.key, c.subject, c.request_id, c.attempt, c.at, c.estimate, c.amount,
       c.settled_at, greatest(c.amount - c.estimate, 0) AS overrun, c.counted AS in_window
  FROM respool.rate_charges c JOIN respool.pools pl ON pl.id = c.pool_id;
COMMENT ON VIEW respool.rate_charge_history IS
    'Every kept charge of a rate key (docs/rates.md): its instant, the estimate granted, the amount that counts (settled or not), the overrun above the estimate, and whether it still counts (inside its window when last expired). Kept about an hour past its window.';

GRANT SELECT ON respool.rate_usage, respool.rate_charge_history TO respool_reader;
