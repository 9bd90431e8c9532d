-- What the reconciler runs (sql/functions/03*.sql, 070_victims.sql, 071_reconcile.sql), and the
-- invariant check it and the dashboard read.

-- pool_ids --
-- Every pool's id, by pool name.
SELECT id FROM respool.pools ORDER BY name;

-- pool_exists --
-- Whether the pool with this id still exists.
SELECT EXISTS (SELECT FROM respool.pools WHERE id = $1);

-- reconcile_pool --
-- One reconciler pass over one pool; NULL when it is gone or locked by another transaction.
SELECT respool.reconcile_pool(p_pool_id => $1);

-- allocate_pool --
-- Grant what fits in one pool's queue; how many were granted.
SELECT respool.allocate_pool(p_pool_id => $1);

-- expire_leases --
-- Expire lapsed leases in one pool; how many expired.
SELECT respool.expire_leases(p_pool_id => $1);

-- invariant_violations --
-- Every broken accounting invariant (the view is empty when all hold).
SELECT invariant, pool, subject, key, detail FROM respool.invariant_violations;

-- existing_pool_ids --
-- Which of the ids $1 (uuid[]) are pools that exist (the reconciler drops notified ids that are not).
SELECT id FROM respool.pools WHERE id = ANY ($1::uuid[]);

-- rate_refills --
-- Per pool whose queue waits for units of a rate key: seconds (database clock) until enough
-- charges have left their window for a queue head (0: due now).
SELECT pool_id, greatest(extract(epoch FROM at - clock_timestamp()), 0)::float8 AS seconds
  FROM respool.rate_refills();

-- seconds_to_window_change --
-- Seconds (database clock) until the next instant a policy's window opens or closes, over every
-- pool; NULL when none is still ahead (a boundary already due is the pass's to apply).
SELECT extract(epoch FROM min(next_change) - clock_timestamp())::float8
  FROM respool.policies WHERE next_change > clock_timestamp();

-- analyze_grown_tables --
-- Analyze the respool tables that have doubled since their statistics (at least 1,000 rows).
SELECT respool.analyze_grown_tables();
