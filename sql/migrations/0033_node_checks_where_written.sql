-- 0033_node_checks_where_written: as 0032 did for requests and the pool and policy counters,
-- the checks of a node's counters and devices that a placement never writes run when those
-- columns are written.
--
-- Every grant in a pool with nodes charges a node counter and takes its devices, and every
-- release gives them back: four row updates that parsed and prepared the eleven CHECKs of
-- node_resources and the seven of node_devices each time (docs/benchmarks.md). A node's key,
-- capacity, device count and sharing offer, and a device's id, position and memory, change only
-- when the node is registered or updated. The invariants a placement can break stay CHECKs:
-- used >= 0, a device whole or sliced, slices within the device's offer.

CREATE OR REPLACE FUNCTION respool._check_written_fields() RETURNS trigger LANGUAGE plpgsql AS $$
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
    ELSIF TG_TABLE_NAME = 'pool_resources' THEN
        v_broken := CASE
            WHEN NOT NEW.key ~ respool._key_pattern() THEN 'pool_resources_key_check'
            WHEN NOT NEW.capacity > 0 THEN 'pool_resources_capacity_check'
        END;
    ELSIF TG_TABLE_NAME = 'node_resources' THEN
        v_broken := CASE
            WHEN NOT NEW.key ~ respool._key_pattern() THEN 'node_resources_key_check'
            WHEN NOT NEW.capacity > 0 THEN 'node_resources_capacity_check'
            WHEN NOT (NEW.devices = 0 OR NEW.devices = NEW.capacity) THEN 'devices_name_every_unit'
            WHEN NOT NEW.sharing IN ('mps', 'time-slicing') THEN 'node_resources_sharing_check'
            WHEN NOT NEW.device_memory_mb > 0 THEN 'node_resources_device_memory_mb_check'
            WHEN NOT NEW.reserved_memory_mb >= 0 THEN 'node_resources_reserved_memory_mb_check'
            WHEN NOT (NEW.sharing IS NULL OR NEW.devices > 0 AND NEW.device_memory_mb IS NOT NULL)
                THEN 'sharing_of_named_devices'
            WHEN NOT (NEW.device_memory_mb IS NULL OR NEW.devices > 0) THEN 'device_memory_of_named_devices'
            WHEN NOT (NEW.reserved_memory_mb = 0 OR NEW.reserved_memory_mb < NEW.device_memory_mb)
                THEN 'reserved_below_device_memory'
            WHEN NOT (NEW.derived_from IS NULL OR NEW.devices = 0 AND NEW.sharing IS NULL)
                THEN 'derived_rows_have_no_devices'
        END;
    ELSE  -- node_devices
        v_broken := CASE
            WHEN NOT (NEW.device <> '' AND length(NEW.device) <= respool._max_device_id())
                THEN 'node_devices_device_check'
            WHEN NOT NEW.position >= 0 THEN 'node_devices_position_check'
            WHEN NOT NEW.memory_mb > 0 THEN 'node_devices_memory_mb_check'
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
    'Trigger: the CHECKs of the columns a status change, a charge or a placement never writes (a request''s fixed fields, a counter''s key, a policy''s limit and reserved share, a pool''s or node''s capacity and device offer, a device''s id), run when a row is inserted or an update names one of them; SQLSTATE 23514 naming the constraint it replaces (migrations 0032, 0033).';

ALTER TABLE respool.node_resources
    DROP CONSTRAINT node_resources_key_check,
    DROP CONSTRAINT node_resources_capacity_check,
    DROP CONSTRAINT devices_name_every_unit,
    DROP CONSTRAINT node_resources_sharing_check,
    DROP CONSTRAINT node_resources_device_memory_mb_check,
    DROP CONSTRAINT node_resources_reserved_memory_mb_check,
    DROP CONSTRAINT sharing_of_named_devices,
    DROP CONSTRAINT device_memory_of_named_devices,
    DROP CONSTRAINT reserved_below_device_memory,
    DROP CONSTRAINT derived_rows_have_no_devices;
CREATE TRIGGER node_resources_written_fields
    BEFORE INSERT OR UPDATE OF key, capacity, devices, sharing, device_memory_mb, reserved_memory_mb, derived_from
    ON respool.node_resources FOR EACH ROW EXECUTE FUNCTION respool._check_written_fields();

ALTER TABLE respool.node_devices
    DROP CONSTRAINT node_devices_device_check,
    DROP CONSTRAINT node_devices_position_check,
    DROP CONSTRAINT node_devices_memory_mb_check;
CREATE TRIGGER node_devices_written_fields
    BEFORE INSERT OR UPDATE OF device, position, memory_mb
    ON respool.node_devices FOR EACH ROW EXECUTE FUNCTION respool._check_written_fields();
