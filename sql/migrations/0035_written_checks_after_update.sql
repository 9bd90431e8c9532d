-- 0035_written_checks_after_update: the checks where written (0032, 0033) run after an update.
--
-- When a table has a BEFORE UPDATE row trigger, PostgreSQL locks every row an UPDATE writes
-- before it decides whether the trigger fires (it fetches a stable version for the trigger; the
-- trigger's column list is looked at later): one more WAL record and a lock per row. A grant and
-- a release each wrote such a lock for every pool and policy counter they charged and for the
-- request row, nine a cycle (docs/benchmarks.md). An AFTER UPDATE trigger reads the row without
-- locking it and fires only when the update names one of its columns. A row that breaks a check
-- is refused as before (SQLSTATE 23514, the constraint's name) and its statement aborted; an
-- insert is still checked before it is written.

DROP TRIGGER requests_written_fields ON respool.requests;
CREATE TRIGGER requests_written_fields
    BEFORE INSERT ON respool.requests FOR EACH ROW EXECUTE FUNCTION respool._check_written_fields();
CREATE TRIGGER requests_written_fields_updated
    AFTER UPDATE OF subject, max_retries, lease_seconds, idempotency_key, max_seconds, node_selector,
                    preemption_group, command, job_env, array_index
    ON respool.requests FOR EACH ROW EXECUTE FUNCTION respool._check_written_fields();

DROP TRIGGER policy_resources_written_fields ON respool.policy_resources;
CREATE TRIGGER policy_resources_written_fields
    BEFORE INSERT ON respool.policy_resources FOR EACH ROW EXECUTE FUNCTION respool._check_written_fields();
CREATE TRIGGER policy_resources_written_fields_updated
    AFTER UPDATE OF key, reserved, "limit", configured
    ON respool.policy_resources FOR EACH ROW EXECUTE FUNCTION respool._check_written_fields();

DROP TRIGGER pool_resources_written_fields ON respool.pool_resources;
CREATE TRIGGER pool_resources_written_fields
    BEFORE INSERT ON respool.pool_resources FOR EACH ROW EXECUTE FUNCTION respool._check_written_fields();
CREATE TRIGGER pool_resources_written_fields_updated
    AFTER UPDATE OF key, capacity
    ON respool.pool_resources FOR EACH ROW EXECUTE FUNCTION respool._check_written_fields();

DROP TRIGGER node_resources_written_fields ON respool.node_resources;
CREATE TRIGGER node_resources_written_fields
    BEFORE INSERT ON respool.node_resources FOR EACH ROW EXECUTE FUNCTION respool._check_written_node_fields();
CREATE TRIGGER node_resources_written_fields_updated
    AFTER UPDATE OF key, capacity, devices, sharing, device_memory_mb, reserved_memory_mb, derived_from
    ON respool.node_resources FOR EACH ROW EXECUTE FUNCTION respool._check_written_node_fields();

DROP TRIGGER node_devices_written_fields ON respool.node_devices;
CREATE TRIGGER node_devices_written_fields
    BEFORE INSERT ON respool.node_devices FOR EACH ROW EXECUTE FUNCTION respool._check_written_node_fields();
CREATE TRIGGER node_devices_written_fields_updated
    AFTER UPDATE OF device, position, memory_mb
    ON respool.node_devices FOR EACH ROW EXECUTE FUNCTION respool._check_written_node_fields();
