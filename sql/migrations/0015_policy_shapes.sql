-- 0015_policy_shapes: policies over time, priority lanes, team quotas, preemption groups and
-- terminate (docs/preemption.md, "Policy shapes").
--
-- A policy's reserved share now has two columns: `configured` is what the operator set (the API's
-- `reserved`), `reserved` is the share in force now: `configured` while the policy is inside one
-- of its windows (or has none), 0 outside. The engine reads `reserved` only; the reconciler's pass
-- flips it at each window boundary (respool._apply_windows), under the pool's lock.

ALTER TABLE respool.policy_resources ADD COLUMN configured bigint NOT NULL DEFAULT 0 CHECK (configured >= 0);
UPDATE respool.policy_resources SET configured = reserved;
ALTER TABLE respool.policy_resources
    DROP CONSTRAINT reserved_within_limit,
    DROP CONSTRAINT np_within_reserved,
    ADD CONSTRAINT reserved_within_limit CHECK ("limit" IS NULL OR configured <= "limit"),
    -- Non-preemptible work is admitted only within the share in force, and keeps its units when
    -- a window closes: it never passes the share the operator set (I3).
    ADD CONSTRAINT np_within_reserved CHECK (np_used <= configured),
    ADD CONSTRAINT reserved_in_force CHECK (reserved = configured OR reserved = 0);
COMMENT ON COLUMN respool.policy_resources.configured IS 'The reserved share the operator set (the API''s reserved).';
COMMENT ON COLUMN respool.policy_resources.reserved IS
    'The reserved share in force now: configured while the policy is active (inside a window, or without windows), 0 outside.';

-- Team quotas: a subject may be a pattern with *, matched against request subjects. A request's
-- policy on a pool is the exact subject's, else the pattern with the longest literal prefix (the
-- text before the first *); two patterns of one pool with one literal prefix could tie: refused.
ALTER TABLE respool.policies DROP CONSTRAINT policies_subject_check;
ALTER TABLE respool.policies
    ADD CONSTRAINT policies_subject_check CHECK (subject ~ '^[A-Za-z0-9*][A-Za-z0-9_.:/@*-]{0,127}$'),
    ADD COLUMN is_pattern boolean GENERATED ALWAYS AS (strpos(subject, '*') > 0) STORED,
    ADD COLUMN literal_prefix text GENERATED ALWAYS AS (split_part(subject, '*', 1)) STORED,
    ADD COLUMN priority_lane boolean NOT NULL DEFAULT false,
    ADD COLUMN windows jsonb CHECK (windows IS NULL OR jsonb_typeof(windows) = 'array'),
    ADD COLUMN active boolean NOT NULL DEFAULT true,
    ADD COLUMN next_change timestamptz,
    ADD CONSTRAINT always_active_without_windows CHECK (windows IS NOT NULL OR (active AND next_change IS NULL));
CREATE UNIQUE INDEX policies_pattern_prefix_idx ON respool.policies (pool_id, literal_prefix) WHERE is_pattern;
CREATE INDEX policies_next_change_idx ON respool.policies (next_change) WHERE next_change IS NOT NULL;
COMMENT ON COLUMN respool.policies.priority_lane IS
    'Its requests come before every non-lane request and may preempt any borrowing non-lane allocation; lane allocations never preempt each other.';
COMMENT ON COLUMN respool.policies.windows IS
    'NULL: always active. Else the normalized list of weekly ({timezone, days, from, to}) and one-time ({start, end}) windows.';
COMMENT ON COLUMN respool.policies.active IS 'Inside one of its windows now (as of the last boundary applied).';
COMMENT ON COLUMN respool.policies.next_change IS 'The next instant active flips (NULL: never).';

-- Preemption groups: a request never preempts an allocation of its own group.
ALTER TABLE respool.requests
    ADD COLUMN preemption_group text
        CHECK (preemption_group IS NULL OR (preemption_group ~ '^[^\x01-\x1f\x7f]{1,128}$'));
COMMENT ON COLUMN respool.requests.preemption_group IS
    'Requests of one group never preempt each other (by reclaim or priority); the ZenML backend sets the pipeline run id.';
CREATE INDEX policies_patterns_idx ON respool.policies (pool_id) WHERE is_pattern;
