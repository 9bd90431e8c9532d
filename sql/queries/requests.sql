-- Requests and their events (sql/functions/040_create.sql to 044_request_lists.sql).

-- create_request --
-- Create (or replay) one request from its create body ($1, a JSON document; an absent
-- lease_seconds is $2 seconds): a batch of one. Returns (created, request).
SELECT created, request FROM respool.create_request(p_body => $1, p_default_lease_seconds => $2);

-- what_if_request --
-- What a create of the same body would answer now, plus would_preempt; nothing is kept.
SELECT respool.what_if_request(p_body => $1, p_default_lease_seconds => $2);

-- get_request --
-- One request as JSON text (RP404 when there is none).
SELECT respool.get_request(p_id => $1)::text;

-- get_requests --
-- Several requests as JSON text in one snapshot, each pool computed once; unknown ids are left out.
SELECT d.doc::text FROM respool.request_docs(p_ids => $1) AS d;

-- request_versions --
-- The version and status of several requests by primary key (unknown ids are left out): what a
-- long-poll checks while it waits, without building the document.
SELECT id, version, status FROM respool.requests WHERE id = ANY ($1::uuid[]);

-- list_requests --
-- One page of requests, newest first, after the (created_at, id) cursor, as JSON text.
SELECT respool.list_requests(p_pool => $1, p_subject => $2, p_status => $3, p_limit => $4,
                             p_before_created => $5, p_before_id => $6, p_subject_like => $7,
                             p_gang_id => $8)::text;

-- release_request --
-- Release a held request (or cancel a queued one); p_attempt guards against a stale holder;
-- p_used ({rate key: units} or null) settles its charges first.
SELECT respool.release_request(p_id => $1, p_attempt => $2, p_used => $3);

-- release_requests --
-- Several releases in one transaction ($1 ids, $2 attempts or nulls, $3 used maps or nulls):
-- one row per member, its document or its error.
SELECT member, request, error_code, error_field, error_message
  FROM respool.release_requests(p_ids => $1, p_attempts => $2, p_used => $3::jsonb[]);

-- cancel_request --
-- Cancel a queued or held request.
SELECT respool.cancel_request(p_id => $1, p_attempt => $2);

-- terminate_request --
-- An admin ends a request ($2 force, $3 the admin's reason): preempting with the pool's grace,
-- preempted at once, or cancelled while queued; never requeued (docs/preemption.md, "Terminate").
SELECT respool.terminate_request(p_id => $1, p_force => $2, p_reason => $3);

-- heartbeat_request --
-- Heartbeat: extend an allocated request's lease to now + $3 seconds (NULL: the request's
-- lease_seconds), or set a queued request's queue lease to now + $4 seconds (NULL: the same as
-- the lease); $2 fences a stale attempt; $5 the holder's use of its slices (NULL: none).
SELECT respool.heartbeat_request(p_id => $1, p_attempt => $2, p_lease_seconds => $3,
                                 p_queue_lease_seconds => $4, p_usage => $5);

-- delete_request --
-- Delete a terminal request (its events stay: history is append-only).
SELECT respool.delete_request(p_id => $1);

-- request_events --
-- A request's status changes, oldest first.
SELECT respool.list_request_events(p_id => $1);
