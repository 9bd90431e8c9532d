-- 0003_preemption: what the reconciler needs to preempt with a grace period (SPEC §5).
-- A victim in `preempting` keeps its units until its client releases or preempt_deadline passes;
-- the request it was preempted for carries earmark_pool_id, so no third request takes the units.
ALTER TABLE respool.requests ADD COLUMN earmark_pool_id uuid;
COMMENT ON COLUMN respool.requests.earmark_pool_id IS
    'Set on a queued request while victims preempted for it in this pool are still in their grace period: the units they free are kept for it.';

ALTER TABLE respool.requests ADD CONSTRAINT earmark_only_while_queued
    CHECK (earmark_pool_id IS NULL OR status = 'queued');
ALTER TABLE respool.requests ADD CONSTRAINT preempting_has_deadline
    CHECK (status <> 'preempting' OR preempt_deadline IS NOT NULL);

CREATE INDEX requests_preempting_idx ON respool.requests (pool_id, preempt_deadline)
    WHERE status = 'preempting';
CREATE INDEX requests_earmark_idx ON respool.requests (earmark_pool_id)
    WHERE earmark_pool_id IS NOT NULL;
CREATE INDEX requests_pool_lease_idx ON respool.requests (pool_id, lease_expires_at)
    WHERE status = 'allocated' AND lease_expires_at IS NOT NULL;
