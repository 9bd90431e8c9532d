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
SELECT pl.name AS pool, n.name AS node, d.key, d.device, d.holder_id AS request_id, r.subject,
       d.position
  FROM respool.node_devices d
  JOIN respool.nodes n ON n.id = d.node_id
  LEFT JOIN respool.pools pl ON pl.id = n.pool_id
  LEFT JOIN respool.requests r ON r.id = d.holder_id
 ORDER BY pl.name NULLS LAST, n.name, d.key, d.position;
COMMENT ON VIEW respool.device_holders IS
    'One row per named device of a node (GPU index, UUID or MIG id), in the node''s list order (position): the request that holds it and its subject, both NULL while the device is free.';

GRANT SELECT ON respool.node_usage, respool.device_holders TO respool_reader;
