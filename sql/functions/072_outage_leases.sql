-- A lease must not lapse because respool itself could not take heartbeats (docs/preemption.md,
-- "Outages"). API processes call respool.service_alive() every second; a gap longer than
-- respool.outage_threshold() between two calls is an outage, and every held lease, grace
-- period and queue lease first gets the gap back. Meanwhile (the service looks down) nothing lapses: the
-- reconciler's expiry steps and the heartbeat's lapsed-lease check ask respool.leases_may_lapse().

CREATE OR REPLACE FUNCTION respool.outage_threshold()
RETURNS interval LANGUAGE sql IMMUTABLE AS $$ SELECT interval '3 seconds' $$;
COMMENT ON FUNCTION respool.outage_threshold() IS 'A gap in service liveness longer than this (three missed one-second ticks) is an outage of respool: leases get the gap back.';

CREATE OR REPLACE FUNCTION respool.leases_may_lapse()
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (SELECT 1 FROM respool.service_heartbeat
                        WHERE now() - last_seen > respool.outage_threshold())
$$;
COMMENT ON FUNCTION respool.leases_may_lapse() IS 'False while respool looks down (no API recorded itself alive within outage_threshold, real time): no lease or grace period lapses then; the next service_alive gives the time back. True when liveness is not tracked (no row).';

CREATE OR REPLACE FUNCTION respool.service_alive()
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_last timestamptz;
    v_gap interval := interval '0';
    v_leases integer := 0;
    v_graces integer := 0;
BEGIN
    -- The row lock serializes API processes: each gap is given back exactly once.
    SELECT last_seen INTO v_last FROM respool.service_heartbeat WHERE id FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO respool.service_heartbeat (id, last_seen) VALUES (true, now())
            ON CONFLICT (id) DO NOTHING;
        RETURN jsonb_build_object('gap_seconds', 0, 'leases', 0, 'grace_periods', 0);
    END IF;
    IF now() - v_last > respool.outage_threshold() THEN
        v_gap := now() - v_last;
        UPDATE respool.requests SET lease_expires_at = lease_expires_at + v_gap
         WHERE status = 'allocated' AND lease_expires_at IS NOT NULL;
        GET DIAGNOSTICS v_leases = ROW_COUNT;
        UPDATE respool.requests SET preempt_deadline = preempt_deadline + v_gap
         WHERE status = 'preempting' AND preempt_deadline IS NOT NULL;
        GET DIAGNOSTICS v_graces = ROW_COUNT;
        -- Waiting clients could not heartbeat either: their queue leases get the gap back too.
        UPDATE respool.queue_leases SET expires_at = expires_at + v_gap;
        RAISE LOG 'respool: service outage of %: % leases and % grace periods extended by it',
            v_gap, v_leases, v_graces;
    END IF;
    IF now() > v_last THEN
        UPDATE respool.service_heartbeat SET last_seen = now() WHERE id;
    END IF;
    RETURN jsonb_build_object('gap_seconds', extract(epoch FROM v_gap), 'leases', v_leases,
                              'grace_periods', v_graces);
END $$;
COMMENT ON FUNCTION respool.service_alive() IS 'An API process is up: records it. After a gap longer than outage_threshold (respool was down: no heartbeat could be taken), first extends every allocated lease and every grace deadline by the gap, in the same transaction, so no holder loses time to the outage. Returns {gap_seconds, leases, grace_periods}.';
