-- 0017_event_cause: the request an event happened for, as data (docs/api.md, "What a client sees").
--
-- A victim's preemption events (and its gang's, and its requeue) record the request they were
-- preempted for: cause_request_id and its subject, kept with the event even after that request is
-- deleted. Messages no longer name that request; the API shows the cause only to a caller that may
-- read the cause's subject, and what-if finds its victims by this column.

ALTER TABLE respool.events
    ADD COLUMN cause_request_id uuid,
    ADD COLUMN cause_subject text;
COMMENT ON COLUMN respool.events.cause_request_id IS
    'The request this change happened for (a preemption''s beneficiary); NULL when none.';
COMMENT ON COLUMN respool.events.cause_subject IS
    'The subject of cause_request_id when the event was written (it outlives that request).';
