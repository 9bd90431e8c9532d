-- 0029_slice_overuse: what a holder of a slice of a shared device reports using, and what its
-- pool does when that is above the slice (docs/placement.md, "Sharing a GPU").

ALTER TABLE respool.pools ADD COLUMN slice_overuse text NOT NULL DEFAULT 'report'
    CHECK (slice_overuse IN ('report', 'terminate'));
COMMENT ON COLUMN respool.pools.slice_overuse IS
    'Use above a slice''s memory, reported with a heartbeat: report (an over_slice event and the gauge) or terminate (also ends the holding, reason over_slice, never requeued).';

CREATE TABLE respool.slice_use (
    request_id  uuid NOT NULL REFERENCES respool.requests (id) ON DELETE CASCADE,
    key         text NOT NULL CHECK (key ~ '^[a-z][a-z0-9_]{0,62}$'),
    attempt     integer NOT NULL,
    used        bigint NOT NULL CHECK (used >= 0),
    slice       bigint NOT NULL CHECK (slice >= 0),
    over        boolean NOT NULL,
    reported_at timestamptz NOT NULL,
    PRIMARY KEY (request_id, key)
);
COMMENT ON TABLE respool.slice_use IS
    'The last use a holder reported per <K>_memory_mb key it asked (its heartbeat''s usage), on which attempt, against the slice it asked; over: above the slice at that report. A crossing (over turning true) records the over_slice event once.';
