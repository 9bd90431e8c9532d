-- Many requests read at once: a page of the request list, the members of a batch (docs/scheduling.md),
-- the answers of many long-polls that end together (one release granting thousands, a wave of
-- waits timing out, shutdown), with the queued ones' positions, messages and
-- ETAs computed set-based (respool._queued_details), not one ETA simulation per request.

CREATE OR REPLACE FUNCTION respool.request_docs(p_ids uuid[])
RETURNS TABLE (id uuid, doc json) LANGUAGE sql STABLE AS $$
    WITH found AS MATERIALIZED (
           -- one primary-key probe per id, whatever a plan kept from a small table thinks of its
           -- size (docs/benchmarks.md, "Plans kept from a small table")
           SELECT x.req, (x.req).id, (x.req).status
             FROM (SELECT DISTINCT unnest(p_ids) AS id) u
            CROSS JOIN LATERAL (SELECT r AS req FROM respool.requests r WHERE r.id = u.id LIMIT 1) x),
         details AS MATERIALIZED (
           SELECT d.request_id, d.queue_position, d.message, d.eta
             FROM respool._queued_details(ARRAY(SELECT id FROM found WHERE status = 'queued'), now()) d)
    SELECT f.id, CASE WHEN f.status = 'queued' AND d.request_id IS NULL
                -- queued without a queue entry (_queued_details leaves it out): its own read
                THEN respool.request_json(f.id)::json
                ELSE respool._request_doc(f.req, d.queue_position,
                                          CASE WHEN f.status = 'queued' THEN d.message ELSE (f.req).message END,
                                          d.eta) END
      FROM found f LEFT JOIN details d ON d.request_id = f.id
$$;
COMMENT ON FUNCTION respool.request_docs(uuid[]) IS 'Guarantees: one (id, document) row per existing request among p_ids (unknown ids are left out, order unspecified), each equal to what respool.request_json gives for that request alone at the same now() (position, message and ETA of a queued one, its gang''s for a gang member); each involved pool and shape computed once for all of them (respool._queued_details). Read-only.';
