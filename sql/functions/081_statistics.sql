-- Table statistics that keep up with a young database (docs/ops.md, "Statistics of a young
-- database"). Every connection keeps the plans of the engine's statements; PostgreSQL plans them
-- anew when a table they read is analyzed. Autovacuum analyzes a table once a minute at most, so
-- in the first minutes of a database (or after a queue fills from empty) a plan made when a table
-- held a page reads all of its rows for one.

CREATE OR REPLACE FUNCTION respool.analyze_grown_tables(p_min_rows bigint DEFAULT 1000)
RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
    v_analyzed text[] := '{}';
    t record;
BEGIN
    -- One caller at a time; the others skip (one table's ANALYZE waits for another's).
    IF NOT pg_try_advisory_xact_lock(hashtext('respool.analyze_grown_tables')) THEN
        RETURN v_analyzed;
    END IF;
    FOR t IN SELECT s.relname
               FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
              WHERE s.schemaname = 'respool' AND s.n_live_tup >= p_min_rows
                AND s.n_live_tup >= 2 * c.reltuples  -- (never analyzed: reltuples is -1)
                AND pg_has_role(c.relowner, 'USAGE')  -- only the tables it may analyze
              ORDER BY s.relname LOOP
        EXECUTE format('ANALYZE respool.%I', t.relname);
        v_analyzed := v_analyzed || t.relname::text;
    END LOOP;
    RETURN v_analyzed;
END $$;
COMMENT ON FUNCTION respool.analyze_grown_tables(bigint) IS
    'Analyzes each respool table that holds at least p_min_rows live rows and at least twice the rows its statistics say (never analyzed: any count), so that plans kept by every connection are made again for its size; returns the tables analyzed. Concurrent callers: one analyzes, the others return none.';
