-- 0013_fewer_indexes: issue 17 item 4. requests_lease_idx (lease_expires_at of allocated requests)
-- served no query: lease expiry runs per pool on requests_pool_lease_idx (pool_id,
-- lease_expires_at), and the outage shift updates every allocated request. One index fewer to
-- maintain at every grant.
DROP INDEX respool.requests_lease_idx;
