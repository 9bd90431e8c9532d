-- The dashboard's queue: only each pool's queue head is read
-- (respool._queue_top: O(shapes * limit)), never the whole order and never once per entry: with
-- 10,000 queued the per-entry way took seconds. (The positions of a page of requests are
-- respool._queue_positions, sql/functions/033_queue_order.sql.) Its ETA is the engine's
-- (respool._eta_pool, sql/functions/037_eta.sql), one simulation per pool shown, as the queue
-- view reads it.

CREATE OR REPLACE FUNCTION respool.dashboard_queue(p_limit integer DEFAULT 200)
RETURNS TABLE (pool text, "position" bigint, request_id uuid, subject text, resources jsonb,
               preemptible boolean, priority integer, in_share boolean, waiting_seconds double precision,
               attempt integer, labels jsonb, waiting_for text, eta jsonb)
LANGUAGE sql STABLE AS $$
    -- The first p_limit entries of every pool (its queue head, computed once per pool and
    -- MATERIALIZED: never re-run per row), cut to p_limit rows; only those rows' shapes get
    -- their blocker sentence, once per (pool, policy, resources, preemptible) shape.
    WITH page AS MATERIALIZED (
        SELECT pl.id AS pool_id, pl.name AS pool, o.request_id, o.policy_id, o.subject,
               o.priority, o.in_share, o.position
          FROM respool.pools pl
         CROSS JOIN LATERAL respool._queue_top(pl.id, p_limit) o
         ORDER BY pl.name, o.position
         LIMIT p_limit
    ), rows AS MATERIALIZED (
        SELECT q.*, r.resources, r.preemptible, r.queued_at, r.attempt, r.labels,
               CASE WHEN r.gang_id IS NULL THEN r.node_selector END AS node_selector
          FROM page q JOIN respool.requests r ON r.id = q.request_id
    ), shapes AS MATERIALIZED (
        SELECT s.pool_id, s.policy_id, s.resources, s.preemptible, s.node_selector,
               coalesce(respool._blocker(s.resources, s.preemptible, s.pool_id, s.policy_id),
                        respool._node_blocker(s.resources, s.pool_id, s.node_selector)) AS blocker
          FROM (SELECT DISTINCT x.pool_id, x.policy_id, x.resources, x.preemptible, x.node_selector FROM rows x) s
    ), etas AS MATERIALIZED (
        -- One ETA simulation per pool among the rows (it estimates that pool's first
        -- respool._eta_depth() entries; rows without an estimate get null).
        SELECT p.pool_id, e.request_id, e.p50_seconds, e.p90_seconds
          FROM (SELECT DISTINCT x.pool_id FROM rows x) p
         CROSS JOIN LATERAL respool._eta_pool(p.pool_id, now()) e
    )
    SELECT q.pool, q.position, q.request_id, q.subject, q.resources, q.preemptible, q.priority,
           q.in_share, extract(epoch FROM now() - q.queued_at)::double precision, q.attempt, q.labels,
           coalesce(s.blocker, 'fits, waiting for its turn'),
           CASE WHEN e.p50_seconds IS NOT NULL
                THEN jsonb_build_object('p50_seconds', e.p50_seconds, 'p90_seconds', e.p90_seconds) END
      FROM rows q
      JOIN shapes s ON s.pool_id = q.pool_id AND s.policy_id = q.policy_id
                   AND s.resources = q.resources AND s.preemptible = q.preemptible
                   AND s.node_selector IS NOT DISTINCT FROM q.node_selector
      LEFT JOIN etas e ON e.pool_id = q.pool_id AND e.request_id = q.request_id
     ORDER BY q.pool, q.position
$$;
COMMENT ON FUNCTION respool.dashboard_queue(integer) IS 'The first p_limit queue entries over all pools (by pool name, then grant order), each with what blocks it now (or ''fits, waiting for its turn'') and its ETA in that pool: {p50_seconds, p90_seconds} from respool._eta_pool, or NULL when the engine has no estimate (no recorded holds, or deeper than respool._eta_depth()). Cost O(shapes * p_limit) per pool shown, not O(queue). Read-only.';

-- A running job's last lines, read through respool.job_logs (the read of GET
-- /v1/requests/{id}/logs): only the last few chunks, more only while they hold too few lines.
CREATE OR REPLACE FUNCTION respool.job_log_tail(p_id uuid, p_lines integer DEFAULT 20,
                                                p_chars integer DEFAULT 8000)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_last integer := (SELECT a.last_seq FROM respool.job_log_attempts a JOIN respool.requests r
                         ON r.id = a.request_id AND r.attempt = a.attempt WHERE a.request_id = p_id);
    v_back integer := 4;
    v_text text;
    v_lines text[];
    v_n integer;
BEGIN
    IF v_last IS NULL OR v_last < 0 THEN
        RETURN NULL;  -- no output yet
    END IF;
    LOOP
        SELECT string_agg(c.value ->> 'data', '' ORDER BY c.ordinality) INTO v_text
          FROM jsonb_array_elements(respool.job_logs(p_id, NULL, v_last - v_back) -> 'chunks')
               WITH ORDINALITY c;
        EXIT WHEN v_last - v_back < 0 OR length(v_text) >= p_chars
               OR length(v_text) - length(replace(v_text, E'\n', '')) > p_lines;
        v_back := v_back * 4;
    END LOOP;
    v_lines := string_to_array(rtrim(coalesce(v_text, ''), E'\n'), E'\n');
    v_n := coalesce(cardinality(v_lines), 0);
    RETURN right(array_to_string(v_lines[greatest(1, v_n - p_lines + 1):v_n], E'\n'), p_chars);
END $$;
COMMENT ON FUNCTION respool.job_log_tail(uuid, integer, integer) IS 'The last p_lines lines (at most p_chars characters) of the stored output of a job''s current attempt, stdout and stderr as they came (through respool.job_logs, so a [... N bytes dropped ...] marker shows where bytes were dropped); NULL while it has none. Reads only the last chunks it needs. Read-only.';
