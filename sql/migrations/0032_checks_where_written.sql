-- 0032_checks_where_written: the checks of columns that a status change never writes run when
-- those columns are written, not on every row update.
--
-- PostgreSQL evaluates every CHECK constraint of a table on every update of a row, and before
-- that it parses and prepares each one for the statement. A request's row is written three times
-- in its simplest life (made, granted, released) and its counters twice, so the checks of the
-- fields that never change after insert (a request's subject, key, lease, job; a counter's key;
-- a policy's limit and reserved share, which only a policy update writes) cost about a tenth of
-- an engine cycle (docs/benchmarks.md, "Checks where they are written"). A trigger does the
-- same checks, with the same constraint names and SQLSTATE 23514, on INSERT and on an UPDATE
-- that names one of those columns. The invariants a grant or release can break (used >= 0,
-- np_used, holder_has_pool, the earmark and deadline rules, status values) stay CHECKs.

CREATE FUNCTION respool._check_written_fields() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_broken text;
BEGIN
    -- Each test is NULL where a CHECK passes (a NULL field), as the constraint it replaces; the
    -- bounds and patterns are the engine's named ones (005_bounds_and_patterns.sql).
    IF TG_TABLE_NAME = 'requests' THEN
        v_broken := CASE
            WHEN NOT NEW.subject ~ respool._subject_pattern() THEN 'requests_subject_check'
            WHEN NOT NEW.max_retries >= 0 THEN 'requests_max_retries_check'
            WHEN NOT NEW.lease_seconds > 0 THEN 'requests_lease_seconds_check'
            WHEN NOT length(NEW.idempotency_key) BETWEEN 1 AND respool._max_key_length()
                THEN 'requests_idempotency_key_check'
            WHEN NOT NEW.max_seconds > 0 THEN 'requests_max_seconds_check'
            WHEN NOT jsonb_typeof(NEW.node_selector) = 'object' THEN 'requests_node_selector_check'
            WHEN NOT NEW.preemption_group ~ respool._group_pattern() THEN 'requests_preemption_group_check'
            WHEN NOT jsonb_typeof(NEW.command) = 'array' THEN 'requests_command_check'
            WHEN NOT jsonb_typeof(NEW.job_env) = 'object' THEN 'requests_job_env_check'
            WHEN NOT NEW.array_index >= 0 THEN 'requests_array_index_check'
        END;
    ELSIF TG_TABLE_NAME = 'policy_resources' THEN
        v_broken := CASE
            WHEN NOT NEW.key ~ respool._key_pattern() THEN 'policy_resources_key_check'
            WHEN NOT NEW.reserved >= 0 THEN 'policy_resources_reserved_check'
            WHEN NOT NEW."limit" > 0 THEN 'policy_resources_limit_check'
            WHEN NOT NEW.configured >= 0 THEN 'policy_resources_configured_check'
            WHEN NOT (NEW."limit" IS NULL OR NEW.configured <= NEW."limit") THEN 'reserved_within_limit'
            WHEN NOT (NEW.reserved = NEW.configured OR NEW.reserved = 0) THEN 'reserved_in_force'
        END;
    ELSE  -- pool_resources
        v_broken := CASE
            WHEN NOT NEW.key ~ respool._key_pattern() THEN 'pool_resources_key_check'
            WHEN NOT NEW.capacity > 0 THEN 'pool_resources_capacity_check'
        END;
    END IF;
    IF v_broken IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', TG_TABLE_NAME, v_broken
            USING ERRCODE = 'check_violation', SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
                  CONSTRAINT = v_broken;
    END IF;
    RETURN NEW;
END $$;
COMMENT ON FUNCTION respool._check_written_fields() IS
    'Trigger: the CHECKs of the columns a status change or a charge never writes (a request''s fixed fields, a counter''s key, a policy''s limit and reserved share, a pool''s capacity), run when a row is inserted or an update names one of them; SQLSTATE 23514 naming the constraint it replaces (migration 0032).';

ALTER TABLE respool.requests
    DROP CONSTRAINT requests_subject_check,
    DROP CONSTRAINT requests_max_retries_check,
    DROP CONSTRAINT requests_lease_seconds_check,
    DROP CONSTRAINT requests_idempotency_key_check,
    DROP CONSTRAINT requests_max_seconds_check,
    DROP CONSTRAINT requests_node_selector_check,
    DROP CONSTRAINT requests_preemption_group_check,
    DROP CONSTRAINT requests_command_check,
    DROP CONSTRAINT requests_job_env_check,
    DROP CONSTRAINT requests_array_index_check;
CREATE TRIGGER requests_written_fields
    BEFORE INSERT OR UPDATE OF subject, max_retries, lease_seconds, idempotency_key, max_seconds, node_selector,
                               preemption_group, command, job_env, array_index
    ON respool.requests FOR EACH ROW EXECUTE FUNCTION respool._check_written_fields();

ALTER TABLE respool.policy_resources
    DROP CONSTRAINT policy_resources_key_check,
    DROP CONSTRAINT policy_resources_reserved_check,
    DROP CONSTRAINT policy_resources_limit_check,
    DROP CONSTRAINT policy_resources_configured_check,
    DROP CONSTRAINT reserved_within_limit,
    DROP CONSTRAINT reserved_in_force;
CREATE TRIGGER policy_resources_written_fields
    BEFORE INSERT OR UPDATE OF key, reserved, "limit", configured
    ON respool.policy_resources FOR EACH ROW EXECUTE FUNCTION respool._check_written_fields();

ALTER TABLE respool.pool_resources
    DROP CONSTRAINT pool_resources_key_check,
    DROP CONSTRAINT pool_resources_capacity_check;
CREATE TRIGGER pool_resources_written_fields
    BEFORE INSERT OR UPDATE OF key, capacity
    ON respool.pool_resources FOR EACH ROW EXECUTE FUNCTION respool._check_written_fields();
