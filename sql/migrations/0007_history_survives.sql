-- 0007_history_survives: a request's history outlives the request (SPEC §8: append-only).
-- Deleting a terminal request (DELETE /v1/requests/{id}) no longer takes its events with it, so
-- it stays in respool.request_events and the reporting views (usage_by_subject_day...). Only
-- retention (respool.prune_requests: RESPOOL_RETENTION, `respool request prune`) removes history.

ALTER TABLE respool.events DROP CONSTRAINT IF EXISTS events_request_id_fkey;
COMMENT ON TABLE respool.events IS
    'Append-only history of request status changes. Rows outlive their request (a deleted request keeps its history, see respool.deleted_requests); only retention (prune_requests) removes them.';

CREATE TABLE respool.deleted_requests (
    id          uuid PRIMARY KEY,
    subject     text NOT NULL,
    pool_name   text,
    resources   jsonb NOT NULL,
    preemptible boolean NOT NULL,
    status      text NOT NULL,
    finished_at timestamptz,
    deleted_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX deleted_requests_finished_idx ON respool.deleted_requests (finished_at);
COMMENT ON TABLE respool.deleted_requests IS
    'Who and what a deleted request was (the columns the reporting views need), so its events still attribute usage; removed by retention with those events.';

CREATE FUNCTION respool.keep_deleted_request() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO respool.deleted_requests (id, subject, pool_name, resources, preemptible, status, finished_at)
    VALUES (OLD.id, OLD.subject, OLD.pool_name, OLD.resources, OLD.preemptible, OLD.status, OLD.finished_at)
    ON CONFLICT (id) DO NOTHING;
    RETURN OLD;
END $$;
COMMENT ON FUNCTION respool.keep_deleted_request() IS
    'Guarantees a deleted request leaves a respool.deleted_requests row, so its history keeps its subject, pool and resources.';
CREATE TRIGGER requests_keep_deleted AFTER DELETE ON respool.requests
    FOR EACH ROW EXECUTE FUNCTION respool.keep_deleted_request();
