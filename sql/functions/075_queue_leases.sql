-- Queue leases (SPEC §6, migration 0008): the reconciler's step 1 cancels queued requests whose
-- waiting client stopped heartbeating.

CREATE OR REPLACE FUNCTION respool._abandon_queue_leases(p_pool_id uuid, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid;
    v_pool uuid;
    v_pools uuid[];
    abandoned integer := 0;
BEGIN
    -- Queued requests of this pool whose queue lease (on their current attempt) lapsed. A request
    -- locked elsewhere (being granted, or a heartbeat's lease update) is left for the next pass.
    -- [SPEC §11.6] a gang waits on one member's entries: a lapsed member of it counts too.
    FOR v_id IN SELECT r.id
                  FROM respool.queue_leases l
                  JOIN respool.requests r ON r.id = l.request_id
                 WHERE l.expires_at <= p_now AND r.status = 'queued' AND r.attempt = l.attempt
                   AND EXISTS (SELECT FROM respool.queue_entries e
                                WHERE e.pool_id = p_pool_id
                                  AND (e.request_id = r.id
                                       OR e.request_id IN (SELECT m.id FROM respool.requests m
                                                            WHERE m.gang_id = r.gang_id)))
                 ORDER BY l.expires_at, r.id
                   FOR UPDATE OF r SKIP LOCKED LOOP
        -- Re-check under the row lock: a heartbeat may have renewed the lease meanwhile.
        CONTINUE WHEN NOT EXISTS (SELECT FROM respool.queue_leases l JOIN respool.requests r ON r.id = l.request_id
                                   WHERE l.request_id = v_id AND l.expires_at <= p_now
                                     AND r.status = 'queued' AND r.attempt = l.attempt);
        CONTINUE WHEN NOT respool._gang_lockable(v_id);  -- [SPEC §11.6] never wait for a member
        v_pools := respool._unqueue(v_id);
        PERFORM respool._set_status(v_id, 'cancelled', 'abandoned',
                                    'queue lease lapsed: the waiting client stopped heartbeating', p_now);
        PERFORM respool._gang_follow(v_id, 'cancelled', 'abandoned', 'abandoned', p_now);  -- [SPEC §11.6]
        DELETE FROM respool.queue_leases WHERE request_id = v_id;
        -- This pool's queue moves in the caller's step 4; other candidate pools are not locked
        -- here (lock order), so their reconcilers are woken instead.
        FOREACH v_pool IN ARRAY coalesce(v_pools, '{}') LOOP
            IF v_pool <> p_pool_id THEN
                PERFORM respool._pool_changed(v_pool);
            END IF;
        END LOOP;
        abandoned := abandoned + 1;
    END LOOP;
    -- Rows that bind nothing any more: their request left the queue, moved to another attempt,
    -- or is gone. Rows locked by a concurrent heartbeat or pass are left for a later one.
    DELETE FROM respool.queue_leases l
     WHERE l.request_id IN (SELECT x.request_id FROM respool.queue_leases x
                             WHERE NOT EXISTS (SELECT FROM respool.requests r
                                                WHERE r.id = x.request_id AND r.status = 'queued'
                                                  AND r.attempt = x.attempt)
                             FOR UPDATE SKIP LOCKED);
    RETURN abandoned;
END $$;
COMMENT ON FUNCTION respool._abandon_queue_leases(uuid, timestamptz) IS
    'Reconciler step 1, in a pool the caller has locked: queued requests of the pool whose queue lease lapsed on their current attempt become cancelled (reason abandoned; with the rest of their gang, SPEC §11.6) and leave every queue; other candidate pools'' reconcilers are woken. Also removes queue leases that no longer bind a queued request. Returns how many were abandoned.';
