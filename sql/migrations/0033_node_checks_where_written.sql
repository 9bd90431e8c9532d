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

CREATE FUNCTION respool._refuse_written_field(p_schema text, p_table text, p_constraint text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', p_table, p_constraint
        USING ERRCODE = 'check_violation', SCHEMA = p_schema, TABLE = p_table, CONSTRAINT = p_constraint;
END $$;
COMMENT ON FUNCTION respool._refuse_written_field(text, text, text) IS
    'Raises what PostgreSQL raises for a failed CHECK (SQLSTATE 23514, its message, schema, table and constraint name), for a trigger that checks a field where it is written (migration 0033).';

CREATE FUNCTION respool._check_written_node_fields() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_broken text;
BEGIN
    -- As respool._check_written_fields (0032): each test NULL where the CHECK it replaces passes.
    IF TG_TABLE_NAME = 'node_resources' THEN
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
    PERFORM respool._refuse_written_field(TG_TABLE_SCHEMA, TG_TABLE_NAME, v_broken) WHERE v_broken IS NOT NULL;
    RETURN NEW;
END $$;
COMMENT ON FUNCTION respool._check_written_node_fields() IS
    'Trigger: the CHECKs of a node''s counters and devices that a placement never writes (a counter''s key, capacity, device count and sharing offer; a device''s id, position and memory), run when a row is inserted or an update names one of them; SQLSTATE 23514 naming the constraint it replaces (migration 0033).';

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
    ON respool.node_resources FOR EACH ROW EXECUTE FUNCTION respool._check_written_node_fields();

ALTER TABLE respool.node_devices
    DROP CONSTRAINT node_devices_device_check,
    DROP CONSTRAINT node_devices_position_check,
    DROP CONSTRAINT node_devices_memory_mb_check;
CREATE TRIGGER node_devices_written_fields
    BEFORE INSERT OR UPDATE OF device, position, memory_mb
    ON respool.node_devices FOR EACH ROW EXECUTE FUNCTION respool._check_written_node_fields();
