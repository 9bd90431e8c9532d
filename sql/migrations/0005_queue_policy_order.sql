-- 0005_queue_policy_order: a policy's queue entries in queue-time order. Counting what is ahead
-- of a request (its queue position, respool._queue_position) is then an index-only range count
-- when its policy queues a single shape, with no comparison of resources per entry.
DROP INDEX respool.queue_entries_policy_idx;
CREATE INDEX queue_entries_policy_idx ON respool.queue_entries (policy_id, queued_at, request_id);
