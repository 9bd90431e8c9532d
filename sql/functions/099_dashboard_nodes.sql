-- The dashboard's nodes (docs/api.md, GET /v1/dashboard): every node of every pool with its state,
-- labels, per-key used/capacity and its named devices with their holders (whole, or the slices of a
-- shared device), in one read.

CREATE OR REPLACE FUNCTION respool.dashboard_nodes()
RETURNS TABLE (pool text, name text, state text, labels jsonb, keys jsonb, devices jsonb)
LANGUAGE sql STABLE AS $$
    SELECT pl.name, n.name, n.state, n.labels,
           coalesce((
               SELECT jsonb_agg(jsonb_build_object(
                          'key', nr.key, 'capacity', nr.capacity, 'used', nr.used,
                          'named', nr.devices > 0)
                      ORDER BY nr.key)
                 FROM respool.node_resources nr
                WHERE nr.node_id = n.id), '[]'::jsonb),
           coalesce((
               SELECT jsonb_agg(jsonb_build_object(
                          'key', d.key, 'device', d.device, 'request_id', d.holder_id,
                          'subject', r.subject, 'sharing', nr.sharing, 'memory_mb', d.memory_mb,
                          'slices', coalesce((
                              SELECT jsonb_agg(jsonb_build_object(
                                         'request_id', h.request_id, 'subject', hr.subject,
                                         'memory_mb', h.memory_mb, 'share', h.share)
                                     ORDER BY h.memory_mb DESC, h.request_id)
                                FROM respool.device_slices h
                                JOIN respool.requests hr ON hr.id = h.request_id
                               WHERE h.node_id = d.node_id AND h.key = d.key
                                 AND h.device = d.device), '[]'::jsonb))
                      ORDER BY d.key, d.position)
                 FROM respool.node_devices d
                 JOIN respool.node_resources nr ON nr.node_id = d.node_id AND nr.key = d.key
                 LEFT JOIN respool.requests r ON r.id = d.holder_id
                WHERE d.node_id = n.id), '[]'::jsonb)
      FROM respool.nodes n
      JOIN respool.pools pl ON pl.id = n.pool_id
     ORDER BY pl.name, n.name
$$;
COMMENT ON FUNCTION respool.dashboard_nodes() IS 'Every node that is in a pool (by pool name, then node name): state, labels, keys (per key: capacity, used, named = the key has device ids) and devices (per key in list order: the device id, and the request id and subject of its whole holder, null when not held whole; sharing: its key''s sharing mode, null for whole devices only; memory_mb: its offer to slices, null when not shared; slices: its slice holders, largest first, each with request id, subject, memory_mb and share, [] when none). Nodes in no pool are left out. Read-only; one row per node.';
