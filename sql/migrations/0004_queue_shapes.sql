-- 0004_queue_shapes: queue work in O(distinct request shapes), not O(queue length).
-- A queue entry carries a copy of its request's resources and preemptible flag (both fixed for a
-- request's whole life). Entries of one (pool, policy, preemptible, resources) "shape" are alike
-- for every admission rule and for in-share, so the engine handles a pool's queue shape by shape:
-- the index below finds each shape's first entry (a skip scan) and walks a shape in queue-time
-- order, and counts what is ahead of a request without reading every entry's request row.
ALTER TABLE respool.queue_entries ADD COLUMN resources jsonb, ADD COLUMN preemptible boolean;
UPDATE respool.queue_entries e SET resources = r.resources, preemptible = r.preemptible
  FROM respool.requests r WHERE r.id = e.request_id;
ALTER TABLE respool.queue_entries ALTER COLUMN resources SET NOT NULL,
                                  ALTER COLUMN preemptible SET NOT NULL;
COMMENT ON COLUMN respool.queue_entries.resources IS 'Copy of requests.resources (never changes after creation): the entry''s shape.';
COMMENT ON COLUMN respool.queue_entries.preemptible IS 'Copy of requests.preemptible (never changes after creation): the entry''s shape.';
CREATE INDEX queue_entries_shape_idx
    ON respool.queue_entries (pool_id, policy_id, preemptible, resources, queued_at, request_id);
