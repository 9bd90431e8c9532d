-- Views of nodes and devices (docs/placement.md, docs/ops.md), readable by respool_reader like
-- 010_ops.sql (099_reader_scope.sql moves the grants to this database's reader role).
-- Plain joins of base tables: no function that reads a table, so a reader needs nothing more.

CREATE VIEW respool.node_usage AS
SELECT pl.name AS pool, n.name AS node, n.state, nr.key,
       nr.capacity, nr.used AS allocated, nr.capacity - nr.used AS free
  FROM respool.nodes n
  JOIN respool.node_resources nr ON nr.node_id = n.id
  LEFT JOIN respool.pools pl ON pl.id = n.pool_id
 ORDER BY pl.name NULLS LAST, n.name, nr.key;
COMMENT ON VIEW respool.node_usage IS
    'Per node and key the node tracks: its pool (NULL: in no pool), state, capacity, allocated units (the node''s counter) and free (capacity minus allocated: negative after a shrink until the reconciler preempts). Ordered by pool, node, key.';

CREATE VIEW respool.device_holders AS
SELECT pl.name AS pool, n.name AS node, d.key, d.device, coalesce(d.holder_id, h.request_id) AS request_id,
       r.subject, d.position,
       CASE WHEN d.holder_id IS NOT NULL THEN 'whole' WHEN h.request_id IS NOT NULL THEN 'slice' END AS holds,
       h.memory_mb, h.share
  FROM respool.node_devices d
  JOIN respool.nodes n ON n.id = d.node_id
  LEFT JOIN respool.pools pl ON pl.id = n.pool_id
  LEFT JOIN respool.device_slices h ON h.node_id = d.node_id AND h.key = d.key AND h.device = d.device
  LEFT JOIN respool.requests r ON r.id = coalesce(d.holder_id, h.request_id)
 ORDER BY pl.name NULLS LAST, n.name, d.key, d.position, h.request_id;
COMMENT ON VIEW respool.device_holders IS
    'One row per named device of a node (GPU index, UUID or MIG id) and holder, in the node''s list order (position): the request that holds it and its subject, both NULL while the device is free; holds: whole, or slice for a slice of a shared device (one row per slice, with its memory_mb and share; docs/placement.md, "Sharing a GPU").';

CREATE VIEW respool.device_usage AS
SELECT pl.name AS pool, n.name AS node, d.key, d.device, nr.sharing, d.memory_mb,
       d.memory_used, d.memory_mb - d.memory_used AS memory_free,
       CASE WHEN d.memory_mb IS NOT NULL THEN d.share_used END AS share_used,
       CASE WHEN d.memory_mb IS NOT NULL THEN 100 - d.share_used END AS share_free,
       (SELECT count(*) FROM respool.device_slices h
         WHERE h.node_id = d.node_id AND h.key = d.key AND h.device = d.device) AS slices,
       d.holder_id AS whole_holder, d.position
  FROM respool.node_devices d
  JOIN respool.nodes n ON n.id = d.node_id
  JOIN respool.node_resources nr ON nr.node_id = d.node_id AND nr.key = d.key
  LEFT JOIN respool.pools pl ON pl.id = n.pool_id
 ORDER BY pl.name NULLS LAST, n.name, d.key, d.position;
COMMENT ON VIEW respool.device_usage IS
    'One row per named device of a node: its sharing mode (NULL: whole devices only), its offer to slices (memory_mb: device memory less what it keeps back; NULL when not shared), the memory and share its slices hold and leave free, how many slices it has, and the request holding it whole (NULL: none). A device with slices is not free for a whole request, and the reverse (docs/placement.md, "Sharing a GPU").';

GRANT SELECT ON respool.node_usage, respool.device_holders, respool.device_usage TO respool_reader;
