-- Pools (sql/functions/050_pools.sql); each returns the pool as JSON.

-- create_pool --
-- Create a pool with every setting, the scheduling and placement ones, its rate keys ($9) and
-- what use above a slice does ($10) included; returns pool_json.
SELECT respool.create_pool(p_name => $1, p_capacity => $2, p_description => $3, p_queueing => $4,
                           p_preemption_grace_seconds => $5, p_starvation_seconds => $6,
                           p_ordering => $7, p_placement => $8, p_rates => $9,
                           p_slice_overuse => $10);

-- update_pool --
-- Update a pool (NULL keeps a field; $7 true turns the starvation guard off; $10 rate keys
-- merge, null removes one; $11 slice_overuse); returns pool_json.
SELECT respool.update_pool(p_ref => $1, p_capacity => $2, p_description => $3, p_queueing => $4,
                           p_preemption_grace_seconds => $5, p_starvation_seconds => $6,
                           p_starvation_off => $7, p_ordering => $8, p_placement => $9,
                           p_rates => $10, p_slice_overuse => $11);

-- delete_pool --
-- Delete a pool and its policies; p_force cancels its live requests instead of refusing.
SELECT respool.delete_pool(p_ref => $1, p_force => $2);

-- get_pool --
-- One pool by name or id (RP404 when there is none).
SELECT respool.get_pool(p_ref => $1);

-- list_pools --
-- Every pool, by name.
SELECT respool.list_pools();
