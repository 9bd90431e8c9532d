-- Batch create (sql/functions/040_create.sql).

-- create_requests --
-- Create 1..1000 requests ($1: a JSON array of create bodies) in one transaction, one row per member in member order.
SELECT member, created, request
  FROM respool.create_requests(p_members => $1, p_all_or_nothing => $2,
                               p_default_lease_seconds => $3, p_distinct_nodes => $4);

-- create_requests_each --
-- Create 1..1000 requests ($1: a JSON array of create bodies) each as its single create would, one row per member in member order: its document or its error.
SELECT member, created, request, error_code, error_field, error_message
  FROM respool.create_requests_each(p_members => $1, p_default_lease_seconds => $2);
