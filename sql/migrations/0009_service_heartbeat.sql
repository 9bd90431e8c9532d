-- 0009_service_heartbeat: when respool last took heartbeats (docs/preemption.md, "Outages").
-- Each API process records itself alive every second; a gap in that record is an outage of
-- respool (its API or its database), during which no holder could heartbeat, so no lease may
-- lapse for it (respool.service_alive, respool.leases_may_lapse in functions/072).
CREATE TABLE respool.service_heartbeat (
    id        boolean PRIMARY KEY DEFAULT true CHECK (id),
    last_seen timestamptz NOT NULL
);
COMMENT ON TABLE respool.service_heartbeat IS
    'One row: the last time an API process recorded itself alive (respool.service_alive). No row: liveness not tracked (no API ever ran); leases lapse as usual.';
