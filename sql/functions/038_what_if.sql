-- What-if (SPEC §11.3): a create answered by the real engine in a subtransaction that is rolled
-- back. PL/pgSQL variables survive the rollback; rows, events and NOTIFYs (queued in the
-- subtransaction) do not.

CREATE OR REPLACE FUNCTION respool.what_if_request(
    p_subject text,
    p_pool text DEFAULT NULL,
    p_resources jsonb DEFAULT NULL,
    p_settings jsonb DEFAULT NULL,
    p_preemptible boolean DEFAULT true,
    p_max_retries integer DEFAULT 0,
    p_lease_seconds integer DEFAULT NULL,
    p_idempotency_key text DEFAULT NULL,
    p_labels jsonb DEFAULT NULL,
    p_max_seconds integer DEFAULT NULL,
    p_now timestamptz DEFAULT now())
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_request jsonb;
    v_victims jsonb := '[]';
    v_last_event bigint;
    v_pool uuid;
    c record;
BEGIN
    BEGIN
        SELECT * INTO c FROM respool.create_request(
            p_subject => p_subject, p_pool => p_pool, p_resources => p_resources, p_settings => p_settings,
            p_preemptible => p_preemptible, p_max_retries => p_max_retries, p_lease_seconds => p_lease_seconds,
            p_idempotency_key => p_idempotency_key, p_labels => p_labels, p_max_seconds => p_max_seconds,
            p_now => p_now);
        v_request := c.request;
        IF c.created AND v_request ->> 'status' = 'queued' THEN
            -- The reconciler's next pass over each of its candidate pools: who would it preempt
            -- for this request? (Its pools are locked by the create already.)
            v_last_event := coalesce((SELECT max(id) FROM respool.events), 0);
            FOR v_pool IN SELECT e.pool_id FROM respool.queue_entries e
                           WHERE e.request_id = (v_request ->> 'id')::uuid ORDER BY e.pool_id LOOP
                CONTINUE WHEN NOT EXISTS (SELECT FROM respool.requests
                                           WHERE id = (v_request ->> 'id')::uuid AND status = 'queued');
                PERFORM respool.reconcile_pool(v_pool, p_now);
            END LOOP;
            SELECT coalesce(jsonb_agg(jsonb_build_object('id', r.id, 'subject', r.subject, 'pool', r.pool_name,
                                                         'resources', r.resources)
                                      ORDER BY ev.id), '[]')
              INTO v_victims
              FROM respool.events ev JOIN respool.requests r ON r.id = ev.request_id
             WHERE ev.id > v_last_event AND ev.to_status IN ('preempting', 'preempted')
               AND ev.message LIKE '%for request ' || (v_request ->> 'id') || ' %';
        END IF;
        RAISE EXCEPTION 'what-if: roll back' USING ERRCODE = 'RP299';
    EXCEPTION WHEN SQLSTATE 'RP299' THEN
        NULL;  -- rolled back: nothing of it remains
    END;
    RETURN v_request || jsonb_build_object('would_preempt', v_victims);
END $$;
COMMENT ON FUNCTION respool.what_if_request(text, text, jsonb, jsonb, boolean, integer, integer, text, jsonb, integer, timestamptz) IS
    'SPEC §11.3: what a create would answer now (status, pool, queue position, message, reason, eta) plus would_preempt, the allocations the reconciler''s next pass would preempt for it; computed by the real create and reconcile in a rolled-back subtransaction: no row, event or NOTIFY remains. Input errors raise as for a create.';
