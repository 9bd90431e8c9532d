-- The dashboard's nodes (docs/api.md, GET /v1/dashboard): every node of every pool with its state,
-- labels, per-key used/capacity and its named devices with their holders, in one read.

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
                          'subject', r.subject)
                      ORDER BY d.key, d.position)
                 FROM respool.node_devices d
                 LEFT JOIN respool.requests r ON r.id = d.holder_id
                WHERE d.node_id = n.id), '[]'::jsonb)
      FROM respool.nodes n
      JOIN respool.pools pl ON pl.id = n.pool_id
     ORDER BY pl.name, n.name
$$;
COMMENT ON FUNCTION respool.dashboard_nodes() IS 'Every node that is in a pool (by pool name, then node name): state, labels, keys (per key: capacity, used, named = the key has device ids) and devices (per key in list order: the device id, and the request id and subject of its holder, null when free). Nodes in no pool are left out. Read-only; one row per node.';
