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

-- A running job's last lines: the text GET /v1/requests/{id}/logs reads (respool.job_logs: chunks
-- in order, a head part before its chunk's tail part, the dropped-bytes marker before the first
-- tail chunk), cut to its end; only the last chunks are read (the primary key, backwards), more
-- only while they hold too few lines. job_logs itself reads every chunk of the attempt.
CREATE OR REPLACE FUNCTION respool.job_log_tail(p_id uuid, p_lines integer DEFAULT 20,
                                                p_chars integer DEFAULT 8000)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    a respool.job_log_attempts;
    v_back integer := 1;
    v_rows integer;
    v_min integer;
    v_first_tail integer;
    v_marker text := '';
    v_text text;
    v_lines text[];
    v_n integer;
BEGIN
    SELECT l.* INTO a FROM respool.job_log_attempts l JOIN respool.requests r
        ON r.id = l.request_id AND r.attempt = l.attempt WHERE l.request_id = p_id;
    IF a.request_id IS NULL OR a.last_seq < 0 THEN
        RETURN NULL;  -- no output yet
    END IF;
    LOOP
        SELECT count(*), min(x.seq), min(x.seq) FILTER (WHERE NOT x.head) INTO v_rows, v_min, v_first_tail
          FROM (SELECT l.seq, l.head FROM respool.job_logs l
                 WHERE l.request_id = p_id AND l.attempt = a.attempt AND l.seq >= 0
                 ORDER BY l.seq DESC LIMIT v_back) x;
        -- The marker opens the first tail chunk of all: the chunk before it is a head one (or none).
        IF v_first_tail IS NOT NULL AND a.dropped_bytes > 0 AND NOT coalesce(
               (SELECT NOT l.head FROM respool.job_logs l WHERE l.request_id = p_id AND l.attempt = a.attempt
                   AND l.seq >= 0 AND l.seq < v_first_tail ORDER BY l.seq DESC LIMIT 1), false) THEN
            v_marker := CASE WHEN right(coalesce(
                            (SELECT l.data FROM respool.job_logs l WHERE l.request_id = p_id AND l.attempt = a.attempt AND l.seq < 0),
                            (SELECT l.data FROM respool.job_logs l WHERE l.request_id = p_id AND l.attempt = a.attempt
                                AND l.seq >= 0 AND l.seq < v_first_tail ORDER BY l.seq DESC LIMIT 1)), 1)
                            IS DISTINCT FROM E'\n' THEN E'\n' ELSE '' END
                        || format(E'[... %s bytes dropped ...]\n', a.dropped_bytes);
        END IF;
        SELECT string_agg(CASE WHEN c.seq = v_first_tail THEN v_marker || c.data ELSE c.data END, ''
                          ORDER BY c.s, c.head DESC) INTO v_text
          FROM (SELECT l.seq, l.seq AS s, l.head, l.data FROM respool.job_logs l
                 WHERE l.request_id = p_id AND l.attempt = a.attempt AND l.seq >= v_min
                UNION ALL  -- a head part (seq -1 - s) goes before its chunk's tail part
                SELECT l.seq, -1 - l.seq, l.head, l.data FROM respool.job_logs l
                 WHERE l.request_id = p_id AND l.attempt = a.attempt AND l.seq < 0 AND -1 - l.seq >= v_min) c;
        EXIT WHEN v_rows < v_back OR length(v_text) >= p_chars
               OR length(v_text) - length(replace(v_text, E'\n', '')) > p_lines;
        v_back := v_back * 8;
    END LOOP;
    v_lines := string_to_array(rtrim(coalesce(v_text, ''), E'\n'), E'\n');
    v_n := coalesce(cardinality(v_lines), 0);
    RETURN right(array_to_string(v_lines[greatest(1, v_n - p_lines + 1):v_n], E'\n'), p_chars);
END $$;
COMMENT ON FUNCTION respool.job_log_tail(uuid, integer, integer) IS 'The last p_lines lines (at most p_chars characters) of the output of a job''s current attempt, stdout and stderr as they came: the end of the text respool.job_logs reads (the [... N bytes dropped ...] marker where bytes were dropped), reading only the last chunks it needs; NULL while it has none. Read-only.';
