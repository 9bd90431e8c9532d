-- 0014_nodes: placement on nodes and devices (docs/placement.md).
-- A pool may be backed by nodes (machines). Every allocation in such a pool is placed on one
-- node (respool.placements) and, for keys with device ids, on named devices
-- (respool.node_devices.holder_id). Per-node counters are guarded like the pool's: one row per
-- (node, key), `used + n <= capacity` in the UPDATE, CHECKs that fail loudly.

ALTER TABLE respool.pools
    ADD COLUMN placement text NOT NULL DEFAULT 'pack' CHECK (placement IN ('pack', 'spread'));
COMMENT ON COLUMN respool.pools.placement IS
    'Pools with nodes: pack (the fitting node left with the fewest free units) or spread (the most).';

CREATE TABLE respool.nodes (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name       text NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
    pool_id    uuid REFERENCES respool.pools (id) ON DELETE SET NULL,
    labels     jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object'),
    state      text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'cordoned', 'draining')),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX nodes_pool_idx ON respool.nodes (pool_id, name);
COMMENT ON TABLE respool.nodes IS
    'Machines. A node in a pool gives it capacity (the pool''s capacity is the sum over its nodes); pool_id NULL: registered, in no pool.';

CREATE TABLE respool.node_resources (
    node_id  uuid NOT NULL REFERENCES respool.nodes (id) ON DELETE CASCADE,
    key      text NOT NULL CHECK (key ~ '^[a-z][a-z0-9_]{0,62}$'),
    capacity bigint NOT NULL CHECK (capacity > 0),
    used     bigint NOT NULL DEFAULT 0 CHECK (used >= 0),
    devices  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (node_id, key),
    CONSTRAINT devices_name_every_unit CHECK (devices = 0 OR devices = capacity)
);
COMMENT ON COLUMN respool.node_resources.devices IS
    'How many named devices (respool.node_devices) the key has: 0 for anonymous units, else exactly capacity.';
COMMENT ON TABLE respool.node_resources IS
    'Capacity and allocated units per node and key; a key the node lacks is untracked for soft keys, 0 for others. used may pass capacity only after a shrink, until the reconciler preempts (I5).';

CREATE TABLE respool.node_devices (
    node_id   uuid NOT NULL REFERENCES respool.nodes (id) ON DELETE CASCADE,
    key       text NOT NULL,
    device    text NOT NULL CHECK (device <> '' AND length(device) <= 128),
    position  integer NOT NULL CHECK (position >= 0),
    holder_id uuid REFERENCES respool.requests (id),
    PRIMARY KEY (node_id, key, device),
    UNIQUE (node_id, key, position),
    FOREIGN KEY (node_id, key) REFERENCES respool.node_resources (node_id, key) ON DELETE CASCADE
);
CREATE INDEX node_devices_holder_idx ON respool.node_devices (holder_id) WHERE holder_id IS NOT NULL;
COMMENT ON TABLE respool.node_devices IS
    'Named devices of a node key (GPU index, UUID or MIG id) in list order; holder_id: the allocation that holds the device. One holder column per device: two holders of one device cannot be stored (I6).';

CREATE TABLE respool.placements (
    request_id uuid PRIMARY KEY,
    node_id    uuid NOT NULL REFERENCES respool.nodes (id),
    resources  jsonb NOT NULL
);
CREATE INDEX placements_node_idx ON respool.placements (node_id);
COMMENT ON TABLE respool.placements IS
    'Where a holding request of a pool with nodes is placed: its node and the units charged there (the request''s resources on the keys the node tracks). Written by respool._place, removed by respool._unplace (I7).';

ALTER TABLE respool.requests
    ADD COLUMN node_selector jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(node_selector) = 'object'),
    ADD COLUMN distinct_nodes boolean NOT NULL DEFAULT false,
    ADD COLUMN earmark_node_id uuid;
COMMENT ON COLUMN respool.requests.node_selector IS
    'Labels a node must carry to hold the request ({label: value}; the built-in label node is the node''s name).';
COMMENT ON COLUMN respool.requests.distinct_nodes IS
    'A gang member whose gang wants every member on a different node.';
COMMENT ON COLUMN respool.requests.earmark_node_id IS
    'With earmark_pool_id: the node whose units victims in their grace period free for this request.';
ALTER TABLE respool.requests ADD CONSTRAINT earmark_node_with_pool
    CHECK (earmark_node_id IS NULL OR earmark_pool_id IS NOT NULL);

-- The queue shape gains the selector: entries of one (policy, preemptible, resources, selector)
-- are alike for every admission rule, node rules included.
ALTER TABLE respool.queue_entries ADD COLUMN node_selector jsonb NOT NULL DEFAULT '{}';
COMMENT ON COLUMN respool.queue_entries.node_selector IS 'Copy of requests.node_selector: part of the entry''s shape.';
DROP INDEX respool.queue_entries_shape_idx;
CREATE INDEX queue_entries_shape_idx
    ON respool.queue_entries (pool_id, policy_id, preemptible, resources, node_selector, queued_at, request_id);
