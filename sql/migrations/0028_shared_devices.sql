-- 0028_shared_devices: devices shared by slices (docs/placement.md, "Sharing a GPU").
--
-- A device key of a node (one with a device list) may be shared: each of its devices then offers
-- memory_mb = device_memory_mb - reserved_memory_mb and a compute share of 100, and a request may
-- hold a slice of one device (<K>_memory_mb, optionally <K>_share) instead of whole devices. The
-- node keeps two derived counters per shared key, <K>_memory_mb and <K>_share (the sums of its
-- devices' offers), so the pool's derived capacity and the node rule count slices like any key.
-- Per device the slices are counted too (memory_used, share_used), under CHECKs that make the
-- device invariants fail loudly: slices within the offer (I8) and never held whole and in slices
-- at once (I9).

ALTER TABLE respool.node_resources
    ADD COLUMN sharing text CHECK (sharing IN ('mps', 'time-slicing')),
    ADD COLUMN device_memory_mb bigint CHECK (device_memory_mb > 0),
    ADD COLUMN reserved_memory_mb bigint NOT NULL DEFAULT 0 CHECK (reserved_memory_mb >= 0),
    ADD COLUMN derived_from text,
    ADD CONSTRAINT sharing_of_named_devices CHECK (sharing IS NULL OR (devices > 0 AND device_memory_mb IS NOT NULL)),
    ADD CONSTRAINT device_memory_of_named_devices CHECK (device_memory_mb IS NULL OR devices > 0),
    ADD CONSTRAINT reserved_below_device_memory CHECK (reserved_memory_mb = 0 OR reserved_memory_mb < device_memory_mb),
    ADD CONSTRAINT derived_rows_have_no_devices CHECK (derived_from IS NULL OR (devices = 0 AND sharing IS NULL));
COMMENT ON COLUMN respool.node_resources.sharing IS
    'A device key whose devices may be sliced: mps or time-slicing (the isolation a slice gets); NULL: whole devices only.';
COMMENT ON COLUMN respool.node_resources.device_memory_mb IS
    'Each device''s memory (MiB) of a device key; required when the key is shared.';
COMMENT ON COLUMN respool.node_resources.reserved_memory_mb IS
    'Memory (MiB) each device keeps back for the driver: a shared device offers device_memory_mb - reserved_memory_mb.';
COMMENT ON COLUMN respool.node_resources.derived_from IS
    'For the counters <K>_memory_mb and <K>_share of a shared device key K: K. Their capacity is the sum of the offers of K''s devices, their used the slices and the whole devices held there.';

ALTER TABLE respool.node_devices
    ADD COLUMN memory_mb bigint CHECK (memory_mb > 0),
    ADD COLUMN memory_used bigint NOT NULL DEFAULT 0 CHECK (memory_used >= 0),
    ADD COLUMN share_used integer NOT NULL DEFAULT 0 CHECK (share_used >= 0),
    ADD CONSTRAINT slices_within_offer CHECK (memory_used <= coalesce(memory_mb, 0) AND share_used <= 100),
    ADD CONSTRAINT never_whole_and_sliced CHECK (holder_id IS NULL OR (memory_used = 0 AND share_used = 0));
COMMENT ON COLUMN respool.node_devices.memory_mb IS
    'A shared device''s offer (MiB): its memory less what it keeps back; NULL for a device that is not shared.';
COMMENT ON COLUMN respool.node_devices.memory_used IS
    'The memory (MiB) its slices hold (respool.device_slices); at most memory_mb (I8), 0 while it is held whole (I9).';
COMMENT ON COLUMN respool.node_devices.share_used IS
    'The compute share (percent) its slices hold; at most 100 (I8), 0 while it is held whole (I9).';

CREATE TABLE respool.device_slices (
    request_id uuid NOT NULL,
    node_id    uuid NOT NULL,
    key        text NOT NULL,
    device     text NOT NULL,
    memory_mb  bigint NOT NULL CHECK (memory_mb > 0),
    share      integer CHECK (share BETWEEN 1 AND 100),
    PRIMARY KEY (request_id, key)
);
CREATE INDEX device_slices_device_idx ON respool.device_slices (node_id, key, device);
COMMENT ON TABLE respool.device_slices IS
    'The slices of shared devices held now: one per holding request and device key, with its memory (MiB) and compute share (percent, NULL: none promised). Written by respool._place_on_node, removed by respool._unplace; the device''s memory_used and share_used are their sums (I8). No foreign key to the device: a node change rewrites its device rows (docs/engine.md), and invariant I8 names a slice whose device is gone.';

ALTER TABLE respool.placements
    ADD COLUMN extra jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(extra) = 'object');
COMMENT ON COLUMN respool.placements.extra IS
    'Units charged on the node and the pool beyond what the request asks: for whole shared devices, their memory and share (<K>_memory_mb, <K>_share), so the counters stay exact. Also in resources (the node''s charge).';

CREATE INDEX node_resources_sharing_idx ON respool.node_resources (node_id) WHERE sharing IS NOT NULL;
