-- 0034_request_state_where_written: a request's state invariants run where its state is written.
--
-- PostgreSQL parses every CHECK of a table again for each statement that writes a row of it, and
-- a request's row is written three times in its simplest life (made, granted, released). Its
-- six state invariants (the status values, attempt >= 1, a holder's pool, a victim's deadline,
-- an earmark only while queued, an earmarked node only with its pool) were six expression trees
-- parsed per statement, about 5 % of an engine cycle (docs/benchmarks.md). A trigger now checks
-- them on INSERT and after an UPDATE that names one of the columns they read: a row that breaks
-- one is refused as before, with SQLSTATE 23514 naming the constraint it breaks.

CREATE FUNCTION respool._check_request_state() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    -- Each test as the CHECK it replaces (a NULL passes).
    v_broken text := CASE
        WHEN NOT NEW.status IN ('queued', 'allocated', 'preempting', 'released', 'preempted', 'expired',
                                'cancelled', 'rejected') THEN 'requests_status_check'
        WHEN NOT NEW.attempt >= 1 THEN 'requests_attempt_check'
        WHEN NOT (NEW.status NOT IN ('allocated', 'preempting')
                  OR (NEW.pool_id IS NOT NULL AND NEW.policy_id IS NOT NULL AND NEW.allocated_at IS NOT NULL))
            THEN 'holder_has_pool'
        WHEN NOT (NEW.status <> 'preempting' OR NEW.preempt_deadline IS NOT NULL) THEN 'preempting_has_deadline'
        WHEN NOT (NEW.earmark_pool_id IS NULL OR NEW.status = 'queued') THEN 'earmark_only_while_queued'
        WHEN NOT (NEW.earmark_node_id IS NULL OR NEW.earmark_pool_id IS NOT NULL) THEN 'earmark_node_with_pool'
    END;
BEGIN
    IF v_broken IS NOT NULL THEN
        PERFORM respool._refuse_written_field(TG_TABLE_SCHEMA, TG_TABLE_NAME, v_broken);
    END IF;
    RETURN NEW;
END $$;
COMMENT ON FUNCTION respool._check_request_state() IS
    'Trigger: a request row''s state invariants (its status values, attempt >= 1, holder_has_pool, preempting_has_deadline, earmark_only_while_queued, earmark_node_with_pool), run when a row is inserted or an update names a column they read; SQLSTATE 23514 naming the constraint it replaces (migration 0034).';

ALTER TABLE respool.requests
    DROP CONSTRAINT requests_status_check,
    DROP CONSTRAINT requests_attempt_check,
    DROP CONSTRAINT holder_has_pool,
    DROP CONSTRAINT preempting_has_deadline,
    DROP CONSTRAINT earmark_only_while_queued,
    DROP CONSTRAINT earmark_node_with_pool;
-- Before an insert; after an update (an AFTER trigger reads the row without locking it: 0035).
CREATE TRIGGER requests_state
    BEFORE INSERT ON respool.requests FOR EACH ROW EXECUTE FUNCTION respool._check_request_state();
CREATE TRIGGER requests_state_updated
    AFTER UPDATE OF status, attempt, pool_id, policy_id, allocated_at, preempt_deadline, earmark_pool_id,
                    earmark_node_id
    ON respool.requests FOR EACH ROW EXECUTE FUNCTION respool._check_request_state();
