-- Who and what each request was, deleted or not (0007_history_survives): the reporting views
-- (020_reporting.sql) join events to this instead of respool.requests, so deleting a request
-- does not erase its usage.

CREATE VIEW respool.request_history AS
SELECT id, subject, pool_name, resources, preemptible FROM respool.requests
UNION ALL
SELECT id, subject, pool_name, resources, preemptible FROM respool.deleted_requests;
COMMENT ON VIEW respool.request_history IS
    'Every request that still has history: stored requests plus those a client deleted (until retention prunes them).';
