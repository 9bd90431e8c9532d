-- 0018_last_placement: where a request ran stays known after it gives its units back
-- (docs/placement.md, "Where a request ran").
--
-- respool.requests.last_placement: the placement document ({"node", "labels", "devices"}) of the
-- request's last holding, written when it gives its units back (respool._unplace); null when it
-- was never placed on a node. respool.events.placement: on an event into `allocated`, the node and
-- devices that grant placed it on. Requests that ended before this migration have neither.

ALTER TABLE respool.requests ADD COLUMN last_placement jsonb;
COMMENT ON COLUMN respool.requests.last_placement IS
    'Where the request held units the last time ({"node", "labels", "devices"} as at its release), written when it gave them back; null if never placed on a node.';

ALTER TABLE respool.events ADD COLUMN placement jsonb;
COMMENT ON COLUMN respool.events.placement IS
    'On an event into allocated in a pool with nodes: the node (name, labels) and devices of that grant; null otherwise.';
